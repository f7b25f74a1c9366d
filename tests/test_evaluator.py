"""TFX's stock Evaluator in the pipeline (pipelines/evaluation.py): the `evaluator` section's checks,
the EvalConfig made from it, the tf.Example copy of a Parquet split it reads
(components/tf_example_copy) and its blessing at our Pusher (components/model_registry). The
Evaluator itself runs on every orchestrator in tests/test_kubeflow.py (kfp_runs)."""
import json
import re
import os

import pytest

from tests.stages import artifact, demo_raw_config

from components.config.loading import parse_config
from components.config.schema import ConfigError
from pipelines import evaluation  # noqa: F401  (registers the section's checks)
from components.tfx_wiring import component_keys


def _config(**evaluator):
    raw = demo_raw_config()
    raw["input"]["path"] = "/nonexistent/data.csv"  # never read: parsing only
    raw["evaluator"] = dict({"enabled": True}, **evaluator)
    return parse_config(raw, "e.yaml")


@pytest.mark.parametrize("evaluator, message", [
    ({"min_auc": 0}, "evaluator.min_auc: 0.0 is not an AUC in (0, 1)"),
    ({"min_auc": 1.0}, "evaluator.min_auc: 1.0 is not an AUC in (0, 1)"),
    ({"calibration_bounds": [1.2, 0.8]}, "evaluator.calibration_bounds: [1.2, 0.8] is not [lower, upper]"),
    ({"calibration_bounds": [0.8]}, "evaluator.calibration_bounds: [0.8] is not [lower, upper]"),
    ({"slice_features": ["label"]}, "evaluator.slice_features[0]: 'label' is the label"),
    ({"slice_features": ["C1", "nope"]}, "evaluator.slice_features[1]: 'nope' is not a configured column"),
    ({"slice_features": ["C1", "C1"]}, "evaluator.slice_features: C1 named twice"),
])
def test_bad_evaluator_section_names_the_field(evaluator, message):
    with pytest.raises(ConfigError, match="^" + re.escape("e.yaml: " + message)):
        _config(**evaluator)


def test_evaluator_section_is_no_part_of_the_data_stages_shares():
    """Turning the Evaluator on changes no execution property of ExampleGen, preprocessing or the
    exporter: a cached run keeps their outputs."""
    from components.config.stages import stage_json

    on, off = _config(slice_features=["C1"], min_auc=0.6), _config(enabled=False)
    for stage in ("example_gen", "preprocess", "exporter"):
        assert stage_json(on, stage) == stage_json(off, stage), stage


@pytest.mark.slow(reason="imports TensorFlow Model Analysis (about 17 s on 2 cores) for its EvalConfig")
def test_eval_config_holds_the_label_thresholds_and_slices():
    import tensorflow_model_analysis as tfma

    from pipelines.evaluation import eval_config

    ec = eval_config(_config(min_auc=0.6, calibration_bounds=[0.8, 1.25], slice_features=["C1", "I1"]))
    (spec,) = ec.model_specs
    assert (spec.signature_name, spec.label_key, spec.prediction_key) == ("serving_default", "label", "probabilities")
    assert [s.feature_keys for s in ec.slicing_specs] == [[], ["C1"], ["I1"]]
    metrics = {m.class_name: m for m in ec.metrics_specs[0].metrics}
    assert {"AUC", "Calibration", "ExampleCount"} <= set(metrics)
    auc = metrics["AUC"].per_slice_thresholds
    assert len(auc) == 1 and list(auc[0].slicing_specs) == [tfma.SlicingSpec()]  # the overall slice only
    assert auc[0].threshold.value_threshold.lower_bound.value == 0.6
    cal = metrics["Calibration"].per_slice_thresholds[0].threshold.value_threshold
    assert (cal.lower_bound.value, cal.upper_bound.value) == (0.8, 1.25)
    assert not metrics["ExampleCount"].per_slice_thresholds
    no_calibration = eval_config(_config())
    assert not {m.class_name: m for m in no_calibration.metrics_specs[0].metrics}["Calibration"].per_slice_thresholds


# ---- the tf.Example copy of a Parquet split ----------------------------------------------------

@pytest.mark.slow(reason="runs TFExampleCopy's Beam pipeline (about 4 s with Beam's start)")
def test_tf_example_copy_encodes_every_row_of_the_chosen_splits(tmp_path):
    """Three hand-written rows (a null and an empty list among them) and an empty split: the copy
    holds exactly those rows as tf.Examples, the types kept, and counts them."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import tensorflow as tf
    from tfx.components.util import examples_utils
    from tfx.proto import example_gen_pb2
    from tfx.types import standard_artifacts

    from components.tf_example_copy import executor as copy_executor
    from tests.stages import beam_context

    src = artifact(standard_artifacts.Examples, tmp_path / "in", ["train", "eval", "other"])
    examples_utils.set_payload_format(src, example_gen_pb2.FORMAT_PARQUET)
    table = pa.table({"label": pa.array([[1], [0], [1]], pa.list_(pa.int64())),
                      "I1": pa.array([[0.5], None, [2.0]], pa.list_(pa.float32())),
                      "C1": pa.array([[b"a"], [], [b"b", b"c"]], pa.list_(pa.binary()))})
    for split, rows in (("eval", table), ("train", table.slice(0, 1)), ("other", table.slice(0, 0))):
        os.makedirs(tmp_path / "in" / f"Split-{split}")
        pq.write_table(rows, str(tmp_path / "in" / f"Split-{split}" / "data.parquet"))
    out = artifact(standard_artifacts.Examples, tmp_path / "out")
    copy_executor.Executor(beam_context()).Do(
        {component_keys.EXAMPLES_KEY: [src]}, {component_keys.TF_EXAMPLES_KEY: [out]},
        {component_keys.SPLITS_KEY: json.dumps(["eval", "other"])})
    assert json.loads(out.split_names) == ["eval", "other"]
    assert examples_utils.get_payload_format(out) == example_gen_pb2.FORMAT_TF_EXAMPLE
    assert out.get_int_custom_property("eval_rows") == 3 and out.get_int_custom_property("other_rows") == 0
    assert not os.path.exists(tmp_path / "out" / "Split-train")

    def read(split):
        files = sorted(tf.io.gfile.glob(str(tmp_path / "out" / f"Split-{split}" / "*.gz")))
        assert files
        return [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(files, "GZIP")]

    got = sorted(({k: (list(v.int64_list.value) or list(v.float_list.value) or list(v.bytes_list.value))
                   for k, v in e.features.feature.items()} for e in read("eval")), key=lambda d: d["label"] + d.get("I1", []))
    # a null is written as the feature with no value, as tfx_bsl's encoder writes it for the exporter too
    assert got == [{"label": [0], "I1": [], "C1": []}, {"label": [1], "I1": [0.5], "C1": [b"a"]},
                   {"label": [1], "I1": [2.0], "C1": [b"b", b"c"]}]
    kinds = {k: v.WhichOneof("kind") for e in read("eval") for k, v in e.features.feature.items()}
    assert kinds == {"label": "int64_list", "I1": "float_list", "C1": "bytes_list"}
    assert read("other") == []


def test_tf_example_copy_refuses_a_missing_split(tmp_path):
    from tfx.components.util import examples_utils
    from tfx.proto import example_gen_pb2
    from tfx.types import standard_artifacts

    from components.tf_example_copy import executor as copy_executor

    src = artifact(standard_artifacts.Examples, tmp_path / "in", ["train"])
    examples_utils.set_payload_format(src, example_gen_pb2.FORMAT_PARQUET)
    with pytest.raises(ValueError, match=r"has no split eval \(it has train\)"):
        copy_executor.Executor().Do({component_keys.EXAMPLES_KEY: [src]},
                                    {component_keys.TF_EXAMPLES_KEY: [artifact(standard_artifacts.Examples, tmp_path / "out")]},
                                    {component_keys.SPLITS_KEY: json.dumps(["eval"])})


# ---- the Evaluator's blessing at our Pusher ----------------------------------------------------

def _blessing(tmp_path, name, blessed):
    from tfx.types import standard_artifacts

    b = artifact(standard_artifacts.ModelBlessing, tmp_path / name)
    if blessed is not None:
        b.set_int_custom_property("blessed", int(blessed))
    return b


def _serving_model(tmp_path):
    """A stand-in exporter output: the registry copies files and reads the report only."""
    from tfx.types import standard_artifacts

    m = artifact(standard_artifacts.Model, tmp_path / "serving_model")
    os.makedirs(tmp_path / "serving_model" / "Format-Serving")
    (tmp_path / "serving_model" / "Format-Serving" / "saved_model.pb").write_text("pb")
    (tmp_path / "serving_model" / "export_report.json").write_text(json.dumps(
        {"eval_auc": {"serving": 0.7, "examples": 10}, "validation": {"checks": [
            {"name": "last_blessed", "passed": True, "skipped": True, "reason": "first"}]}}))
    return m


@pytest.mark.parametrize("exporter, evaluator, pushed, reason", [
    (True, True, True, None),
    (True, None, False, "TFX's Evaluator did not bless the serving model (no metrics read): its thresholds did not hold"),
    (True, False, False, "TFX's Evaluator did not bless"),
    (False, True, False, "the exporter's validation gate did not bless the model"),
    (True, "absent", True, None),  # a pipeline without the Evaluator
])
def test_pusher_needs_the_evaluators_blessing_too(tmp_path, exporter, evaluator, pushed, reason):
    """Both blessings must bless; an Evaluator's blessing without a `blessed` property (TFX's
    Evaluator ran without thresholds) blesses nothing. The pushed model's registry entry records
    the Evaluator's check beside the exporter's."""
    from tfx.proto import pusher_pb2
    from tfx.types import standard_artifacts, standard_component_specs as specs
    from tfx.utils import proto_utils

    from components.model_registry import executor as registry_executor
    from components.model_registry import registry

    blessing = _blessing(tmp_path, "blessing", exporter)
    blessing.set_string_custom_property("current_model", str(tmp_path / "trainer"))
    inputs = {specs.MODEL_KEY: [_serving_model(tmp_path)], specs.MODEL_BLESSING_KEY: [blessing]}
    if evaluator != "absent":
        inputs[component_keys.EVALUATOR_BLESSING_KEY] = [_blessing(tmp_path, "evaluator_blessing", evaluator)]
    out = artifact(standard_artifacts.PushedModel, tmp_path / "pushed")
    serving_dir = tmp_path / "serving"
    registry_executor.RegistryPusherExecutor().Do(inputs, {specs.PUSHED_MODEL_KEY: [out]}, {
        specs.PUSH_DESTINATION_KEY: proto_utils.proto_to_json(pusher_pb2.PushDestination(
            filesystem=pusher_pb2.PushDestination.Filesystem(base_directory=str(serving_dir)))),
        component_keys.PIPELINE_NAME_KEY: "p"})
    assert out.get_int_custom_property("pushed") == int(pushed)
    if not pushed:
        assert out.get_string_custom_property(registry_executor.NOT_PUSHED_REASON).startswith(reason)
        assert registry.versions(str(serving_dir)) == []
        return
    (version,) = registry.versions(str(serving_dir))
    entry = registry.read_entry(str(serving_dir), version)
    gate = [(c["name"], c["passed"]) for c in entry["gate"]]
    if evaluator == "absent":
        assert gate == [("last_blessed", True)] and entry["evaluator"] is None
    else:
        assert gate == [("last_blessed", True), ("evaluator", True)]
        assert entry["evaluator"]["reason"].startswith("TFX's Evaluator blessed the serving model")
