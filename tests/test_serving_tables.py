"""The exporter's serving tables (model.ServingTable) in every storage dtype: the pooled lookup of
a batch equals safe_embedding_lookup_sparse (what TPUEmbeddingForServing and the trainer's CPU
model compute) over the (dequantized) table, bit for bit for float32 tables, including batches in
which no row has an ID for the feature (a single request without it), which failed for float16
and int8 when the lookup was safe_embedding_lookup_sparse itself."""
from __future__ import annotations

from types import SimpleNamespace

import components  # noqa: F401
import numpy as np
import pytest
import tensorflow as tf

from components.embedding_model.serving_model import ServingTable
from components.planning.derivation import hand_built_plan

ROWS, DIM = 50, 4


def _table(storage: str, combiner: str):
    layer = ServingTable(SimpleNamespace(rows=ROWS, dim=DIM, combiner=combiner), "t", storage)
    layer.build()
    rng = np.random.default_rng(3)
    values = rng.normal(size=(ROWS, DIM)).astype(np.float32)
    if storage == "int8":
        scale = np.abs(values).max(axis=1) / 127.0
        layer.embeddings.assign(np.round(values / scale[:, None]).astype(np.int8))
        layer.scale.assign(scale.astype(np.float32))
        dequantized = layer.embeddings.numpy().astype(np.float32) * scale[:, None]
    else:
        layer.embeddings.assign(values.astype(storage))
        dequantized = layer.embeddings.numpy().astype(np.float32)
    return layer, dequantized


def _ids(rows):
    """SparseTensor [len(rows), width] of the given IDs per row."""
    indices = [[r, i] for r, ids in enumerate(rows) for i in range(len(ids))]
    values = [v for ids in rows for v in ids]
    width = max([len(ids) for ids in rows] + [1])
    return tf.SparseTensor(tf.constant(indices, tf.int64, shape=[len(indices), 2]),
                           tf.constant(values, tf.int64, shape=[len(values)]), [len(rows), width])


@pytest.mark.parametrize("storage", ["float32", "float16", "int8"])
@pytest.mark.parametrize("combiner", ["mean", "sum", "sqrtn"])
@pytest.mark.parametrize("rows", [[[]], [[], []], [[3, 7], [], [7]], [[0], [49, 49, 1]]],
                         ids=["one-row-no-ids", "no-ids", "some-empty", "all-full"])
def test_pooled_lookup_matches_the_dequantized_table(storage, combiner, rows):
    layer, dequantized = _table(storage, combiner)
    ids = _ids(rows)
    got = layer(ids).numpy()
    want = tf.nn.safe_embedding_lookup_sparse(tf.constant(dequantized), ids, combiner=combiner).numpy()
    assert got.shape == (len(rows), DIM)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    if storage == "float32":  # the same sums in the same order: the same bits
        np.testing.assert_array_equal(got, want)
    for r, row_ids in enumerate(rows):
        if not row_ids:
            assert not got[r].any()  # no IDs: zeros, as on the trained model


@pytest.mark.parametrize("combiner", ["mean", "sum", "sqrtn"])
@pytest.mark.parametrize("rows", [[[]], [[3, 7], [], [7]], [[0], [49, 49, 1], []]], ids=["no-ids", "some-empty", "last-empty"])
def test_tensor_core_table_without_safe_lookup_pools_valid_ids_alike(combiner, rows):
    """use_safe_embedding_lookup: false skips safe_embedding_lookup_sparse's checks; on valid IDs
    (all preprocessing emits) the result is the same, bit for bit, empty and trailing rows
    included (plain embedding_lookup_sparse drops trailing rows without IDs)."""
    from components.contracts.plan import Initializer
    from components.embedding_model.model import TensorCoreTable

    layer = TensorCoreTable(SimpleNamespace(rows=ROWS, dim=DIM, combiner=combiner,
                                            initializer=Initializer("random_normal", 0.0, 1.0)), "t")
    layer.build()
    ids = _ids(rows)
    np.testing.assert_array_equal(layer(ids, safe=False).numpy(), layer(ids, safe=True).numpy())


@pytest.mark.parametrize("combiner", ["mean", "sum", "sqrtn"])
def test_weighted_pooling_matches_tensorflow_on_every_path(combiner):
    """Issue 18, item 3: weighted IDs pooled by the serving tables (pool_sparse, every dtype's
    path) and by TensorCore tables (sparse, unchecked sparse, padded dense) as TensorFlow's
    safe_embedding_lookup_sparse weighs them (the CPU lookup of TPUEmbeddingForServing); a row
    whose weights sum to 0 and a row without IDs pool to zeros."""
    import numpy as np
    import tensorflow as tf

    from components.embedding_model.input import to_dense_ids
    from components.embedding_model.lookups import pool_sparse
    from components.embedding_model.model import TensorCoreTable
    from components.embedding_model.serving_model import ServingTable

    rng = np.random.default_rng(0)
    table = tf.constant(rng.normal(size=(7, 3)).astype(np.float32))
    indices = [[0, 0], [0, 1], [0, 2], [1, 0], [3, 0], [3, 1]]  # row 2 has no IDs
    ids = tf.SparseTensor(indices, tf.constant([1, 4, 1, 6, 2, 5], tf.int64), [4, 3])
    weights = tf.SparseTensor(indices, tf.constant([0.5, 2.0, 1.5, 3.0, 0.0, 0.0]), [4, 3])  # row 3 sums to 0
    expected = tf.nn.safe_embedding_lookup_sparse(table, ids, weights, combiner=combiner).numpy()
    assert np.allclose(expected[2:], 0.0)
    np.testing.assert_allclose(pool_sparse(table, ids, combiner, weights=weights).numpy(), expected, atol=1e-6)
    plan = hand_built_plan({"t": (7, 3, "tensor_core")}, combiner=combiner)
    core = TensorCoreTable(plan.tables["t"], "t")
    core.build()
    core.embeddings.assign(table)
    for got in (core(ids, weights=weights), core(ids, safe=False, weights=weights),
                core(to_dense_ids(ids, 3), weights=to_dense_ids(weights, 3))):
        np.testing.assert_allclose(got.numpy(), expected, atol=1e-6)
    for storage in ("float32", "float16"):
        serving = ServingTable(plan.tables["t"], "t", storage)
        serving.build()
        serving.embeddings.assign(tf.cast(table, storage))
        np.testing.assert_allclose(serving(ids, weights=weights).numpy(), expected, atol=1e-2 if storage == "float16" else 1e-6)


def test_sequence_lookups_and_pooling():
    """Issue 18, item 1: a sequence feature's [batch, length, dim] lookup from TensorCore and
    serving tables (sparse and padded IDs) equals TPUEmbeddingForServing's CPU sequence lookup
    (first `length` IDs, zeros after); mean pooling averages a row's positions; attention weighs
    only real positions (a padding position's key never counts) and gives zeros for an empty row."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.tpu import tpu_embedding_for_serving as serving_lib

    from components.embedding_model.input import to_dense_ids
    from components.embedding_model.dense_tower import SequencePooling
    from components.embedding_model.lookups import sequence_mask
    from components.embedding_model.model import TensorCoreTable
    from components.embedding_model.serving_model import ServingTable

    rng = np.random.default_rng(1)
    table = tf.constant(rng.normal(size=(9, 4)).astype(np.float32))
    ids = tf.SparseTensor([[0, 0], [0, 1], [0, 2], [0, 3], [1, 0], [3, 0], [3, 1]],
                          tf.constant([1, 2, 3, 8, 5, 7, 7], tf.int64), [4, 4])  # row 0 longer than 3; row 2 empty
    config = tf.tpu.experimental.embedding.FeatureConfig(
        table=tf.tpu.experimental.embedding.TableConfig(9, 4, name="t"), max_sequence_length=3)
    expected = serving_lib._embedding_lookup_for_sparse_tensor(ids, None, tf.Variable(table), config).numpy()
    assert expected.shape == (4, 3, 4)
    plan = hand_built_plan({"t": (9, 4, "tensor_core")})
    core = TensorCoreTable(plan.tables["t"], "t")
    core.build()
    core.embeddings.assign(table)
    serving = ServingTable(plan.tables["t"], "t")
    serving.build()
    serving.embeddings.assign(table)
    for got in (core(ids, sequence_length=3), core(to_dense_ids(ids, 3), sequence_length=3), serving(ids, sequence_length=3)):
        np.testing.assert_allclose(got.numpy(), expected, atol=1e-7)
    mask = sequence_mask(ids, 3)
    assert mask.numpy().tolist() == [[1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 0]]
    mean = SequencePooling("mean", "m")(tf.constant(expected), mask).numpy()
    np.testing.assert_allclose(mean[0], table.numpy()[[1, 2, 3]].mean(0), atol=1e-6)
    np.testing.assert_allclose(mean[2], 0.0)
    tf.random.set_seed(5)  # the score network's initial weights: the same whatever ran before
    attention = SequencePooling("attention", "a")
    query = tf.constant(rng.normal(size=(4, 4)).astype(np.float32))
    pooled = attention(tf.constant(expected), mask, query=query).numpy()
    np.testing.assert_allclose(pooled[1], table.numpy()[5], atol=1e-6)  # one real position: its key
    np.testing.assert_allclose(pooled[2], 0.0)
    np.testing.assert_allclose(pooled[3], table.numpy()[7], atol=1e-6)  # the same item twice
    changed = expected.copy()
    changed[1, 1:] = 100.0  # padding positions of row 1: never attended
    np.testing.assert_allclose(attention(tf.constant(changed), mask, query=query).numpy()[1], pooled[1], atol=1e-6)


def _attention_with_score(weights):
    """SequencePooling("attention") whose score is exactly sum(weights * [query, key, q - k, q * k])
    (identity-like hidden layer, relu on non-negative inputs): the expected weights by hand."""
    from components.embedding_model.dense_tower import SequencePooling

    dim = len(weights) // 4
    layer = SequencePooling("attention", "a", hidden=1)
    layer(tf.zeros([1, 1, dim]), tf.ones([1, 1]), query=tf.zeros([1, dim]))  # builds the score network
    hidden, out = layer.score.layers
    hidden.set_weights([np.array(weights, np.float32)[:, None], np.zeros([1], np.float32)])
    out.set_weights([np.ones([1, 1], np.float32), np.zeros([1], np.float32)])
    return layer


def test_attention_weights_are_a_softmax_over_real_positions_only():
    """Scores 1 and 2 on the two real positions and 1000 on the padding position: the output is
    softmax([1, 2]) over the real keys (padding masked before the maximum is taken: a padding score
    far above the real ones must not underflow every real weight to zero)."""
    # score = key[0] (weight 1 on the key's first component); query zeros: q - k and q * k are
    # -key and 0, and relu keeps the non-negative keys' scores as they are.
    layer = _attention_with_score([0, 0, 1, 0, 0, 0, 0, 0])
    keys = tf.constant([[[1.0, 10.0], [2.0, 20.0], [1000.0, 0.0]]])
    mask = tf.constant([[1.0, 1.0, 0.0]])
    got = layer(keys, mask, query=tf.zeros([1, 2])).numpy()
    w = np.exp([1.0, 2.0]) / np.exp([1.0, 2.0]).sum()  # 0.2689, 0.7311
    np.testing.assert_allclose(got, [[w[0] * 1 + w[1] * 2, w[0] * 10 + w[1] * 20]], rtol=1e-6)
    empty = layer(keys, tf.zeros([1, 3]), query=tf.zeros([1, 2])).numpy()
    np.testing.assert_array_equal(empty, 0.0)  # no real position: zeros, not NaN


def test_sequence_lengths_from_the_host_mask_like_the_ids():
    """The TPU step's sequence mask comes from lengths computed in the input pipeline (no sparse
    ops on the TPU); it equals the mask taken from the IDs."""
    import numpy as np
    import tensorflow as tf

    from components.contracts.manifest import VocabularyManifest, CategoricalFeatureEntry
    from components.embedding_model.input import length_key, parse_batch
    from components.embedding_model.lookups import sequence_mask

    rows = [[1, 2, 3, 4], [5], [], [7, 7]]
    examples = [tf.train.Example(features=tf.train.Features(feature={
        "s": tf.train.Feature(int64_list=tf.train.Int64List(value=r)),
        "label": tf.train.Feature(float_list=tf.train.FloatList(value=[0.0]))})).SerializeToString() for r in rows]
    manifest = VocabularyManifest("unused", "label", {}, (), (CategoricalFeatureEntry("s", "s", "t", None, None),), {})
    features, _ = parse_batch(tf.constant(examples), manifest, static_batch=4, sequence_lengths={"s": 3})
    assert features[length_key("s")].numpy().tolist() == [3, 1, 0, 2] and features[length_key("s")].shape == [4]
    np.testing.assert_array_equal(sequence_mask(features["s"], 3, features[length_key("s")]).numpy(),
                                  sequence_mask(features["s"], 3).numpy())


@pytest.mark.parametrize("storage", ["float32", "float16", "int8"])
@pytest.mark.parametrize("combiner", ["mean", "sum", "sqrtn"])
def test_wide_weights_pool_beside_the_rows_in_float32_on_every_path(storage, combiner):
    """training.wide: a stack's wide weights (one float32 per row, beside the rows; never
    compressed) pool from the same positions and segments as the rows: per feature (`lookup`:
    plain, weighted, sequence) and fused (`pool_fused`), each equal to TensorFlow's lookup over
    the wide column, bit for bit on the plain paths; `assign` / `read` address a wide table by
    its own name."""
    from components.embedding_model.serving_model import ServingTables

    plan = hand_built_plan({"a": (7, 3, "tensor_core"), "b": (5, 3, "tensor_core")}, combiner=combiner)
    stack = ServingTables(dict(plan.tables), "s", storage, wide={"a": "a__wide", "b": "b__wide"})
    rng = np.random.default_rng(4)
    wide = {"a": rng.normal(size=(7, 1)).astype(np.float32), "b": rng.normal(size=(5, 1)).astype(np.float32)}
    for t in ("a", "b"):
        values = rng.normal(size=(plan.tables[t].rows, 3)).astype(np.float32)
        scale = np.abs(values).max(axis=1) / 127.0 if storage == "int8" else None
        stack.assign(t, np.round(values / scale[:, None]).astype(np.int8) if scale is not None else values.astype(storage),
                     scale.astype(np.float32) if scale is not None else None)
        stack.assign(t + "__wide", wide[t])
        np.testing.assert_array_equal(stack.read(t + "__wide"), wide[t])
    assert stack.wide.dtype == tf.float32
    ids_b = _ids([[4, 0, 4], [], [2]])
    ids_a = _ids([[6], [1, 2], []])
    expected_b = tf.nn.safe_embedding_lookup_sparse(tf.constant(wide["b"]), ids_b, combiner=combiner).numpy()
    expected_a = tf.nn.safe_embedding_lookup_sparse(tf.constant(wide["a"]), ids_a, combiner=combiner).numpy()
    _, got_b = stack.lookup("b", ids_b)
    np.testing.assert_array_equal(got_b.numpy(), expected_b)
    weights = tf.SparseTensor(ids_b.indices, tf.constant([0.5, 2.0, 1.0, 3.0]), ids_b.dense_shape)
    _, weighted = stack.lookup("b", ids_b, weights=weights)
    np.testing.assert_allclose(weighted.numpy(), tf.nn.safe_embedding_lookup_sparse(
        tf.constant(wide["b"]), ids_b, weights, combiner=combiner).numpy(), atol=1e-6)
    _, positions = stack.lookup("b", ids_b, sequence_length=2)
    np.testing.assert_array_equal(positions.numpy()[:, :, 0], [[wide["b"][4, 0], wide["b"][0, 0]], [0, 0], [wide["b"][2, 0], 0]])
    # fused: feature a then b, rows offset into the stack (b starts at 7), segment = feature x batch + row
    rows = tf.constant([6, 1, 2, 7 + 4, 7 + 0, 7 + 4, 7 + 2], tf.int64)
    segments = tf.constant([0, 1, 1, 3, 3, 3, 5], tf.int64)
    vectors, fused = stack.pool_fused(rows, segments, 2, tf.constant(3, tf.int64), combiner)
    assert vectors.shape == (2, 3, 3) and fused.shape == (2, 3, 1)
    np.testing.assert_array_equal(fused.numpy()[0], expected_a)
    np.testing.assert_array_equal(fused.numpy()[1], expected_b)
    plain = ServingTables(dict(plan.tables), "p", storage)  # no wide part: nothing beside the rows
    plain.build()
    assert plain.wide is None and plain.pool_fused(rows, segments, 2, tf.constant(3, tf.int64), combiner)[1] is None


# The anchors' way (tensorflow-recommenders' tpu_embedding_layer_test): a 2x4 table holding 0..7
# and the pooled results written out by hand. Row 0 looks up IDs 0 and 1, row 1 ID 1 twice, row 2
# nothing.
EXACT_TABLE = [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
EXACT_IDS = [[0, 1], [1, 1], []]
EXACT_POOLED = {
    "sum": [[4.0, 6.0, 8.0, 10.0], [8.0, 10.0, 12.0, 14.0], [0.0] * 4],
    "mean": [[2.0, 3.0, 4.0, 5.0], [4.0, 5.0, 6.0, 7.0], [0.0] * 4],
    # sum / sqrt(number of IDs): sqrt(2) for rows 0 and 1
    "sqrtn": [[v / 2 ** 0.5 for v in (4.0, 6.0, 8.0, 10.0)], [v / 2 ** 0.5 for v in (8.0, 10.0, 12.0, 14.0)], [0.0] * 4],
}


@pytest.mark.parametrize("combiner", sorted(EXACT_POOLED))
def test_every_table_path_pools_the_hand_computed_sums(combiner):
    """TensorCore tables (checked sparse, unchecked sparse, padded dense IDs) and the serving stack
    (float32, and float16, where 0..7 are exact) give the sums written out above."""
    from components.embedding_model.input import to_dense_ids
    from components.embedding_model.model import TensorCoreTable

    plan = hand_built_plan({"t": (2, 4, "tensor_core")}, combiner=combiner)
    ids = _ids(EXACT_IDS)
    core = TensorCoreTable(plan.tables["t"], "t")
    core.build()
    core.embeddings.assign(EXACT_TABLE)
    got = {"checked": core(ids), "unchecked": core(ids, safe=False), "padded": core(to_dense_ids(ids, 2))}
    for storage in ("float32", "float16"):
        serving = ServingTable(plan.tables["t"], "t", storage)
        serving.build()
        serving.embeddings.assign(np.array(EXACT_TABLE, storage))
        got[f"serving-{storage}"] = serving(ids)
    for path, pooled in got.items():
        np.testing.assert_allclose(pooled.numpy(), EXACT_POOLED[combiner], rtol=1e-6, err_msg=path)
