"""IDs per chip on SparseCore (components/embedding_trainer/sparsecore_limits.py): the statistics'
IDs per example checked against TF 2.16's `max_ids_per_chip_per_sample` buffer before training.

The buffer's size and the stacks' sample counts are TF's own: one test builds TF 2.16.2's real
`TPUEmbeddingV2` on CPU (tests/tpu_harness.py) and reads both from it. The rest are plain cases on
hand-built plans and statistics: certified, refused (naming the feature, its measured maximum and
mean, the bound and the way out), not certified (reported, not refused), statistics missing, a
wide feature reading its feature's IDs, and a per-replica batch the kernel refuses.
"""
import dataclasses

import pytest

import components  # noqa: F401

from components.contracts.plan import PlanError
from components.planning.derivation import optimizer_spec
from components.contracts.statistics import EmbeddingStatistics
from components.config.training_schema import OptimizerConfig
from components.embedding_trainer import sparsecore_limits as sl
from tests import tpu_harness
from components.planning.fitting import with_run
from components.planning.derivation import hand_built_plan

ADAGRAD = optimizer_spec(OptimizerConfig(name="adagrad", learning_rate=0.1))


def _plan(features=None, tables=None, batch=256, chips=2):
    tables = tables or {"items": (4096, 16, "tpu_embedding"), "cat": (10, 16, "tpu_embedding"),
                        "small": (40, 4, "tensor_core")}
    features = features or {"item": "items", "history": "items", "c": "cat", "s": "small"}
    return hand_built_plan(tables, features=features, global_batch_size=batch, num_chips=chips,
                                    optimizer=ADAGRAD)


def _statistics(per_feature, batch=256, tables=None):
    """Statistics with only the train split's IDs per example (and optionally per-table batches) set."""
    features = {f: {"splits": {"train": {"ids_per_example": dict(v)}}} for f, v in per_feature.items()}
    return EmbeddingStatistics(batch, (8,), {}, features, {}, tables or {}, 0, {})


LIGHT = {"item": {"mean": 1.0, "max": 1}, "c": {"mean": 1.0, "max": 1}}


def test_within_the_bound_is_certified_for_the_runs_topology():
    stats = _statistics({**LIGHT, "history": {"mean": 30.0, "max": 90}})
    report = sl.check_ids_per_chip(_plan(), stats, num_replicas=2, sparse_cores_per_chip=4, per_replica_batch=128)
    assert report["passed"] and report["violations"] == [] and report["not_certified"] == []
    (name, stack), = report["stacks"].items()  # items and cat: same dim and optimizer, one stack
    assert stack["tables"] == ["cat", "items"] and stack["features"] == ["c", "history", "item"]
    assert stack["sample_count"] == 3 * 128 and stack["bound"] == 64 * 3 * 128
    assert stack["ids_per_replica_batch_max"] == 128 * (1 + 90 + 1)
    assert stack["verdict"] == sl.CERTIFIED and stack["minibatches_certified"] >= 1
    assert stack["ids_per_example"]["history"]["source"] == "statistics"
    assert "small" not in str(report["stacks"])  # TensorCore tables have no SparseCore buffer


def test_over_the_bound_on_average_is_refused_naming_feature_maximum_and_way_out():
    stats = _statistics({**LIGHT, "history": {"mean": 300.0, "max": 900}})
    with pytest.raises(sl.IdsPerChipError) as err:
        sl.check_ids_per_chip(_plan(), stats, 2, 4, 128)
    msg = str(err.value)
    assert isinstance(err.value, PlanError) and isinstance(err.value, ValueError)
    assert "history: max 900, mean 300.0" in msg
    assert "bound 24576" in msg and "max_ids_per_chip_per_sample 64" in msg
    assert "max_length <= 188 on history" in msg  # 128 x (1 + 188 + 1) + padding fits 24576
    assert "size_threshold >= 4096" in msg and "items" in msg
    # the same, returned instead of raised
    report = sl.check_ids_per_chip(_plan(), stats, 2, 4, 128, raise_on_violation=False)
    (stack,) = report["stacks"].values()
    assert not report["passed"] and stack["verdict"] == sl.EXCEEDS and stack["max_length_to_certify"] == 188


def test_padding_alone_over_the_bound_on_a_large_slice_is_refused_before_training():
    """One feature, 20 IDs per example, per-replica batch 64, 4 SparseCores per chip, 64 replicas:
    1,280 IDs per replica batch against a buffer of 64 x 64 = 4,096, but 1,024 partitions of up to
    7 padding slots each: every step overflows (simulated packed IDs 5,696-6,000), so the check
    refuses it, naming the stack and a way out, instead of reporting it `not_certified`."""
    plan = _plan(features={"item": "items"}, tables={"items": (1 << 20, 16, "tpu_embedding")}, batch=64 * 64, chips=64)
    stats = _statistics({"item": {"mean": 20.0, "max": 20}}, batch=64 * 64)
    with pytest.raises(sl.IdsPerChipError) as err:
        sl.check_ids_per_chip(plan, stats, num_replicas=64, sparse_cores_per_chip=4, per_replica_batch=64)
    msg = str(err.value)
    assert "stack " in msg and "bound 4096 IDs" in msg and "with the padding of 1024 partitions" in msg
    assert "max_length <= 8 on item" in msg and "size_threshold >=" in msg  # 64 x 8 IDs + their padding fit
    (stack,) = sl.check_ids_per_chip(plan, stats, 64, 4, 64, raise_on_violation=False)["stacks"].values()
    assert (stack["verdict"], stack["ids_per_replica_batch_mean"], stack["mean_padded_one_minibatch"]) == (
        sl.EXCEEDS, 1280.0, 1280 + 1024 * 7)
    # the same feature on 2 replicas (32 partitions): 1,280 + 224 padding fits, and so does the maximum
    small = sl.check_ids_per_chip(_plan(features={"item": "items"}, tables={"items": (1 << 20, 16, "tpu_embedding")},
                                        batch=128, chips=2), stats, 2, 4, 64)
    assert [s["verdict"] for s in small["stacks"].values()] == [sl.CERTIFIED]


def test_maxima_over_the_bound_with_a_mean_within_it_is_reported_not_refused():
    # padding counts: one feature whose maximum fills the buffer exactly is not certified
    plan = _plan(features={"item": "items"}, tables={"items": (4096, 16, "tpu_embedding")})
    stats = _statistics({"item": {"mean": 10.0, "max": 64}})
    report = sl.check_ids_per_chip(plan, stats, num_replicas=1, sparse_cores_per_chip=4, per_replica_batch=128)
    (name, stack), = report["stacks"].items()
    assert report["passed"] and report["not_certified"] == [name]
    assert stack["verdict"] == sl.NOT_CERTIFIED and stack["ids_per_replica_batch_max"] == stack["bound"] == 8192
    # 4 SparseCores x 4 physical replicas = 16 partitions, 7 padding slots each at worst: 63 x 128 + 112 fits
    assert stack["max_length_to_certify"] == 63 and "max_length <= 63 on item" in stack["way_out"]


def test_missing_statistics_are_reported_unknown_and_the_plans_figures_are_used_when_present():
    report = sl.check_ids_per_chip(_plan(), None, 2, 4, 128)
    (name, stack), = report["stacks"].items()
    assert report["passed"] and stack["verdict"] == sl.UNKNOWN and report["not_certified"] == [name]
    assert "c, history, item" in stack["reason"] and "rerun preprocessing" in stack["reason"]
    # a feature the statistics lack: unknown, not refused
    partial = sl.check_ids_per_chip(_plan(), _statistics(LIGHT), 2, 4, 128)
    assert next(iter(partial["stacks"].values()))["verdict"] == sl.UNKNOWN
    # no statistics, but the plan records the same train-split figures (derive_plan's ids_per_example)
    plan = _plan()
    figures = {"item": {"mean": 1.0, "p99": 1, "max": 1}, "c": {"mean": 1.0, "p99": 1, "max": 1},
               "history": {"mean": 300.0, "p99": 800, "max": 900}}
    plan = dataclasses.replace(plan, features={
        n: dataclasses.replace(f, ids_per_example=figures.get(n)) for n, f in plan.features.items()})
    with pytest.raises(sl.IdsPerChipError, match="history: max 900, mean 300.0"):
        sl.check_ids_per_chip(plan, None, 2, 4, 128)
    report = sl.check_ids_per_chip(plan, None, 2, 4, 128, raise_on_violation=False)
    assert next(iter(report["stacks"].values()))["ids_per_example"]["history"]["source"] == "plan"


def test_no_tpu_embedding_tables_means_nothing_to_check():
    plan = _plan(features={"s": "small"}, tables={"small": (40, 4, "tensor_core")})
    report = sl.check_ids_per_chip(plan, None, 2, 4, 128)
    assert report["passed"] and report["stacks"] == {}


def test_a_wide_feature_counts_its_features_ids_again():
    plan = _plan(features={"item": "items", "item__wide": "items__wide"},
                 tables={"items": (4096, 8, "tpu_embedding"), "items__wide": (4096, 1, "tpu_embedding")})
    plan = dataclasses.replace(
        plan,
        tables={**plan.tables, "items__wide": dataclasses.replace(plan.tables["items__wide"], wide_of="items")},
        features={**plan.features, "item__wide": dataclasses.replace(plan.features["item__wide"], wide_of="item")})
    stats = _statistics({"item": {"mean": 40.0, "max": 50}}, tables={"items": {"batches": {"ids_per_batch_max": 9000}}})
    report = sl.check_ids_per_chip(plan, stats, 2, 4, 128)
    (stack,) = report["stacks"].values()  # dims 8 and 1 both pad to 8: one stack
    assert stack["features"] == ["item", "item__wide"] and stack["sample_count"] == 2 * 128
    assert stack["ids_per_example"]["item__wide"]["reads"] == "item"
    assert stack["ids_per_replica_batch_max"] == 128 * 2 * 50 and stack["verdict"] == sl.CERTIFIED
    # the per-batch figures are reported, never used to certify (training shuffles)
    order = stack["preprocessing_order"]
    assert order["used"] is False and order["busiest_global_batch_ids_at_most"] == 2 * 9000


def test_a_sample_count_not_a_multiple_of_the_sparse_cores_is_refused():
    plan = _plan(features={"item": "items"}, tables={"items": (4096, 16, "tpu_embedding")}, batch=6)
    with pytest.raises(sl.IdsPerChipError, match="not a multiple of the 4 SparseCores per chip"):
        sl.check_ids_per_chip(plan, _statistics({"item": {"mean": 1.0, "max": 1}}, batch=6), 2, 4, 3)


def test_the_bound_and_the_sample_counts_are_tfs_own(monkeypatch):
    """TF 2.16.2's real TPUEmbeddingV2, built on CPU for the model's feature configs at 2 replicas:
    its hard-coded limits are the module's, and its per-stack sample counts (what the kernel's buffer
    is sized from) are the ones the check uses."""
    from components.embedding_model import tf_objects
    from components.embedding_trainer import model_building

    plan = _plan()
    replicas, per_replica = 2, 128
    cls = tpu_harness.recording_strategy_class(replicas, sparse_cores_per_chip=4)
    tpu_harness.let_pass_type_check(monkeypatch, cls)
    strategy = cls()
    with strategy.scope():
        _, tpu_opt = model_building.embedding_optimizers(ADAGRAD)
        tables = model_building.table_optimizers(plan, ADAGRAD)
        configs = tf_objects.feature_configs(plan, output_batch=per_replica, on_tpu=True,
                                             table_optimizers={n: o.tpu for n, o in tables.items()})
    configs = {n: c for n, c in configs.items() if plan.feature_table(n).placement == "tpu_embedding"}
    mid = tpu_harness.build_real_v2(strategy, configs, tpu_opt)
    assert mid.max_ids_per_chip_per_sample == sl.MAX_IDS_PER_CHIP_PER_SAMPLE
    assert mid.max_minibatches_per_sc == sl.MAX_MINIBATCHES_PER_SC
    report = sl.check_ids_per_chip(plan, _statistics({**LIGHT, "history": {"mean": 2.0, "max": 3}}),
                                   replicas, 4, per_replica)
    assert {s: r["sample_count"] for s, r in report["stacks"].items()} == dict(mid._table_to_sample_count)  # pylint: disable=protected-access


def test_the_trainer_checks_ids_per_chip_before_building_on_sparsecore(trainer_data, monkeypatch):
    """Wiring: on the SparseCore branch (the harness's 2-replica TPU strategy) the Trainer's
    `model_building.build_training_model` runs the check with the run's replicas, SparseCores and per-replica
    batch before anything is built; a buffer too small for the measured IDs stops it naming a
    feature, and the report of a run that fits is kept for the TPU-rules report."""
    import functools

    from components.embedding_trainer import hardware, model_building, resolved_input
    from tests.stages import examples_uri
    from components.planning.run_plan import derive_plan
    from tests.stages import trainer_config

    strategy = tpu_harness.install_sparsecore(monkeypatch, replicas=2, sparse_cores_per_chip=4)
    cfg = trainer_config(trainer_data)
    train_files = [str(trainer_data / "tx" / "Split-train" / "*")]
    manifest = resolved_input.read_manifest(examples_uri(train_files))
    plan = with_run(derive_plan(cfg, manifest, resolved_input.read_statistics(examples_uri(train_files))), vocabulary_dir=manifest.vocabulary_dir)
    per_replica = cfg.training.batch_size // 2

    def placed():
        return hardware.Hardware(strategy, True, 2, per_replica, hardware.checkpoint_layout(strategy, per_replica))

    built = []
    monkeypatch.setattr(model_building, "build_model", lambda *a, **k: built.append(1) or (_ for _ in ()).throw(RuntimeError("built")))
    monkeypatch.setattr(model_building, "check_ids_per_chip", functools.partial(sl.check_ids_per_chip, max_ids_per_chip_per_sample=1))
    with pytest.raises(sl.IdsPerChipError, match=r"IDs per example: \w+: max \d+, mean .*Way out"):
        model_building.build_training_model(cfg, plan, manifest, placed())
    assert not built
    monkeypatch.setattr(model_building, "check_ids_per_chip", sl.check_ids_per_chip)
    h = placed()
    with pytest.raises(RuntimeError, match="built"):  # checked, passed, then the build starts
        model_building.build_training_model(cfg, plan, manifest, h)
    assert h.ids_per_chip["passed"] and h.ids_per_chip["topology"]
