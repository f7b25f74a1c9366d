"""The pipeline on input ordered as a new user's logs are (sorted by label: the first rows of each
split hold one class): every stage completes, the exporter's samples hold both labels, and every
metric the run reports (its JSON files, its ML Metadata properties) is a number or says why not."""
import glob
import json
import math

import pytest

import yaml

from tests.stages import demo_raw_config, with_few_features, write_sorted_by_label


def _no_nan(path):
    """Loads a JSON file the run wrote, refusing NaN and Infinity (what strict JSON readers refuse)."""
    def refuse(name):
        raise AssertionError(f"{path}: {name} in a reported figure")

    with open(path, encoding="utf-8") as fh:
        return json.load(fh, parse_constant=refuse)


def _defined_or_why(section, name):
    """A metric of a report section: a finite number, or None with its reason under `undefined`."""
    value = section.get(name)
    if value is None:
        assert (section.get("undefined") or {}).get(name, "").startswith("undefined: "), section
    else:
        assert math.isfinite(value), (name, value)
    return value


@pytest.mark.slow(reason="runs the local pipeline on 3,000 rows sorted by label")
def test_the_pipeline_on_input_sorted_by_label_completes_with_every_metric_defined_or_explained(tmp_path):
    from ml_metadata.metadata_store.metadata_store import MetadataStore
    from ml_metadata.proto import metadata_store_pb2 as mlmd

    from components.config.loading import load_config
    from pipelines.pipeline import METADATA_FILE
    from pipelines.runner import run

    data = tmp_path / "data" / "sorted.csv"
    data.parent.mkdir()
    rows, positives = write_sorted_by_label(data, 3000)
    assert 0 < positives < rows
    raw = with_few_features(demo_raw_config())  # the row order and the metrics are under test, not the model
    raw["input"]["path"] = str(data)
    raw["beam"]["direct_running_mode"] = "in_memory"
    raw["training"].update(train_steps=40, checkpoint_every_steps=20)
    # The failing case: a 400-row AUC sample of a ~600-row eval split, whose first ~470 rows are 0s.
    raw["export"].update(auc_sample_size=400, parity_sample_size=32, compare_compression=False)
    # A 40-step model is not held to the baseline (fitted all the same): the model is blessed and
    # pushed, as in the run that failed, and its registry entry is written.
    raw["validation"] = {"baseline_margin": None}
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    summary = run(load_config(str(cfg_path)), str(out)).summary
    assert summary["pushed_by_this_run"], summary

    root = out / "pipeline_root"
    [metrics_file] = glob.glob(str(root / "Trainer" / "model" / "*" / "eval_metrics.json"))
    metrics = _no_nan(metrics_file)
    for name in ("auc", "log_loss"):
        _defined_or_why(metrics, name)
        _defined_or_why(metrics["baseline"], name)
    [report_file] = glob.glob(str(root / "EmbeddingExporter" / "serving_model" / "*" / "export_report.json"))
    report = _no_nan(report_file)
    auc = report["eval_auc"]
    # drawn across the eval split: both labels, so a number (the first 400 rows hold only 0s)
    assert auc["examples"] == 400 and auc["undefined"] is None, auc
    for name in ("serving", "trained_model", "serving_float32"):
        assert 0.0 < auc[name] < 1.0, auc
    for path in glob.glob(str(out / "**" / "*.json"), recursive=True):
        _no_nan(path)

    config = mlmd.ConnectionConfig()
    config.sqlite.filename_uri = str(out / METADATA_FILE)
    store = MetadataStore(config)
    assert {e.last_known_state for e in store.get_executions()} <= {mlmd.Execution.COMPLETE, mlmd.Execution.CACHED}
    for a in store.get_artifacts():
        for name, v in a.custom_properties.items():
            if v.HasField("double_value"):
                assert math.isfinite(v.double_value), (a.uri, name)
    [serving] = [a for a in store.get_artifacts() if "eval_auc" in a.custom_properties and "Format" not in a.uri
                 and "serving_model" in a.uri]
    assert serving.custom_properties["eval_auc"].double_value == pytest.approx(auc["serving"])
