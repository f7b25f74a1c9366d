"""The dense tower's cost options on hand-set inputs (no plan, no data): training.dense_buckets.into
(where the dense features' bucket vectors enter, on a tower of two dense features and one
categorical feature) and training.input_dropout_mask (the byte mask)."""
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

import components  # noqa: F401
import tensorflow as tf

from components.config.training_schema import DenseBucketsConfig, TrainingConfig
from components.contracts.plan import DenseBuckets
from components.embedding_model.dense_tower import DenseTower, ModelFeatures, StepDropout, byte_keep_mask
from components.embedding_model.sparsecore_state import plan_signature

BOUNDARIES = {"a": (0.0, 1.0), "b": (5.0,)}  # a: 3 buckets, b: 2
DIM = 2  # the buckets' width
CAT_DIM = 4  # the categorical feature's width


def _tower(model: str, into: str) -> DenseTower:
    """A tower over dense features a, b (bucketed, dim 2) and categorical feature c (dim 4)."""
    features = ModelFeatures(
        dense_names=("a", "b"), categorical_names=("c",), wide_features={}, wide_feature_of={},
        feature_table={"c": "t"}, feature_dim={"c": CAT_DIM}, feature_safe={"c": False},
        weighted_features=frozenset(), sequence_length={}, sequence_query={}, sequence_pooling={}, wide_combiner={})
    plan = SimpleNamespace(dense_buckets=DenseBuckets(dim=DIM, boundaries=BOUNDARIES, source="hand-set"))
    training = dataclasses.replace(TrainingConfig(), model=model, bottom_mlp=[3], top_mlp=[2], cross_layers=1,
                                   cross_projection_dim=None,  # full rank: one [width, width] kernel to read
                                   input_dropout=0.0, dense_buckets=DenseBucketsConfig(dim=DIM, into=into))
    return DenseTower(plan, features, training)


def _inputs():
    return {"a": tf.constant([[-1.0], [0.5], [1.0]]), "b": tf.constant([[5.0], [4.0], [9.0]])}


def _set_bucket_rows(tower: DenseTower) -> None:
    """Bucket rows 10 * feature + bucket in every column: a: rows 0, 1, 2; b: rows 10, 11."""
    for j, (name, table) in enumerate(sorted(tower.bucket_tables.items())):
        rows = table.embeddings.shape[0]
        table.embeddings.assign(np.repeat(10.0 * j + np.arange(rows, dtype=np.float32)[:, None], DIM, axis=1))


def test_buckets_into_bottom_mlp_are_its_input_beside_the_dense_values():
    """into: bottom_mlp: the bottom MLP reads [signed log1p values, a's bucket row, b's bucket row]
    (buckets by rulebook B1: how many boundaries are <= the value)."""
    tower = _tower("dcn_v2", "bottom_mlp")
    tower.bottom(_inputs())  # builds the layers
    _set_bucket_rows(tower)
    dense, buckets, bottom = tower.bottom(_inputs())
    # a = -1, 0.5, 1 -> buckets 0, 1, 2; b = 5, 4, 9 -> buckets 1, 0, 1
    expected_input = np.array([
        [-np.log(2.0), np.log(6.0), 0, 0, 11, 11],
        [np.log(1.5), np.log(5.0), 1, 1, 10, 10],
        [np.log(2.0), np.log(10.0), 2, 2, 11, 11]], np.float32)
    layer = tower.bottom_mlp.layers[0]
    assert layer.kernel.shape == (2 + 2 * DIM, 3)
    expected = np.maximum(expected_input @ layer.kernel.numpy() + layer.bias.numpy(), 0.0)
    np.testing.assert_allclose(bottom.numpy(), expected, rtol=1e-5, atol=1e-6)
    assert sorted(buckets) == ["a", "b"]  # still returned: their wide weights, with a wide part


@pytest.mark.parametrize("into, width", [("interaction", 3 + CAT_DIM + 2 * DIM), ("bottom_mlp", 3 + CAT_DIM)])
def test_cross_layers_read_the_bucket_vectors_only_into_interaction(into, width):
    """dcn_v2: the cross layers' input is [bottom, c] with the buckets in the bottom MLP, [bottom,
    c, a's bucket, b's bucket] with them beside the features (the former behaviour)."""
    tower = _tower("dcn_v2", into)
    dense, buckets, bottom = tower.bottom(_inputs())
    tower.top(bottom, dense, buckets, {"c": tf.ones([3, CAT_DIM])})
    assert tower.cross[0]._dense.kernel.shape == (width, width)  # pylint: disable=protected-access
    assert tower.bottom_mlp.layers[0].kernel.shape[0] == (2 if into == "interaction" else 2 + 2 * DIM)


@pytest.mark.parametrize("into, vectors, projected", [("interaction", 4, ["a", "b", "c"]), ("bottom_mlp", 2, ["c"])])
def test_dot_interaction_pairs_only_the_vectors_that_enter_it(into, vectors, projected):
    """dlrm: bottom output, c, and (into: interaction) the two bucket vectors, each projected to the
    bottom width: n vectors give n (n - 1) / 2 dot products beside the bottom output."""
    tower = _tower("dlrm", into)
    dense, buckets, bottom = tower.bottom(_inputs())
    tower.top(bottom, dense, buckets, {"c": tf.ones([3, CAT_DIM])})
    assert sorted(tower.projections) == projected
    assert tower.top_mlp.layers[0].kernel.shape[0] == 3 + vectors * (vectors - 1) // 2


def test_byte_mask_drops_the_entries_whose_byte_is_under_the_rounded_rate():
    """rate 0.2 -> threshold round(51.2) = 51: an entry is dropped where its byte (four to each of
    the stateless 32-bit draws, in order) is < 51, the rest scaled by 256 / 205."""
    seed = tf.constant([7, 3], tf.int64)
    words = tf.random.stateless_uniform([2], seed=seed, minval=None, maxval=None, dtype=tf.uint32)
    drawn = tf.reshape(tf.bitcast(words, tf.uint8), [-1]).numpy()[:6]
    mask = byte_keep_mask(tf.constant([2, 3]), 0.2, seed).numpy()
    np.testing.assert_allclose(mask, np.where(drawn >= 51, 256 / 205, 0.0).reshape(2, 3).astype(np.float32), rtol=1e-6)


def test_byte_mask_dropout_is_stateless_and_drops_about_the_rate():
    """The same step draws the same mask, the next step another; about a fifth of 20,000 entries
    dropped; inference unchanged."""
    layer = StepDropout(0.2, seed=5, mask="byte")
    step = tf.Variable(0, dtype=tf.int64)
    layer.step_fn = lambda: step
    x = tf.ones([100, 200])
    first = layer(x, training=True).numpy()
    np.testing.assert_array_equal(first, layer(x, training=True).numpy())
    assert 0.18 < (first == 0).mean() < 0.22
    step.assign_add(1)
    assert not np.array_equal(first, layer(x, training=True).numpy())
    np.testing.assert_array_equal(layer(x, training=False).numpy(), x.numpy())


def test_byte_mask_compiles_under_xla_and_draws_the_eager_mask():
    """A TPU step is XLA-compiled: the byte mask's ops (stateless full-range uint32 draws, a bitcast
    to four bytes each, a compare) compile with XLA on CPU and give the mask eager mode gives. The
    TPU backend itself is not run here."""
    seed = tf.constant([7, 3], tf.int64)
    compiled = tf.function(lambda s: byte_keep_mask(tf.constant([64, 130]), 0.2, s), jit_compile=True)
    np.testing.assert_array_equal(compiled(seed).numpy(), byte_keep_mask(tf.constant([64, 130]), 0.2, seed).numpy())


def test_an_unknown_mask_is_refused():
    with pytest.raises(ValueError, match="'bits' is not one of float, byte"):
        StepDropout(0.2, seed=5, mask="bits")


@pytest.mark.slow(reason="a Trainer run (run_fn, 20 steps) and its model restored for serving from the checkpoint")
def test_buckets_into_bottom_mlp_train_and_restore_for_serving(trainer_data):
    """A run with `into: bottom_mlp` and the byte mask: its checkpoint restores into the serving
    model (which shares the tower: every dense weight found at its shape), whose bottom MLP reads
    the dense values and the buckets and whose cross layers do not, with the bucket rows trained."""
    import os  # lazy: only this scenario test writes a run

    from components.embedding_exporter.export import (latest_checkpoint, read_model_manifest, read_model_plan)  # lazy: the scenario's
    from components.embedding_model.input import make_dataset  # lazy: the scenario's
    from components.embedding_model.restore import model_from_checkpoint  # lazy: the scenario's
    from components.embedding_trainer import trainer_module  # lazy: the scenario's
    from tests.stages import fn_args, trainer_config  # lazy: the scenario's

    cfg = trainer_config(trainer_data, train_steps=20, model="dcn_v2", cross_projection_dim=None, input_dropout=0.2,
                         input_dropout_mask="byte", dense_buckets={"into": "bottom_mlp"})
    args = fn_args(trainer_data, cfg, 71)
    trainer_module.run_fn(args)
    model_uri = os.path.dirname(args.serving_model_dir)
    plan, manifest = read_model_plan(model_uri), read_model_manifest(model_uri)
    features, _ = next(iter(make_dataset([str(trainer_data / "tx" / "Split-eval" / "*")], manifest, 64, training=False)))
    model = model_from_checkpoint(plan, manifest, cfg, latest_checkpoint(model_uri), features)
    dense, dim = len(manifest.dense_names), plan.dense_buckets.dim
    assert model.bottom_mlp.layers[0].kernel.shape[0] == dense + len(model.bucket_tables) * dim
    widths = {n: plan.tables[plan.features[n].table].dim for n in manifest.categorical_names}
    assert model.cross[0]._dense.kernel.shape[0] == cfg.training.bottom_mlp[-1] + sum(widths.values())  # pylint: disable=protected-access
    assert all(np.abs(t.embeddings.numpy()).max() > 0 for t in model.bucket_tables.values())
    probs = model(features).numpy()
    assert probs.shape == (64, 1) and np.all((probs > 0) & (probs < 1))


@pytest.mark.parametrize("into, recorded", [("interaction", None), ("bottom_mlp", "bottom_mlp")])
def test_the_resume_signature_holds_where_the_buckets_enter(into, recorded):
    """A run resumed with another `into` builds other dense kernels: the state's plan signature
    names it, and leaves the default out (records written before the option compare equal)."""
    plan = SimpleNamespace(tables={}, features={},
                           dense_buckets=DenseBuckets(dim=DIM, boundaries=BOUNDARIES, source="hand-set"))
    training = dataclasses.replace(TrainingConfig(), dense_buckets=DenseBucketsConfig(dim=DIM, into=into))
    signature = plan_signature(plan, SimpleNamespace(kind="A"), SimpleNamespace(training=training), ["a", "b"])
    assert signature["model"].get("dense_buckets_into") == recorded
