"""Evaluation at the input pipeline's speed: the compiled scoring of evaluation.evaluate, the
held-out slice read once as serialized records (input.read_holdout, input.records_dataset) and the
selection scoring only those records at every evaluation (selection.HoldoutSelection)."""
import numpy as np
import pytest

import components  # noqa: F401
import tensorflow as tf

from components.contracts.manifest import VocabularyManifest
from components.embedding_model import input as input_lib
from components.embedding_trainer import evaluation
from components.embedding_trainer import selection as SEL
from components.embedding_trainer import resolved_input
from tests.stages import examples_uri
from components.config.loading import parse_config


def _manifest(fmt="examples", block_rows=0):
    return VocabularyManifest(vocabulary_dir="", label="label", raw_feature_kinds={}, dense_features=(),
                              categorical_features=(), vocabularies={}, transformed_format=fmt, block_rows=block_rows)


def test_evaluate_scores_every_row_with_one_compiled_function():
    """Seven rows in batches of 3, 3 and 1 (a SparseTensor among the features): the exact AUC and
    log loss of every row, written out by hand, and the model traced once for all batch sizes and
    both evaluations."""
    x = np.array([0.1, 0.9, 0.4, 0.8, 0.3, 0.7, 0.2], np.float32)
    labels = np.array([0, 1, 1, 1, 0, 0, 0], np.float32)
    ids = tf.sparse.from_dense(tf.constant([[1, 0], [2, 3], [0, 0], [4, 0], [0, 0], [5, 6], [7, 0]], tf.int64))
    ds = tf.data.Dataset.from_tensor_slices(({"x": x[:, None], "ids": ids}, labels[:, None])).batch(3)
    traces = []

    def model(features):
        traces.append(1)  # Python runs only while tracing
        assert isinstance(features["ids"], tf.SparseTensor)
        return features["x"]  # the probability is x itself

    got = evaluation.evaluate(model, ds)
    # positives 0.9, 0.4, 0.8 against negatives 0.1, 0.3, 0.7, 0.2: 3 + 2 + 3 = 11 pairs ordered of 12
    assert got["auc"] == pytest.approx(11 / 12)
    expected_loss = -np.mean([np.log(p) if y else np.log(1 - p) for p, y in zip(x.astype(float), labels)])
    assert got["log_loss"] == pytest.approx(expected_loss, rel=1e-5)
    assert got["examples"] == 7 and got["positive_rate"] == pytest.approx(3 / 7) and got["seconds"] >= 0
    assert evaluation.evaluate(model, ds)["auc"] == got["auc"]  # scored again: the same compiled function
    assert len(traces) == 1


def test_evaluate_refuses_an_empty_dataset():
    ds = tf.data.Dataset.from_tensor_slices(({"x": np.zeros([0, 1], np.float32)}, np.zeros([0, 1], np.float32))).batch(4)
    with pytest.raises(ValueError, match="no examples"):
        evaluation.evaluate(lambda f: f["x"], ds)


def test_the_evaluation_batch_is_whole_blocks():
    assert evaluation.evaluation_batch(_manifest()) == evaluation.EVAL_ROWS == 8192
    assert evaluation.evaluation_batch(_manifest("blocks", 64)) == 8192
    assert evaluation.evaluation_batch(_manifest("blocks", 100)) == 8100
    assert evaluation.evaluation_batch(_manifest("blocks", 64), rows=10) == 64  # at least one block


def _example(i):
    return tf.train.Example(features=tf.train.Features(feature={
        "label": tf.train.Feature(float_list=tf.train.FloatList(value=[i % 2])),
        "row": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
    })).SerializeToString()


@pytest.fixture
def two_files(tmp_path):
    """600 one-row tf.Examples in two TFRecord files, and all their records."""
    records = [_example(i) for i in range(600)]
    for n, part in enumerate((records[:300], records[300:])):
        with tf.io.TFRecordWriter(str(tmp_path / f"part-{n}")) as w:
            for r in part:
                w.write(r)
    return [str(tmp_path / "part-*")], records


def _buckets(records):
    return tf.math.floormod(input_lib.record_keys(tf.constant(records)), input_lib.HOLDOUT_BUCKETS).numpy()


def test_the_holdout_is_read_once_as_exactly_the_slices_records(two_files):
    pattern, records = two_files
    held = input_lib.read_holdout(pattern, _manifest(), 0.1)
    chosen = input_lib.in_holdout(tf.constant(records), 0.1).numpy()
    want = [r for r, c in zip(records, chosen) if c]
    assert sorted(held.records.numpy().tolist()) == sorted(want)
    assert held.rows == held.slice_rows == len(want) and 40 < len(want) < 80
    rows = [int(r) for _, y in input_lib.records_dataset(held.records, _manifest(), 64) for r in y.numpy().ravel()]
    assert len(rows) == len(want)


def test_a_slice_over_max_rows_keeps_its_lowest_content_buckets(two_files):
    """At most max_rows rows, the slice's records below one bucket bound (a uniform part of it, by
    content), the highest bound that fits: the next bucket would be over. 8 rows kept of ~60, so
    the memory bound (twice max_rows) also cuts while the files are read."""
    pattern, records = two_files
    held = input_lib.read_holdout(pattern, _manifest(), 0.1, max_rows=8)
    slice_records = [r for r, c in zip(records, input_lib.in_holdout(tf.constant(records), 0.1).numpy()) if c]
    buckets = dict(zip(slice_records, _buckets(slice_records)))
    kept = held.records.numpy().tolist()
    assert held.rows == len(kept) <= 8 and held.slice_rows == len(slice_records)
    assert sorted(kept) == sorted(r for r in slice_records if buckets[r] < held.bucket_bound)
    assert sum(b <= held.bucket_bound for b in buckets.values()) > 8


def test_bad_holdout_reads_are_refused(tmp_path, two_files):
    with pytest.raises(ValueError, match="no transformed examples match"):
        input_lib.read_holdout([str(tmp_path / "none-*")], _manifest(), 0.1)
    with pytest.raises(ValueError, match="max_holdout_rows"):
        input_lib.read_holdout(two_files[0], _manifest(), 0.1, max_rows=0)


def test_an_empty_slice_reads_as_no_records_and_no_batches(two_files):
    held = input_lib.read_holdout(two_files[0], _manifest(), 0.0)
    assert held.rows == held.slice_rows == 0 and held.records.shape == (0,)
    assert next(iter(input_lib.records_dataset(held.records, _manifest(), 64)), None) is None


def test_the_held_out_blocks_read_once_hold_the_slices_rows(trainer_data):
    """On real transformed blocks (whole and tail files): the records read once are those the rule
    puts in the slice, their rows counted, and they batch as whole blocks with every row's label."""
    pattern = [str(trainer_data / "tx" / "Split-train" / "*")]
    manifest = resolved_input.read_manifest(examples_uri(pattern))
    held = input_lib.read_holdout(pattern, manifest, 0.2)
    records = [r.numpy() for r in tf.data.TFRecordDataset(sorted(tf.io.gfile.glob(pattern[0])))]
    chosen = [r for r, c in zip(records, input_lib.in_holdout(tf.constant(records), 0.2).numpy()) if c]
    assert sorted(held.records.numpy().tolist()) == sorted(chosen)
    labels = tf.io.parse_example(tf.constant(chosen), {manifest.label: tf.io.RaggedFeature(tf.float32)})[manifest.label]
    batches = [y.numpy().ravel() for _, y in input_lib.records_dataset(held.records, manifest, 128)]
    assert held.rows == held.slice_rows == sum(len(b) for b in batches) == int(labels.row_lengths().numpy().sum()) > 0
    assert sorted(np.concatenate(batches).tolist()) == sorted(labels.flat_values.numpy().tolist())
    assert max(len(b) for b in batches) <= 128


class _Twin:
    """Stands in for the CPU twin: scores a row by its first dense feature."""

    def __init__(self, name):
        self.name = name

    def __call__(self, features):
        return tf.sigmoid(features[self.name])


def test_the_selection_reads_the_slice_once_for_every_evaluation(trainer_data, tmp_path, monkeypatch):
    pattern = [str(trainer_data / "tx" / "Split-train" / "*")]
    manifest = resolved_input.read_manifest(examples_uri(pattern))
    reads = []
    real = SEL.read_holdout
    monkeypatch.setattr(SEL, "read_holdout", lambda *a, **k: (reads.append(a[0]), real(*a, **k))[1])
    monkeypatch.setattr(SEL, "build_serving_model", lambda *a, **k: _Twin(manifest.dense_names[0]))
    monkeypatch.setattr(SEL, "restore_dense", lambda *a: 0)
    monkeypatch.setattr(SEL, "open_checkpoint_tables", lambda *a: None)
    monkeypatch.setattr(SEL, "load_tables", lambda *a: None)
    cfg = parse_config({"name": "t", "input": {"path": "x.csv"}, "label": "label",
                        "categorical_features": [{"name": "C1"}], "training": {"early_stopping": {"evaluations": 10}}})
    sel = SEL.HoldoutSelection(cfg, None, manifest, pattern, str(tmp_path / "state"), 0.2, 100)
    assert reads == []  # nothing is read before prepare
    sel.prepare()
    for step in (10, 20, 30):
        ckpt = tf.train.Checkpoint(v=tf.Variable(float(step))).write(str(tmp_path / "ckpts" / f"ckpt-{step}"))
        sel.evaluate(ckpt, step)
    assert reads == [pattern]
    r = sel.record
    assert r["holdout_rows"] == r["holdout_slice_rows"] > 0 and r["holdout_read_seconds"] >= 0
    assert [e["examples"] for e in r["evaluations"]] == [r["holdout_rows"]] * 3
    assert all(e["seconds"] >= e["load_seconds"] >= 0 for e in r["evaluations"]) and sel.evaluation_seconds > 0
