"""Training with several replicas (logical CPU devices, tests/conftest.py) trains the model one
replica would train.

- One step on two replicas updates every table, TensorCore and TPU-embedding alike, as one
  replica does on the same global batch, clipping included: the gradients are summed over the
  replicas before they are clipped (the TPU embedding engine's rule), not clipped per replica
  and summed; sparse gradients stay sparse, so a lazy optimizer stays lazy.
- A run resumed at step k with several replicas continues at the exact next example: every step
  took one batch per replica.
- Two replicas reach the eval AUC of one, within noise (slow tier).
"""
import numpy as np
import pytest

import components  # noqa: F401
import tensorflow as tf

from components.embedding_model.input import make_dataset
from components.embedding_model.tf_objects import dense_id_widths, sequence_lengths
from components.planning.run_plan import derive_plan
from components.embedding_trainer import (hardware, model_artifact, model_building, resolved_input, training_data,
                                          training_loop)
from tests import tpu_harness
from components.config.loading import parse_config
from tests.stages import trainer_config as _config, trainer_raw_config as _raw_config, examples_uri
from components.planning.fitting import with_run


@pytest.fixture(scope="session")
def data(trainer_data):
    """The session's preprocessed small data (tests/conftest.py); read-only."""
    return trainer_data

REPLICAS = 2


def _files(root):
    return [str(root / "tx" / "Split-train" / "*")], [str(root / "tx" / "Split-eval" / "*")]


def _plan(cfg, root):
    train, _ = _files(root)
    manifest = resolved_input.read_manifest(examples_uri(train))
    return derive_plan(cfg, manifest, resolved_input.read_statistics(examples_uri(train))), manifest


def _concat(a, b):
    if isinstance(a, tf.SparseTensor):
        return tf.sparse.concat(0, [a, b])
    return tf.concat([a, b], 0)


def _built(cfg, plan, manifest, sample, strategy=None, precision="float32"):
    scope = strategy.scope() if strategy is not None else tf.distribute.get_strategy().scope()
    with scope:
        model = model_building.build_model(plan, manifest, cfg, for_training=True, precision=precision)
        model.compile(optimizer=model.dense_optimizer, loss=tf.keras.losses.BinaryCrossentropy())
    if strategy is None:
        model(sample)
        model.create_optimizer_slots()
    else:
        strategy.run(lambda f: model(f), args=(sample,))
        with strategy.scope():
            model.create_optimizer_slots()
    return model


@pytest.mark.parametrize("optimizer, precision", [
    ({"name": "adagrad", "learning_rate": 0.1, "clipvalue": 0.002}, "float32"),
    ({"name": "adam", "learning_rate": 0.05, "clipvalue": 0.002, "lazy_adam": True}, "float32"),
    # the dense network in bfloat16 (training.precision), as a TPU trains it by default
    ({"name": "adagrad", "learning_rate": 0.1, "clipvalue": 0.002}, "mixed_bfloat16"),
])
@pytest.mark.slow(reason="builds the demo model on one and on two replicas (15 s a case)")
def test_one_step_on_two_replicas_updates_tables_as_one_replica_on_the_global_batch(optimizer, precision, data):
    cfg = _config(data, embedding_optimizer=optimizer, dropout=0.0, input_dropout=0.0, precision=precision)
    plan, manifest = _plan(cfg, data)
    train, _ = _files(data)
    widths, lengths = dense_id_widths(plan), sequence_lengths(plan)
    batches = list(make_dataset(train, manifest, 32, training=True, seed=3, dense_id_widths=widths,
                                sequence_lengths=lengths).take(REPLICAS))
    features = {k: _concat(batches[0][0][k], batches[1][0][k]) for k in batches[0][0]}
    labels = tf.concat([batches[0][1], batches[1][1]], 0)

    one = _built(cfg, plan, manifest, batches[0][0], precision=precision)
    strategy = tpu_harness.mirrored_strategy(REPLICAS)
    two = _built(cfg, plan, manifest, batches[0][0], strategy, precision=precision)
    assert one.dense_tower.cross[0].compute_dtype == two.dense_tower.cross[0].compute_dtype == precision[-8:]
    two.set_weights(one.get_weights())
    for a, b in zip(one.embedding_optimizer.weights, two.embedding_optimizer.weights):
        b.assign(a.numpy())

    initial = {v.name: v.numpy() for v in one.trainable_variables}
    one.fit(tf.data.Dataset.from_tensors((features, labels)), epochs=1, steps_per_epoch=1, verbose=0)
    # one input pipeline, one per-replica batch for each replica: together the global batch
    two.fit(strategy.distribute_datasets_from_function(
        lambda ctx: tf.data.Dataset.from_tensors(batches[0]).concatenate(tf.data.Dataset.from_tensors(batches[1]))),
        epochs=1, steps_per_epoch=1, verbose=0)

    tables = [v.name for v in one.trainable_variables if id(v) in one.embedding_variable_ids()]
    assert any("table_" in n for n in tables) and any("_tpu_embedding" in n or "embedding_layer" in n for n in tables), tables
    # Adam's first step moves a row by about lr x g / |g|: where a summed gradient is near zero,
    # the rounding of the two reductions (one batch, or two replicas' all-reduce) is amplified, and
    # it varied with the machine's load (2.7e-6 on one element of 2,480, with tests running in two
    # processes). 1e-5 is still 1/5,000 of that step: a wrong batch or a wrong average shows.
    atol = 1e-5 if optimizer["name"] == "adam" else 1e-6
    for v1, v2 in zip(one.trainable_variables, two.trainable_variables):
        assert v1.shape == v2.shape and v1.name.split("/")[-1] == v2.name.split("/")[-1]
        if precision == "float32":
            np.testing.assert_allclose(v2.numpy(), v1.numpy(), rtol=1e-5, atol=atol, err_msg=v1.name)
    if precision != "float32":
        _close_in_bfloat16([(v1.name, v1.numpy(), v2.numpy()) for v1, v2 in zip(one.trainable_variables,
                                                                                 two.trainable_variables)])
        if v1.name in tables:
            assert not np.array_equal(v1.numpy(), initial[v1.name]), f"{v1.name} did not train"


DENSE_STEP = 0.002  # the demo's dense Adam learning rate: its first step moves a weight by about that


def _close_in_bfloat16(pairs):
    """In bfloat16 each replica's half of a dense gradient is rounded to 8 bits of mantissa before
    the sum, and Adam's first step (lr x g / |g|) turns that rounding in a near-zero gradient into
    up to a whole step: over all variables at most 5% of the entries may differ, each by at most
    two steps; the rest agree within 1e-5 (measured: 2-4%, one entry in a 16-wide bias among them).
    A wrong batch or a wrong average moves most entries (14% of one kernel's, measured, and more)."""
    diffs = {name: np.abs(one - two) for name, one, two in pairs}
    assert all(d.max() <= 2 * DENSE_STEP for d in diffs.values()), {n: d.max() for n, d in diffs.items()}
    share = sum(int(np.sum(d > 1e-5)) for d in diffs.values()) / sum(d.size for d in diffs.values())
    assert share <= 0.05, share


def _replica_batches(strategy, dataset_fn, steps):
    """[[per-replica label vectors] per step] of `steps` steps of a distributed input."""
    it = iter(strategy.distribute_datasets_from_function(dataset_fn))
    out = []
    for _ in range(steps):
        _, labels = next(it)
        out.append([v.numpy().ravel() for v in strategy.experimental_local_results(labels)])
    return out


def test_a_resumed_run_with_several_replicas_continues_at_the_next_example(data):
    """training_input at step k gives the replicas the batches an uninterrupted run gives them at
    step k: every step consumed one batch per replica (skipping only k batches would replay)."""
    cfg = _config(data)
    plan, manifest = _plan(cfg, data)
    train, _ = _files(data)
    strategy = tpu_harness.mirrored_strategy(REPLICAS)
    fn = lambda start: training_data.training_input(train, manifest, plan, cfg.training, 32, start, REPLICAS)  # noqa: E731
    whole = _replica_batches(strategy, fn(0), 5)
    resumed = _replica_batches(strategy, fn(3), 2)
    for step in range(2):
        for replica in range(REPLICAS):
            np.testing.assert_array_equal(resumed[step][replica], whole[3 + step][replica])
    # the examples differ from step to step (the check above can tell positions apart)
    assert not np.array_equal(whole[3][0], whole[2][0]) or not np.array_equal(whole[3][1], whole[2][1])


def _seeds_start(raw):
    """The config with the tables started as the seeds start them (stddev 1/sqrt(dim), 0.25 at the
    demo's dim 16): 200 steps from the default smaller start leave the 600-row eval AUCs of one
    and two replicas 0.028 apart (measured), more than this test's noise bound."""
    raw.setdefault("categorical_defaults", {})["initializer"] = {"name": "truncated_normal", "stddev": 0.25}
    return parse_config(raw)


@pytest.mark.slow(reason="two 200-step trainings, on one replica and on two")
def test_two_replicas_reach_the_auc_of_one(data, tmp_path, monkeypatch):
    """Same config and steps on one and on two replicas (the same global batch): the eval AUC
    agrees within noise. (A two-replica run killed and resumed ends with the weights of an
    uninterrupted one: tests/test_early_stopping.py.)"""
    cfg = _seeds_start(_raw_config(data, train_steps=200, checkpoint_every_steps=100))
    plan, manifest = _plan(cfg, data)
    train, evals = _files(data)
    results = {}
    for replicas in (1, REPLICAS):
        if replicas > 1:
            monkeypatch.setattr(hardware, "distribution_strategy", lambda c: tpu_harness.mirrored_strategy(REPLICAS))
        ckpt, rules, run = training_loop.train(cfg, with_run(plan, vocabulary_dir=manifest.vocabulary_dir), manifest, train,
                                               evals, str(tmp_path / f"state{replicas}"))
        assert run["replicas"] == replicas
        # the TPU-rules report says how the TensorCore tables' gradients were summed over the replicas
        exchanged = rules.get("gradient_exchange")
        assert (exchanged is None) if replicas == 1 else (
            exchanged["replicas"] == replicas and set(exchanged["tables"]) == set(plan.tables_placed("tensor_core"))
            and {e["method"] for e in exchanged["tables"].values()} == {"all_gather", "all_reduce"}), exchanged
        metrics, _ = model_artifact.finish(cfg, plan, manifest, ckpt, evals, str(tmp_path / f"serving{replicas}"))
        results[replicas] = metrics["auc"]
    print("eval AUC by replicas:", results)
    assert abs(results[REPLICAS] - results[1]) < 0.02, results  # 600 eval rows: AUC standard error ~0.02
