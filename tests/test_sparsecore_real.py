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
   A plan made for 8 chips (num_chips not set) and trained at 2 or 4 replicas is re-derived by the
   trainer's plan_for_hardware from the strategy to TF's bytes per device (the 8-chip figure is
   about half of them, and the fit check would have approved it).
4. While TF builds its stacks, no replica device holds more than the plan's peak: every eager
   tensor TF and the trainer's initializers create is measured (op callbacks, one device each), and
   each initializer holds the full-size copies sizing.INITIALIZER_COPIES says.
5. TPUEmbedding (V1): TF's own TPUEmbedding, constructed on CPU with the trainer's optimizers,
   configures every table with gradient accumulation on, so the TPU runtime keeps a
   gradient_accumulators variable beside the parameters and slots, as the plan counts.
"""
import collections
import dataclasses
import math
import types
import weakref

import numpy as np
import pytest

import components  # noqa: F401
import tensorflow as tf

from tensorflow.core.protobuf.tpu import optimization_parameters_pb2
from tensorflow.python.framework import op_callbacks
from tensorflow.python.tpu import tpu_embedding_v2

from components.config.choices import InitializerKind
from components.config.training_schema import OptimizerConfig
from components.planning import sizing
from components.contracts.plan import CheckpointLayout, Initializer
from components.planning.derivation import optimizer_spec
from components.planning.fitting import plan_memory
from components.embedding_trainer.hardware import plan_for_hardware
from components.embedding_model import layouts
from components.embedding_model.sparsecore_layout import plan_sparse_core_layouts
from components.embedding_model import tf_objects
from components.embedding_trainer import model_building
from tests import tpu_harness
from components.planning.fitting import with_run
from components.planning.derivation import hand_built_plan

DEFAULT = optimizer_spec(OptimizerConfig(name="adagrad", learning_rate=0.1))
OWN = optimizer_spec(OptimizerConfig(name="sgd", learning_rate=0.5))
OTHER = optimizer_spec(OptimizerConfig(name="adam", learning_rate=0.01))
FTRL = optimizer_spec(OptimizerConfig(name="ftrl", learning_rate=0.1))


def _plan(tables, optimizers=None, features=None, batch=64):
    return hand_built_plan(tables, features=features, global_batch_size=batch, optimizer=DEFAULT,
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
        _, tpu_opt = model_building.embedding_optimizers(DEFAULT)
        tables = model_building.table_optimizers(plan, DEFAULT)
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


# 4 replicas: 16 SparseCores, where a stack's rotations (4 x its index) differ from N - rotation
# (at 8 SparseCores, 4 and 8 - 4 coincide), so a reader with the other rotation term fails here.
@pytest.mark.parametrize("replicas", [1, 2, 4])
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
    trained = with_run(plan, checkpoint_layout=CheckpointLayout(
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


def _sized_plan(replicas, per_chip, num_chips_source="config", big=False):
    """Wide (dim-1, FTRL) tables beside a dim-16 and a dim-6 table (default Adagrad), an SGD and
    an Adam table, a TensorCore table and with `big` a 5,000-row Adagrad table; sized for SparseCore
    on `replicas` chips."""
    return hand_built_plan(
        {"a": (100, 16, "tpu_embedding"), "a__wide": (100, 1, "tpu_embedding"), "b": (300, 6, "tpu_embedding"),
         "b__wide": (300, 1, "tpu_embedding"), "c": (50, 8, "tpu_embedding"), "d": (70, 12, "tpu_embedding"),
         "t": (10, 4, "tensor_core"), **({"e": (5000, 16, "tpu_embedding")} if big else {})},
        num_chips=replicas, sparse_cores_per_chip=per_chip, optimizer=DEFAULT,
        optimizers={"a__wide": FTRL, "b__wide": FTRL, "c": OWN, "d": OTHER}, num_chips_source=num_chips_source)


def _tpu_configs(plan, strategy, per_replica):
    """The TPU-placed feature configs and the layer's optimizer the model gives TPUEmbeddingV2."""
    with strategy.scope():
        _, tpu_opt = model_building.embedding_optimizers(DEFAULT)
        opts = model_building.table_optimizers(plan, DEFAULT)
        configs = tf_objects.feature_configs(plan, output_batch=per_replica, on_tpu=True,
                                             table_optimizers={n: o.tpu for n, o in opts.items()})
    return {n: c for n, c in configs.items() if plan.tables[plan.features[n].table].placement == "tpu_embedding"}, tpu_opt


def _tf_bytes_per_device(mid, replicas):
    """{stack: [bytes of its parameters and every slot on each replica device]} of TF's variables
    (TF's make_sharded_variable_creator: one shard per replica device)."""
    out = {}
    for stacked in mid._stacked_table_to_tables:  # pylint: disable=protected-access
        shard_bytes = [0] * replicas
        for v in mid._variables[stacked].values():  # pylint: disable=protected-access
            assert len(v.values) == replicas
            for i, shard in enumerate(v.values):
                shard_bytes[i] += shard.shape.num_elements() * shard.dtype.size
        out[stacked] = shard_bytes
    return out


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
        _, tpu_opt = model_building.embedding_optimizers(DEFAULT)
        opts = model_building.table_optimizers(plan, DEFAULT)
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
    # stack at its whole padded shape, one stack at a time, the stack's tables together; beyond them a
    # device holds the larger of its shard's slices (before their concatenation) and the initializer's
    # extra copies of the largest table (test_tf_initialization_peak_is_within_the_plans_peak measures it).
    expected, transient = [], {}
    for stacked, tables in mid._stacked_table_to_tables.items():  # pylint: disable=protected-access
        block = [(t.name, (t.vocabulary_size, t.dim)) for t in tables]
        expected += block * (replicas * per_chip)
        full = sum(r * d * 4 for _, (r, d) in block)
        extra = max((sizing.initializer_copies(plan.tables[n].initializer.name) - 1) * r * d * 4 for n, (r, d) in block)
        transient[tuple(t.name for t in tables)] = full + max(full // replicas, extra)
    assert calls == expected
    largest = max(transient, key=transient.get)
    assert (plan.memory.init_transient_bytes, plan.memory.init_transient_tables) == (transient[largest], largest)
    assert largest == ("a__wide", "b__wide")  # the wide tables: one FTRL stack of 8 padded columns


@pytest.mark.parametrize("replicas", [2, 4])
def test_a_plan_made_for_more_chips_is_re_derived_to_what_tf_allocates(replicas, monkeypatch):
    """A plan sized for the default 8 chips, trained at fewer replicas (a v5p-8 runs 4): TF pads and
    shards by num_replicas_in_sync x SparseCores per chip, so a device holds up to twice (4
    replicas) or four times (2) the 8-chip figure of a table. plan_for_hardware re-derives the plan
    from the strategy: its bytes per chip are TF's bytes per device."""
    plan8 = _sized_plan(8, 4, num_chips_source="default", big=True)
    strategy = _strategy(monkeypatch, replicas, 4)
    roomy = dataclasses.replace(plan8, memory=dataclasses.replace(plan8.memory, budget_per_chip_bytes=1 << 30, fits=True))
    sized = plan_for_hardware(roomy, strategy, on_tpu=True)
    assert (sized.topology.num_chips, sized.topology.num_sparse_cores, sized.topology.num_chips_source) == (
        replicas, replicas * 4, "hardware")
    configs, tpu_opt = _tpu_configs(sized, strategy, 64 // replicas)
    mid = tpu_harness.build_real_v2(strategy, configs, tpu_opt)
    per_stack = _tf_bytes_per_device(mid, replicas)
    for stacked, tables in mid._stacked_table_to_tables.items():  # pylint: disable=protected-access
        planned = [sized.tables[t.name] for t in tables]
        assert per_stack[stacked] == [sum(t.memory.per_chip_bytes for t in planned)] * replicas, stacked
        assert [t.memory.padded_rows for t in planned] == [t.vocabulary_size for t in tables], stacked
    per_device = [sum(b[i] for b in per_stack.values()) for i in range(replicas)]
    tpu = sized.tables_placed("tpu_embedding")
    assert per_device == [sum(t.memory.per_chip_bytes for t in tpu.values())] * replicas
    # the 8-chip plan: e's 5,000 rows padded to 5,120 (8 x 32 SparseCores), 640 a chip; TF pads them to
    # 8 x 16 (5,120) at 4 replicas, 8 x 8 (5,056) at 2, and gives each device its share
    assert plan8.tables["e"].memory.per_chip_rows == 640
    assert sized.tables["e"].memory.per_chip_rows == {2: 2528, 4: 1280}[replicas]
    before = sum(t.memory.per_chip_bytes for t in plan8.tables_placed("tpu_embedding").values())
    assert (before, per_device[0]) == (106_496, {2: 376_832, 4: 193_536}[replicas])


class _LiveBytes:
    """Every eager tensor created while it is on (op callbacks), by device, and the most alive at
    once with the variables assigned so far: what a device holds, tensor by tensor (no allocator)."""

    def __init__(self):
        self.live, self.variables, self.peak = {}, collections.Counter(), collections.Counter()

    def __call__(self, op_type, inputs, attrs, outputs, op_name=None, graph=None):
        if graph is not None:
            return None
        if op_type == "AssignVariableOp":  # a variable's buffer: the value's size, on the variable's device
            self.variables[inputs[0].device] += inputs[1].shape.num_elements() * inputs[1].dtype.size
        for o in outputs or ():
            if o is None or o.dtype == tf.resource:
                continue
            key = id(o)
            self.live[key] = (weakref.ref(o, lambda _, k=key: self.live.pop(k, None)), o.device,
                              o.shape.num_elements() * o.dtype.size)
        now = collections.Counter(self.variables)
        for _, device, n in list(self.live.values()):
            now[device] += n
        for device, n in now.items():
            self.peak[device] = max(self.peak[device], n)
        return None

    def __enter__(self):
        op_callbacks.add_op_callback(self)
        return self

    def __exit__(self, *exc):
        op_callbacks.remove_op_callback(self)


@pytest.mark.parametrize("kind", sorted(sizing.INITIALIZER_COPIES))
def test_each_initializer_holds_the_full_size_copies_the_plan_counts(kind):
    """tf_keras's initializers as the trainer builds them (tf_objects.tf_initializer, stateless draws):
    the truncated and plain normal and the uniform hold the draw, draw x scale and that + shift at
    once (3 tables' worth), zeros one."""
    table = (1000, 8)
    init = tf_objects.tf_initializer({
        "truncated_normal": Initializer(InitializerKind.TRUNCATED_NORMAL, mean=0.0, stddev=0.1),
        "random_normal": Initializer(InitializerKind.RANDOM_NORMAL, mean=0.0, stddev=0.1),
        "random_uniform": Initializer(InitializerKind.RANDOM_UNIFORM, minval=-0.1, maxval=0.1),
        "zeros": Initializer(InitializerKind.ZEROS)}[kind])
    with tf.device("/CPU:0"), _LiveBytes() as meter:
        value = init(shape=table, dtype=tf.float32)
    assert value.shape == table
    full = math.prod(table) * 4
    assert full * sizing.INITIALIZER_COPIES[kind] <= max(meter.peak.values()) < full * sizing.INITIALIZER_COPIES[kind] + 1024


def _one_sgd_table(replicas, per_chip):
    return hand_built_plan({"big": (20_000, 8, "tpu_embedding")}, num_chips=replicas,
                                    sparse_cores_per_chip=per_chip, optimizer=OWN)


def _wide_zeros(plan):
    """The plan with its wide tables initialized to zeros, as the wide part's are."""
    tables = {n: dataclasses.replace(t, initializer=Initializer(InitializerKind.ZEROS)) if n.endswith("__wide") else t
              for n, t in plan.tables.items()}
    return dataclasses.replace(plan, tables=tables, memory=plan_memory(tables, plan.topology, 0))


@pytest.mark.parametrize("replicas,per_chip", [(1, 4), (2, 4), (4, 2)])
@pytest.mark.parametrize("case", ["one_sgd", "sized"])
def test_tf_initialization_peak_is_within_the_plans_peak(case, replicas, per_chip, monkeypatch):
    """TF's real TPUEmbeddingV2 built with the trainer's initializers, every eager tensor measured per
    replica device, variables placed as TPUStrategy places them (the harness: a shard on its own
    device only): no device ever holds
    more than the plan's peak, and its variables are the plan's per-chip bytes. One SGD table:
    without the initializer's temporaries (the table and one shard of it on top of the steady
    bytes) the plan said about half of what a device holds."""
    plan = _one_sgd_table(replicas, per_chip) if case == "one_sgd" else _wide_zeros(_sized_plan(replicas, per_chip))
    strategy = _strategy(monkeypatch, replicas, per_chip)  # places a shard on its own device (tpu_harness)
    configs, tpu_opt = _tpu_configs(plan, strategy, 64 // replicas)
    with _LiveBytes() as meter:
        mid = tpu_harness.build_real_v2(strategy, configs, tpu_opt)
    devices = [d for d in meter.peak if "CPU" in d]
    assert len(devices) == replicas
    tpu_steady = sum(t.memory.per_chip_bytes for t in plan.tables_placed("tpu_embedding").values())
    assert all(meter.variables[d] == tpu_steady for d in devices)
    assert max(meter.peak.values()) <= plan.memory.peak_per_chip_bytes
    if case == "one_sgd":
        full = plan.tables["big"].memory.weight_bytes
        old = plan.memory.per_chip_bytes + full + full // replicas  # the figure without the temporaries
        assert min(meter.peak[d] for d in devices) > old
    assert set(mid._stacked_table_to_tables)  # pylint: disable=protected-access


def test_tpu_embedding_v1_keeps_gradient_accumulators_for_the_trainers_optimizers(monkeypatch):
    """TF's TPUEmbedding (V1) constructed on CPU under the harness strategy (V1 hardware) with the
    trainer's optimizers (SGD with clipping, Adagrad, FTRL, Adam): the TPUEmbeddingConfiguration it
    sends the TPU gives every table GradientAccumulationStatus.ENABLED. The TPU runtime keeps, per
    table, the parameters, the algorithm's auxiliary parameters and, with accumulation ENABLED or
    UNSPECIFIED and base count + 1 <= 7, `gradient_accumulators`
    (tensorflow/core/tpu/tpu_embedding_optimization_parameters_utils.cc, UseGradientAccumulation and
    GetOptimizationAlgorithmStateVariables; it runs in the TPU runtime, not on CPU): with it the
    proto's tables take the plan's V1 bytes per chip, ceil(rows / chips) rows of each variable.
    An optimizer built with use_gradient_accumulation=False says DISABLED."""
    base_count = {"stochastic_gradient_descent": 0, "adagrad": 1, "ftrl": 2, "adam": 2}  # GetBaseAuxiliaryParameterCount
    status = optimization_parameters_pb2.GradientAccumulationStatus
    clipped_sgd = optimizer_spec(OptimizerConfig(name="sgd", learning_rate=0.5, clipvalue=1.0))
    plan = hand_built_plan(
        {"a": (1001, 16, "tpu_embedding"), "w": (300, 1, "tpu_embedding"), "s": (70, 8, "tpu_embedding"),
         "m": (50, 4, "tpu_embedding")},
        num_chips=2, optimizer=DEFAULT, embedding_api="tpu_embedding_v1",
        optimizers={"w": FTRL, "s": clipped_sgd, "m": OTHER})
    cls = tpu_harness.recording_strategy_class(2, embedding_feature=tpu_harness.Feature.V1)
    monkeypatch.setattr(tpu_embedding_v2, "tpu_strategy", types.SimpleNamespace(TPUStrategy=cls, TPUStrategyV2=cls))
    strategy = cls()
    strategy.extended.num_hosts = 1  # TPUStrategy's: one host here
    configs, tpu_opt = _tpu_configs(plan, strategy, 32)
    with strategy.scope():
        mid = tf.tpu.experimental.embedding.TPUEmbedding(configs, tpu_opt)
    proto = mid._create_config_proto()  # pylint: disable=protected-access
    assert proto.num_tensor_cores == 2 and len(proto.table_descriptor) == 4
    for t in proto.table_descriptor:
        params = t.optimization_parameters
        algorithm = params.WhichOneof("parameters")
        assert params.gradient_accumulation_status == status.ENABLED, t.name
        accumulate = params.gradient_accumulation_status in (status.ENABLED, status.UNSPECIFIED) and \
            base_count[algorithm] + 1 <= sizing.MAX_AUXILIARY_PARAMETERS
        variables = 1 + base_count[algorithm] + int(accumulate)
        per_chip = math.ceil(t.vocabulary_size / plan.topology.num_chips) * t.dimension * 4 * variables
        memory = plan.tables[t.name].memory
        assert (per_chip, int(accumulate)) == (memory.per_chip_bytes, memory.gradient_accumulators), t.name
    off = tf.tpu.experimental.embedding.Adagrad(0.1, use_gradient_accumulation=False)
    params = optimization_parameters_pb2.OptimizationParameters()
    off._set_optimization_parameters(params)  # pylint: disable=protected-access
    assert params.gradient_accumulation_status == status.DISABLED
    assert sizing.v1_gradient_accumulators("adagrad", off.use_gradient_accumulation) == 0
