"""`python -m pipelines check-serving` (components/embedding_exporter/serving_check.py): the model
loaded and answered in a fresh process with only TensorFlow, as a stock TF Serving binary would;
the exporter's recorded warm-up requests answered as exported; a damaged model (a truncated,
bit-flipped or missing variables file) refused in one line naming the file; a model without the
record checked for the rest and told so in one line."""
import json
import os
import shutil

import pytest

from components.embedding_exporter.serving_check import ServingCheckFailed, check_serving
from tests.stages import save_toy_serving_model


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return save_toy_serving_model(tmp_path_factory.mktemp("served") / "1")


def _copy(toy, tmp_path):
    shutil.copytree(toy, tmp_path / "model")
    return str(tmp_path / "model")


def _data_file(model):
    (name,) = [n for n in os.listdir(os.path.join(model, "variables")) if n.startswith("variables.data-")]
    return os.path.join(model, "variables", name)


@pytest.mark.slow(reason="a fresh TensorFlow process per damaged model (~5 s each)")
@pytest.mark.parametrize("damage", ["truncated", "bit_flipped"])
def test_a_damaged_model_fails_in_one_line_naming_the_file(toy, tmp_path, damage):
    """A missing variables file is the damage the command line's and the step's tests below check
    (the command line's line names the file as this one does)."""
    model = _copy(toy, tmp_path)
    data = _data_file(model)
    if damage == "truncated":
        with open(data, "r+b") as fh:
            fh.truncate(os.path.getsize(data) // 2)
    else:
        with open(data, "r+b") as fh:
            fh.seek(100)
            byte = fh.read(1)
            fh.seek(100)
            fh.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(ServingCheckFailed) as e:
        check_serving(model)
    line = str(e.value)
    assert len(line.splitlines()) == 1 and line.startswith(f"--model {model}: {data} is damaged"), line


@pytest.mark.slow(reason="two fresh TensorFlow processes")
def test_the_command_line_prints_what_it_found_and_fails_in_one_line(toy, tmp_path, capsys):
    from pipelines.__main__ import main

    assert main(["check-serving", "--model", toy]) == 0
    out = capsys.readouterr().out
    assert "signatures serve_features answered" in out and "batch 1024: p50" in out
    model = _copy(toy, tmp_path)
    data = _data_file(model)
    os.remove(data)  # a missing variables file, named like a cut or changed one
    assert main(["check-serving", "--model", model]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: --model {model}: {data} is damaged"), line


@pytest.mark.slow(reason="the executors' chain (a trained and exported model) checked in a fresh process twice")
def test_the_exported_model_answers_its_warm_up_requests_as_exported(chain, tmp_path):
    _, a, _ = chain
    exported = os.path.join(a["serving"].uri, "Format-Serving")
    found = check_serving(exported)
    assert found.no_record is None and found.compared == 16 and found.max_diff <= 1e-6
    assert found.timed_on == "the warm-up file's eval rows"
    # A recorded score that is not what the model answers: the check names the request and the gap.
    model = str(tmp_path / "model")
    shutil.copytree(exported, model)
    path = os.path.join(model, "assets.extra", "serving_check.json")
    with open(path) as fh:
        record = json.load(fh)
    record["expected"][0] += 0.01
    with open(path, "w") as fh:
        json.dump(record, fh)
    with pytest.raises(ServingCheckFailed, match=r"warm-up request 0 scored .* \(\|diff\| 1\.00e-02 > 1e-06\)"):
        check_serving(model)


# ---- the serving check as a pipeline step (serving_check.enabled) ---------------------------------


def _artifacts(tmp_path, toy, exporter_blessed=True):
    from tfx.types import standard_artifacts

    from tests.stages import artifact

    model = artifact(standard_artifacts.Model, tmp_path / "serving_model")
    shutil.copytree(toy, tmp_path / "serving_model" / "Format-Serving")
    blessing = artifact(standard_artifacts.ModelBlessing, tmp_path / "exporter_blessing")
    blessing.set_int_custom_property("blessed", int(exporter_blessed))
    out = artifact(standard_artifacts.InfraBlessing, tmp_path / "infra_blessing")
    return model, blessing, out


def _run_step(model, blessing, out):
    from tfx.types import standard_component_specs as specs

    from components.embedding_exporter.serving_check_step import ServingCheckExecutor
    from components.tfx_wiring.component_keys import BLESSING_KEY

    ServingCheckExecutor().Do({specs.MODEL_KEY: [model], specs.MODEL_BLESSING_KEY: [blessing]},
                              {BLESSING_KEY: [out]}, {})
    with open(os.path.join(out.uri, "serving_check.json")) as fh:
        return json.load(fh)


@pytest.mark.slow(reason="a fresh TensorFlow process per checked model")
def test_the_step_blesses_a_model_that_answers_and_not_a_damaged_one_and_the_push_needs_it(toy, tmp_path):
    """The good model is the toy, which has no exporter's record: the step's report is what the
    check found of a model without it (loaded, answered and timed, and told so), in the same fresh
    process."""
    from components.model_registry.executor import not_blessed_reason
    from tfx.types import standard_component_specs as specs

    model, blessing, out = _artifacts(tmp_path / "good", toy)
    report = _run_step(model, blessing, out)
    assert out.get_int_custom_property("blessed") == 1 and os.path.isfile(os.path.join(out.uri, "INFRA_BLESSED"))
    assert report["checked"] and report["signatures"] == ["serve_features"] and report["ops"] > 0
    # the toy has no exporter's record: loaded, answered and timed, and told so
    assert report["no_record"].startswith("the model has no answers to compare") and report["compared"] == 0
    timings = report["timings"]
    assert set(timings) == {"1", "64", "1024"} and all(t["p99_ms"] >= t["p50_ms"] > 0 for t in timings.values())
    model, blessing, out = _artifacts(tmp_path / "damaged", toy)
    os.remove(_data_file(os.path.join(model.uri, "Format-Serving")))
    report = _run_step(model, blessing, out)
    assert out.get_int_custom_property("blessed") == 0 and os.path.isfile(os.path.join(out.uri, "INFRA_NOT_BLESSED"))
    assert "is damaged" in report["reason"]
    # the Pusher's reason for not pushing names the check and its line
    reason = not_blessed_reason({specs.INFRA_BLESSING_KEY: [out]})
    assert reason.startswith("the serving check did not bless the model: --model ") and "is damaged" in reason


def test_a_model_the_exporter_did_not_bless_is_not_checked(toy, tmp_path):
    model, blessing, out = _artifacts(tmp_path, toy, exporter_blessed=False)
    report = _run_step(model, blessing, out)
    assert report == {"checked": False, "reason": "the exporter did not bless the model: not checked"}
    assert out.get_int_custom_property("blessed") == 0


def test_the_switch_adds_the_step_and_the_pusher_takes_its_blessing(tmp_path):
    from components.config.loading import parse_config
    from pipelines.pipeline import create_pipeline
    from tests.stages import minimal_raw_config

    raw = minimal_raw_config()
    raw["input"]["path"] = str(tmp_path / "x.csv")
    (tmp_path / "x.csv").write_text("label\n1\n")
    for enabled in (False, True):
        raw["serving_check"] = {"enabled": enabled}
        p = create_pipeline(parse_config(raw), pipeline_root=str(tmp_path / "root"), metadata_path=None,
                            serving_dir=str(tmp_path / "serving"))
        ids = [c.id for c in p.components]
        pusher = next(c for c in p.components if c.id == "Pusher")
        assert ("ServingCheck" in ids) == enabled and ("infra_blessing" in pusher.inputs) == enabled, ids
