"""Issue 19, items 1-2: the baseline fitted beside every model and the exporter's validation gate.

- The gate's rule on figures (gate.decide): a table of cases.
- The exporter with a last blessed model that is deliberately better (a SavedModel that reads the
  label out of the raw example: AUC 1) refuses the new model: NOT_BLESSED, reasons with both
  figures, the serving model kept, and the Pusher pushes nothing; with one deliberately worse
  (1 - label: AUC 0) it blesses, and the Pusher pushes.
- The baseline's logistic regression against an independent fit (scikit-learn on a one-hot design
  matrix built here from the same transformed examples), and its fused pooling against TF's
  per-feature embedding lookups.
"""
import copy
import dataclasses
import json
import os

import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

from components.embedding_exporter import executor as export_executor
from components.embedding_exporter.gate import decide
from components.model_registry import registry
from components.planning.run_plan import derive_plan
from components.embedding_trainer import resolved_input
from components.embedding_trainer.baseline import LinearBaseline, baseline_holdout_fraction, train_baseline
from components.embedding_model.input import make_dataset
from components.rules.metrics import roc_auc
from tfx.types import standard_artifacts
from tfx.utils import io_utils

from tests.stages import artifact as _artifact, look_up, minimal_raw_config, push, examples_uri
from components.tfx_wiring.component_keys import CONFIG_KEY
from components.tfx_wiring import component_keys


def _gate_config(cfg, **validation):
    """A resolved config with the defaults' margins (the chain's config opens the gate), then the
    case's."""
    out = copy.deepcopy(cfg)
    margins = dict(baseline_margin=0.0, regression_margin=0.002)
    margins.update(validation)
    out.validation = dataclasses.replace(cfg.validation, **margins)
    return out


METRICS = {"auc": 0.80, "baseline": {"auc": 0.78, "model": "logistic_regression", "examples": 1000}}
PREVIOUS = {"eval_auc": 0.81, "examples": 500, "serving_dir": "/prev/Format-Serving"}

# (validation overrides, trainer metrics, new serving AUC, last blessed, blessed, failed checks)
GATE_CASES = [
    ({}, METRICS, 0.81, None, True, []),  # first model: only the baseline check
    ({}, METRICS, 0.810, PREVIOUS, True, []),  # equal to the last: within the margin
    ({}, METRICS, 0.807, PREVIOUS, False, ["last_blessed"]),  # 0.003 below: beyond 0.002
    ({"regression_margin": 0.005}, METRICS, 0.807, PREVIOUS, True, []),
    ({}, {"auc": 0.77, "baseline": METRICS["baseline"]}, 0.9, PREVIOUS, False, ["baseline"]),
    ({"baseline_margin": 0.02}, {"auc": 0.77, "baseline": METRICS["baseline"]}, 0.9, PREVIOUS, True, []),
    ({}, {"auc": 0.70, "baseline": METRICS["baseline"]}, 0.5, PREVIOUS, False, ["baseline", "last_blessed"]),
    ({}, {"auc": 0.9}, 0.9, None, False, ["baseline"]),  # no baseline recorded: refused, says why
    ({"baseline_margin": None, "regression_margin": None}, {"auc": 0.1}, 0.1, PREVIOUS, True, []),
]


@pytest.mark.parametrize("overrides, metrics, serving_auc, previous, blessed, failed", GATE_CASES)
def test_gate_rule(overrides, metrics, serving_auc, previous, blessed, failed):
    from components.config.loading import parse_config

    cfg = _gate_config(parse_config(minimal_raw_config()), **overrides)
    d = decide(cfg, metrics, serving_auc, previous)
    assert d["blessed"] is blessed
    assert [c["name"] for c in d["checks"] if not c["passed"]] == failed
    assert len(d["reasons"]) == len(failed)
    for c in d["checks"]:
        if "model_auc" in c and not c["passed"]:  # both figures in the reason
            assert f"{c['model_auc']:.4f}" in c["reason"] and f"{c['reference_auc']:.4f}" in c["reason"]


class _LabelModel(tf.Module):
    """A 'serving model' that reads the label's source column out of the raw example: a model no
    trained one can beat (AUC 1), or, inverted, one every model beats (AUC 0)."""

    def __init__(self, column: str, threshold: float, inverted: bool):
        super().__init__()
        self.column, self.threshold, self.inverted = column, threshold, inverted

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def serve(self, examples):
        parsed = tf.io.parse_example(examples, {self.column: tf.io.FixedLenFeature([1], tf.int64, default_value=[0])})
        p = tf.cast(tf.cast(parsed[self.column], tf.float32) >= self.threshold, tf.float32)
        return {"probabilities": 1.0 - p if self.inverted else p}


def _label_model(cfg, path, inverted):
    rule = cfg.label_rule
    module = _LabelModel(cfg.label_source(), rule.value if rule else 0.5, inverted)
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    return path


def _export_with_previous(chain, tmp_path, previous_serving, name, **validation):
    """A push destination whose registry serves `previous_serving`; then, as a pipeline run does:
    LastBlessedModel's lookup, the exporter's Do with it, and the registering Pusher. The baseline
    check off unless `validation` sets its margin."""

    cfg, a, _ = chain
    cfg = _gate_config(cfg, **dict({"baseline_margin": None}, **validation))
    destination = tmp_path / name / "serving_destination"
    first = registry.push(previous_serving, str(destination), {
        "pipeline": cfg.name, "run": {"id": "earlier"}, "trainer_model": a["model"].uri, "eval_auc": 0.5,
        "exported_model": os.path.dirname(previous_serving)})
    last = look_up(tmp_path / name / "last_blessed", destination)
    serving = _artifact(standard_artifacts.Model, tmp_path / name / "serving_model")
    blessing = _artifact(standard_artifacts.ModelBlessing, tmp_path / name / "blessing")
    export_executor.Executor().Do(
        {component_keys.MODEL_KEY: [a["model"]], component_keys.EXAMPLES_KEY: [a["examples"]],
         component_keys.LAST_MODEL_KEY: [last]},
        {component_keys.SERVING_MODEL_KEY: [serving], component_keys.BLESSING_KEY: [blessing]},
        {CONFIG_KEY: cfg.to_json()},
    )
    pushed = push(serving, blessing, tmp_path / name / "pushed_model", destination, cfg.name)
    report = json.loads(io_utils.read_string_file(os.path.join(serving.uri, "export_report.json")))
    return serving, blessing, pushed, destination, report, first


@pytest.mark.slow(reason="exports the executors' chain's model against a last blessed one")
def test_gate_refuses_a_model_worse_than_the_last_blessed_and_keeps_it_unpushed(chain, tmp_path):
    """With the baseline check on too (the default margin): the chain's 30-step model against its
    own baseline (both measured on the eval split), its decision following the figures whichever
    way they fall; the last blessed model's check refuses the model in any case."""
    cfg, a, _ = chain
    better = _label_model(cfg, str(tmp_path / "better" / "Format-Serving"), inverted=False)
    serving, blessing, pushed, destination, report, first = _export_with_previous(chain, tmp_path, better, "refused",
                                                                                  baseline_margin=0.0)
    v = report["validation"]
    # the baseline check: the Trainer's figures, as its eval_metrics.json has them
    metrics = json.load(open(os.path.join(a["model"].uri, "eval_metrics.json")))
    baseline = v["checks"][0]
    assert baseline["name"] == "baseline" and baseline["margin"] == 0.0
    assert baseline["model_auc"] == metrics["auc"] and baseline["reference_auc"] == metrics["baseline"]["auc"]
    assert baseline["passed"] is (metrics["auc"] >= metrics["baseline"]["auc"])
    check = next(c for c in v["checks"] if c["name"] == "last_blessed")
    assert check["reference_auc"] == 1.0 and check["model_auc"] < 1.0 - 0.002
    assert check["reference_model"] == first["serving_model"] and check["examples"] == report["eval_auc"]["examples"]
    # the report says which served version it compared with, and what its registry entry says of it
    assert v["last_blessed"] == dict(v["last_blessed"], found=True, served_model=first["serving_model"],
                                     version=first["version"], reference_auc=1.0, registered_eval_auc=0.5,
                                     run={"id": "earlier"}, trainer_model=chain[1]["model"].uri)
    assert not check["passed"] and not v["blessed"]
    assert v["reasons"] == [c["reason"] for c in (baseline, check) if not c["passed"]]
    assert blessing.get_int_custom_property("blessed") == 0
    assert os.path.exists(os.path.join(blessing.uri, "NOT_BLESSED"))
    assert "last blessed model's 1.0000" in blessing.get_string_custom_property("not_blessed_reason")
    # Kept: the serving model is complete; not pushed: the Pusher withheld it, the registry still
    # serves the better model.
    assert os.path.exists(os.path.join(serving.uri, "Format-Serving", "saved_model.pb"))
    assert pushed.get_int_custom_property("pushed") == 0
    assert sorted(os.listdir(destination)) == [first["version"], "_registry"]
    assert registry.lookup(str(destination)).served_model == first["serving_model"]


@pytest.mark.slow(reason="exports the executors' chain's model against a last blessed one")
def test_gate_blesses_a_model_better_than_the_last_blessed_and_pushes_it(chain, tmp_path):
    cfg = chain[0]
    worse = _label_model(cfg, str(tmp_path / "worse" / "Format-Serving"), inverted=True)
    serving, blessing, pushed, destination, report, first = _export_with_previous(chain, tmp_path, worse, "blessed")
    v = report["validation"]
    check = next(c for c in v["checks"] if c["name"] == "last_blessed")
    assert check["reference_auc"] == 0.0 and check["passed"] and v["blessed"]
    assert blessing.get_int_custom_property("blessed") == 1
    assert blessing.get_string_custom_property("serving_model") == serving.uri
    assert pushed.get_int_custom_property("pushed") == 1
    # the new model is served now, and its entry records the gate that blessed it
    found = registry.lookup(str(destination))
    assert found.served_model == pushed.get_string_custom_property("pushed_destination") != first["serving_model"]
    assert found.entry["exported_model"] == serving.uri
    assert next(g for g in found.entry["gate"] if g["name"] == "last_blessed")["reference_auc"] == 0.0


def _one_hot(files, manifest, plan, **part):
    """The baseline's design matrix built independently: one column per table row (a bag of a
    feature's IDs: each ID's count in the row), the dense features signed-log1p. `part`: make_dataset's
    part and holdout_fraction (the rows the baseline trains on: the train split less its held-out slice)."""
    offsets, total = {}, 0
    for t in sorted(plan.tables):
        offsets[t], total = total, total + plan.tables[t].rows
    rows, cols, vals, labels, dense, n0 = [], [], [], [], [], 0
    for f, y in make_dataset(files, manifest, 1024, training=False, **part):
        n = len(y)
        for name in manifest.categorical_names:
            ids = f[name]
            r = ids.indices[:, 0].numpy()
            rows.append(r + n0)
            cols.append(ids.values.numpy() + offsets[plan.features[name].table])
            vals.append(np.ones(len(r)))  # csr_matrix sums repeated (row, column) pairs: counts
        d = np.concatenate([f[k].numpy().reshape(-1, 1) for k in manifest.dense_names] or [np.zeros((n, 0))], 1)
        dense.append(np.sign(d) * np.log1p(np.abs(d)))  # (no dense features: zero columns)
        labels.append(y.numpy().ravel())
        n0 += n
    x = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n0, total))
    return sp.hstack([x, sp.csr_matrix(np.concatenate(dense))]).tocsr(), np.concatenate(labels)


@pytest.mark.slow(reason="the baseline's fit (1,000 steps, five L2 candidates) and scikit-learn's")
def test_baseline_auc_matches_an_independent_fit(trainer_data):
    """On the Trainer tests' data (a few features of each kind: a shared table, multi-hot, dense)."""
    from sklearn.linear_model import LogisticRegression

    from components.config.loading import parse_config
    from tests.stages import trainer_raw_config

    raw = trainer_raw_config(trainer_data)
    raw["validation"] = {"baseline_margin": None}  # the demo's baseline
    cfg = parse_config(raw)
    train, evals = [str(trainer_data / "tx" / f"Split-{s}" / "*") for s in ("train", "eval")]
    manifest, stats = resolved_input.read_manifest(examples_uri([train])), resolved_input.read_statistics(examples_uri([train]))
    plan = derive_plan(cfg, manifest, stats)
    rows = stats.splits["train"]["examples_written"]
    ours = train_baseline(cfg, plan, manifest, [train], [evals], model_steps=cfg.training.train_steps, train_rows=rows)
    # fitted on the same rows: the train split less the held-out slice
    x, y = _one_hot([train], manifest, plan, part="train", holdout_fraction=baseline_holdout_fraction(cfg, rows))
    xe, ye = _one_hot([evals], manifest, plan)
    theirs = max(roc_auc(LogisticRegression(C=c, max_iter=5000).fit(x, y).decision_function(xe), ye) for c in (1.0, 0.1))
    assert ours["examples"] == len(ye)
    # Within 0.02 on these 600 eval rows (an AUC's sampling error here is about 0.02; the chosen L2
    # rests on a held-out slice of ~300 rows; measured: 0.672 against scikit-learn's 0.655). bench/baseline_vs_sklearn.py holds 0.005 on the public
    # datasets, with thousands of rows.
    assert ours["auc"] >= theirs - 0.02, (ours["auc"], theirs, ours["candidates"], ours["train_steps"])
    # the regularization kept is the candidate best on the held-out slice
    aucs = [c["holdout_auc"] for c in ours["candidates"]]
    assert [c["l2"] for c in ours["candidates"]] == cfg.validation.baseline.l2 and None not in aucs
    assert ours["l2"] == ours["candidates"][aucs.index(max(aucs))]["l2"] and ours["holdout_rows"] > 0


@pytest.mark.slow(reason="exports the executors' chain's model against a last blessed one")
def test_baseline_fused_pooling_equals_tf_embedding_lookups(chain):
    cfg, a, _ = chain
    train = os.path.join(a["transformed"].uri, "Split-train", "*")
    manifest = resolved_input.read_manifest(examples_uri([train]))
    plan = derive_plan(cfg, manifest, resolved_input.read_statistics(examples_uri([train])))
    model = LinearBaseline(plan, manifest)
    rng = np.random.default_rng(0)
    model.weights.assign(rng.normal(size=model.weights.shape).astype(np.float32))
    model.w_dense.assign(rng.normal(size=model.w_dense.shape).astype(np.float32))
    features, _ = next(iter(make_dataset([train], manifest, 256, training=False)))
    np.testing.assert_allclose(model.logits(features).numpy(), model.reference_logits(features).numpy(), atol=1e-5)
