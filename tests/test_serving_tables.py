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

from components.embedding_trainer.model import ServingTable

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
    from components.embedding_trainer.model import TensorCoreTable

    layer = TensorCoreTable(SimpleNamespace(rows=ROWS, dim=DIM, combiner=combiner,
                                            initializer=Initializer("random_normal", 0.0, 1.0)), "t")
    layer.build()
    ids = _ids(rows)
    np.testing.assert_array_equal(layer(ids, safe=False).numpy(), layer(ids, safe=True).numpy())
