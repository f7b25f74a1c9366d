"""SparseCore layouts proven by TensorFlow's own `TPUEmbeddingV2`, built on CPU (tests/tpu_harness.py).

1. TF's constructor (padding, C++ `stack_tables`, offsets, rotations) on the feature configs the
   model builds from real plans, at 1, 2 and 4 replicas, equals the layout the exporter recomputes
   from the plan (sparsecore_layout.plan_sparse_core_layouts) for every table.
2. TF's `build` initializes the stacked, sharded variables with its own index mapping and its
   sharded saveables write them; the exporter reads every logical row back: several tables per
   stack, a padded lone table, and a lone table that needs no padding (keeps its own name and
   shape: read as one plain table, its rows would come out permuted).
3. The plan's memory is what TF allocates: for wide (dim-1) tables, mixed dims and SGD, Adagrad,
   FTRL and Adam, the bytes of TF's stacked, sharded variables (parameters and every slot) per
   replica device and per stack equal the plan's per-chip bytes of the stack's tables, and the
   initialization transient the plan counts is what TF's initializer builds (its calls recorded).
"""
import dataclasses

import numpy as np
import pytest

import components  # noqa: F401
import tensorflow as tf

from components.config.schema import OptimizerConfig
from components.contracts.plan import CheckpointLayout, EmbeddingPlan, optimizer_spec
from components.embedding_model import layouts
from components.embedding_model.sparsecore_layout import plan_sparse_core_layouts
from components.embedding_model import tf_objects
from components.embedding_trainer import trainer_module as tm
from tests import tpu_harness

DEFAULT = optimizer_spec(OptimizerConfig(name="adagrad", learning_rate=0.1))
OWN = optimizer_spec(OptimizerConfig(name="sgd", learning_rate=0.5))
OTHER = optimizer_spec(OptimizerConfig(name="adam", learning_rate=0.01))
FTRL = optimizer_spec(OptimizerConfig(name="ftrl", learning_rate=0.1))


def _plan(tables, optimizers=None, features=None, batch=64):
    return EmbeddingPlan.for_tables(tables, features=features, global_batch_size=batch, optimizer=DEFAULT,
                                    optimizers=optimizers)


PLANS = {
    # several tables per stack: dims 6 and 8 both pad to 8; rows padded to 8 x SparseCores
    "stacks": lambda: _plan({"a": (100, 6, "tpu_embedding"), "b": (50, 8, "tpu_embedding"),
                             "c": (64, 8, "tpu_embedding"), "d": (1000, 16, "tpu_embedding"),
                             "small": (40, 4, "tensor_core")}),
    # per-table optimizers: `own` alone in its group and needing no padding at 1-2 replicas
    # (128 rows, dim 8), `pad` alone and padded (70 x 12), `e`/`f` sharing one spec (one stack)
    "lone": lambda: _plan({"own": (128, 8, "tpu_embedding"), "pad": (70, 12, "tpu_embedding"),
                           "e": (96, 8, "tpu_embedding"), "f": (33, 8, "tpu_embedding"),
                           "rest": (300, 8, "tpu_embedding")},
                          optimizers={"own": OWN, "pad": OTHER, "e": OTHER, "f": OTHER}),
    # shared tables (two features on one table: twice the samples), hashed-size tables
    "shared": lambda: _plan({"items": (4096, 16, "tpu_embedding"), "hash": (1 << 10, 16, "tpu_embedding"),
                             "cat": (10, 16, "tpu_embedding")},
                            features={"item": "items", "history_item": "items", "h": "hash", "c": "cat"}),
}


def _strategy(monkeypatch, replicas, per_chip=4):
    cls = tpu_harness.recording_strategy_class(replicas, sparse_cores_per_chip=per_chip)
    tpu_harness.let_pass_type_check(monkeypatch, cls)
    return cls()


def _model_v2(plan, strategy, per_replica, initializers=None):
    """TF's TPUEmbeddingV2 on the feature configs the model gives it (RankingModel/EmbeddingLayer:
    TPU-placed features, per-table TPU optimizers shared by equal specs, the layer's optimizer)."""
    with strategy.scope():
        _, tpu_opt = tm.embedding_optimizers(DEFAULT)
        tables = tm.table_optimizers(plan, DEFAULT)
        configs = tf_objects.feature_configs(plan, output_batch=per_replica, on_tpu=True,
                                    table_optimizers={n: o.tpu for n, o in tables.items()})
    configs = {n: c for n, c in configs.items() if plan.tables[plan.features[n].table].placement == "tpu_embedding"}
    for i, name in enumerate(sorted(plan.tables)):
        for c in configs.values():
            if c.table.name == name and initializers is not None:
                c.table.initializer = initializers(i)
    return tpu_harness.build_real_v2(strategy, configs, tpu_opt)


@pytest.mark.parametrize("replicas,per_chip", [(1, 4), (2, 4), (4, 2)])
@pytest.mark.parametrize("case", sorted(PLANS))
def test_tf_constructor_lays_tables_out_as_the_exporter_recomputes(case, replicas, per_chip, monkeypatch):
    plan = PLANS[case]()
    per_replica = plan.global_batch_size // replicas
    mid = _model_v2(plan, _strategy(monkeypatch, replicas, per_chip), per_replica)
    ours = {n: tpu_harness.layout_as_dict(l) for n, l in
            plan_sparse_core_layouts(plan, replicas, per_chip, per_replica).items()}
    assert tpu_harness.tf_layout(mid) == ours
    assert set(ours) == set(plan.tables_placed("tpu_embedding"))


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("case", sorted(PLANS))
def test_exporter_reads_every_row_tf_placed(case, replicas, monkeypatch, tmp_path):
    plan = PLANS[case]()
    per_replica = plan.global_batch_size // replicas
    strategy = _strategy(monkeypatch, replicas)
    mid = _model_v2(plan, strategy, per_replica, initializers=tpu_harness.row_identity_initializer)
    prefix = tpu_harness.checkpoint_of_model_path(mid).save(str(tmp_path / "ckpt"))
    index = {name: i for i, name in enumerate(sorted(plan.tables))}
    # the harness reads TF's variables through TF's map: the values are where TF put them
    for name in plan.tables_placed("tpu_embedding"):
        t = plan.tables[name]
        np.testing.assert_array_equal(tpu_harness.logical_table(mid, name, t.rows, t.dim).numpy(),
                                      tpu_harness.expected_rows(index[name], t.rows, t.dim))
    trained = plan.with_run(checkpoint_layout=CheckpointLayout(
        kind="B", embedding_api="TPUEmbeddingV2 (SparseCore)", num_replicas=replicas, sparse_cores_per_chip=4,
        per_replica_batch_size=per_replica))
    tables = layouts.CheckpointTables(prefix, dataclasses.replace(
        trained, tables=trained.tables_placed("tpu_embedding"),
        features={f: p for f, p in trained.features.items() if trained.tables[p.table].placement == "tpu_embedding"}))
    for name in plan.tables_placed("tpu_embedding"):
        t = plan.tables[name]
        assert tables.sources[name].kind == "B", (name, tables.sources[name].source)
        np.testing.assert_array_equal(tables.read(name), tpu_harness.expected_rows(index[name], t.rows, t.dim), err_msg=name)


def test_a_lone_unpadded_table_keeps_its_name_and_shape_but_not_its_row_order(monkeypatch, tmp_path):
    """D3's trap, shown on TF's own variables: the stack of `own` is named `own` and is
    [128, 8] (no padding at 2 replicas x 4 SparseCores), yet row r sits at shard
    (r % 8 + rotation) % 8, position r // 8."""
    plan = PLANS["lone"]()
    mid = _model_v2(plan, _strategy(monkeypatch, 2), 32, initializers=tpu_harness.row_identity_initializer)
    prefix = tpu_harness.checkpoint_of_model_path(mid).save(str(tmp_path / "ckpt"))
    key = layouts.table_key("own", "tpu_embedding")
    assert tf.train.load_checkpoint(prefix).get_variable_to_shape_map()[key] == [128, 8]
    raw = tf.train.load_checkpoint(prefix).get_tensor(key)
    logical = tpu_harness.expected_rows(sorted(plan.tables).index("own"), 128, 8)
    assert not np.array_equal(raw, logical)  # read as a plain table: permuted
    assert sorted(raw[:, 0].tolist()) == sorted(logical[:, 0].tolist())  # the same rows, in another order


def test_tf_cannot_build_a_sequence_feature_on_sparsecore_and_the_model_refuses_it_first(monkeypatch):
    """D1's reason, on TF's own constructor: a sequence feature (max_sequence_length, no
    output_shape) crashes TPUEmbeddingV2.__init__; the model's check names it first."""
    from components.embedding_model.model import SparseCoreUnsupported, check_sparsecore_features

    emb = tf.tpu.experimental.embedding
    table = emb.TableConfig(128, 8, name="items")
    configs = {"history": emb.FeatureConfig(table, max_sequence_length=4, name="history"),
               "item": emb.FeatureConfig(table, output_shape=[32], name="item")}
    strategy = _strategy(monkeypatch, 2)
    with pytest.raises((TypeError, ValueError), match="unknown rank"):
        tpu_harness.build_real_v2(strategy, configs, emb.SGD(0.1))
    with pytest.raises(SparseCoreUnsupported, match=r"'history' \(table 'items', length 4\)"):
        check_sparsecore_features(configs)
    check_sparsecore_features({"item": configs["item"]})  # pooled features pass


def _sized_plan(replicas, per_chip):
    """Wide (dim-1, FTRL) tables beside a dim-16 and a dim-6 table (default Adagrad), an SGD and
    an Adam table, and a TensorCore table; sized for SparseCore on `replicas` chips."""
    return EmbeddingPlan.for_tables(
        {"a": (100, 16, "tpu_embedding"), "a__wide": (100, 1, "tpu_embedding"), "b": (300, 6, "tpu_embedding"),
         "b__wide": (300, 1, "tpu_embedding"), "c": (50, 8, "tpu_embedding"), "d": (70, 12, "tpu_embedding"),
         "t": (10, 4, "tensor_core")},
        num_chips=replicas, sparse_cores_per_chip=per_chip, optimizer=DEFAULT,
        optimizers={"a__wide": FTRL, "b__wide": FTRL, "c": OWN, "d": OTHER})


@pytest.mark.parametrize("replicas,per_chip", [(1, 2), (2, 4), (4, 4)])
def test_plan_memory_is_what_tf_allocates_on_sparse_core(replicas, per_chip, monkeypatch):
    plan = _sized_plan(replicas, per_chip)
    assert plan.topology.embedding_api == "sparse_core"
    calls = []

    def recording(table, init):
        # not sharding-aware (no shard_info), as the trainer's Keras initializers: TF builds whole tables
        def record(shape, dtype=None, **kwargs):
            calls.append((table, tuple(int(x) for x in shape)))
            return init(shape, dtype=dtype, **kwargs)
        return record

    strategy = _strategy(monkeypatch, replicas, per_chip)
    with strategy.scope():
        _, tpu_opt = tm.embedding_optimizers(DEFAULT)
        opts = tm.table_optimizers(plan, DEFAULT)
        configs = tf_objects.feature_configs(plan, output_batch=64 // replicas, on_tpu=True,
                                    table_optimizers={n: o.tpu for n, o in opts.items()})
    configs = {n: c for n, c in configs.items() if plan.tables[plan.features[n].table].placement == "tpu_embedding"}
    for c in configs.values():
        c.table.initializer = recording(c.table.name, c.table.initializer)
    mid = tpu_harness.build_real_v2(strategy, configs, tpu_opt)
    slots = {"sgd": set(), "adagrad": {"accumulators"}, "ftrl": {"accumulators", "linears"}, "adam": {"momenta", "velocities"}}
    per_device = [0] * replicas
    for stacked, tables in mid._stacked_table_to_tables.items():  # pylint: disable=protected-access
        variables = mid._variables[stacked]  # pylint: disable=protected-access
        planned = [plan.tables[t.name] for t in tables]
        assert set(variables) == {"parameters"} | slots[planned[0].optimizer["name"]], stacked
        # one shard per replica device (TF's make_sharded_variable_creator: shard i on device i), all equal
        shard_bytes = [0] * replicas
        for v in variables.values():
            assert len(v.values) == replicas
            for i, shard in enumerate(v.values):
                shard_bytes[i] += shard.shape.num_elements() * shard.dtype.size
        assert shard_bytes == [sum(t.memory.per_chip_bytes for t in planned)] * replicas, stacked
        assert [tuple(t.memory.padded_rows for t in planned), planned[0].memory.padded_dim] == [
            tuple(t.vocabulary_size for t in tables), tables[0].dim], stacked
        per_device = [a + b for a, b in zip(per_device, shard_bytes)]
    tpu = plan.tables_placed("tpu_embedding")
    assert per_device == [sum(t.memory.per_chip_bytes for t in tpu.values())] * replicas
    assert sum(t.memory.total_bytes for t in tpu.values()) == sum(per_device)
    # The transient: for every device and SparseCore of it, TF's initializer builds every table of the
    # stack at its whole padded shape, one stack at a time, the stack's tables together.
    expected, transient = [], {}
    for stacked, tables in mid._stacked_table_to_tables.items():  # pylint: disable=protected-access
        block = [(t.name, (t.vocabulary_size, t.dim)) for t in tables]
        expected += block * (replicas * per_chip)
        full = sum(r * d * 4 for _, (r, d) in block)
        transient[tuple(t.name for t in tables)] = full + full // replicas  # + the shard's slices before concat
    assert calls == expected
    largest = max(transient, key=transient.get)
    assert (plan.memory.init_transient_bytes, plan.memory.init_transient_tables) == (transient[largest], largest)
    assert largest == ("a__wide", "b__wide")  # the wide tables: one FTRL stack of 8 padded columns
