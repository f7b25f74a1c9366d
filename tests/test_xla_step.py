"""The TPU training step compiles with XLA, and its sparse updates are Keras' own rules.

On a TPU the Trainer's step (`RankingModel.train_step`, run by Keras' `fit` inside
`strategy.run`) is one XLA computation. TensorCore tables are looked up with `tf.gather`, so their
gradients are IndexedSlices; Keras' legacy Adagrad and FTRL apply those with fused kernels XLA
cannot translate. These tests compile the Trainer's own step with `jit_compile=True` on CPU (XLA's
CPU backend translates the same TensorFlow ops as the TPU's) for every embedding optimizer, with
tables on the TensorCore, per-table optimizers, the wide part's lazy Adam, clipping and each dense
optimizer, check that it computes what the uncompiled step computes, and that the row rules
(components/embedding_model/xla_updates.py) equal Keras' fused kernels.

With several replicas (2 and 4 logical CPU devices), a TensorCore table's gradient summed over
the replicas by the step's own code (model.sum_over_replicas, under TF's MirroredStrategy: gathered,
or all-reduced table-sized where that is smaller) is what the compiled row rules then apply.

Not compiled here: TPU-embedding tables' lookups and updates, which the TPU embedding engine does
outside the TensorCore's XLA computation (its CPU stand-in, TPUEmbeddingForServing's sparse
lookup, is not what a TPU runs), and the cross-replica exchange itself: XLA on CPU refuses one
computation over several devices' variables (`test_xla_refuses_one_computation_over_several_cpu_devices`
says why), and XLA's cross-replica collectives need a TPU.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from components.embedding_model import optimizers, xla_updates

legacy = tf.keras.optimizers.legacy
XLA_ERRORS = (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError, tf.errors.InternalError)

# indices with repeats, out of order; a gradient row each
# (numpy: TensorFlow may not initialize at import, tests/conftest.py sets its logical devices first)
INDICES = np.array([3, 1, 3, 0, 7, 3, 1], np.int64)
VALUES = (np.random.default_rng(0).normal(size=(7, 4)) * 0.3).astype(np.float32)


def _sparse_steps(optimizer, steps=3, jit=False, seed=1, moments=False):
    """`steps` sparse updates of an [8, 4] table (random start) by `optimizer`; the table and its slots.
    `moments`: Adam's m and v start non-zero in every row (from an earlier step), so that a row the
    batch never looks up shows whether the update touched it."""
    rng = np.random.default_rng(seed)
    var = tf.Variable(rng.normal(size=(8, 4)).astype(np.float32))
    if moments:
        optimizer.add_slot(var, "m").assign(rng.normal(size=(8, 4)).astype(np.float32) * 0.1)
        optimizer.add_slot(var, "v").assign(rng.uniform(0.01, 0.1, size=(8, 4)).astype(np.float32))

    def step(k):
        g = tf.IndexedSlices(tf.constant(VALUES) * (1.0 + k), tf.constant(INDICES), tf.constant([8, 4], tf.int64))
        optimizer.apply_gradients([(g, var)])

    run = tf.function(step, jit_compile=True) if jit else step
    for k in range(steps):
        run(tf.constant(float(k)))
    return {"var": var.numpy(), **{s: optimizer.get_slot(var, s).numpy() for s in optimizer.get_slot_names()}}


FTRL = dict(learning_rate=0.2, initial_accumulator_value=0.1, l1_regularization_strength=0.01,
            l2_regularization_strength=0.05)


@pytest.mark.slow(reason="XLA compilations that fail, ~5 s: the reason for xla_updates, not a check of it")
def test_keras_own_sparse_adagrad_and_ftrl_do_not_compile():
    """Why xla_updates exists: Keras' fused sparse kernels have no XLA translation."""
    for opt in (legacy.Adagrad(0.1), legacy.Ftrl(**FTRL)):
        with pytest.raises(XLA_ERRORS, match="ResourceSparseApply"):
            _sparse_steps(opt, steps=1, jit=True)


@pytest.mark.parametrize("name, ours, keras", [
    ("adagrad", lambda: xla_updates.Adagrad(0.1, initial_accumulator_value=0.1), lambda: legacy.Adagrad(0.1, initial_accumulator_value=0.1)),
    ("ftrl", lambda: xla_updates.Ftrl(**FTRL), lambda: legacy.Ftrl(**FTRL)),
    ("ftrl_power", lambda: xla_updates.Ftrl(learning_rate_power=-0.7, **FTRL), lambda: legacy.Ftrl(learning_rate_power=-0.7, **FTRL)),
    ("ftrl_power_positional", lambda: xla_updates.Ftrl(0.2, -0.7, 0.1, 0.01, 0.05), lambda: legacy.Ftrl(0.2, -0.7, 0.1, 0.01, 0.05)),
    ("adam", lambda: xla_updates.Adam(0.05), lambda: legacy.Adam(0.05)),
])
def test_row_rules_compile_and_equal_keras_fused_kernels(name, ours, keras):
    """3 steps with repeated rows: compiled with XLA, our rule gives Keras' own (eager, fused
    kernel) tables and slots."""
    want = _sparse_steps(keras())
    got = _sparse_steps(ours(), jit=True)
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-7, err_msg=f"{name} {k}")
    assert not np.allclose(want["var"], _sparse_steps(keras(), steps=0)["var"])  # the table moved


def test_lazy_adam_compiles_and_moves_only_looked_up_rows():
    """The lazy rule, compiled, equals its eager self and the formula on the summed row gradients;
    rows never looked up keep their values and moments."""
    eager = _sparse_steps(xla_updates.LazyAdam(0.05))
    compiled = _sparse_steps(xla_updates.LazyAdam(0.05), jit=True)
    for k in eager:
        np.testing.assert_allclose(compiled[k], eager[k], rtol=1e-6, atol=1e-7)
    start = _sparse_steps(xla_updates.LazyAdam(0.05), steps=0)["var"]
    untouched = [2, 4, 5, 6]
    np.testing.assert_array_equal(compiled["var"][untouched], start[untouched])
    assert not np.any(compiled["m"][untouched]) and not np.any(compiled["v"][untouched])
    # from moments every row holds (zero moments would leave an eager Adam's untouched rows still too):
    # the rows never looked up keep their values and their moments, compiled
    before = _sparse_steps(xla_updates.LazyAdam(0.05), steps=0, moments=True)
    after = _sparse_steps(xla_updates.LazyAdam(0.05), steps=2, jit=True, moments=True)
    for k in ("var", "m", "v"):
        np.testing.assert_array_equal(after[k][untouched], before[k][untouched], err_msg=k)
        assert not np.allclose(after[k][[0, 1, 3, 7]], before[k][[0, 1, 3, 7]]), k  # the looked-up rows moved
    # one step by hand: the summed gradient of each row, Keras' bias-corrected rate
    one = _sparse_steps(xla_updates.LazyAdam(0.05), steps=1, jit=True)
    g = np.zeros((8, 4), np.float32)
    np.add.at(g, INDICES, VALUES)
    m, v = 0.1 * g, 0.001 * g * g
    lr = 0.05 * np.sqrt(1 - 0.999) / (1 - 0.9)
    np.testing.assert_allclose(one["var"], start - lr * m / (np.sqrt(v) + 1e-7), rtol=1e-5, atol=1e-6)


def test_occurrence_sums_and_static_clipping():
    sums, first = xla_updates.occurrence_sums(tf.constant(VALUES), tf.constant(INDICES))
    dense = np.zeros((8, 4), np.float32)
    np.add.at(dense, INDICES, VALUES)
    np.testing.assert_allclose(sums.numpy(), dense[INDICES], rtol=1e-6)
    assert first.numpy().tolist() == [True, True, False, True, True, False, False]
    v = tf.Variable(tf.zeros([8, 4]))
    [(clipped, _)] = tf.function(lambda: optimizers.clip_embedding_gradients(
        [(tf.IndexedSlices(tf.constant(VALUES), tf.constant(INDICES), tf.constant([8, 4], tf.int64)), v)], 0.2), jit_compile=True)()
    np.testing.assert_allclose(tf.convert_to_tensor(clipped).numpy(), np.clip(dense, -0.2, 0.2), rtol=1e-6)
    # any rank: a one-dimensional variable's gradient keeps its shape
    [(flat, _)] = optimizers.clip_embedding_gradients(
        [(tf.IndexedSlices(tf.constant([0.3, 0.3, -0.5]), tf.constant([1, 1, 2]), tf.constant([4])), tf.Variable(tf.zeros([4])))], 0.4)
    assert flat.values.shape == (3,)
    np.testing.assert_allclose(tf.convert_to_tensor(flat).numpy(), [0.0, 0.4, -0.4, 0.0], rtol=1e-6)
    empty, first = xla_updates.occurrence_sums(tf.zeros([0, 4]), tf.zeros([0], tf.int64))
    assert empty.shape == (0, 4) and first.shape == (0,)


# The Trainer's own step, compiled. Every table on the TensorCore (size_threshold: null), dropout
# off (the compiled and uncompiled steps are compared), the wide part on (its lazy Adam), a TensorCore
# table with an SGD override and one with Adagrad, and each dense optimizer in turn.
STEP_CASES = {
    # embedding optimizer, dense optimizer, embedding clipvalue
    "ftrl": ({"name": "ftrl", "learning_rate": 0.1, "l1_regularization_strength": 0.001,
              "l2_regularization_strength": 0.01}, {"name": "adam", "learning_rate": 0.01}, None),
    "adagrad": ({"name": "adagrad", "learning_rate": 0.1}, {"name": "adagrad", "learning_rate": 0.05, "clipnorm": 1.0}, 0.05),
    "lazy_adam": ({"name": "adam", "learning_rate": 0.01}, {"name": "ftrl", "learning_rate": 0.05}, 0.05),
    "adam": ({"name": "adam", "learning_rate": 0.01, "lazy_adam": False}, {"name": "sgd", "learning_rate": 0.05}, None),
    "sgd": ({"name": "sgd", "learning_rate": 0.1}, {"name": "adam", "learning_rate": 0.01, "clipvalue": 0.5}, 0.05),
}


def _step_model(data, embedding_optimizer, dense_optimizer, clipvalue, precision="float32", **dense_tower):
    """(model, batch): the Trainer's compiled training model (model_building.build_training_model)
    with every optimizer's slots built, and one training batch as the trainer feeds it;
    `dense_tower`: training fields that size the dense network (cross_layers, bottom_mlp, top_mlp)."""
    from components.config.loading import parse_config
    from components.contracts.manifest import VocabularyManifest
    from components.embedding_model.input import make_dataset
    from components.embedding_model.tf_objects import dense_id_widths, sequence_lengths
    from components.embedding_trainer import hardware, model_building, resolved_input
    from tests.stages import examples_uri
    from components.planning.run_plan import derive_plan
    from tests.stages import trainer_raw_config

    emb = dict(embedding_optimizer, clipvalue=clipvalue)
    raw = trainer_raw_config(data, dropout=0.0, input_dropout=0.0, embedding={"size_threshold": None},
                             embedding_optimizer=emb, dense_optimizer=dense_optimizer, wide={"enabled": True},
                             precision=precision, **dense_tower)
    own = [f for f in raw["categorical_features"] if "table" not in f]
    own[0]["optimizer"] = {"name": "sgd", "learning_rate": 0.3}
    own[1]["optimizer"] = {"name": "adagrad", "learning_rate": 0.2}
    cfg = parse_config(raw)
    manifest = VocabularyManifest.from_json((data / "vocab" / "manifest.json").read_text())
    train_files = [str(data / "tx" / "Split-train" / "*")]
    plan = derive_plan(cfg, manifest, resolved_input.read_statistics(examples_uri(train_files)))
    assert {t.placement for t in plan.tables.values()} == {"tensor_core"}
    tf.keras.utils.set_random_seed(7)
    _, model = model_building.build_training_model(cfg, plan, manifest, hardware.place_training(cfg))
    batch = next(iter(make_dataset(train_files, manifest, 64, training=True, seed=3, dense_id_widths=dense_id_widths(plan),
                                   sequence_lengths=sequence_lengths(plan))))
    model(batch[0])
    model.create_optimizer_slots()
    return model, batch


def _state(model):
    variables = model.variables + [v for o in [model.dense_optimizer] + [o for o, _ in model._embedding_optimizers().values()]
                                   for v in o.variables()]
    return {id(v): v for v in variables}


def _check_step_compiles(data, case, precision="float32", rtol=2e-5, atol=2e-6, **dense_tower):
    """Two compiled steps of the Trainer's train_step equal two uncompiled ones from the same start;
    returns the model."""
    model, batch = _step_model(data, *STEP_CASES[case], precision=precision, **dense_tower)
    state = _state(model)
    start = {k: v.numpy() for k, v in state.items()}
    compiled = tf.function(model.train_step, jit_compile=True)
    for _ in range(2):
        loss = compiled(batch)["loss"]
    assert np.isfinite(float(loss))
    after_xla = {k: v.numpy() for k, v in state.items()}
    for k, v in state.items():
        v.assign(start[k])
    plain = tf.function(model.train_step)
    for _ in range(2):
        plain(batch)
    moved = 0
    for k, v in state.items():
        np.testing.assert_allclose(after_xla[k], v.numpy(), rtol=rtol, atol=atol, err_msg=v.name)
        moved += not np.array_equal(after_xla[k], start[k])
    tables = [t.embeddings for t in model.tensor_core_tables.values()]
    assert all(not np.array_equal(after_xla[id(t)], start[id(t)]) for t in tables)  # every table trained
    assert moved > len(tables)
    return model


def test_the_trainer_step_compiles_with_xla_at_a_small_size(trainer_data):
    """The fast tier's guard of the compiled step: the Adagrad case (tables under SGD, Adagrad
    and the wide part's lazy Adam, the dense network under Adagrad with clipnorm) with a small
    dense network (one cross layer, MLPs of 8), about 3.5 s; the other cases at the defaults' size below."""
    _check_step_compiles(trainer_data, "adagrad", cross_layers=1, bottom_mlp=[8], top_mlp=[8])


@pytest.mark.slow(reason="one model build and two XLA compilations per optimizer, ~5 s each")
@pytest.mark.parametrize("case", [c for c in STEP_CASES if c != "adagrad"])  # adagrad: above, and in bfloat16 below
def test_trainer_step_compiles_with_xla(trainer_data, case):
    _check_step_compiles(trainer_data, case)


@pytest.mark.slow(reason="one model build and two XLA compilations, ~10 s")
def test_the_mixed_bfloat16_step_compiles_with_xla(trainer_data):
    """The step a TPU compiles, with the dense network under Keras' mixed_bfloat16 policy: XLA and
    the uncompiled step agree within bfloat16's resolution (8 bits of mantissa: 2**-8 relative). With
    Adagrad: Adam's first steps are about lr x sign(gradient), which turns a rounding difference in a
    near-zero gradient into a whole step."""
    model = _check_step_compiles(trainer_data, "adagrad", precision="mixed_bfloat16", rtol=2**-7, atol=2**-10)
    assert model.dense_tower.cross[0].compute_dtype == "bfloat16"


@pytest.mark.slow(reason="the Trainer's model built and its step traced for XLA")
def test_trainer_step_with_keras_own_optimizers_does_not_compile(trainer_data, monkeypatch):
    """The test above fails on the Trainer as it was (Keras' own classes): it guards the fix."""
    monkeypatch.setattr(xla_updates, "KERAS_CLASSES", {"sgd": legacy.SGD, "adagrad": legacy.Adagrad,
                                                       "adam": legacy.Adam, "ftrl": legacy.Ftrl})
    from components.embedding_model import tf_objects

    monkeypatch.setattr(tf_objects, "KERAS_CLASSES", xla_updates.KERAS_CLASSES)
    model, batch = _step_model(trainer_data, *STEP_CASES["ftrl"])
    with pytest.raises(XLA_ERRORS, match="ResourceSparseApply"):
        tf.function(model.train_step, jit_compile=True)(batch)


# ---- several replicas: the exchange of a TensorCore table's gradient (model.sum_over_replicas) ----

DIM, IDS_PER_REPLICA = 4, 6


def _replica_ids(replicas: int, rows: int) -> np.ndarray:
    """[replicas, IDS_PER_REPLICA] IDs: repeats within a replica and across replicas, and rows no replica looks up."""
    rng = np.random.default_rng(replicas * 100 + rows)
    return rng.integers(0, max(2, rows - 2), size=(replicas, IDS_PER_REPLICA)).astype(np.int64)


def _summed_over_replicas(replicas: int, rows: int):
    """Each replica's gradient of sum(gather(table, its IDs) x its weights) / replicas (Keras'
    scaling) summed by model.sum_over_replicas under MirroredStrategy on `replicas` logical CPU
    devices: (values, indices) as replica 0 holds them, and the weights."""
    from components.embedding_model import model as model_lib
    from tests import tpu_harness

    ids = _replica_ids(replicas, rows)
    weights = np.random.default_rng(rows).normal(size=(replicas, IDS_PER_REPLICA, DIM)).astype(np.float32)
    strategy = tpu_harness.mirrored_strategy(replicas)
    with strategy.scope():
        table = tf.Variable(tf.zeros([rows, DIM]))

    @tf.function
    def step():
        def replica():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.gather(table, tf.gather(ids, r)) * tf.gather(weights, r)) / replicas
            [(g, _)] = model_lib.sum_over_replicas([(tape.gradient(loss, table), table)])
            return g.values, g.indices
        return strategy.run(replica)

    values, indices = (strategy.experimental_local_results(t)[0] for t in step())
    return values, indices, ids, weights


@pytest.mark.parametrize("replicas", [2, 4])
def test_the_replicas_summed_gradient_compiles_into_the_row_rules_lazily(replicas):
    """A TensorCore table's gradient summed over 2 and 4 replicas (TF's MirroredStrategy on logical
    CPU devices, the real sum_over_replicas) is gathered where the replicas' rows are no more than
    the table's and all-reduced table-sized beyond (planning.gradient_exchange's rule): the static
    shapes XLA needs either way. Applied by each row rule compiled with XLA (clipped), it gives
    what Keras' own kernels give for one replica's gradient of the global batch, and the rows no
    replica looked up keep their values and slots (lazy Adam from non-zero moments)."""
    from components.planning.gradient_exchange import ALL_GATHER, ALL_REDUCE, exchange_method

    looked_up = replicas * IDS_PER_REPLICA
    for rows, method in ((looked_up + 8, ALL_GATHER), (looked_up - 4, ALL_REDUCE)):
        assert exchange_method(replicas, IDS_PER_REPLICA, rows, DIM) == method
        values, indices, ids, weights = _summed_over_replicas(replicas, rows)
        assert values.shape == ((looked_up if method == ALL_GATHER else rows), DIM), (method, values.shape)
        untouched = sorted(set(range(rows)) - set(ids.ravel().tolist()))
        assert untouched
        # one replica on the global batch: every replica's IDs, its gradient rows w / replicas
        whole = tf.IndexedSlices(tf.constant(weights.reshape(-1, DIM) / replicas), tf.constant(ids.ravel()),
                                 tf.constant([rows, DIM], tf.int64))
        summed = tf.IndexedSlices(values, indices, tf.constant([rows, DIM], tf.int64))
        for name, ours, keras in (
                ("adagrad", lambda: xla_updates.Adagrad(0.1), lambda: legacy.Adagrad(0.1)),
                ("ftrl", lambda: xla_updates.Ftrl(**FTRL), lambda: legacy.Ftrl(**FTRL)),
                ("lazy_adam", lambda: xla_updates.LazyAdam(0.05), lambda: xla_updates.LazyAdam(0.05))):
            got, start = _applied(ours(), summed, rows, jit=True)
            want, _ = _applied(keras(), whole, rows, jit=False)
            for k in want:
                np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=f"{replicas} {method} {name} {k}")
                np.testing.assert_array_equal(got[k][untouched], start[k][untouched], err_msg=f"{method} {name} {k}")
            assert not np.allclose(got["var"], start["var"])


def _applied(optimizer, gradient: tf.IndexedSlices, rows: int, jit: bool):
    """One clipped update of a [rows, DIM] table (random start; Adam's moments non-zero in every
    row) by `optimizer`: (table and slots after, and before)."""
    rng = np.random.default_rng(rows)
    var = tf.Variable(rng.normal(size=(rows, DIM)).astype(np.float32))
    if "m" in optimizer.get_slot_names() or isinstance(optimizer, legacy.Adam):
        optimizer.add_slot(var, "m").assign(rng.normal(size=(rows, DIM)).astype(np.float32) * 0.1)
        optimizer.add_slot(var, "v").assign(rng.uniform(0.01, 0.1, size=(rows, DIM)).astype(np.float32))
    optimizer._create_all_weights([var])  # pylint: disable=protected-access

    def state():
        return {"var": var.numpy(), **{s: optimizer.get_slot(var, s).numpy() for s in optimizer.get_slot_names()}}

    before = state()

    def step():
        optimizer.apply_gradients(optimizers.clip_embedding_gradients([(gradient, var)], 0.2),
                                  experimental_aggregate_gradients=False)

    (tf.function(step, jit_compile=True) if jit else step)()
    return state(), before


def test_xla_refuses_one_computation_over_several_cpu_devices():
    """Why the exchange itself is not compiled here: MirroredStrategy runs a `jit_compile`
    function over CPU devices as one XLA computation holding every replica
    (mirrored_run.call_for_each_replica lifts it; it keeps merge_call on devices that are not GPUs,
    `_use_merge_call`), and XLA refuses the variables that live on the other devices (TensorFlow's
    known issue "tf.Variable on a different device"). XLA's cross-replica collectives
    (CrossReplicaSum, AllToAll, which TPUStrategy emits) need a TPU. Should TensorFlow allow it,
    this fails and the exchange can be compiled whole."""
    from components.embedding_model import model as model_lib
    from tests import tpu_harness

    strategy = tpu_harness.mirrored_strategy(2)
    with strategy.scope():
        table = tf.Variable(tf.zeros([6, DIM]))

    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, ids))
        [(g, _)] = model_lib.sum_over_replicas([(tape.gradient(loss, table), table)])
        return g.values

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"located in device .*CPU:1 from device .*CPU:0"):
        strategy.run(tf.function(step, jit_compile=True), args=(tf.constant([1, 2, 2]),))
