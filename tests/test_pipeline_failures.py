"""`python -m pipelines run` on bad input: one line naming the component and the cause, where the
log is, exit 1, no traceback on the terminal; nothing pushed."""
import json
import os
import subprocess
import sys

import pytest

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _failed_run(cfg, out):
    """`python -m pipelines run` that must fail: its result and its one `error:` line."""
    env = dict(os.environ, PYTHONPATH=REPO, TF_USE_LEGACY_KERAS="1", PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, "-m", "pipelines", "run", "--config", str(cfg), "--output-dir", str(out)],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert r.returncode == 1, r.stderr[-3000:]
    errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert len(errors) == 1, r.stderr[-3000:]
    return r, errors


@pytest.mark.slow(reason="runs the local pipeline")
def test_unhealthy_feature_stops_the_run_with_one_line(tmp_path):
    from components.example_gen.synthetic_data import GeneratorSpec, ensure_dataset

    data = tmp_path / "data.csv"
    ensure_dataset(str(data), GeneratorSpec(rows=600, seed=5))
    lines = data.read_text().splitlines()
    i7 = lines[0].split(",").index("I7")
    out = [lines[0]]
    for k, line in enumerate(lines[1:]):
        cells = line.split(",")
        if k % 3:
            cells[i7] = "n/a"  # two thirds of I7 is not a number
        out.append(",".join(cells))
    out.insert(3, "1,2,3")  # and one malformed row, which is counted, not fatal
    data.write_text("\n".join(out) + "\n")
    raw = yaml.safe_load(open(os.path.join(REPO, "configs", "demo.yaml")))
    raw["input"]["path"] = str(data)
    raw["beam"]["direct_running_mode"] = "in_memory"
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    r, errors = _failed_run(cfg, tmp_path / "out")
    assert errors[0].startswith("error: EmbeddingPreprocess failed: feature health: I7 (dense)")
    assert "input.allow_invalid" in errors[0]
    assert f"full log: {tmp_path / 'out' / 'pipeline.log'}" in r.stderr
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    assert "Traceback" in (tmp_path / "out" / "pipeline.log").read_text()
    assert not os.path.exists(tmp_path / "out" / "serving")
    # ExampleGen finished, with the malformed row in its ledger
    import glob
    led = json.load(open(glob.glob(str(tmp_path / "out" / "pipeline_root" / "EmbeddingExampleGen" / "examples" / "*" / "ledger.json"))[0]))
    stage = led["stages"][0]
    assert stage["rows_in"] == 601 and stage["malformed"] == {"too_few_fields": 1} and led["balanced"]
    assert stage["cells"]["not_numeric"]["I7"] == 400


@pytest.mark.slow(reason="runs the local pipeline")
def test_a_half_written_registry_entry_stops_the_run_before_anything_is_pushed(tmp_path, capfd):
    """The model served at the push destination has a half-written registry entry: the run stops at
    LastBlessedModel with one line naming the entry and the way out; nothing is pushed on a guess.
    The command's entry point in this process: a fresh process's terminal (no traceback there, the
    traceback in the log) is test_unhealthy_feature_stops_the_run_with_one_line's, whose failure
    reaches the terminal by the same path; under capfd the run's log is captured too."""
    from components.model_registry import registry
    from components.example_gen.synthetic_data import GeneratorSpec, ensure_dataset
    from pipelines.__main__ import main

    data = tmp_path / "data.csv"
    ensure_dataset(str(data), GeneratorSpec(rows=300, seed=5))
    raw = yaml.safe_load(open(os.path.join(REPO, "configs", "demo.yaml")))
    raw["input"]["path"] = str(data)
    raw["beam"]["direct_running_mode"] = "in_memory"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    serving = tmp_path / "out" / "serving"
    served = serving / "1764000000"
    served.mkdir(parents=True)
    (served / "saved_model.pb").write_text("a model TF Serving loads")
    entry = registry.entry_path(str(serving), "1764000000")
    os.makedirs(os.path.dirname(entry))
    with open(entry, "w") as fh:
        fh.write('{"format": 1, "version": "1764000000", "serving_mo')  # the write was cut off
    status = main(["run", "--config", str(cfg), "--output-dir", str(tmp_path / "out")])
    err = capfd.readouterr().err
    errors = [l for l in err.splitlines() if l.startswith("error:")]
    assert status == 1 and len(errors) == 1, err[-3000:]
    assert errors[0].startswith("error: LastBlessedModel failed: RegistryError: ")
    assert f"{entry}: not valid JSON" in errors[0] and f"delete {served}" in errors[0]
    assert errors[0].endswith(f"(full log: {tmp_path / 'out' / 'pipeline.log'})")
    assert sorted(os.listdir(serving)) == ["1764000000", "_registry"]  # nothing pushed
    # LastBlessedModel runs first: no data was read, nothing trained
    assert not any(os.path.exists(tmp_path / "out" / "pipeline_root" / c) for c in ("EmbeddingExampleGen", "Trainer"))


@pytest.mark.slow(reason="runs the local pipeline")
def test_a_model_the_gate_keeps_back_exits_3_with_progress_and_no_noise(tmp_path):
    """A run that works but whose model the gate refuses, with --json: exit status 3; stdout is the
    summary as JSON and nothing else; stderr showed every stage's progress, the Beam workers'
    counts and the Trainer's steps included, and nothing else (no TF, XLA, absl or Beam lines, no
    Python warnings); the summary says why no model was pushed; the run report was written."""
    from components.reporting.report import render
    from components.example_gen.synthetic_data import GeneratorSpec, ensure_dataset
    from pipelines.summary import summary_report
    from tests.stages import with_few_features

    data = tmp_path / "data.csv"
    ensure_dataset(str(data), GeneratorSpec(rows=3000, seed=5))
    raw = with_few_features(yaml.safe_load(open(os.path.join(REPO, "configs", "demo.yaml"))))  # what is under test is the terminal
    raw["input"]["path"] = str(data)
    # The demo's Beam worker processes, one rather than one per core: 3,000 rows are one range, and
    # several processes' events sharing the progress file are test_progress_and_reports.py's.
    raw["beam"]["direct_num_workers"] = 1
    raw["training"].update(train_steps=40, checkpoint_every_steps=20)
    raw["export"].update(auc_sample_size=400, parity_sample_size=32, compare_compression=False)
    # model AUC >= baseline AUC + 0.6: no model on this data can pass against any baseline above
    # AUC 0.4. The baseline fitted in 100 steps, not its default 1,000 (4 s of the run): its fit is
    # held to scikit-learn's in test_validation_gate.py.
    raw.setdefault("validation", {}).update(baseline_margin=-0.6, baseline={"train_steps": 100})
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    env = dict(os.environ, PYTHONPATH=REPO, TF_USE_LEGACY_KERAS="1")
    env.pop("PYTHONWARNINGS", None)  # the run itself must keep warnings off the terminal
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    r = subprocess.run([sys.executable, "-m", "pipelines", "run", "--config", str(cfg), "--output-dir",
                        str(tmp_path / "out"), "--json"], capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert r.returncode == 3, (r.stdout[-3000:], r.stderr[-3000:])
    summary = json.loads(r.stdout)
    assert summary["validation"]["blessed"] is False and not summary["pushed_by_this_run"]
    assert "serving model:        none pushed: the validation gate kept the model back: eval AUC" in render(summary_report(summary))
    err = r.stderr
    for stage in ("EmbeddingExampleGen", "EmbeddingPreprocess", "Trainer", "EmbeddingExporter", "Pusher"):
        assert f"] {stage} running" in err and f"] {stage} finished in" in err, stage
    # counts only Beam's worker processes report
    assert "byte ranges: 1 / 1 ranges (100%); rows read: 3,000 rows" in err
    train = summary["rows_read"]["train"]
    assert f"transforming train: {train:,} / {train:,} rows (100%" in err
    assert "Trainer: step 40/40, loss" in err
    # the final evaluation is the kept model's: its line, the summary and the training record agree
    kept = summary["eval_model"]
    assert kept["step"] == (summary["training"].get("model_step") or 40), (kept, summary["training"])
    assert kept["choice"] == ("best on the held-out slice" if "model_step" in summary["training"] else "the last step")
    assert f"Trainer: eval of the kept model (step {kept['step']}, {kept['choice']}): auc " in err
    assert "Trainer: eval at step 40: auc" not in err
    assert f"eval AUC:             the kept model (step {kept['step']}, {kept['choice']}): " in render(
        summary_report(summary))
    assert "EmbeddingExporter: validation gate: not blessed" in err
    noise = [l for l in err.splitlines() if l and not l.startswith("[") and not l.startswith("running ")]
    assert noise == [], noise  # no TF / XLA / absl / Beam lines, no Python warnings
    assert os.path.exists(summary["report_html"])
    assert not os.path.exists(tmp_path / "out" / "serving")  # nothing pushed


def test_the_failed_component_is_the_one_ml_metadata_marks_failed_in_this_run(tmp_path):
    """The run's ML Metadata names the failed component: the node of this run's FAILED execution
    (not an earlier run's), else of one it registered and never finished (its driver raised)."""
    import time

    from ml_metadata.metadata_store.metadata_store import MetadataStore
    from ml_metadata.proto import metadata_store_pb2 as mlmd

    from pipelines.runner import failed_component, failed_node

    path = str(tmp_path / "metadata.sqlite")
    config = mlmd.ConnectionConfig()
    config.sqlite.filename_uri = path
    store = MetadataStore(config)
    execution_type = store.put_execution_type(mlmd.ExecutionType(name="component"))
    pipeline_type = store.put_context_type(mlmd.ContextType(name="pipeline"))
    node_type = store.put_context_type(mlmd.ContextType(name="node"))
    [pipeline] = store.put_contexts([mlmd.Context(type_id=pipeline_type, name="demo.v2")])
    nodes = dict(zip(("LastBlessedModel", "EmbeddingExampleGen", "Trainer"), store.put_contexts(
        [mlmd.Context(type_id=node_type, name=f"demo.v2.{n}") for n in ("LastBlessedModel", "EmbeddingExampleGen", "Trainer")])))

    def execution(node, state):
        [e] = store.put_executions([mlmd.Execution(type_id=execution_type, last_known_state=state)])
        store.put_attributions_and_associations([], [mlmd.Association(execution_id=e, context_id=c)
                                                     for c in (pipeline, nodes[node])])

    execution("LastBlessedModel", mlmd.Execution.FAILED)  # an earlier run's
    time.sleep(0.01)
    since = time.time()
    time.sleep(0.01)
    execution("LastBlessedModel", mlmd.Execution.COMPLETE)
    execution("EmbeddingExampleGen", mlmd.Execution.NEW)
    assert failed_node(store, int(since * 1000)) == "EmbeddingExampleGen"  # registered, never finished
    execution("Trainer", mlmd.Execution.FAILED)
    assert failed_node(store, int(since * 1000)) == "Trainer"
    assert failed_component(path, since) == "Trainer"  # read back from the file, read-only
    assert failed_component(path, time.time() + 1) is None  # nothing of a later run
    assert failed_component(str(tmp_path / "none.sqlite"), since) is None
