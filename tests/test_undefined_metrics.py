"""Metrics undefined on their rows, and samples drawn across a split whatever its order.

- rules/metrics.py: an AUC of one label, a log loss of no rows: NaN in the arithmetic, None and a
  reason in what leaves a stage (`with_reasons`, `json_safe`).
- tfx_wiring/metric_properties.py: the one guard every metric written to ML Metadata goes
  through; a NaN double is what SQLite refuses while a component's outputs are published.
- gate.decide: a check whose figure is undefined fails with the reason, never compares NaN.
- data_io/sampling.py: a split sorted by label gives a sample of both labels, the same for a seed.
- pipelines/runner.py: a publish that fails after the Trainer completed is named the exporter's.
"""
import copy
import dataclasses
import json
import math
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy.stats import rankdata  # noqa: F401  (roc_auc imports it lazily: loaded here at collection)
import tensorflow as tf
from ml_metadata.metadata_store.metadata_store import MetadataStore
from ml_metadata.proto import metadata_store_pb2 as mlmd
from tfx_bsl.coders import example_coder

from components.rules.metrics import (
    UNDEFINED_KEY, auc_undefined_reason, evaluation_reasons, json_safe, log_loss, log_loss_undefined_reason,
    reported, roc_auc, with_reasons,
)
from components.config.loading import parse_config
from components.data_io.sampling import sample_examples, stratified_runs
from components.embedding_exporter.gate import decide
from components.model_registry.evaluation import evaluator_check
from components.tfx_wiring.metric_properties import set_metric_property
from pipelines.runner import failed_component

from tests.stages import minimal_raw_config

NAN = float("nan")


# (labels, AUC reason); the reason is None when both labels are there
AUC_CASES = [
    ([0, 0, 0], "undefined: the 3-row sample holds only label 0"),
    ([1, 1], "undefined: the 2-row sample holds only label 1"),
    ([], "undefined: the sample holds no rows"),
    ([0, 1, 0], None),
]


@pytest.mark.parametrize("labels, reason", AUC_CASES)
def test_auc_is_nan_exactly_when_a_reason_says_why(labels, reason):
    auc = roc_auc(np.asarray([0.2, 0.7, 0.4][:len(labels)]), np.asarray(labels))
    assert auc_undefined_reason(np.asarray(labels)) == reason
    assert math.isnan(auc) is (reason is not None)


def test_log_loss_of_no_rows_is_undefined_with_its_reason():
    assert math.isnan(log_loss(np.zeros(0), np.zeros(0)))
    assert log_loss_undefined_reason(np.zeros(0), "eval split") == "undefined: the eval split holds no rows"
    assert log_loss_undefined_reason(np.zeros(2)) is None
    assert log_loss(np.asarray([0.5]), np.asarray([1.0])) == pytest.approx(math.log(2))


def test_undefined_metrics_leave_a_stage_as_null_with_their_reason():
    assert reported(0.75) == (0.75, None)
    assert reported(NAN, "undefined: the 4-row sample holds only label 0") == (None, "undefined: the 4-row sample holds only label 0")
    assert reported(float("inf")) == (None, "undefined: not a finite number (inf)")
    out = with_reasons({"auc": NAN, "log_loss": 0.3, "examples": 4},
                       {"auc": "undefined: the 4-row eval split holds only label 0"})
    assert out == {"auc": None, "log_loss": 0.3, "examples": 4,
                   UNDEFINED_KEY: {"auc": "undefined: the 4-row eval split holds only label 0"}}
    assert with_reasons({"auc": 0.6}) == {"auc": 0.6}  # nothing undefined: no `undefined` key
    # an evaluation that kept only its counts: 5 rows, positive rate 0
    assert evaluation_reasons({"examples": 5, "positive_rate": 0.0}) == {
        "auc": "undefined: the 5-row eval split holds only label 0", "log_loss": None}
    assert evaluation_reasons({"examples": 5, "positive_rate": 0.4}) == {"auc": None, "log_loss": None}


def test_json_safe_leaves_no_nan_at_any_depth():
    obj = {"auc": NAN, "selection": {"best_auc": float("-inf"), "steps": [1, NAN]}, "ok": 1.5}
    safe = json_safe(obj)
    assert json.loads(json.dumps(safe, allow_nan=False)) == {
        "auc": None, "ok": 1.5, UNDEFINED_KEY: {"auc": "undefined: not a finite number"},
        "selection": {"best_auc": None, "steps": [1, None], UNDEFINED_KEY: {"best_auc": "undefined: not a finite number"}}}


class _Artifact:
    """The two setters of a TFX Artifact, on an ML Metadata Artifact proto (what publishing writes)."""

    def __init__(self):
        self.proto = mlmd.Artifact(uri="/serving_model/7")
        self.uri = self.proto.uri

    def set_float_custom_property(self, name, value):
        self.proto.custom_properties[name].double_value = value

    def set_string_custom_property(self, name, value):
        self.proto.custom_properties[name].string_value = value


def test_the_guard_writes_a_number_or_the_reason_never_a_nan():
    a = _Artifact()
    assert set_metric_property(a, "eval_auc", 0.71) is None
    why = "undefined: the 512-row eval sample holds only label 0"
    assert set_metric_property(a, "baseline_reference_auc", NAN, why) == why
    assert set_metric_property(a, "parity_max_abs_diff", None) == "undefined: not measured"
    props = a.proto.custom_properties
    assert props["eval_auc"].double_value == 0.71
    assert "baseline_reference_auc" not in props and props["baseline_reference_auc_undefined"].string_value == why
    assert not any(math.isnan(v.double_value) for v in props.values() if v.HasField("double_value"))


def _store(path):
    config = mlmd.ConnectionConfig()
    config.sqlite.filename_uri = path
    return MetadataStore(config)


def test_a_publish_failing_after_the_trainer_completed_is_named_the_exporters(tmp_path):
    """The run of the issue: the Trainer COMPLETE, the exporter's executor done, then publishing its
    outputs (one execution update with its artifacts, as TFX's launcher does) fails on a NaN
    property: the exporter's execution stays RUNNING and the failure line names it. The same
    outputs through the guard publish."""
    path = str(tmp_path / "metadata.sqlite")
    store = _store(path)
    execution_type = store.put_execution_type(mlmd.ExecutionType(name="component"))
    model_type = store.put_artifact_type(mlmd.ArtifactType(name="Model"))
    pipeline_type = store.put_context_type(mlmd.ContextType(name="pipeline"))
    node_type = store.put_context_type(mlmd.ContextType(name="node"))
    since = time.time()
    time.sleep(0.01)
    [pipeline] = store.put_contexts([mlmd.Context(type_id=pipeline_type, name="demo")])
    names = ("Trainer", "EmbeddingExporter")
    nodes = dict(zip(names, store.put_contexts([mlmd.Context(type_id=node_type, name=f"demo.{n}") for n in names])))
    contexts = {n: [store.get_contexts_by_id([pipeline])[0], store.get_contexts_by_id([nodes[n]])[0]] for n in names}

    def execution(node, state):
        [e] = store.put_executions([mlmd.Execution(type_id=execution_type, last_known_state=state)])
        store.put_attributions_and_associations([], [mlmd.Association(execution_id=e, context_id=c.id)
                                                     for c in contexts[node]])
        return store.get_executions_by_id([e])[0]

    trainer = execution("Trainer", mlmd.Execution.RUNNING)
    trainer.last_known_state = mlmd.Execution.COMPLETE
    store.put_execution(trainer, [(mlmd.Artifact(type_id=model_type, uri="/model/6", state=mlmd.Artifact.LIVE),
                                   mlmd.Event(type=mlmd.Event.OUTPUT))], contexts["Trainer"])
    exporter = execution("EmbeddingExporter", mlmd.Execution.RUNNING)
    exporter.last_known_state = mlmd.Execution.COMPLETE
    serving = mlmd.Artifact(type_id=model_type, uri="/serving_model/7", state=mlmd.Artifact.LIVE)
    serving.custom_properties["eval_auc"].double_value = NAN
    with pytest.raises(Exception, match="no such column: nan"):
        store.put_execution(exporter, [(serving, mlmd.Event(type=mlmd.Event.OUTPUT))], contexts["EmbeddingExporter"])
    assert failed_component(path, since) == "EmbeddingExporter"

    guarded = _Artifact()
    guarded.proto.type_id, guarded.proto.state = model_type, mlmd.Artifact.LIVE
    set_metric_property(guarded, "eval_auc", NAN, "undefined: the 400-row eval sample holds only label 0")
    store.put_execution(exporter, [(guarded.proto, mlmd.Event(type=mlmd.Event.OUTPUT))], contexts["EmbeddingExporter"])
    assert failed_component(path, since) is None  # nothing failed, nothing left running


# ---- the gate on undefined figures ----------------------------------------------------------------

BASE = {"auc": 0.78, "model": "logistic_regression", "examples": 1000}
PREVIOUS = {"eval_auc": 0.81, "examples": 500, "serving_dir": "/prev/Format-Serving"}
ONE_LABEL = "undefined: the 400-row eval sample holds only label 0"

# (margins, trainer metrics, serving AUC, last blessed, failed check, the start of its reason)
UNDEFINED_GATE_CASES = [
    ({}, {"auc": None, "undefined": {"auc": "undefined: the 90-row eval split holds only label 0"}, "baseline": BASE},
     0.8, None, "baseline", "the model's eval AUC is undefined: the 90-row eval split holds only label 0"),
    ({}, {"auc": 0.8, "baseline": dict(BASE, auc=NAN)}, 0.8, None, "baseline",
     "the baseline's eval AUC is undefined: not a finite number (nan)"),
    ({}, {"auc": 0.8, "baseline": BASE}, None, PREVIOUS, "last_blessed",
     "the serving model's AUC on the eval sample is " + ONE_LABEL),
    ({}, {"auc": 0.8, "baseline": BASE}, 0.8, dict(PREVIOUS, eval_auc=None, eval_auc_undefined=ONE_LABEL), "last_blessed",
     "the last blessed model's AUC on the eval sample is " + ONE_LABEL),
    # both checks off: still not blessed, nothing to push a model with no AUC
    ({"baseline_margin": None, "regression_margin": None}, {"auc": 0.8}, NAN, None, "eval_auc",
     "the serving model's AUC on the eval sample is " + ONE_LABEL),
]


@pytest.mark.parametrize("margins, metrics, serving_auc, previous, failed, reason", UNDEFINED_GATE_CASES)
def test_the_gate_refuses_to_compare_an_undefined_figure_and_says_why(margins, metrics, serving_auc, previous,
                                                                       failed, reason):
    cfg = copy.deepcopy(parse_config(minimal_raw_config()))
    cfg.validation = dataclasses.replace(cfg.validation, **{"baseline_margin": 0.0, "regression_margin": 0.002, **margins})
    d = decide(cfg, metrics, serving_auc, previous, serving_auc_undefined=ONE_LABEL if serving_auc is None or
               serving_auc != serving_auc else None)
    assert d["blessed"] is False
    [check] = [c for c in d["checks"] if not c["passed"]]
    assert check["name"] == failed and check["reason"].startswith(reason), check["reason"]
    assert not any(isinstance(v, float) and math.isnan(v) for c in d["checks"] for v in c.values())


def test_an_evaluator_auc_of_nan_is_no_figure_in_the_check():
    check = evaluator_check(False, {"overall": {"auc": NAN, "calibration": 1.25, "example_count": 5},
                                    "failures": ["auc nan < 0.6"]}, "/Evaluator/evaluation/9")
    assert check["model_auc"] is None and check["calibration"] == 1.25
    assert check["reason"] == ("TFX's Evaluator did not bless the serving model (calibration 1.2500, AUC undefined "
                               "(nan)): auc nan < 0.6")


# ---- samples across a split ---------------------------------------------------------------------


def test_stratified_runs_cover_the_split_and_add_up():
    runs = stratified_runs(1000, 40, 8, np.random.default_rng(3))
    assert sum(n for _, n in runs) == 40 and len(runs) == 8
    for j, (first, n) in enumerate(runs):  # one run of 5 rows in each eighth of the split
        assert j * 125 <= first and first + n <= (j + 1) * 125 and n == 5
    assert stratified_runs(30, 40, 8, np.random.default_rng(3)) == [(0, 30)]  # small split: all of it
    assert stratified_runs(0, 40, 8, np.random.default_rng(3)) == []


def _sorted_split(tmp_path, kind):
    """40 rows sorted by label (30 zeros, then 10 ones), `row` numbering them, in two files."""

    split = tmp_path / kind
    split.mkdir()
    rows = np.arange(40)
    for f, part in enumerate((rows[:24], rows[24:])):
        table = pa.table({"row": pa.array([[int(r)] for r in part], pa.list_(pa.int64())),
                          "label": pa.array([[int(r >= 30)] for r in part], pa.list_(pa.int64()))})
        if kind == "parquet":
            pq.write_table(table, str(split / f"data-{f}.parquet"), row_group_size=8)
        else:
            with tf.io.TFRecordWriter(str(split / f"data-{f}.gz"), options="GZIP") as w:
                for record in example_coder.RecordBatchToExamplesEncoder().encode(table.to_batches()[0]):
                    w.write(record)
    return str(split / "*")


@pytest.mark.parametrize("kind", ["parquet", "tfrecord"])
def test_a_sample_of_a_split_sorted_by_label_holds_both_labels(tmp_path, kind):
    pattern = _sorted_split(tmp_path, kind)

    def rows(sample):
        return [tf.train.Example.FromString(r).features.feature["row"].int64_list.value[0] for r in sample]

    sample = rows(sample_examples(pattern, 12, seed=7, blocks=4))
    assert len(sample) == len(set(sample)) == 12
    assert {r >= 30 for r in sample} == {False, True}  # the first 12 rows hold label 0 only
    assert sample != sorted(sample)  # a random order: any prefix comes from across the split
    assert rows(sample_examples(pattern, 12, seed=7, blocks=4)) == sample  # the same for a seed
    assert rows(sample_examples(pattern, 12, seed=8, blocks=4)) != sample
    assert sorted(rows(sample_examples(pattern, 100, seed=7))) == list(range(40))  # small split: all rows
    if kind == "parquet":  # a run per quarter of the split: rows 0-9, 10-19, 20-29, 30-39
        assert sorted(r // 10 for r in sample) == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]


# ---- the run summary --------------------------------------------------------------------------


def test_the_summary_says_why_the_eval_and_baseline_auc_are_undefined(tmp_path):
    """A Trainer whose eval split holds one label wrote null AUCs with their reasons: the summary
    names each reason on the AUC's line (before, the lines were left out), within the summary's width."""
    from components.reporting.report import render
    from pipelines.pipeline import PIPELINE_ROOT
    from pipelines.summary import SUMMARY_WIDTH, summarize, summary_report

    one_label = "undefined: the 300-row eval split holds only label 0"
    metrics = with_reasons({"auc": NAN, "log_loss": 0.1234, "examples": 300, "positive_rate": 0.0},
                           evaluation_reasons({"examples": 300, "positive_rate": 0.0}))
    metrics["baseline"] = with_reasons({"auc": NAN, "log_loss": 0.2}, {"auc": one_label})
    model = tmp_path / PIPELINE_ROOT / "Trainer" / "model" / "7"
    model.mkdir(parents=True)
    (model / "eval_metrics.json").write_text(json.dumps(metrics, allow_nan=False))
    cfg = parse_config(minimal_raw_config())

    summary = summarize(cfg, str(tmp_path), {"Trainer.model": str(model)})
    assert (summary["eval_auc"], summary["eval_auc_undefined"]) == (None, one_label)
    assert summary["eval_log_loss_undefined"] is None  # log loss is defined on one label
    lines = render(summary_report(summary)).splitlines()
    assert f"eval AUC:             {one_label}; log loss 0.1234" in lines
    assert any(line.startswith(f"baseline AUC:         {one_label} (logistic regression") for line in lines), lines
    assert max(len(line) for line in lines) <= SUMMARY_WIDTH
    # the exporter's table files of such a run: no AUC, so no AUC change (a TypeError ended the
    # run with exit 1 instead of the gate's 3 and no summary)
    summary.update(export_layout="A: 5 tables", export_compression={"float32": {"table_bytes": 120_000, "auc_change": None},
                                                                    "int8": {"table_bytes": 40_000, "auc_change": -0.0004}})
    text = " ".join(line.strip() for line in render(summary_report(summary)).splitlines())
    assert "layout A: 5 tables; float32 0.1 MB (AUC change undefined), int8 0.0 MB (AUC -4.0e-04)" in text


def test_a_span_report_says_why_its_auc_is_undefined():
    """`python -m pipelines continuous --show`'s per-span report names the AUC's reason (before: `-`),
    wrapped at the summary's 100 columns."""
    from components.reporting.report import render
    from pipelines.continuous import span_report

    one_label = "undefined: the 300-row eval split holds only label 0"
    s = {"span": 2, "eval_auc": None, "eval_auc_undefined": one_label, "baseline_auc": None,
         "baseline_auc_undefined": one_label, "validation": {"blessed": False, "checks": [], "reasons": []}}
    text = render(span_report(s))
    assert max(len(line) for line in text.splitlines()) <= 100, text
    assert f"model {one_label}, baseline {one_label}" in " ".join(text.split()), text


def test_the_run_report_keeps_an_undefined_metrics_row_with_its_reason(tmp_path):
    """The HTML run report's evaluation table shows each undefined AUC and log loss's reason (before,
    the AUC row was left out, and a None log loss beside a number failed to format)."""
    from pipelines.run_report import write_run_report

    one_label = "undefined: the 300-row eval split holds only label 0"
    no_rows = "undefined: the eval split holds no rows"
    summary = {"serving_model": None, "eval_auc": None, "eval_auc_undefined": one_label, "eval_log_loss": None,
               "eval_log_loss_undefined": no_rows, "baseline_auc": None, "baseline_auc_undefined": one_label}
    page = open(write_run_report(summary, str(tmp_path), str(tmp_path / "r.html"))).read()
    assert f"<td>this run&#x27;s model</td><td>{one_label}</td><td>log loss {no_rows}</td>" in page  # ' escaped
    assert f"<td>baseline (logistic regression)</td><td>{one_label}</td>" in page
    # a defined AUC beside a log loss that is None (a summary without its reason) renders too
    summary = {"serving_model": None, "eval_auc": 0.75, "eval_log_loss": None}
    page = open(write_run_report(summary, str(tmp_path), str(tmp_path / "r2.html"))).read()
    assert "<td>0.7500</td><td>log loss not measured</td>" in page
