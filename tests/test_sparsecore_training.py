"""SparseCore training on CPU: TF's real `TPUEmbeddingV2` (2 replicas x 4 SparseCores, its padded,
stacked, rotated variables and the slot variables TF built) with tests/tpu_harness.py's CPU step
(lookups and updates through TF's index mapping, the replicas' row gradients summed first, one
update per touched row by the SparseCore rule of tests/optimizer_reference.py).

- `test_cpu_step_updates_the_stacked_rows_by_hand`: one step on hand-set tables and IDs, the
  tables and slots after it written out by hand (Adagrad, FTRL; a stack of two tables with a
  rotation and a row offset; a dim-1 table padded to 8; sum and mean combiners; a row looked up
  on both replicas).
- `test_sparsecore_training_matches_cpu_row_by_row`: the Trainer's real model, optimizers and
  train_step (FTRL and Adagrad tables, stacks, dim-1 wide tables), a few steps of `fit` under the
  harness's TPU strategy from the same tables and dense weights as a CPU (layout A) run on the same
  batches; the tables read back from the SparseCore checkpoint by the exporter's layout-B reader
  equal the CPU run's row by row, and moved from where they started; so do every table's slots
  (TPU embedding and TensorCore) and the dense network's weights and slots. This is the TPU smoke test's
  own comparison (components/tpu_smoke/, `sparsecore_training`) with the
  harness in place of the TPU.
"""
import numpy as np
import pytest

import components  # noqa: F401
import tensorflow as tf

from tests import tpu_harness

EMB = tf.tpu.experimental.embedding
REPLICAS, PER_CHIP, BATCH = 2, 4, 4  # BATCH: per replica
# The parity runs' steps, as tests/test_smoke_mutations.py's: the CPU reference run of a precision
# (tests/stages.py, PARITY_REFERENCE) is trained once for the correct step here and the broken ones.
STEPS = 3


def _init(scale: float):
    def init(shape, dtype=tf.float32):
        r = tf.range(shape[0], dtype=tf.float32)[:, None]
        c = tf.range(shape[1], dtype=tf.float32)[None, :]
        return tf.cast(scale * (1.0 + tf.math.floormod(r, 7.0)) + 0.01 * c, dtype)
    return init


def _expected_init(rows: int, dim: int, scale: float) -> np.ndarray:
    r = np.arange(rows, dtype=np.float64)[:, None]
    c = np.arange(dim, dtype=np.float64)[None, :]
    return (scale * (1.0 + r % 7) + 0.01 * c).astype(np.float32).astype(np.float64)


# Per replica: feature -> (IDs per sample); gradient of each sample's activation: a constant per
# replica and feature, so the row gradients can be written out.
IDS = {
    "fa": ([[3], [3, 5], [], [39]], [[3], [0], [6], [7]]),   # table a (sum); row 3 on both replicas
    "fb": ([[1, 2], [2], [23], [1]], [[2, 2], [4], [], [0]]),  # table b (mean)
    "fw": ([[3], [4], [5], [3]], [[4], [], [6], [6]]),         # table w, dim 1 (sum)
}
GRAD = {"fa": (0.5, -0.25), "fb": (1.0, 2.0), "fw": (0.3, -0.2)}


def _sparse(rows):
    idx = [[i, j] for i, r in enumerate(rows) for j in range(len(r))]
    vals = [v for r in rows for v in r]
    return tf.sparse.SparseTensor(tf.constant(idx, tf.int64, shape=[len(idx), 2]), tf.constant(vals, tf.int64),
                                  [len(rows), max(1, max(len(r) for r in rows))])


def test_the_cpu_runs_batches_are_each_steps_replica_batches_in_order():
    """parity.global_batches: the CPU run's input is each step's per-replica batches as one batch,
    replica after replica, whatever the kind of tensor (dense, sparse, ragged)."""
    from components.tpu_smoke.parity import global_batches

    ids = [[1], [2, 3], [], [4], [5, 6, 7], [8], [9, 9], [10]]
    rows = tf.data.Dataset.from_tensor_slices({"d": tf.range(8.0)[:, None], "r": tf.ragged.constant(ids, tf.int64)})
    per_replica = rows.batch(2).map(lambda x: dict(x, s=x["r"].to_sparse()))  # 4 batches of 2 rows
    steps = list(global_batches(per_replica, 2))  # 2 replicas: 2 steps of 4 rows
    assert len(steps) == 2
    for step, first in zip(steps, (0, 4)):
        assert step["d"].numpy().ravel().tolist() == list(range(first, first + 4))
        assert step["r"].to_list() == ids[first:first + 4]
        sparse = tf.sparse.to_dense(step["s"]).numpy().tolist()
        assert [[v for v in row if v] for row in sparse] == ids[first:first + 4] and step["s"].dense_shape[0] == 4


@pytest.mark.slow(reason="TF's TPUEmbeddingV2 built and one step traced under the 2-replica harness strategy (~3 s)")
def test_cpu_step_updates_the_stacked_rows_by_hand(monkeypatch):
    cls = tpu_harness.recording_strategy_class(REPLICAS, sparse_cores_per_chip=PER_CHIP)
    tpu_harness.let_pass_type_check(monkeypatch, cls)
    strategy = cls()
    adagrad = lambda: EMB.Adagrad(learning_rate=0.5, initial_accumulator_value=0.1)  # noqa: E731
    tables = {
        "a": EMB.TableConfig(40, 4, initializer=_init(0.1), combiner="sum", name="a", optimizer=adagrad()),
        "b": EMB.TableConfig(24, 4, initializer=_init(0.2), combiner="mean", name="b", optimizer=adagrad()),
        "w": EMB.TableConfig(24, 1, initializer=_init(0.3), combiner="sum", name="w",
                             optimizer=EMB.FTRL(learning_rate=0.2, initial_accumulator_value=0.1)),
    }
    features = {f: EMB.FeatureConfig(tables[f[1]], name=f, output_shape=[BATCH]) for f in IDS}
    with strategy.scope():
        mid = tpu_harness.cpu_step_v2_class()(features, EMB.Adagrad(0.5))
        mid.build()
    layout = tpu_harness.tf_layout(mid)
    assert layout["a"]["stacked"] == layout["b"]["stacked"] == "a_b"  # one stack: rotation and offset
    assert {layout["b"]["rotation"], layout["b"]["offset_in_shard"]} != {0} and layout["w"]["padded"] == [64, 8]

    inputs = strategy.experimental_distribute_values_from_function(
        lambda ctx: {f: _sparse(IDS[f][ctx.replica_id_in_sync_group]) for f in IDS})

    @tf.function
    def step(inputs):
        def fn(x):
            activations, preserved = mid(x)
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            grads = {f: tf.fill([BATCH, tables[f[1]].dim], tf.gather(tf.constant(GRAD[f]), r)) for f in IDS}
            mid.apply_gradients(grads, preserved_outputs=preserved)
            return activations
        return strategy.run(fn, args=(inputs,))

    activations = step(inputs)

    init = {n: _expected_init(t.vocabulary_size, t.dim, s) for (n, t), s in zip(tables.items(), (0.1, 0.2, 0.3))}
    # The lookups: sum or mean of the rows of each sample, zeros for a sample without IDs.
    for f in IDS:
        t = init[f[1]]
        for rep in range(REPLICAS):
            got = strategy.experimental_local_results(activations[f])[rep].numpy()
            for i, ids in enumerate(IDS[f][rep]):
                want = t[ids].sum(0) if ids else np.zeros(t.shape[1])
                if ids and tables[f[1]].combiner == "mean":
                    want = want / len(ids)
                np.testing.assert_allclose(got[i], want, rtol=1e-6, err_msg=f"{f} replica {rep} sample {i}")
    # Row gradients: sample gradient x gain (mean: 1 / IDs in the sample), summed over both replicas.
    g = {n: {} for n in tables}
    for f in IDS:
        for rep in range(REPLICAS):
            for ids in IDS[f][rep]:
                for row in ids:
                    gain = 1.0 / len(ids) if tables[f[1]].combiner == "mean" else 1.0
                    g[f[1]][row] = g[f[1]].get(row, 0.0) + GRAD[f][rep] * gain
    assert g["a"][3] == pytest.approx(0.5 + 0.5 - 0.25)  # row 3 of a: twice on replica 0, once on 1
    for name in ("a", "b"):  # Adagrad: acc = 0.1 + g^2, w -= lr g / sqrt(acc), touched rows only
        want_w, want_acc = init[name].copy(), np.full_like(init[name], 0.1)
        for row, grad in g[name].items():
            want_acc[row] += grad * grad
            want_w[row] -= 0.5 * grad / np.sqrt(want_acc[row])
        rows, dim = want_w.shape
        np.testing.assert_allclose(tpu_harness.logical_table(mid, name, rows, dim).numpy(), want_w, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(tpu_harness.logical_table(mid, name, rows, dim, "accumulators").numpy(), want_acc, rtol=1e-6)
    # FTRL (lr_power -0.5, no l1/l2/beta): n' = n + g^2, z = g - (sqrt(n') - sqrt(n)) / lr x w,
    # w = -z / (sqrt(n') / lr); untouched rows keep w, n = 0.1, z = 0.
    w, n, z = init["w"].copy(), np.full_like(init["w"], 0.1), np.zeros_like(init["w"])
    for row, grad in g["w"].items():
        n2 = n[row] + grad * grad
        z[row] = grad - (np.sqrt(n2) - np.sqrt(n[row])) / 0.2 * w[row]
        w[row], n[row] = -z[row] / (np.sqrt(n2) / 0.2), n2
    np.testing.assert_allclose(tpu_harness.logical_table(mid, "w", 24, 1).numpy(), w, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(tpu_harness.logical_table(mid, "w", 24, 1, "accumulators").numpy(), n, rtol=1e-6)
    np.testing.assert_allclose(tpu_harness.logical_table(mid, "w", 24, 1, "linears").numpy(), z, rtol=1e-6, atol=1e-7)
    assert sorted(g["w"]) == [3, 4, 5, 6] and not np.allclose(w[[3, 4, 5, 6]], init["w"][[3, 4, 5, 6]])


@pytest.mark.slow(reason="the TPU smoke test's parity check: the Trainer's model trained 3 steps under the 2-replica "
                         "SparseCore harness and 3 on CPU")
def test_sparsecore_training_matches_cpu_row_by_row(parity_data, monkeypatch, tmp_path):
    from components.tpu_smoke import parity, scenario
    from tests.stages import PARITY_CATEGORICAL, PARITY_REFERENCE, trainer_raw_config

    strategy = tpu_harness.install_sparsecore(monkeypatch, REPLICAS, PER_CHIP)
    files = [str(parity_data / "tx" / "Split-train" / "*")]
    raw = trainer_raw_config(parity_data, PARITY_CATEGORICAL)
    cfg, plan, manifest = scenario.parity_plan(raw, str(parity_data))
    # FTRL and Adagrad, a stack of several, dim-1 wide, TensorCore tables, what the config's plan trains
    covered = scenario.coverage(plan, REPLICAS, PER_CHIP, scenario.derived_plan(raw, str(parity_data)))
    result = parity.sparsecore_training(strategy, cfg, plan, manifest, files, STEPS, str(tmp_path), tolerance=1e-4,
                                        reference=PARITY_REFERENCE)
    assert result["layout"] == "B", result
    tpu, tensor_core = plan.tables_placed("tpu_embedding"), plan.tables_placed("tensor_core")
    want = {"ftrl": {"accumulator", "linear"}, "adagrad": {"accumulator"}, "adam": {"m", "v"}}
    for name, entry in result["tables"].items():
        assert entry["change_diff"] <= 1e-4 and entry["max_diff"] <= 1e-6, (name, entry)
        assert entry["moved"] > 1e-4 and entry["rows_moved"] > 0, (name, entry)
        # the slots of every table: those TF created for the stacks (FTRL's, Adagrad's and the wide
        # tables' Adam's) and the TensorCore tables' Keras slots
        table = plan.tables[name]
        assert set(entry["slots"]) == want[table.optimizer["name"]] and max(entry["slots"].values()) <= 1e-4, (name, entry)
    assert {tpu[n].optimizer["name"] for n in tpu} == {"ftrl", "adagrad", "adam"}, covered
    assert tensor_core and {tensor_core[n].optimizer["name"] for n in tensor_core} == {"ftrl", "adam"}, covered
    # and every other variable: the dense network's weights and slots, the optimizers' counters
    v = result["variables"]
    assert v["trained"] > 40 and v["compared"] > v["trained"] and v["max_change_diff"] <= 1e-4, v


@pytest.mark.slow(reason="3 steps under the 2-replica SparseCore harness and on CPU, the dense network in bfloat16")
def test_sparsecore_training_in_bfloat16_passes_its_tolerances(parity_data, monkeypatch, tmp_path):
    """What a TPU trains under `training.precision: auto`: both runs' dense networks in bfloat16,
    judged by parity.tolerances_for("mixed_bfloat16"); every table's change within 2**-7 in scale
    of the CPU run's, every slot's within 2**-3 (its elements 2**-2) (test_smoke_mutations.py: every broken step still fails them)."""
    from components.tpu_smoke import parity, scenario
    from tests.stages import PARITY_CATEGORICAL, PARITY_REFERENCE, trainer_raw_config

    strategy = tpu_harness.install_sparsecore(monkeypatch, REPLICAS, PER_CHIP)
    files = [str(parity_data / "tx" / "Split-train" / "*")]
    cfg, plan, manifest = scenario.parity_plan(trainer_raw_config(parity_data, PARITY_CATEGORICAL), str(parity_data))
    result = parity.sparsecore_training(strategy, cfg, plan, manifest, files, STEPS, str(tmp_path),
                                        precision="mixed_bfloat16", reference=PARITY_REFERENCE)
    scales = [e["scale"] for e in result["tables"].values()]
    slot_scales = [v for e in result["tables"].values() for v in e.get("slot_scales", {}).values()]
    assert result["layout"] == "B" and len(scales) == len(plan.tables) and max(abs(x - 1) for x in scales) <= 2**-7, scales
    slots = {"ftrl": 2, "adagrad": 1, "adam": 2}  # every table's slots judged, TPU embedding and TensorCore
    assert len(slot_scales) == sum(slots[t.optimizer["name"]] for t in plan.tables.values()), slot_scales
    assert max(abs(x - 1) for x in slot_scales) <= 2**-3, slot_scales
    assert result["variables"]["trained"] > 40 and result["variables"]["max_scale_off"] <= 2**-4, result["variables"]
