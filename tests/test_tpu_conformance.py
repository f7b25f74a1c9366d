"""The trainer's TPU branch, walked on CPU with several replicas.

No TPU is reachable here, so `run_fn` is run with `training.tpu` set and every TensorFlow TPU entry
point it reaches replaced by a recording stand-in:
- `TPUClusterResolver`, `experimental_connect_to_cluster`, `initialize_tpu_system`, `TPUStrategy`,
  and every call on the mid-level APIs TFRS's layer builds and on the strategy (`scope`, `run`,
  `distribute_datasets_from_function`): each call is bound to the *installed* signature with
  `inspect.signature(real).bind(...)` using the arguments the trainer really passes (a wrong name,
  a missing or extra argument raises TypeError here as on a TPU);
- the strategy is tests/tpu_harness.py's: a MirroredStrategy over REPLICAS logical CPU devices
  (so Keras' fit runs one step per replica, gradients cross replicas, and the batch is split as
  on a TPU) with TPUStrategy's TPU-only attributes; it records whether each TPU embedding call
  happens inside `strategy.run` and whether the mid-level object is created in
  `strategy.scope()`; a call outside (e.g. evaluating the training model after fit, the bug that
  made every TPU run fail after training) fails the test;
- SparseCore (V2): TensorFlow's real `TPUEmbeddingV2`. Its constructor pads and stacks the tables
  (TF's C++ `stack_tables`), `build` creates the stacked, sharded variables over the replicas'
  devices with TF's initializer and index mapping, and the checkpoint holds what TF writes; only
  the SparseCore step (`__call__`, `apply_gradients`) runs on CPU through TF's index mapping;
- TensorCore-embedding hardware (V1): `TPUEmbedding` cannot even be built without a TPU; its
  stand-in keeps its tables as non-trainable variables under the table names, as TPUEmbedding
  does, and creates its slots through the TPU optimizer's slot creator.

What this proves: the TPU branch's control flow and every call's arguments against TF 2.16.2 and
TFRS 0.7.7 at several replicas; SparseCore's real table layout in the checkpoint, read back by the
Trainer's and the exporter's CPU path; and that everything after training (evaluation,
SavedModel, checkpoint copy) runs from the checkpoint on CPU. What it cannot: the TPU runtime
itself (embedding engine, HBM, SparseCore kernels and their update rules, XLA compilation of the
step) - see bench/tpu_smoke.py.
"""
import inspect
import json
import os
import re

import numpy as np
import pytest

import components  # noqa: F401
import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_for_serving as serving_lib
from tensorflow_recommenders.layers.embedding import tpu_embedding_layer as tfrs_layer

from components.embedding_trainer import (hardware, model_building, resolved_input, trainer_module, training_data,
                                          training_loop, training_state)
from components.embedding_trainer.checkpoints import copy_checkpoint
from tests import tpu_harness
from tests.stages import (Killed, assert_traced_once_with_the_first_steps_values,
                          fits_with_variables_created_before_and_by_the_first_step, kill_after)
from tests.stages import fn_args as _fn_args, trainer_config as _config, trainer_raw_config as _raw_config, examples_uri
from components.contracts.artifacts import CHECKPOINT_DIR, EVAL_METRICS_FILE, TPU_RULES_FILE, TRAINING_RUN_FILE
from components.planning.fitting import with_run


@pytest.fixture(scope="session")
def data(trainer_data):
    """The session's preprocessed small data (tests/conftest.py); read-only."""
    return trainer_data

EMB = tf.tpu.experimental.embedding
Feature = tf.tpu.experimental.HardwareFeature.EmbeddingFeature
# The installed entry points, captured before any test replaces them.
REAL = {
    "TPUStrategy": tf.distribute.TPUStrategy,
    "TPUClusterResolver": tf.distribute.cluster_resolver.TPUClusterResolver,
    "experimental_connect_to_cluster": tf.config.experimental_connect_to_cluster,
    "initialize_tpu_system": tf.tpu.experimental.initialize_tpu_system,
    "TPUEmbedding": EMB.TPUEmbedding,
    "TPUEmbeddingV2": EMB.TPUEmbeddingV2,
}


class Recorder:
    def __init__(self):
        self.calls = []
        self.in_scope = 0
        self.in_run = 0
        self.mids = []  # the mid-level objects the steps called

    def bind(self, call, real, /, *args, **kwargs):
        """Binds a call to the installed signature of `real` (TypeError on any mismatch)."""
        bound = inspect.signature(real).bind(*args, **kwargs)
        self.calls.append({"call": call, "args": sorted(bound.arguments), "in_scope": self.in_scope > 0,
                           "in_run": self.in_run > 0, "values": dict(bound.arguments)})
        return bound

    def names(self):
        return [c["call"] for c in self.calls]


REPLICAS = 2  # the recording TPU strategy's replicas (logical CPU devices, tests/conftest.py)


def make_strategy(rec: Recorder, embedding_feature, replicas: int = REPLICAS):
    """tests/tpu_harness.py's recording TPU strategy (a MirroredStrategy over `replicas` CPU
    devices with TPUStrategy's TPU-only attributes), its scope, run and dataset distribution bound
    to TPUStrategy's signatures and recorded."""
    real = REAL["TPUStrategy"]

    def on_scope(strategy, entered):
        if entered:
            rec.bind("TPUStrategy.scope", real.scope, strategy)
        rec.in_scope += 1 if entered else -1

    def on_run(strategy, fn, args, kwargs, options, entered):
        if entered:
            rec.bind("TPUStrategy.run", real.run, strategy, fn, args=args, kwargs=kwargs, options=options)
        rec.in_run += 1 if entered else -1

    def on_distribute(strategy, dataset_fn, options):
        rec.bind("TPUStrategy.distribute_datasets_from_function", real.distribute_datasets_from_function,
                 strategy, dataset_fn, options)

    return tpu_harness.recording_strategy_class(replicas, embedding_feature, on_scope=on_scope, on_run=on_run,
                                      on_distribute=on_distribute)


def make_real_v2(rec: Recorder):
    """TF's own TPUEmbeddingV2 (constructor, padding, stacking, build, sharded variables, saving),
    its SparseCore step done on CPU through TF's index mapping (tests/tpu_harness.py); creation
    and every step call recorded and bound to the installed signatures."""
    name = "TPUEmbeddingV2"

    def on_call(mid, bound):
        rec.bind(f"{name}.__call__", REAL_V2_CALL, mid, **bound_without_self(bound))
        assert rec.in_run, f"{name}.__call__ called outside strategy.run"
        rec.mids.append(mid)

    def on_apply(mid, bound):
        rec.bind(f"{name}.apply_gradients", REAL["TPUEmbeddingV2"].apply_gradients, mid, **bound_without_self(bound))
        assert rec.in_run, f"{name}.apply_gradients called outside strategy.run"

    base = tpu_harness.cpu_step_v2_class(on_call=on_call, on_apply=on_apply)

    class RecordedV2(base):
        def __init__(self, *args, **kwargs):
            rec.bind(f"{name}.__init__", REAL["TPUEmbeddingV2"].__init__, None, *args, **kwargs)
            assert rec.in_scope, f"{name} must be created in strategy.scope()"
            super().__init__(*args, **kwargs)

        def build(self, *args, **kwargs):
            rec.bind(f"{name}.build", REAL["TPUEmbeddingV2"].build, self, *args, **kwargs)
            return super().build(*args, **kwargs)

    return RecordedV2


REAL_V2_CALL = REAL["TPUEmbeddingV2"].__call__


def bound_without_self(bound):
    return {k: v for k, v in bound.items() if k != "self"}


def make_mid_level(rec: Recorder, v2: bool):
    """A stand-in for TPUEmbedding (v2=False; TF's needs a TPU to build): CPU lookups, TPU
    signatures. v2=True: TF's real TPUEmbeddingV2 (make_real_v2)."""
    if v2:
        return make_real_v2(rec)
    real = REAL["TPUEmbedding"]
    name = real.__name__

    class RecordingMidLevel(serving_lib.TPUEmbeddingForServing):
        def __init__(self, *args, **kwargs):
            bound = rec.bind(f"{name}.__init__", real.__init__, None, *args, **kwargs)
            assert rec.in_scope, f"{name} must be created in strategy.scope()"
            a = bound.arguments
            self.pipelining = a.get("pipeline_execution_with_tensor_core", False)
            self.given_optimizer = a.get("optimizer")
            super().__init__(a["feature_config"], a.get("optimizer"))
            object.__setattr__(self, "_enqueued", {})  # not tracked: Python refs within one step trace

        def _create_variables_and_slots(self):
            # As TPUEmbedding on TPU: tables are non-trainable stand-ins (the TPU updates them).
            return {t.name: self._create_variables(t, trainable=False) for t in self._table_config}

        def build(self, *args, **kwargs):
            rec.bind(f"{name}.build", real.build, self, *args, **kwargs)
            return super().build()

        def _in_step(self, what):
            assert rec.in_run, f"{name}.{what} called outside strategy.run"

        def enqueue(self, *args, **kwargs):
            a = rec.bind(f"{name}.enqueue", real.enqueue, self, *args, **kwargs).arguments
            self._in_step("enqueue")
            self._enqueued[a.get("name")] = (a["features"], a.get("weights"))

        def dequeue(self, *args, **kwargs):
            a = rec.bind(f"{name}.dequeue", real.dequeue, self, *args, **kwargs).arguments
            self._in_step("dequeue")
            features, weights = self._enqueued.pop(a.get("name"))
            return serving_lib.cpu_embedding_lookup(features, weights, self.embedding_tables, self._feature_config)

        def __call__(self, *args, **kwargs):
            a = rec.bind(f"{name}.__call__", real.__call__, self, *args, **kwargs).arguments
            self._in_step("__call__")
            out = serving_lib.cpu_embedding_lookup(a["features"], a.get("weights"), self.embedding_tables,
                                                   self._feature_config)
            return out, {"stacked_table": tf.zeros([1])}

        def apply_gradients(self, *args, **kwargs):
            a = rec.bind(f"{name}.apply_gradients", real.apply_gradients, self, *args, **kwargs).arguments
            self._in_step("apply_gradients")
            tf.nest.assert_same_structure(self._feature_config, a["gradients"])

    return RecordingMidLevel


@pytest.fixture
def tpu_branch(monkeypatch):
    """Installs the stand-ins; yields a function that selects V1 or V2 hardware."""
    rec = Recorder()

    def install(embedding_feature):
        strategy_cls = make_strategy(rec, embedding_feature)
        def resolver(*args, **kwargs):
            rec.bind("TPUClusterResolver", REAL["TPUClusterResolver"].__init__, None, *args, **kwargs)
            return object()

        def connect(*args, **kwargs):
            rec.bind("experimental_connect_to_cluster", REAL["experimental_connect_to_cluster"], *args, **kwargs)

        def initialize(*args, **kwargs):
            rec.bind("initialize_tpu_system", REAL["initialize_tpu_system"], *args, **kwargs)

        def strategy(*args, **kwargs):
            rec.bind("TPUStrategy", REAL["TPUStrategy"].__init__, None, *args, **kwargs)
            return strategy_cls()

        monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", resolver)
        monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", connect)
        monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", initialize)
        monkeypatch.setattr(tf.distribute, "TPUStrategy", strategy)
        is_rec = lambda s: isinstance(s, strategy_cls)  # noqa: E731
        monkeypatch.setattr(hardware, "is_tpu_strategy", is_rec)
        tpu_harness.let_pass_type_check(monkeypatch, strategy_cls)  # TF's TPUEmbeddingV2 accepts it
        monkeypatch.setattr(tfrs_layer, "_is_tpu_strategy", is_rec)
        # Bound to the real classes before they are replaced; TFRS reaches them through
        # tensorflow.compat.v2, another module object than tf's.
        v1, v2 = make_mid_level(rec, v2=False), make_mid_level(rec, v2=True)
        for module in {id(m): m for m in (EMB, tf.compat.v2.tpu.experimental.embedding)}.values():
            monkeypatch.setattr(module, "TPUEmbedding", v1)
            monkeypatch.setattr(module, "TPUEmbeddingV2", v2)
        return rec

    return install


def _assert_checkpoint_tables_are_the_trained_ones(mid, model_uri):
    """Every TPU-embedding table the Trainer's CPU path reads from the artifact's checkpoint
    (stacked by TF's TPUEmbeddingV2 over REPLICAS x 4 SparseCores, no layout record) equals the
    table the training step looked rows up in, row for row."""
    from components.contracts.plan import EmbeddingPlan
    from components.embedding_model.layouts import CheckpointTables

    with open(os.path.join(model_uri, "embedding_plan.json")) as fh:
        plan = EmbeddingPlan.from_json(fh.read())
    tables = CheckpointTables(tf.train.latest_checkpoint(os.path.join(model_uri, CHECKPOINT_DIR)), plan)
    tpu_tables = plan.tables_placed("tpu_embedding")
    assert tpu_tables and mid._num_sc_shards == REPLICAS * 4  # pylint: disable=protected-access
    assert any(len(ts) > 1 for ts in mid._stacked_table_to_tables.values())  # pylint: disable=protected-access
    for name, t in tpu_tables.items():
        assert tables.sources[name].kind == "B", (name, tables.sources[name].source)
        np.testing.assert_array_equal(tables.read(name), tpu_harness.logical_table(mid, name, t.rows, t.dim).numpy(), err_msg=name)


@pytest.mark.slow(reason="two 3-step TPU-branch fits per case, each traced")
@pytest.mark.parametrize("feature", ["V1", "V2"])
def test_variables_created_before_a_tpu_fit_trace_the_step_once_and_hold_the_first_steps_values(
        feature, tpu_branch, parity_data, tmp_path):
    """On the TPU branch, model_building.create_variables (a forward pass traced inside
    strategy.run, never run) makes Keras trace the training step once, and after three steps every
    checkpoint value (TPU-embedding tables, TensorCore tables, the dense network and every slot)
    equals that of a fit whose first step created the variables (on parity_data's model: the
    fewest features with both table placements)."""
    from components.planning.run_plan import derive_plan
    from tests.stages import PARITY_CATEGORICAL

    tpu_branch(getattr(Feature, feature))
    cfg = _config(parity_data, PARITY_CATEGORICAL, tpu="local", dropout=0.3, wide={"enabled": True})
    files = [str(parity_data / "tx" / "Split-train" / "*")]
    manifest = resolved_input.read_manifest(examples_uri(files))
    plan = with_run(derive_plan(cfg, manifest, resolved_input.read_statistics(examples_uri(files))),
                    vocabulary_dir=manifest.vocabulary_dir)
    runs = fits_with_variables_created_before_and_by_the_first_step(cfg, plan, manifest, files, tmp_path)
    assert_traced_once_with_the_first_steps_values(runs, more_than=20)


def test_calling_the_tpu_layer_outside_run_fails(tpu_branch, data):
    """The original bug, caught on CPU: the TPU-built model called after fit, outside strategy.run
    (TFRS's own check raises, as it does on a TPU)."""
    rec = tpu_branch(Feature.V1)
    cfg = _config(data, tpu="local")
    manifest = resolved_input.read_manifest(examples_uri([str(data / "tx" / "Split-train" / "*")]))
    from components.embedding_model.tf_objects import dense_id_widths
    from components.planning.run_plan import derive_plan

    plan = derive_plan(cfg, manifest, resolved_input.read_statistics(examples_uri([str(data / "tx" / "Split-train" / "*")])))
    strategy = hardware.distribution_strategy(cfg)
    with strategy.scope():
        model = model_building.build_model(plan, manifest, cfg, for_training=True, on_tpu=True, per_replica_batch=64)
    from components.embedding_model.input import make_dataset

    features, _ = next(iter(make_dataset([str(data / "tx" / "Split-eval" / "*")], manifest, 64, training=False,
                                         dense_id_widths=dense_id_widths(plan))))
    strategy.run(lambda f: model(f, training=True), args=(features,))  # built in a step, as fit does
    with pytest.raises(RuntimeError, match="strategy.run"):
        model(features)  # e.g. evaluating the training model after fit
    assert "TPUEmbedding.__init__" in rec.names()


def test_wrong_argument_fails_the_bind():
    rec = Recorder()
    with pytest.raises(TypeError):
        rec.bind("TPUEmbeddingV2.__init__", REAL["TPUEmbeddingV2"].__init__, None, {}, None, False, None)  # TFRS 0.7.7's call
    rec.bind("TPUEmbeddingV2.__init__", REAL["TPUEmbeddingV2"].__init__, None, feature_config={}, optimizer=None,
             pipeline_execution_with_tensor_core=False)  # ours (model.EmbeddingLayer)


def _round_trip_config(data, **training):
    """The demo-derived config plus a TPU-embedding table (C12) with an Adagrad of its own and an
    embedding gradient multiplier with a warm-up (issue 18, item 2)."""
    from components.config.loading import parse_config
    raw = _raw_config(data, embedding_gradient_multiplier={"value": 0.5, "schedule": {"warmup_steps": 15}}, **training)
    next(f for f in raw["categorical_features"] if f["name"] == "C12")["optimizer"] = {
        "name": "adagrad", "learning_rate": 0.1, "clipvalue": 0.2}
    return parse_config(raw)


@pytest.mark.slow(reason="trains three times")
def test_checkpoint_round_trip_tpu_to_cpu_and_back(tpu_branch, data, tmp_path, monkeypatch):
    """A run checkpointed on the TPU branch resumes on CPU, and a CPU checkpoint resumes on the TPU
    branch: same keys for tables and optimizer slots (the TPU optimizer creates its slots through
    the Keras optimizer), lazy Adam with clipping so every embedding option is in the checkpoint,
    and a table with an optimizer of its own (its slots under table_embedding_optimizers, its step
    count carried across platforms)."""
    optimizer = {"name": "adam", "learning_rate": 0.01, "clipvalue": 0.5, "lazy_adam": True}
    state = str(tmp_path / "state")
    _config = _round_trip_config
    table_iter = "model/table_embedding_optimizers/C12/iter/.ATTRIBUTES/VARIABLE_VALUE"

    def keys(prefix):
        return {k for k in tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
                if "embedding_layer" in k and "dummy" not in k}

    rec = tpu_branch(Feature.V1)
    # one 30-step run, stopped after step 10 on the TPU branch and after step 20 on CPU (a finished
    # state resumes under no change: resume_rule.py)
    cfg = _config(data, tpu="local", train_steps=30, checkpoint_every_steps=10, checkpoint_dir=state,
                  embedding_optimizer=optimizer)
    plan_manifest = _plan(cfg, data)
    save = training_loop.Checkpointer.on_epoch_end
    kill_after(monkeypatch, 10)
    with pytest.raises(Killed):
        training_loop.train(cfg, *plan_manifest, *_files(data), state)
    tpu_ckpt = tf.train.latest_checkpoint(state)
    assert "TPUEmbedding.apply_gradients" in rec.names()
    tpu_keys = keys(tpu_ckpt)
    assert any("/.OPTIMIZER_SLOT/model/embedding_optimizer/m/" in k for k in tpu_keys), sorted(tpu_keys)[:5]
    assert any("C12/.OPTIMIZER_SLOT/model/table_embedding_optimizers/C12/accumulator/" in k for k in tpu_keys)
    assert tf.train.load_checkpoint(tpu_ckpt).get_tensor(table_iter) == 10  # counted on TPU, where the engine updates

    # Resume on CPU (the real, non-TPU branch): restore must match every object, then train on.
    cpu = _config(data, train_steps=30, checkpoint_every_steps=10, checkpoint_dir=state, embedding_optimizer=optimizer)
    monkeypatch.setattr(hardware, "is_tpu_strategy", lambda s: False)
    monkeypatch.setattr(training_loop.Checkpointer, "on_epoch_end", save)
    kill_after(monkeypatch, 20)
    with pytest.raises(Killed):
        training_loop.train(cpu, *_plan(cpu, data), *_files(data), state)
    cpu_ckpt = tf.train.latest_checkpoint(state)
    with open(os.path.join(state, "checkpoint_layout.json")) as fh:  # the CPU run resumed it from step 10
        assert cpu_ckpt.endswith("ckpt-20") and json.load(fh)["embedding_api"].startswith("TPUEmbeddingForServing")
    assert keys(cpu_ckpt) == tpu_keys

    # And back: the TPU branch resumes the CPU checkpoint.
    monkeypatch.setattr(training_loop.Checkpointer, "on_epoch_end", save)
    tpu_branch(Feature.V1)
    back = _config(data, tpu="local", train_steps=30, checkpoint_every_steps=10, checkpoint_dir=state,
                   embedding_optimizer=optimizer)
    back_ckpt, _, run = training_loop.train(back, *_plan(back, data), *_files(data), state)
    assert run["resumed_from_step"] == 20 and run["strategy"] == "RecordingTPUStrategy"
    assert keys(back_ckpt) == tpu_keys
    assert tf.train.load_checkpoint(cpu_ckpt).get_tensor(table_iter) == 20
    assert tf.train.load_checkpoint(back_ckpt).get_tensor(table_iter) == 30


def _files(data):
    return [str(data / "tx" / "Split-train" / "*")], [str(data / "tx" / "Split-eval" / "*")]


def _plan(cfg, data):
    from components.planning.run_plan import derive_plan

    train_files, _ = _files(data)
    manifest = resolved_input.read_manifest(examples_uri(train_files))
    plan = with_run(derive_plan(cfg, manifest, resolved_input.read_statistics(examples_uri(train_files))), vocabulary_dir=manifest.vocabulary_dir)
    return plan, manifest


# `clipvalue` on the embedding optimizer (refused by TFRS's translation before) trains on CPU with
# both table placements: test_checkpoint_round_trip_tpu_to_cpu_and_back's CPU leg (lazy Adam, and
# C12's Adagrad of its own, each clipped; their slots in the CPU checkpoint) and
# tests/test_replicas.py (Adagrad, clipped, one replica against two, every table compared).


def test_artifact_checkpoint_is_found_after_the_artifact_moves(tmp_path):
    """copy_checkpoint writes the `checkpoint` state file with relative paths."""
    import shutil

    prefix = tf.train.Checkpoint(v=tf.Variable(3.0)).save(str(tmp_path / "state" / "ckpt"))
    copy_checkpoint(prefix, str(tmp_path / "model" / "checkpoints"))
    shutil.move(str(tmp_path / "model"), str(tmp_path / "moved"))
    found = tf.train.latest_checkpoint(str(tmp_path / "moved" / "checkpoints"))
    assert found == str(tmp_path / "moved" / "checkpoints" / os.path.basename(prefix))
    assert tf.train.load_checkpoint(found).get_tensor("v/.ATTRIBUTES/VARIABLE_VALUE") == 3.0


def test_sparsecore_refuses_a_table_optimizer_it_would_ignore(tpu_branch, data, tmp_path):
    """A table's own optimizer gets the same SparseCore check as training.embedding_optimizer:
    TF 2.16's TPUEmbeddingV2 would drop C12's clipvalue, so the run stops naming the table."""
    from components.embedding_model.optimizers import EmbeddingOptimizerError

    tpu_branch(Feature.V2)
    cfg = _round_trip_config(data, tpu="local", train_steps=10, checkpoint_every_steps=10)
    with pytest.raises(EmbeddingOptimizerError, match=r"the optimizer of table 'C12'\.clipvalue: SparseCore"):
        training_loop.train(cfg, *_plan(cfg, data), *_files(data), str(tmp_path / "state"))


def test_a_tpu_without_an_embedding_engine_is_refused_before_training(tpu_branch, data, tmp_path):
    """A TPU reporting EmbeddingFeature.UNSUPPORTED (v5e; TFRS would build TPUEmbeddingV0 and
    replicate every table on every chip) with tables placed in TPU embedding: the run stops once
    the strategy exists, before any model is built or step run, naming the feature and the way
    out; the checkpoint layout of such a TPU names no TPUEmbedding."""
    from components.contracts.plan import PlanError

    rec = tpu_branch(Feature.UNSUPPORTED)
    cfg = _config(data, tpu="local", train_steps=10, checkpoint_every_steps=10)
    plan, manifest = _plan(cfg, data)
    assert plan.tables_placed("tpu_embedding") and plan.topology.embedding_api == "sparse_core"  # no chip named
    with pytest.raises(PlanError, match=r"^the TPU \(EmbeddingFeature.UNSUPPORTED\) has no embedding engine .*"
                                        r"size_threshold: null"):
        training_loop.train(cfg, plan, manifest, *_files(data), str(tmp_path / "state"))
    assert "TPUStrategy" in rec.names()
    assert not [c["call"] for c in rec.calls if c["call"].startswith(("TPUEmbedding", "TPUStrategy.run", "TPUStrategy.distribute"))]
    assert not (tmp_path / "state").exists()
    layout = hardware.checkpoint_layout(hardware.distribution_strategy(cfg), 32)
    assert (layout.kind, layout.hardware_api) == ("A", "none") and layout.embedding_api.startswith("none (EmbeddingFeature.UNSUPPORTED")


def _assert_wide_tables_in_tpu_embedding(rec, cfg, model_uri, mid):
    """training.wide on the TPU branch (`mid`: the mid-level API the run built): the wide part's one-dimensional tables of TPU-embedding
    tables are TPU-embedding tables themselves, each TableConfig carrying the wide optimizer (lazy Adam, a bag)
    while the deep tables keep the embedding optimizer; on SparseCore, TensorFlow's own
    TPUEmbeddingV2 stacks them (dim 1, padded, apart from the deep tables: another dim and
    optimizer)."""
    from components.contracts.plan import EmbeddingPlan

    with open(os.path.join(model_uri, "embedding_plan.json")) as fh:
        plan = EmbeddingPlan.from_json(fh.read())
    wide_tpu = {n for n, t in plan.tables_placed("tpu_embedding").items() if t.wide_of}
    assert wide_tpu and all(plan.tables[n].dim == 1 for n in wide_tpu)
    init = [c for c in rec.calls if c["call"] == f"{mid}.__init__"][-1]
    configs = {f.table.name: f.table for f in tf.nest.flatten(init["values"]["feature_config"])}
    assert cfg.training.wide.optimizer.name == "adam"  # the wide part's default (lazy Adam 0.01)
    for table in wide_tpu:
        assert isinstance(configs[table].optimizer, tf.tpu.experimental.embedding.Adam), table
        # Adam's rate is a function of the step (Keras' bias correction, optimizers.tpu_learning_rate)
        assert callable(configs[table].optimizer.learning_rate)
        assert plan.tables[table].optimizer["learning_rate"] == pytest.approx(cfg.training.wide.optimizer.learning_rate)
        assert configs[table].optimizer.lazy_adam and configs[table].combiner == "sum"
        deep = configs[plan.tables[table].wide_of]
        assert deep.optimizer is None or not isinstance(deep.optimizer, tf.tpu.experimental.embedding.Adam)
    if mid == "TPUEmbeddingV2":
        stacks = rec.mids[-1]._stacked_table_to_tables  # pylint: disable=protected-access
        wide_stacks = [ts for ts in stacks.values() if {t.name for t in ts} & wide_tpu]
        assert wide_stacks and all({t.name for t in ts} <= wide_tpu for ts in wide_stacks)  # never with a deep table


def _weighted_raw_config(data, feature, **training):
    """The module's config with the wide part on, C12 (a TPU-embedding table) and C1 (a TensorCore
    table) weighed by the numeric column I2 and, on V1 only, C24 (a TPU-embedding table) a
    sequence feature attending from C26 (SparseCore refuses those, D1). With the wide part, a
    weighted feature's wide feature takes its weights, a sequence feature's reads the same
    positions."""
    raw = _raw_config(data, wide={"enabled": True}, **training)
    for f in raw["categorical_features"]:
        if f["name"] in ("C12", "C1"):
            f["weight_column"] = "I2"
        if f["name"] == "C24" and feature == "V1":
            f["sequence"] = {"length": 4, "pooling": "attention", "query": "C26"}
    return raw


@pytest.fixture(scope="module")
def weighted_data(data, tmp_path_factory):
    """The module's rows preprocessed again with C12 and C1 weighed by I2 (the session's
    preprocessing has no weights); read-only. One run serves V1 and V2: preprocessing reads each
    feature's column, table, separator, max_length and weight column (the manifest's entries, what
    the Trainer holds the config to), not how the model pools it, so V1's sequence feature trains
    on the same examples."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from components.config.loading import parse_config
    from components.embedding_preprocess.run import run_preprocessing

    root = tmp_path_factory.mktemp("weighted")
    run_preprocessing(
        beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=in_memory"])),
        parse_config(_weighted_raw_config(data, "V2")), {"train": str(data / "train.csv"), "eval": str(data / "eval.csv")},
        str(root / "vocab"), {s: str(root / "tx" / f"Split-{s}") for s in ("train", "eval")}, str(root / "stats"),
        input_format="csv",
    )
    return root


@pytest.mark.slow(reason="a TPU-branch Trainer run (20 steps, the held-out selection) with weighted (V1: and sequence) "
                         "features and the wide part, on the module's weighted preprocessing")
@pytest.mark.parametrize("feature", ["V1", "V2"])
def test_tpu_branch_calls_bind_and_stay_in_scope_and_run(feature, tpu_branch, data, weighted_data, monkeypatch):
    """run_fn on the TPU branch: every TPU entry point is called with arguments that bind to the
    installed signatures, the mid-level API is created in strategy.scope() and every lookup runs in
    strategy.run; everything after training (the held-out selection's CPU twin, the evaluation, the
    SavedModel) runs on CPU from the TPU run's checkpoints.

    The run has every input kind the TPU layer takes (one run checks both): a weighted feature of a
    TPU-embedding table (C12, weighed by the numeric column I2) gives the TPU layer its weights:
    the lookup is bound with a weights structure holding C12's per-ID weights beside its IDs (None
    for the unweighted features), and the whole run (TensorCore table C1 weighed too) completes
    through the CPU post-training path. V1 adds a sequence feature of a TPU-embedding table (C24,
    attending from C26); SparseCore refuses those (D1), so on V2 the run is weighted only, with
    TF's real TPUEmbeddingV2 stacking the tables and the checkpoint read back row for row. The
    wide part (training.wide) trains in TPU embedding with its own optimizer
    (`_assert_wide_tables_in_tpu_embedding`)."""
    from components.config.loading import parse_config
    from components.data_io.examples_io import transformed_rows

    rec = tpu_branch(getattr(Feature, feature))
    mid = "TPUEmbeddingV2" if feature == "V2" else "TPUEmbedding"
    # The artifact keeps the held-out selection's best checkpoint (step 10 or 20): the SparseCore
    # stand-in keeps its tables as placed, so the step's last tables are the artifact's.
    monkeypatch.setattr(EMB.TPUEmbeddingV2, "apply_updates", False)
    # With the held-out selection on (run to the end): its CPU twin reads the TPU run's checkpoints.
    cfg = parse_config(_weighted_raw_config(data, feature, tpu="local", train_steps=20, checkpoint_every_steps=10,
                                            pipeline_execution_with_tensor_core=True,
                                            early_stopping={"evaluations": 2, "patience": 100}))
    fn_args = _fn_args(weighted_data, cfg, f"tpu-{feature}")
    trainer_module.run_fn(fn_args)
    model_uri = os.path.dirname(fn_args.serving_model_dir)
    names = rec.names()
    for expected in ("TPUClusterResolver", "experimental_connect_to_cluster", "initialize_tpu_system",
                     "TPUStrategy", "TPUStrategy.scope", "TPUStrategy.distribute_datasets_from_function",
                     "TPUStrategy.run", f"{mid}.__init__", f"{mid}.build", f"{mid}.apply_gradients"):
        assert expected in names, (expected, sorted(set(names)))
    lookups = [c for c in rec.calls if c["call"] in (f"{mid}.enqueue", f"{mid}.dequeue", f"{mid}.__call__")]
    assert lookups and all(c["in_run"] for c in lookups)
    init = next(c for c in rec.calls if c["call"] == f"{mid}.__init__")
    assert init["in_scope"] and "pipeline_execution_with_tensor_core" in init["args"]
    # the weights, bound beside the IDs (enqueue on V1, the call on V2)
    weights = [c["values"].get("weights") for c in lookups if c["call"] != f"{mid}.dequeue"]
    assert any(w is not None and w.get("C12") is not None and w.get("C24") is None for w in weights), weights[:1]
    assert any(w is not None and w.get("C12__wide") is not None for w in weights)
    features = init["values"]["feature_config"]
    assert features["C12"].output_shape == features["C12__wide"].output_shape == [64 // REPLICAS]
    if feature == "V1":
        # the sequence keeps max_sequence_length; output_shape unset, or TF 2.16 would ignore the length
        assert (features["C24"].max_sequence_length, features["C24"].output_shape) == (4, None)
        assert (features["C24__wide"].max_sequence_length, features["C24__wide"].table.dim) == (4, 1)
    # Everything after training ran on CPU from the checkpoint: the artifact is complete.
    for name in (EVAL_METRICS_FILE, TPU_RULES_FILE, TRAINING_RUN_FILE, "embedding_plan.json"):
        assert os.path.exists(os.path.join(model_uri, name)), name
    run = json.load(open(os.path.join(model_uri, TRAINING_RUN_FILE)))
    assert run["final_step"] == 20 and run["strategy"] == "RecordingTPUStrategy"
    assert [e["step"] for e in run["selection"]["evaluations"]] == [10, 20]
    assert run["model_step"] == run["selection"]["best_step"] in (10, 20)
    plan = json.load(open(os.path.join(model_uri, "embedding_plan.json")))
    assert plan["checkpoint_layout"]["kind"] == ("B" if feature == "V2" else "A")
    assert plan["checkpoint_layout"]["per_replica_batch_size"] == 64 // REPLICAS
    assert plan["checkpoint_layout"]["num_replicas"] == REPLICAS
    loaded = tf.saved_model.load(os.path.join(model_uri, "Format-Serving"))
    eval_pattern = str(weighted_data / "tx" / "Split-eval" / "*")
    records = transformed_rows(eval_pattern, resolved_input.read_manifest(examples_uri([eval_pattern])), 8)
    probs = loaded.signatures["serving_default"](examples=tf.constant(records))["probabilities"].numpy()
    assert probs.shape == (8, 1) and np.isfinite(probs).all()
    assert tf.train.latest_checkpoint(os.path.join(model_uri, CHECKPOINT_DIR))
    if feature == "V2":
        _assert_checkpoint_tables_are_the_trained_ones(rec.mids[-1], model_uri)
    _assert_wide_tables_in_tpu_embedding(rec, cfg, model_uri, mid)


@pytest.fixture(scope="module")
def prev(data):
    """The last blessed model the SparseCore warm-start tests start from (read-only): a 10-step
    Trainer run (run_fn) on CPU, one variable per table."""
    from components.embedding_trainer import warm_start

    fn_args = _fn_args(data, _config(data, train_steps=10, checkpoint_every_steps=10), "prev-warm-start")
    trainer_module.run_fn(fn_args)
    return warm_start.previous_model(os.path.dirname(fn_args.serving_model_dir))


@pytest.mark.slow(reason="a TPU-branch warm start from a CPU Trainer run")
def test_sparsecore_warm_start_places_the_last_models_tables_in_tfs_stacks(tpu_branch, data, prev, tmp_path, monkeypatch):
    """D4: the last blessed model (trained on CPU: one variable per table) warm-starts a SparseCore
    run. TF's TPUEmbeddingV2 stacks the tables at 2 replicas x 4 SparseCores; every table and its
    FTRL slots come out of TF's stacks, through TF's index mapping, as the previous model had them
    (the stand-in step is told not to update tables, so what training starts from is what it ends with).
    Restored by name, the stacks of several tables would start fresh and a lone one permuted."""
    from components.embedding_model.layouts import CheckpointTables
    from components.embedding_model.checkpoint_keys import VARIABLE_VALUE, table_checkpoint_key

    rec = tpu_branch(Feature.V2)
    monkeypatch.setattr(EMB.TPUEmbeddingV2, "apply_updates", False)
    cfg = _config(data, tpu="local", train_steps=10, checkpoint_every_steps=10)
    plan, manifest = _plan(cfg, data)
    _, _, run = training_loop.train(cfg, plan, manifest, *_files(data), str(tmp_path / "state"), warm_from=prev)
    mid = rec.mids[-1]
    old_tables = CheckpointTables(prev.checkpoint, prev.plan)
    old = tf.train.load_checkpoint(prev.checkpoint)
    for name, t in plan.tables_placed("tpu_embedding").items():
        np.testing.assert_array_equal(tpu_harness.logical_table(mid, name, t.rows, t.dim).numpy(), old_tables.read(name),
                                      err_msg=name)
        base = table_checkpoint_key(name, "tpu_embedding")[: -len(VARIABLE_VALUE)]
        accumulator = old.get_tensor(f"{base}/.OPTIMIZER_SLOT/model/embedding_optimizer/accumulator{VARIABLE_VALUE}")
        np.testing.assert_array_equal(tpu_harness.logical_table(mid, name, t.rows, t.dim, "accumulators").numpy(), accumulator,
                                      err_msg=name)
    stacks = run["warm_start"]["sparse_core"]["stacks"]
    assert any(len(s["tables"]) > 1 for s in stacks.values()), stacks
    assert all(s["slots"] == ["accumulator", "linear"] for s in stacks.values()), stacks


def _refuses_plan_changes(data, state, rec=None, **tpu):
    """A state trained to step 10 under the test config, started again in that directory with the
    wide part on, or with one table's dim changed: each is refused before any restore or step, in
    one line naming the checkpoint, both plans and what differs, instead of TF's "Found 1 Python
    objects that were not bound" (CPU) or stacks silently starting fresh (TPU)."""
    from components.config.loading import parse_config
    from components.embedding_model.sparsecore_state import PlanMismatch

    saved = set(os.listdir(state))
    wide = _config(data, train_steps=20, checkpoint_every_steps=10, checkpoint_dir=state, wide={"enabled": True}, **tpu)
    raw = _raw_config(data, train_steps=20, checkpoint_every_steps=10, checkpoint_dir=state, **tpu)
    next(f for f in raw["categorical_features"] if f["name"] == "C1")["dim"] = 8  # 16 by default
    dim = parse_config(raw)
    for changed, what in ((wide, r"tables only in this run: C12__wide, C1__wide, "), (dim, r"tables\.C1\.dim 16 -> 8")):
        if rec is not None:
            rec.calls.clear()
        with pytest.raises(PlanMismatch) as err:
            training_loop.train(changed, *_plan(changed, data), *_files(data), state)
        line = str(err.value)
        assert "\n" not in line and "ckpt-10" in line and re.search(what, line), line
        assert "wide part off" in line and ("+ 7 wide" in line if changed is wide else True), line
        if rec is not None:  # refused before any step: no lookup, no update
            assert not any(c["call"].endswith(("__call__", "apply_gradients")) for c in rec.calls)
            assert changed is dim or "stacks only in this run" in line, line  # the wide tables' SparseCore stacks
        assert set(os.listdir(state)) == saved  # nothing written over the checkpoint's record


@pytest.mark.slow(reason="two TPU-branch runs and a CPU run, then refused resumes")
def test_a_sparsecore_checkpoint_is_not_resumed_on_another_layout_or_plan(tpu_branch, data, tmp_path, monkeypatch):
    """D4: a training state written by SparseCore stacks (2 replicas) is not resumed on CPU (one
    variable per table), nor is a CPU state resumed on SparseCore: the run stops naming both
    layouts, instead of starting the stacked tables fresh or permuted. Neither state is resumed
    under another plan, on its own platform (`_refuses_plan_changes`)."""
    from components.embedding_model.sparsecore_state import LayoutMismatch

    state = str(tmp_path / "state")
    rec = tpu_branch(Feature.V2)
    cfg = _config(data, tpu="local", train_steps=10, checkpoint_every_steps=10, checkpoint_dir=state)
    training_loop.train(cfg, *_plan(cfg, data), *_files(data), state)
    _refuses_plan_changes(data, state, rec, tpu="local")
    cpu = _config(data, train_steps=20, checkpoint_every_steps=10, checkpoint_dir=state)
    monkeypatch.setattr(hardware, "is_tpu_strategy", lambda s: False)
    monkeypatch.setattr(hardware, "distribution_strategy", lambda c: tf.distribute.get_strategy())
    with pytest.raises(LayoutMismatch, match=r"TPUEmbeddingV2 \(SparseCore\) wrote them.*num_replicas\": 2.*"
                                             r"this run is TPUEmbeddingForServing"):
        training_loop.train(cpu, *_plan(cpu, data), *_files(data), state)

    other = str(tmp_path / "cpu_state")
    training_loop.train(_config(data, train_steps=10, checkpoint_every_steps=10), *_plan(cpu, data), *_files(data), other)
    _refuses_plan_changes(data, other)
    monkeypatch.undo()
    tpu_branch(Feature.V2)
    back = _config(data, tpu="local", train_steps=20, checkpoint_every_steps=10)
    with pytest.raises(LayoutMismatch, match=r"TPUEmbeddingForServing .* wrote them .* this run is TPUEmbeddingV2"):
        training_loop.train(back, *_plan(back, data), *_files(data), other)


def test_sequence_features_on_sparsecore_are_refused_before_the_build(tpu_branch, data, tmp_path):
    """D1: a sequence feature of a TPU-embedding table (C12) on SparseCore stops the run before
    any model is built, naming the feature, its table and what to change; TF's own constructor
    would fail on it with "Cannot iterate over a shape with unknown rank"."""
    from components.config.loading import parse_config
    from components.embedding_model.model import SparseCoreUnsupported
    rec = tpu_branch(Feature.V2)
    raw = _raw_config(data, tpu="local", train_steps=10, checkpoint_every_steps=10)
    next(f for f in raw["categorical_features"] if f["name"] == "C12")["sequence"] = {"length": 4, "pooling": "mean"}
    cfg = parse_config(raw)
    plan, manifest = _plan(cfg, data)
    assert plan.feature_table("C12").placement == "tpu_embedding" and plan.features["C12"].max_sequence_length == 4
    with pytest.raises(SparseCoreUnsupported, match=r"'C12' \(table 'C12', length 4\).*size_threshold"):
        training_loop.train(cfg, plan, manifest, *_files(data), str(tmp_path / "state"))
    assert not any(c["call"].startswith("TPUEmbeddingV2") for c in rec.calls)


@pytest.mark.slow(reason="a CPU Trainer run (shared), then two TPU-branch warm starts refused")
def test_a_sparsecore_warm_start_missing_a_dense_variable_is_refused(tpu_branch, data, prev, tmp_path, monkeypatch):
    """A warm-start checkpoint that lacks a dense variable (written here by a model with one cross
    layer fewer) is refused before training on SparseCore, naming the variable: the host twin
    must restore from it exactly (both directions). Past that check (switched off here), the
    TPU model's own dense network, restored lazily at its first step, is checked then, before any
    checkpoint is written. On today's code both warm-started silently with the kernel fresh."""
    from components.config.loading import parse_config
    from components.embedding_model.sparsecore_state import LayoutMismatch
    from components.embedding_trainer import warm_start

    write = warm_start.warm_start_checkpoint

    def lossy(prev_model, cfg, plan, manifest, fresh, out_prefix):  # the checkpoint of a model without the last cross layer
        raw = _raw_config(data, tpu="local", train_steps=10, checkpoint_every_steps=10)
        raw["training"]["cross_layers"] = cfg.training.cross_layers - 1
        smaller = model_building.build_model(plan, manifest, parse_config(raw), for_training=True)
        smaller(training_data.sample_batch(_files(data)[0], manifest, plan, 8))
        smaller.create_optimizer_slots()
        return write(prev_model, cfg, plan, manifest, smaller, out_prefix)

    monkeypatch.setattr(warm_start, "warm_start_checkpoint", lossy)
    tpu_branch(Feature.V2)
    monkeypatch.setattr(EMB.TPUEmbeddingV2, "apply_updates", False)
    cfg = _config(data, tpu="local", train_steps=10, checkpoint_every_steps=10)
    plan, manifest = _plan(cfg, data)
    last = f"cross_{cfg.training.cross_layers - 1}"
    with pytest.raises(LayoutMismatch, match=rf"checkpoint .*warm_start/ckpt does not hold exactly this model's variables "
                                              rf"\(in the model only: .*{last}.*kernel"):
        training_loop.train(cfg, plan, manifest, *_files(data), str(tmp_path / "state"), warm_from=prev)
    assert not (tmp_path / "state" / "checkpoint").exists()

    # the TPU model's own check after its first step, with the host check off
    check = training_state.require_consumed
    for module in (training_state, training_loop):  # the host's check before training, the model's after its first step
        monkeypatch.setattr(module, "require_consumed", lambda status, prefix, model, model_side_only=False: (
            check(status, prefix, model, model_side_only) if model_side_only else None))
    with pytest.raises(LayoutMismatch, match=rf"in the model only: .*{last}.*kernel"):
        training_loop.train(cfg, plan, manifest, *_files(data), str(tmp_path / "state2"), warm_from=prev)
    assert not (tmp_path / "state2" / "checkpoint").exists()
