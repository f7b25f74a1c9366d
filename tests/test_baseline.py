"""The built-in baseline's rules on hand-made batches (no files): a feature is a bag of its IDs,
the streamed L2 penalty sums to scikit-learn's over a pass, the regularization is chosen on the
held-out slice, and its length. Its fit against scikit-learn on real transformed data is
tests/test_validation_gate.py's (the executors' chain) and bench/baseline_vs_sklearn.py's."""
from types import SimpleNamespace

import numpy as np
import pytest

from components.config.loading import parse_config
from components.config.schema import ConfigError


def _plan_and_manifest(rows=(5, 3), combiner="mean", dense=("d",)):
    tables = {"t": SimpleNamespace(rows=rows[0], features=("a",), combiner=combiner),
              "u": SimpleNamespace(rows=rows[1], features=("b",), combiner=combiner)}
    features = {"a": SimpleNamespace(table="t", ids_per_example={"mean": 3.0}),
                "b": SimpleNamespace(table="u", ids_per_example={"mean": 1.0})}
    manifest = SimpleNamespace(categorical_names=["a", "b"], dense_names=list(dense), weighted_names=[])
    return SimpleNamespace(tables=tables, features=features), manifest


def _batch(rows_of_a, rows_of_b, dense):
    import tensorflow as tf

    def sparse(rows):
        idx = [[i, j] for i, r in enumerate(rows) for j in range(len(r))]
        vals = [v for r in rows for v in r]
        return tf.sparse.SparseTensor(tf.constant(idx or np.zeros((0, 2)), tf.int64), tf.constant(vals, tf.int64),
                                      [len(rows), max([len(r) for r in rows] + [1])])

    return {"a": sparse(rows_of_a), "b": sparse(rows_of_b), "d": tf.constant(dense, tf.float32)[:, None]}


def test_a_feature_is_a_bag_of_its_ids_whatever_its_combiner():
    from components.embedding_trainer.baseline import LinearBaseline

    plan, manifest = _plan_and_manifest(combiner="mean")
    model = LinearBaseline(plan, manifest, l2=[0.0, 1.0])
    w = np.arange(16, dtype=np.float32).reshape(8, 2) / 10
    model.weights.assign(w)
    model.bias.assign([0.5, -0.5])
    batch = _batch([[1, 1, 2], [4]], [[0], []], [0.0, 0.0])
    model.dense_mean.assign([0.0])
    logits = model.logits(batch).numpy()
    # row 0: a's IDs 1, 1, 2 summed (a mean would be a third of it) and b's ID 0 (offset 5)
    np.testing.assert_allclose(logits[0], [0.5, -0.5] + w[1] + w[1] + w[2] + w[5], rtol=1e-6)
    np.testing.assert_allclose(logits[1], [0.5, -0.5] + w[4], rtol=1e-6)
    np.testing.assert_allclose(logits, model.reference_logits(batch).numpy(), rtol=1e-6)


def test_negative_ids_and_zero_weights_take_no_part_in_logits_or_penalty():
    """safe_embedding_lookup_sparse's pruning, which the reference logits use: an ID below 0 and
    an ID of weight 0 add nothing, not another table's row (b's ID -1 at its offset 5 would read
    a's row 4) nor a penalty term."""
    import tensorflow as tf

    from components.contracts.manifest import weights_key
    from components.embedding_trainer.baseline import LinearBaseline

    plan, manifest = _plan_and_manifest(combiner="sum")
    manifest.weighted_names = ["b"]
    model = LinearBaseline(plan, manifest, l2=[1.0], rows=2)
    rng = np.random.default_rng(1)
    w = rng.normal(size=(8, 1)).astype(np.float32)
    model.weights.assign(w)
    batch = _batch([[1], [2]], [[-1, 0], [1, 2]], [0.0, 0.0])
    batch[weights_key("b")] = tf.sparse.SparseTensor(batch["b"].indices, tf.constant([2.0, 0.5, 0.0, 3.0]),
                                                     batch["b"].dense_shape)
    model.dense_mean.assign([0.0])
    logits, penalty = model.logits_and_penalty(batch)
    np.testing.assert_allclose(logits.numpy()[:, 0], [w[1, 0] + 0.5 * w[5, 0], w[2, 0] + 3.0 * w[7, 0]], rtol=1e-6)
    np.testing.assert_allclose(logits.numpy(), model.reference_logits(batch).numpy(), rtol=1e-6)
    kept = [1, 5, 2, 7]  # a's 1 and 2, b's 0 and 2 at b's offset
    np.testing.assert_allclose(penalty.numpy(), [(w[kept, 0] ** 2).sum()], rtol=1e-5)


def test_the_penalty_over_a_pass_is_l2_times_the_squared_weights():
    """An ID looked up `count` times adds l2 x w^2 / count each time: over a pass, l2 x |w|^2
    (scikit-learn's objective with C = 1 / (2 l2), times the rows)."""
    from components.embedding_trainer.baseline import LinearBaseline

    plan, manifest = _plan_and_manifest()
    rows_a, rows_b = [[0, 0, 1], [1], [2, 3]], [[0], [0], [1]]
    occurrences = np.bincount([i for r in rows_a for i in r], minlength=5).tolist() + \
        np.bincount([i for r in rows_b for i in r], minlength=3).tolist()
    counts = np.maximum(occurrences, 1).astype(np.float32)
    model = LinearBaseline(plan, manifest, l2=[0.0, 2.0], inverse_counts=1.0 / counts, rows=3)
    rng = np.random.default_rng(0)
    model.weights.assign(rng.normal(size=(8, 2)).astype(np.float32))
    model.w_dense.assign(rng.normal(size=(1, 2)).astype(np.float32))
    _, penalty = model.logits_and_penalty(_batch(rows_a, rows_b, [1.0, 2.0, 3.0]))
    w, wd = model.weights.numpy(), model.w_dense.numpy()
    seen = np.asarray(occurrences) > 0
    expected = 2.0 * ((w[seen] ** 2).sum(0) + (wd ** 2).sum(0))
    np.testing.assert_allclose(penalty.numpy(), [0.0, expected[1]], rtol=1e-5)


def test_row_inverse_counts_read_the_counts_file_and_fill_the_rest(tmp_path):
    from components.embedding_trainer.baseline import row_inverse_counts

    plan, _ = _plan_and_manifest(rows=(5, 3))
    (tmp_path / "t.counts.txt").write_bytes(b"40 x\n10 y\n4 z\n")  # 3 tokens, 2 OOV rows
    entries = {"t": SimpleNamespace(kind="counted", counts_file="t.counts.txt"),
               "u": SimpleNamespace(kind="hashed", counts_file="u.counts.txt")}
    manifest = SimpleNamespace(vocabulary_dir=str(tmp_path), vocabulary=entries.get)
    got = row_inverse_counts(plan, manifest, {"t": 0, "u": 5}, 8, rows_trained=100)
    # t: its counts, then its mean (3 IDs per example x 100 rows / 5 rows = 60); u (no tokens): 1 x 100 / 3
    np.testing.assert_allclose(got, 1.0 / np.array([40, 10, 4, 60, 60, 100 / 3, 100 / 3, 100 / 3]), rtol=1e-6)


def test_the_candidate_kept_is_the_best_on_the_held_out_slice():
    from components.embedding_trainer.baseline import _choose

    cands = [{"l2": 0.0, "holdout_auc": 0.70}, {"l2": 0.5, "holdout_auc": 0.74},
             {"l2": 1.5, "holdout_auc": 0.74}, {"l2": 5.0, "holdout_auc": 0.71}]
    assert _choose(cands, 100)[0] == 1  # the smaller L2 of a tie
    k, why = _choose([{"l2": x, "holdout_auc": None} for x in (0.0, 0.5, 1.5)], 0)
    assert k == 1 and "cannot rank" in why


@pytest.mark.parametrize("baseline, train_rows, want", [
    ({}, 1_000_000, {"epochs": 2.1053, "steps": 1954}),  # max_rows 2M / 950k rows (the slice capped at 50k)
    ({}, 20_000_000, {"epochs": 0.1003, "steps": 1954}),  # part of a pass over the 19.95M rows
    ({"min_steps": 50}, 5_000, {"epochs": 20.0, "steps": 88}),  # at most max_epochs over 4,500 rows
    ({}, 5_000, {"epochs": 227.5556, "steps": 1000}),    # at least min_steps
    ({"epochs": 2}, 5_000, {"epochs": 2.0, "steps": 9}),
    ({"train_steps": 7}, 5_000, {"epochs": None, "steps": 7}),
])
def test_the_baseline_length(baseline, train_rows, want):
    from components.embedding_trainer.baseline import baseline_length

    cfg = parse_config({"name": "t", "input": {"path": "x.csv"}, "label": "y",
                        "categorical_features": [{"name": "a"}], "validation": {"baseline": baseline}})
    got = baseline_length(cfg, train_rows, model_steps=100)
    assert {k: got[k] for k in want} == want
    if got["epochs"] is not None:  # the recorded source's arithmetic gives the steps (epochs rounded to 4 places)
        assert f"{got['rows_per_epoch']:,} rows / batch 1024" in got["source"]
        assert abs(got["steps"] - got["epochs"] * got["rows_per_epoch"] / 1024) <= 1


@pytest.mark.parametrize("l2, message", [
    ([], "validation.baseline.l2: empty"),
    ([0.5, -1.0], "validation.baseline.l2[1]: -1.0 is not an L2 strength"),
])
def test_bad_baseline_l2_is_refused(l2, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_config({"name": "t", "input": {"path": "x.csv"}, "label": "y",
                      "categorical_features": [{"name": "a"}], "validation": {"baseline": {"l2": l2}}})
