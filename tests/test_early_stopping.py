"""Early stopping on a held-out slice of the train split (components/embedding_trainer/selection.py):
the slice is a deterministic, disjoint part of the train split's records; the best checkpoint is
kept and training stops after `patience` evaluations without improvement; a killed run resumes
with the same record; and the eval split is never read while training."""
import json
import os
import shutil

import numpy as np
import pytest

import components  # noqa: F401
import tensorflow as tf

from components.config.loading import parse_config
from components.config.schema import ConfigError
from components.embedding_model import input as input_lib
from components.embedding_trainer import selection as SEL
from components.embedding_trainer import (hardware, model_artifact, resolved_input, trainer_module, training_data,
                                          training_loop)
from components.contracts.artifacts import CHECKPOINT_DIR, EVAL_METRICS_FILE, TRAINING_RUN_FILE
from components.reporting import progress
from components.reporting.report import KEPT_BEST
from tests.stages import fn_args as _fn_args, trainer_config as _config, examples_uri
from components.planning.fitting import with_run


@pytest.fixture(scope="session")
def data(trainer_data):
    """The session's preprocessed small data (tests/conftest.py); read-only."""
    return trainer_data


def _records(pattern):
    return [r.numpy() for r in tf.data.TFRecordDataset(tf.io.gfile.glob(pattern))]


def _example(i):
    return tf.train.Example(features=tf.train.Features(feature={
        "label": tf.train.Feature(float_list=tf.train.FloatList(value=[i % 2])),
        "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=list(range(i % 7)))),
        "name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"row %d" % i])),
    }))


def _all_of(ds):
    """A dataset of serialized records, in its order, read whole: a batch at a time, not a Python
    round trip through tf.data's iterator per record (5,500 of them below)."""
    return [r for batch in ds.batch(10_000).as_numpy_iterator() for r in batch]


def test_the_holdout_slice_is_a_fixed_disjoint_part_of_the_records():
    records = [_example(i).SerializeToString(deterministic=True) for i in range(5_000)]
    ds = tf.data.Dataset.from_tensor_slices(records)
    held = _all_of(input_lib._records_of("holdout", 0.1)(ds))
    kept = _all_of(input_lib._records_of("train", 0.1)(ds))
    assert set(held).isdisjoint(kept) and sorted(held + kept) == sorted(records)
    held_set = set(held)
    assert held == [r for r in records if r in held_set]  # in the file's order
    assert abs(len(held) / len(records) - 0.1) < 0.01
    # by content alone: the same records in another order, and keyed alone or in any batch
    again = set(_all_of(input_lib._records_of("holdout", 0.1)(ds.shuffle(5_000, seed=3))))
    assert again == held_set
    one = input_lib.in_holdout(tf.constant(records[:50]), 0.1).numpy().tolist()
    assert one == [bool(input_lib.in_holdout(tf.constant([r]), 0.1).numpy()[0]) for r in records[:50]]
    assert input_lib._records_of("train", 0.0)(ds) is ds
    with pytest.raises(ValueError, match="part 'eval'"):
        input_lib._records_of("eval", 0.1)


def test_a_records_key_is_its_content_not_its_map_order():
    """tf.Example bytes are not canonical: two processes wrote the same blocks with the feature
    map in other orders. A Features message is its map entries back to back, so the same entries
    in another order are the same Example with other bytes: they must get the same key."""
    example = _example(12)
    entries = [tf.train.Features(feature={k: v}).SerializeToString() for k, v in example.features.feature.items()]
    assert len(entries) == 3

    def wrapped(features_bytes):  # Example field 1 (features), length-delimited
        return b"\x0a" + bytes([len(features_bytes)]) + features_bytes

    forward, backward = wrapped(b"".join(entries)), wrapped(b"".join(reversed(entries)))
    assert forward != backward and tf.train.Example.FromString(forward) == tf.train.Example.FromString(backward)
    keys = input_lib.record_keys(tf.constant([forward, backward, example.SerializeToString()])).numpy()
    assert keys[0] == keys[1] == keys[2]
    other = input_lib.record_keys(tf.constant([_example(13).SerializeToString(), tf.train.Example().SerializeToString()])).numpy()
    assert other[0] != keys[0] and other[1] == 0
    # a batch of empty Examples only (no `features` anywhere in it)
    assert input_lib.record_keys(tf.constant([tf.train.Example().SerializeToString()] * 2)).numpy().tolist() == [0, 0]


def test_training_and_holdout_batches_split_the_transformed_rows(data):
    """On real transformed blocks: the part trained on and the slice hold every row once."""
    pattern = [str(data / "tx" / "Split-train" / "*")]
    manifest = resolved_input.read_manifest(examples_uri(pattern))

    def labels(part):
        ds = input_lib.make_dataset(pattern, manifest, 64, training=False, part=part, holdout_fraction=0.2)
        return np.concatenate([y.numpy().ravel() for _, y in ds]) if part else None

    whole, train, held = labels("all"), labels("train"), labels("holdout")
    assert len(whole) == 3000 and len(train) + len(held) == 3000
    assert sorted(np.concatenate([train, held])) == sorted(whole)
    # exactly the rows of the records the rule puts in the slice
    records = [r for f in tf.io.gfile.glob(pattern[0]) for r in _records(f)]
    rows = [len(input_lib.parse_block(tf.constant(r), manifest)[manifest.label]) for r in records]
    chosen = input_lib.in_holdout(tf.constant(records), 0.2).numpy()
    assert len(held) == sum(n for n, c in zip(rows, chosen) if c) > 0


def test_holdout_fraction_and_training_length():
    cfg = parse_config({**_minimal(), "training": {"batch_size": 100}})
    t = cfg.training
    assert t.holdout_fraction(10_000) == 0.1 and t.holdout_fraction(None) == 0.1
    assert t.holdout_fraction(5_000_000) == pytest.approx(0.01)  # max_holdout_rows 50,000
    assert t.steps_for_epochs(10_000) == 1350  # the default 15 epochs over the 9,000 rows trained on
    assert t.evaluation_every(1350) == 135
    off = parse_config({**_minimal(), "training": {"batch_size": 100, "early_stopping": {"enabled": False}}})
    assert off.training.holdout_fraction(10_000) == 0.0 and off.training.steps_for_epochs(10_000) == 1500
    set_ = parse_config({**_minimal(), "training": {"batch_size": 100, "epochs": 5}})
    assert set_.training.epochs_for(10_000_000) == 5 and set_.training.steps_for_epochs(10_000) == 450
    # an epoch is a pass over the rows trained on: the train split less the held-out slice
    assert t.trained_rows(10_000) == 9_000 and off.training.trained_rows(10_000) == 10_000
    assert t.trained_rows(5_000_000) == 4_950_000  # max_holdout_rows 50,000
    assert t.epochs_trained(1350, 10_000) == 15.0 and off.training.epochs_trained(1500, 10_000) == 15.0
    assert set_.training.epochs_trained(450, 10_000) == 5.0


@pytest.mark.parametrize("training", [
    {}, {"epochs": 2.5}, {"epochs": 1.2345678}, {"early_stopping": {"enabled": False}},
    {"steps_per_execution": 4}, {"early_stopping": {"max_holdout_rows": 1_000}}, {"batch_size": 100},
])
def test_the_recorded_source_of_the_length_gives_the_planned_steps(training):
    """run_plan.training_steps' `source` is written from the numbers the steps were computed from
    (the epochs used, the rows trained on: the train split less the held-out slice, the batch), so
    that its arithmetic gives the planned steps; before, it named the whole train split (1,107 for 997)."""
    import math
    import re
    from types import SimpleNamespace

    from components.planning.run_plan import training_steps

    cfg = parse_config({**_minimal(), "training": training})
    t = cfg.training
    length = training_steps(cfg, SimpleNamespace(splits={"train": {"examples_written": 18_893}}))
    m = re.fullmatch(r"(?:training\.epochs|default epochs) ([0-9.]+)(?: \(training\.epochs unset\))? x (\d+) rows "
                     r"trained on \(18893 train rows(?: less the held-out slice of (\d+)|, none held out)\) / batch (\d+)"
                     r"(?:, rounded up to whole steps_per_execution \((\d+)\))?", length["source"])
    assert m, length["source"]
    epochs, rows, batch = float(m[1]), int(m[2]), int(m[4])
    whole = int(m[5] or 1)
    assert math.ceil(math.ceil(epochs * rows / batch) / whole) * whole == length["steps"]
    assert (epochs, rows, batch, whole) == (t.epochs_for(18_893), t.trained_rows(18_893), t.batch_size,
                                            t.steps_per_execution)
    assert rows + int(m[3] or 0) == 18_893
    assert length["trained_rows"] == rows and length["train_rows"] == 18_893 and length["epochs"] == epochs


def test_the_default_length_source_names_the_rows_trained_on():
    """The case a user saw: 18,893 train rows at the default 15 epochs and batch 256 plan 997 steps
    over the 17,004 rows trained on; the record said `15 x 18893 / 256` (1,107)."""
    from types import SimpleNamespace

    from components.planning.run_plan import training_steps

    length = training_steps(parse_config(_minimal()), SimpleNamespace(splits={"train": {"examples_written": 18_893}}))
    assert length["steps"] == 997
    assert length["source"] == ("default epochs 15 (training.epochs unset) x 17004 rows trained on (18893 train "
                                "rows less the held-out slice of 1889) / batch 256")


def test_the_default_length_shrinks_with_the_train_split():
    """training.epochs unset: 15 passes up to 100k rows, then 15 x sqrt(100k / rows), at least one."""
    from components.config.training_schema import default_epochs

    t = parse_config(_minimal()).training
    assert t.epochs is None
    expected = {1: 15.0, 25_000: 15.0, 100_000: 15.0, 400_000: 7.5, 1_000_000: 4.74, 20_000_000: 1.06,
                500_000_000: 1.0}
    assert {rows: t.epochs_for(rows) for rows in expected} == expected
    assert [default_epochs(r) for r in (10**5, 10**6, 10**7, 10**8)] == sorted(
        (default_epochs(r) for r in (10**5, 10**6, 10**7, 10**8)), reverse=True)


@pytest.mark.parametrize("field,value,message", [
    ("holdout_fraction", 0.0, "holdout_fraction"), ("holdout_fraction", 1.0, "holdout_fraction"),
    ("patience", 0, "patience"), ("evaluations", -1, "evaluations"), ("min_improvement", -0.1, "min_improvement"),
    ("enabled", "yes", "enabled"),
])
def test_bad_early_stopping_settings_are_refused(field, value, message):
    with pytest.raises(ConfigError, match=f"training.early_stopping.{message}"):
        parse_config({**_minimal(), "training": {"early_stopping": {field: value}}})


def _minimal():
    return {"name": "t", "input": {"path": "x.csv"}, "label": "label",
            "categorical_features": [{"name": "C1"}]}


class _Scores:
    """Stands in for the twin's scoring: the given AUCs in order."""

    def __init__(self, aucs):
        self.aucs = list(aucs)

    def __call__(self, path):
        return {"auc": self.aucs.pop(0), "log_loss": 0.5, "examples": 100}


def _selection(tmp_path, monkeypatch, aucs, total=100, **options):
    cfg = parse_config({**_minimal(), "training": {"early_stopping": {"evaluations": 10, **options}}})
    sel = SEL.HoldoutSelection(cfg, None, None, ["train/*"], str(tmp_path / "state"), 0.1, total)
    monkeypatch.setattr(sel, "_score", _Scores(aucs))
    return sel


def _checkpoint(tmp_path, step):
    v = tf.Variable(float(step))
    return tf.train.Checkpoint(v=v).write(str(tmp_path / "ckpts" / f"ckpt-{step}"))


def test_the_best_checkpoint_is_kept_and_training_stops_after_patience(tmp_path, monkeypatch):
    sel = _selection(tmp_path, monkeypatch, [0.70, 0.74, 0.73, 0.745, 0.74, 0.72], patience=2, min_improvement=0.01)
    stops = []
    for step in (10, 20, 30, 40, 50, 60):
        assert sel.due(step)
        stops.append(sel.evaluate(_checkpoint(tmp_path, step), step))
        if stops[-1]:
            break
    # 0.745 at step 40 is no gain of more than 0.01 over 0.74: steps 30 and 40 count against it
    assert stops == [False, False, False, True]
    r = sel.record
    assert r["best_step"] == 20 and r["best_auc"] == 0.74 and r["stopped_at"] == 40
    assert [e["step"] for e in r["evaluations"]] == [10, 20, 30, 40]
    best = sel.best_checkpoint()
    assert best.endswith("ckpt-20") and tf.train.load_checkpoint(best).get_tensor("v/.ATTRIBUTES/VARIABLE_VALUE") == 20.0
    assert len(tf.io.gfile.glob(os.path.join(sel.dir, "ckpt-*.index"))) == 1  # earlier bests removed
    # A resumed run reads the record: it has stopped, and it keeps the same best.
    again = _selection(tmp_path, monkeypatch, [])
    assert again.stopped and again.best_checkpoint() == best and again.record == r


def test_evaluations_fall_every_so_many_steps_and_at_the_end(tmp_path, monkeypatch):
    sel = _selection(tmp_path, monkeypatch, [0.6, 0.7, 0.8], total=100)  # every 10 steps
    assert sel.every == 10 and sel.due(10) and not sel.due(5)
    sel.evaluate(_checkpoint(tmp_path, 10), 10)
    assert not sel.due(15) and sel.due(20) and sel.due(100)
    # the last step never stops training (there is nothing left to save) and is always evaluated
    sel.evaluate(_checkpoint(tmp_path, 20), 20)
    assert not sel.evaluate(_checkpoint(tmp_path, 100), 100) and sel.record["best_step"] == 100


def test_a_slice_of_one_label_cannot_choose(tmp_path, monkeypatch):
    sel = _selection(tmp_path, monkeypatch, [])
    monkeypatch.setattr(sel, "_score", lambda path: sel._cannot_rank("the held-out slice's 3 examples all have one label"))
    assert not sel.evaluate(_checkpoint(tmp_path, 10), 10)
    assert "one label" in sel.record["note"] and not sel.due(20) and sel.best_checkpoint() is None


def test_an_empty_held_out_slice_cannot_choose(tmp_path):
    """A slice that holds no row (a small split, a small fraction): no twin is built and nothing is
    scored; the record says why, and the last step's model is kept."""
    cfg = parse_config({**_minimal(), "training": {"early_stopping": {"evaluations": 10}}})
    sel = SEL.HoldoutSelection(cfg, None, None, ["train/*"], str(tmp_path / "state"), 0.1, 100)
    sel.dataset = tf.data.Dataset.range(0)  # the slice as read: empty
    assert not sel.evaluate(_checkpoint(tmp_path, 10), 10)
    assert sel.record["note"].startswith("the held-out slice of the train split is empty: no AUC to choose by, so the last")
    assert sel.best_checkpoint() is None
    assert not sel.due(20) and sel.record["evaluations"] == []


def test_the_final_evaluation_is_reported_as_the_kept_models(tmp_path, monkeypatch):
    """The Trainer's own evaluation scores the kept checkpoint (step 400, the best on the held-out
    slice), not the last step's weights (700): its progress event and eval_metrics.json say step
    400; before, the progress line read `eval at step 700: auc ...`."""
    from components.reporting import progress
    from components.reporting.report import KEPT_BEST, KEPT_LAST

    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv(progress.ENV, str(path))
    run = {"final_step": 700, "model_step": 400, "model_choice": KEPT_BEST}
    metrics = model_artifact.report_final_evaluation(run, {"auc": 0.9155, "log_loss": 0.3, "examples": 500, "positive_rate": 0.2})
    [event] = [json.loads(line) for line in path.read_text().splitlines()]
    assert (event["event"], event["step"], event["kept"]) == (progress.EVAL, 400, KEPT_BEST)
    assert event["metrics"] == {"auc": 0.9155, "log_loss": 0.3, "examples": 500, "positive_rate": 0.2}
    assert (metrics["model_step"], metrics["model_choice"], metrics["auc"]) == (400, KEPT_BEST, 0.9155)
    # no held-out slice (or one that cannot rank): the model is the last step's, and says so
    path.unlink()
    model_artifact.report_final_evaluation({"final_step": 700, "model_step": 700, "model_choice": KEPT_LAST}, {"auc": 0.8})
    [event] = [json.loads(line) for line in path.read_text().splitlines()]
    assert (event["step"], event["kept"]) == (700, KEPT_LAST)


@pytest.mark.slow(reason="a 60-step Trainer run with the held-out selection")
def test_training_never_reads_the_eval_split_and_keeps_the_best_checkpoint(data, monkeypatch, tmp_path):
    """The whole run_fn with early stopping: every dataset the training, the selection and the
    baseline open is recorded; none may name the eval split before training has ended. Its fit
    traces the training step once."""
    opened = []
    real = input_lib.make_dataset
    training_done = []

    def recording(patterns, *a, **k):
        if not training_done:
            opened.append(list(patterns))
        return real(patterns, *a, **k)

    real_holdout = SEL.read_holdout

    def recording_holdout(patterns, *a, **k):
        if not training_done:
            opened.append(list(patterns))
        return real_holdout(patterns, *a, **k)

    for module in (training_data, training_loop, model_artifact):  # each Trainer module that reads a split
        monkeypatch.setattr(module, "make_dataset", recording)
    monkeypatch.setattr(SEL, "read_holdout", recording_holdout)
    real_finish = model_artifact.finish
    monkeypatch.setattr(model_artifact, "finish", lambda *a, **k: (training_done.append(True), real_finish(*a, **k))[1])
    # and the training step traced once (model_building.create_variables, before fit)
    from components.embedding_model.model import RankingModel

    traces, real_fit = [], RankingModel.fit

    def fit(self, *a, **k):
        out = real_fit(self, *a, **k)
        traces.append(self.train_function.experimental_get_tracing_count())
        return out

    monkeypatch.setattr(RankingModel, "fit", fit)
    cfg = _config(data, train_steps=60, checkpoint_every_steps=10,
                  early_stopping={"evaluations": 6, "patience": 2, "holdout_fraction": 0.2})
    fn_args = _fn_args(data, cfg, "selection")
    events = tmp_path / "progress.jsonl"
    monkeypatch.setenv(progress.ENV, str(events))
    trainer_module.run_fn(fn_args)
    assert opened and all("Split-eval" not in p for ps in opened for p in ps), opened
    assert traces == [1], traces
    model_uri = os.path.dirname(fn_args.serving_model_dir)
    run = json.load(open(os.path.join(model_uri, TRAINING_RUN_FILE)))
    sel = run["selection"]
    assert sel["evaluations"] and sel["best_step"] == run["model_step"] and run["model_choice"] == KEPT_BEST
    # the eval split's metrics, in eval_metrics.json and on the progress line, are the kept model's
    metrics = json.load(open(os.path.join(model_uri, EVAL_METRICS_FILE)))
    assert (metrics["model_step"], metrics["model_choice"]) == (run["model_step"], KEPT_BEST)
    final = [e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == progress.EVAL and "kept" in e]
    assert [(e["step"], e["kept"], e["metrics"]["auc"]) for e in final] == [(run["model_step"], KEPT_BEST, metrics["auc"])]  # unrounded, as the summary reads it
    assert max(e["auc"] for e in sel["evaluations"]) == sel["best_auc"]
    assert sel["evaluations"][0]["examples"] == sel["holdout_rows"] > 0
    # where the Trainer's time went: training steps, the slice's one read, its evaluations, the final evaluation
    assert set(run["seconds"]) == {"training", "holdout_read", "holdout_evaluations", "final_evaluation"}
    assert all(v > 0 for v in run["seconds"].values()), run["seconds"]
    # the artifact's checkpoint is the best one: its step counter says so
    reader = tf.train.load_checkpoint(os.path.join(model_uri, CHECKPOINT_DIR))
    assert reader.get_tensor("model/dense_optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE") == run["model_step"]
    assert run["final_step"] == (sel["stopped_at"] or 60)


def test_a_stream_the_slice_empties_is_left_out_of_the_endless_training_input(data):
    """The tail files hold one short block per preprocessing batch; on small data the held-out
    slice can take all of them. The training input must then draw from the whole blocks only,
    not end when it first draws the empty tail stream (as it did on a 58k-row public dataset)."""
    from components.contracts.manifest import TAIL_PREFIX

    pattern = [str(data / "tx" / "Split-train" / "*")]
    manifest = resolved_input.read_manifest(examples_uri(pattern))
    tail_files = [f for f in tf.io.gfile.glob(pattern[0]) if os.path.basename(f).startswith(TAIL_PREFIX)]
    tail_records = tf.constant([r for f in tail_files for r in _records(f)])
    assert tail_records.shape[0] > 0

    def without_tail(ds):
        return ds.filter(lambda r: tf.reduce_all(tf.not_equal(r, tail_records)))

    ds = input_lib._blocks_dataset(pattern, manifest, 64, True, 1, 0, None, None, 64, 4096, without_tail)
    labels = [y.numpy() for _, y in ds.take(200)]  # far more batches than one pass holds
    assert len(labels) == 200 and all(y.shape == (64, 1) for y in labels)


@pytest.mark.slow(reason="a 60-step training on two replicas and a 30-step resume")
def test_a_killed_two_replica_run_resumes_with_the_same_selection(data, tmp_path, monkeypatch):
    """Two replicas (MirroredStrategy on logical CPUs), early stopping on: a run killed right after
    its evaluation at step 30 and started again carries on with the same record, evaluates each
    checkpoint once, and ends with the evaluations, the best step and the weights of an
    uninterrupted run. The killed run's state is the uninterrupted run's, copied at that moment
    (what a killed process leaves: nothing of it runs after the kill)."""
    from tests import tpu_harness

    monkeypatch.setattr(hardware, "distribution_strategy", lambda c: tpu_harness.mirrored_strategy(2))
    cfg = _config(data, train_steps=60, checkpoint_every_steps=10,
                  early_stopping={"evaluations": 6, "patience": 100, "holdout_fraction": 0.2})
    pattern = [str(data / "tx" / "Split-train" / "*")]
    manifest = resolved_input.read_manifest(examples_uri(pattern))
    from components.planning.run_plan import derive_plan

    plan = with_run(derive_plan(cfg, manifest, resolved_input.read_statistics(examples_uri(pattern))), vocabulary_dir=manifest.vocabulary_dir)
    evals = ["/nonexistent/eval/*"]  # never read while training
    real, state = SEL.HoldoutSelection.evaluate, tmp_path / "killed"

    def killed_at_30(self, path, step):
        stop = real(self, path, step)
        if step == 30:
            shutil.copytree(tmp_path / "whole", state)
        return stop

    monkeypatch.setattr(SEL.HoldoutSelection, "evaluate", killed_at_30)
    whole_ckpt, _, whole = training_loop.train(cfg, plan, manifest, pattern, evals, str(tmp_path / "whole"))
    monkeypatch.setattr(SEL.HoldoutSelection, "evaluate", real)
    once = tf.train.load_checkpoint(whole_ckpt)
    once = {k: once.get_tensor(k) for k in once.get_variable_to_shape_map()}
    os.rename(tmp_path / "whole", tmp_path / "whole-gone")  # the resumed run can reach nothing of it
    ckpt, _, run = training_loop.train(cfg, plan, manifest, pattern, evals, str(state))
    assert run["replicas"] == 2 and run["resumed_from_step"] == 30 and run["final_step"] == 60
    got, want = run["selection"]["evaluations"], whole["selection"]["evaluations"]
    assert [e["step"] for e in got] == [e["step"] for e in want] == [10, 20, 30, 40, 50, 60]
    np.testing.assert_allclose([e["auc"] for e in got], [e["auc"] for e in want], atol=1e-4)
    assert run["model_step"] == whole["model_step"] and ckpt.endswith(f"ckpt-{run['model_step']}")
    # every variable of the kept checkpoint (tables, slots, dense network; one written after the
    # restart) as the uninterrupted run's
    assert run["model_step"] > 30 and os.path.basename(whole_ckpt) == os.path.basename(ckpt)
    again = tf.train.load_checkpoint(ckpt)
    keys = [k for k in once if k.endswith("VARIABLE_VALUE") and "save_counter" not in k]
    assert len(keys) > 20, keys
    for key in keys:
        np.testing.assert_allclose(again.get_tensor(key), once[key], rtol=1e-4, atol=1e-5, err_msg=key)
