"""Embedding plan: derivation from config + statistics, rendering to TF configs, optimizer mapping."""
import math

import pytest

import components  # noqa: F401
import tensorflow as tf

from components.config.loading import parse_config
from components.config.training_schema import OptimizerConfig, ScheduleConfig
from components.contracts.manifest import VocabularyEntry, VocabularyManifest
from components.contracts.plan import EmbeddingPlan
from components.contracts.statistics import EmbeddingStatistics
from components.planning.derivation import fourth_root_dim, MAX_RULE_DIM, optimizer_spec
from components.planning.fitting import hardware_num_chips
from components.contracts.plan import PlanError
from components.embedding_model.tf_objects import (dense_id_widths, feature_configs, gradient_multiplier,
                                                   learning_rate, table_configs)
from components.planning.run_plan import derive_plan
from components.planning.fitting import sized_for, with_run


def _config(**training):
    return parse_config({
        "input": {"path": "unused.csv"},
        "label": "label",
        "tables": [{"name": "shared", "dim": 8}],
        "categorical_features": [
            {"name": "A", "table": "shared"},
            {"name": "B", "table": "shared"},
            {"name": "big"},  # dim from categorical_defaults (16): not explicit
            {"name": "small", "dim": 4},
        ],
        "training": {"embedding": {"size_threshold": 1000, "topology": {"num_chips": 2, "sparse_cores_per_chip": 4}},
                     **training},
    })


VOCABULARIES = {
    "shared": {"rows": 5001, "size": 5000, "num_oov_buckets": 1},
    "big": {"rows": 100_010, "size": 100_000, "num_oov_buckets": 10},
    "small": {"rows": 11, "size": 10, "num_oov_buckets": 1},
}


def _manifest(vocabularies=VOCABULARIES) -> VocabularyManifest:
    """A manifest with only what the plan reads (rows, size, OOV buckets) set."""
    entries = {n: VocabularyEntry(f"{n}.txt", f"{n}.counts.txt", v["size"], v["size"], v["num_oov_buckets"],
                                  v["rows"], None, "mean", ()) for n, v in vocabularies.items()}
    return VocabularyManifest("unused", "label", {}, (), (), entries)


MANIFEST = _manifest()


def _statistics():
    limits = {"max_ids_per_table": 120, "max_unique_ids_per_table": 60, "headroom": 0.2, "basis": "busiest"}
    return {
        "tables": {"big": {"shards": {"8": {"suggested_sparsecore_limits": limits}}}},
        "features": {"A": {"splits": {"train": {"ids_per_example": {"mean": 1.5, "p99": 3, "max": 4}}}}},
    }


def _typed(stats) -> EmbeddingStatistics:
    """The statistics sections the plan reads, as the typed statistics."""
    return EmbeddingStatistics(64, (8,), {}, stats["features"], {}, stats["tables"], 0, {})


def test_plan_places_sizes_and_limits_tables():
    cfg = _config()
    plan = derive_plan(cfg, MANIFEST, _typed(_statistics())).to_dict()  # the JSON form the artifact holds
    t = plan["tables"]
    assert t["big"]["placement"] == "tpu_embedding" and t["shared"]["placement"] == "tpu_embedding"
    assert t["small"]["placement"] == "tensor_core"  # 11 rows <= size_threshold 1000
    assert (t["shared"]["dim"], t["big"]["dim"], t["small"]["dim"]) == (8, 16, 4)
    assert t["big"]["initializer"]["stddev"] == pytest.approx(0.2 / math.sqrt(16))
    assert plan["features"]["A"]["table"] == plan["features"]["B"]["table"] == "shared"
    assert t["shared"]["features"] == ["A", "B"]
    # adagrad (the default embedding optimizer): one slot. Sized for SparseCore (no chip named): big's
    # rows padded to a multiple of 8 x 8 SparseCores (2 chips x 4) and sharded over 2 chips; small replicated
    assert plan["topology"]["embedding_api"] == "sparse_core" and plan["topology"]["chip"] is None
    assert t["big"]["memory"]["total_bytes"] == 100_032 * 16 * 4 * 2
    assert (t["big"]["memory"]["padded_rows"], t["big"]["memory"]["padded_dim"]) == (100_032, 16)
    assert t["big"]["memory"]["per_chip_bytes"] == 50_016 * 16 * 4 * 2
    assert t["shared"]["memory"]["per_chip_bytes"] == 5056 // 2 * 8 * 4 * 2
    assert t["small"]["memory"]["per_chip_bytes"] == 11 * 4 * 4 * 2
    # the initialization transient: big's whole padded table (its own stack group) + the larger of one
    # shard of it and its truncated normal's two more full-size tensors (draw, draw x stddev, + mean)
    assert plan["memory"]["init_transient_tables"] == ["big"]
    assert plan["memory"]["init_transient_bytes"] == 100_032 * 16 * 4 * (1 + max(1 / 2, 2))
    assert plan["memory"]["peak_per_chip_bytes"] == plan["memory"]["per_chip_bytes"] + plan["memory"]["init_transient_bytes"]
    # SparseCore limits come from the statistics for 2 chips x 4 SparseCores = 8 shards
    assert t["big"]["sparsecore_limits"]["max_ids_per_table"] == 120
    assert t["big"]["sparsecore_limits"]["max_unique_ids_per_table"] == 60
    assert t["shared"]["sparsecore_limits"]["max_ids_per_table"] is None
    assert "statistics.shard_counts" in t["shared"]["sparsecore_limits"]["source"]
    assert plan["sparse_core_config"]["available_in_tensorflow"] is False  # TF 2.16
    assert plan["features"]["A"]["ids_per_example"] == {"mean": 1.5, "p99": 3, "max": 4}
    assert plan["memory"]["fits"] and plan["memory"]["per_chip_bytes"] == sum(
        x["memory"]["per_chip_bytes"] for x in t.values()
    )


def test_fourth_root_rule_only_replaces_implicit_dims():
    plan = derive_plan(_config(embedding={"dim_rule": "fourth_root"}), MANIFEST).to_dict()
    assert plan["tables"]["big"]["dim"] == fourth_root_dim(100_010) == 8 * math.ceil(6 * 100_010 ** 0.25 / 8)
    assert plan["tables"]["big"]["dim_source"] == "fourth_root rule"
    assert plan["tables"]["shared"]["dim"] == 8 and plan["tables"]["small"]["dim"] == 4  # explicit
    assert fourth_root_dim(10 ** 12) == MAX_RULE_DIM


def test_size_threshold_extremes():
    all_tpu = derive_plan(_config(embedding={"size_threshold": 0}), MANIFEST).to_dict()
    assert {t["placement"] for t in all_tpu["tables"].values()} == {"tpu_embedding"}
    none_tpu = derive_plan(_config(embedding={"size_threshold": None}), MANIFEST).to_dict()
    assert {t["placement"] for t in none_tpu["tables"].values()} == {"tensor_core"}


def test_dense_id_widths_of_tensor_core_features():
    """TensorCore-table features get a static width for the TPU step: max_length, else the most IDs
    per train example (statistics); a feature with neither is refused with the fix named."""
    stats = _statistics()
    stats["features"]["small"] = {"splits": {"train": {"ids_per_example": {"mean": 1.0, "p99": 1, "max": 1}}}}
    stats["features"]["A"]["splits"]["train"]["ids_per_example"]["max"] = 7
    plan = derive_plan(_config(embedding={"size_threshold": None}), MANIFEST, _typed(stats))
    with pytest.raises(ValueError, match="'B' uses TensorCore table 'shared'.*set max_length"):
        dense_id_widths(plan)  # B has no statistics and no max_length
    stats["features"]["B"] = {"splits": {"train": {"ids_per_example": {"mean": 1.0, "p99": 1, "max": 0}}}}
    stats["features"]["big"] = stats["features"]["small"]
    plan = derive_plan(_config(embedding={"size_threshold": None}), MANIFEST, _typed(stats))
    assert dense_id_widths(plan) == {"A": 7, "B": 1, "big": 1, "small": 1}  # an all-empty feature: width 1
    # Only TensorCore tables are padded; TPU-embedding features stay SparseTensors.
    assert set(dense_id_widths(derive_plan(_config(), MANIFEST, _typed(stats)))) == {"small"}


def test_a_tensor_core_tables_gradient_is_exchanged_the_smaller_way_and_counted_in_the_plans_memory():
    """On several replicas each TensorCore table's gradient is gathered (replicas x its looked-up
    rows) or all-reduced table-sized, whichever holds fewer bytes (the rule sum_over_replicas
    follows); the run's plan records each table's and the sum in its memory, in the peak beside the
    steady bytes, and through its JSON. However many replicas, no table exchanges more than a
    table-sized all-reduce."""
    from components.planning.gradient_exchange import all_reduce_bytes, plan_gradient_exchanges

    stats = _statistics()
    for name, most in (("A", 7), ("B", 1), ("big", 1), ("small", 1)):
        stats["features"][name] = {"splits": {"train": {"ids_per_example": {"mean": 1.0, "p99": most, "max": most}}}}
    plan = derive_plan(_config(embedding={"size_threshold": None}, batch_size=64), MANIFEST, _typed(stats))
    exchanges = plan_gradient_exchanges(plan, 4)  # 16 examples a replica
    assert {n: (e.method, e.ids_per_replica) for n, e in exchanges.items()} == {
        "shared": ("all_gather", 16 * (7 + 1)), "big": ("all_gather", 16), "small": ("all_reduce", 16)}
    assert exchanges["small"].all_reduce_bytes == 11 * (4 + 1) * 4 < exchanges["small"].gathered_bytes == 4 * 16 * (4 * 4 + 8)
    assert all(e.bytes == min(e.gathered_bytes, e.all_reduce_bytes) for e in exchanges.values())
    assert plan_gradient_exchanges(plan, 1) == {} and with_run(plan, replicas=1).memory == plan.memory
    memory = with_run(plan, replicas=4).memory
    assert memory.gradient_exchange_replicas == 4 and memory.gradient_exchange == {n: e.to_dict() for n, e in exchanges.items()}
    assert memory.gradient_exchange_bytes == sum(e.bytes for e in exchanges.values()) > 0
    assert memory.peak_per_chip_bytes == memory.per_chip_bytes + max(memory.init_transient_bytes, memory.gradient_exchange_bytes)
    assert EmbeddingPlan.from_json(with_run(plan, replicas=4).to_json()).memory == memory
    for replicas in (8, 64, 4096):
        for name, e in plan_gradient_exchanges(plan, replicas).items():
            t = plan.tables[name]
            assert e.bytes <= all_reduce_bytes(t.rows, t.dim), (replicas, name, e)


def test_plan_that_cannot_fit_is_refused_naming_the_tables():
    cfg = _config(embedding={"topology": {"num_chips": 1, "hbm_gib_per_chip": 0.01}})
    with pytest.raises(PlanError, match=r"per chip.*largest: big"):
        derive_plan(cfg, MANIFEST)


def test_missing_vocabulary_is_refused():
    with pytest.raises(PlanError, match="'small' has no vocabulary"):
        derive_plan(_config(), _manifest({k: v for k, v in VOCABULARIES.items() if k != "small"}))


def test_table_and_feature_configs_render_the_plan():
    plan = derive_plan(_config(), MANIFEST)
    features = feature_configs(plan)
    assert features["A"].table is features["B"].table  # one shared TableConfig object
    assert features["big"].table.vocabulary_size == 100_010 and features["big"].table.dim == 16
    assert features["A"].table.combiner == "mean" and features["A"].max_sequence_length == 0


def test_clipping_and_schedules_map_to_both_apis():
    opt = OptimizerConfig(
        name="adagrad", learning_rate=0.1, clipvalue=2.0,
        schedule=ScheduleConfig(name="exponential", warmup_steps=10, decay_steps=100, decay_rate=0.5),
    )
    # Which update each platform applies, clipping included: tests/test_optimizer_rules.py.
    from components.embedding_model import optimizers

    spec = optimizer_spec(opt)
    keras = optimizers.keras_optimizer(spec, learning_rate(spec))
    assert keras.clipvalue is None  # the trainer clips embedding gradients itself (TPU rule)
    sched = keras.learning_rate
    assert float(sched(0)) == pytest.approx(0.1 / 10)  # warm-up
    assert float(sched(9)) == pytest.approx(0.1)
    assert float(sched(110)) == pytest.approx(0.1 * 0.5)  # 100 steps after warm-up: one halving
    step = tf.Variable(110, dtype=tf.int64)
    tpu = optimizers.tpu_optimizer(spec, learning_rate(spec), step_fn=lambda: step)
    assert (tpu.clip_gradient_min, tpu.clip_gradient_max) == (-2.0, 2.0)
    assert float(tpu.learning_rate()) == pytest.approx(0.05)
    cosine = learning_rate(optimizer_spec(OptimizerConfig(
        learning_rate=1.0, schedule=ScheduleConfig(name="cosine", decay_steps=10, alpha=0.1))))
    assert float(cosine(0)) == pytest.approx(1.0) and float(cosine(10)) == pytest.approx(0.1)
    assert float(cosine(5)) == pytest.approx(0.1 + 0.9 * 0.5)


def test_plan_round_trips_through_its_json_and_refuses_other_versions():
    plan = derive_plan(_config(), MANIFEST, _typed(_statistics()))
    assert EmbeddingPlan.from_json(plan.to_json()) == plan
    run = with_run(plan, vocabulary_dir="/vocab")
    assert plan.vocabulary_dir is None and run.vocabulary_dir == "/vocab"  # a copy: the plan is never changed
    assert EmbeddingPlan.from_json(run.to_json()) == run
    assert "checkpoint_layout" not in plan.to_dict()  # set only by a training run
    data = plan.to_dict()
    data["version"] = 99
    with pytest.raises(ValueError, match="version 99, this code reads version 1; retrain"):
        EmbeddingPlan.from_dict(data, "m/embedding_plan.json")
    del data["tables"]["big"]["rows"]
    data["version"] = 1
    with pytest.raises(ValueError, match="tables.big: field 'rows' missing"):
        EmbeddingPlan.from_dict(data)


def test_initializers_and_safe_lookups_reach_the_tpu_configs_and_the_keras_tables():
    """Issue 18, item 5: the table initializer in the plan (defaults filled in, through its JSON),
    on TableConfig and on the TensorCore tables; use_safe_embedding_lookup on FeatureConfig."""
    from components.embedding_model.model import TensorCoreTable

    cfg = parse_config({
        "input": {"path": "unused.csv"}, "label": "label",
        "tables": [{"name": "shared", "dim": 8, "initializer": {"name": "random_uniform", "minval": 0.1}}],
        "categorical_features": [
            {"name": "A", "table": "shared", "use_safe_embedding_lookup": False},
            {"name": "B", "table": "shared"},
            {"name": "big", "initializer": {"name": "zeros"}},
            {"name": "small", "dim": 4, "initializer": {"name": "random_normal", "mean": 1.0}},
        ],
        "training": {"embedding": {"size_threshold": 1000}},
    })
    plan = EmbeddingPlan.from_json(derive_plan(cfg, MANIFEST).to_json())
    init = {n: t.initializer for n, t in plan.tables.items()}
    assert (init["shared"].name, init["shared"].minval, init["shared"].maxval) == ("random_uniform", 0.1, 1 / math.sqrt(8))
    assert init["big"].name == "zeros" and init["big"].stddev is None
    assert (init["small"].name, init["small"].mean, init["small"].stddev) == ("random_normal", 1.0, pytest.approx(0.2 / math.sqrt(4)))
    on_tpu = feature_configs(plan, on_tpu=True)
    assert [on_tpu[n].validate_weights_and_indices for n in ("A", "B", "big")] == [False, True, True]
    features = feature_configs(plan)  # CPU/GPU: TF 2.16's unchecked CPU lookup drops empty trailing rows
    assert all(f.validate_weights_and_indices for f in features.values())
    assert isinstance(features["big"].table.initializer, tf.initializers.Zeros)
    uniform = features["A"].table.initializer
    assert isinstance(uniform, tf.initializers.RandomUniform) and (uniform.minval, uniform.maxval) == (0.1, 1 / math.sqrt(8))
    values = features["A"].table.initializer([1000, 8], tf.float32).numpy()
    assert values.min() >= 0.1 and values.max() <= 1 / math.sqrt(8)
    # the TensorCore table (small: 11 rows) starts from the same initializer
    layer = TensorCoreTable(plan.tables["small"], "small")
    layer.build()
    assert abs(float(tf.reduce_mean(layer.embeddings)) - 1.0) < 0.2
    # an old plan without the new fields still loads (the seeds' default, validation on)
    data = derive_plan(_config(), MANIFEST).to_dict()
    for t in data["tables"].values():
        t["initializer"] = {"name": "truncated_normal", "mean": 0.0, "stddev": 0.25}
    for f in data["features"].values():
        f.pop("validate_weights_and_indices", None)
    old = EmbeddingPlan.from_dict(data)
    assert all(f.validate_weights_and_indices for f in old.features.values())
    assert old.tables["big"].initializer.stddev == 0.25


def test_table_optimizers_and_gradient_multiplier_in_the_plan():
    """Issue 18, item 2: each table's optimizer spec in the plan (merged over
    training.embedding_optimizer, through its JSON), its memory counting that optimizer's slots,
    the gradient multiplier recorded; a plan written before the multiplier existed still loads."""
    from components.embedding_trainer import model_building

    cfg = parse_config({
        "input": {"path": "unused.csv"}, "label": "label",
        "tables": [{"name": "shared", "dim": 8, "optimizer": {"name": "adam", "learning_rate": 0.01}}],
        "categorical_features": [
            {"name": "A", "table": "shared"}, {"name": "B", "table": "shared"},
            {"name": "big", "optimizer": {"name": "sgd", "learning_rate": 0.5}},
            {"name": "small", "dim": 4, "optimizer": {"learning_rate": 0.2}},
        ],
        "training": {"embedding": {"size_threshold": 1000}, "embedding_optimizer": {"name": "adagrad", "learning_rate": 0.05},
                     "embedding_gradient_multiplier": {"value": 2.0, "schedule": {"name": "exponential", "decay_steps": 10,
                                                                                  "decay_rate": 0.5}}},
    })
    plan = EmbeddingPlan.from_json(derive_plan(cfg, MANIFEST).to_json())
    spec = {n: t.optimizer for n, t in plan.tables.items()}
    assert (spec["shared"]["name"], spec["shared"]["learning_rate"], spec["shared"]["beta_1"]) == ("adam", 0.01, 0.9)
    assert (spec["big"]["name"], spec["small"]["name"], spec["small"]["learning_rate"]) == ("sgd", "adagrad", 0.2)
    assert spec["small"]["initial_accumulator_value"] == 0.1  # inherited from training.embedding_optimizer
    assert [plan.tables[n].memory.slots_per_row for n in ("shared", "big", "small")] == [2, 0, 1]
    multiplier = gradient_multiplier(plan.embedding_gradient_multiplier)
    assert [float(multiplier(s)) for s in (0, 10, 20)] == pytest.approx([2.0, 1.0, 0.5])
    # One optimizer pair per distinct spec; tables with the default spec keep the layer's.
    default = optimizer_spec(cfg.training.embedding_optimizer)
    opts = model_building.table_optimizers(plan, default)
    assert sorted(opts) == ["big", "shared", "small"] and len({id(o) for o in opts.values()}) == 3
    assert model_building.table_optimizers(plan, dict(plan.tables["small"].optimizer)).keys() == {"big", "shared"}
    configs = table_configs(plan, {n: o.tpu for n, o in opts.items()})
    assert isinstance(configs["shared"].optimizer, tf.tpu.experimental.embedding.Adam)
    assert isinstance(configs["big"].optimizer, tf.tpu.experimental.embedding.SGD)
    assert table_configs(plan)["big"].optimizer is None  # no override given: the layer's optimizer
    old = plan.to_dict()
    del old["embedding_gradient_multiplier"]
    assert EmbeddingPlan.from_dict(old).embedding_gradient_multiplier is None


def test_sequence_length_from_config_or_statistics():
    """Issue 18, item 1: a sequence feature's max_sequence_length is its configured length, else
    the train split's percentile of IDs per example (rounded up, capped by max_length); the plan
    records where it came from; without either the plan is refused, naming the feature. The
    TPU FeatureConfig keeps the length and leaves output_shape unset (TF 2.16 ignores the length
    when it is set); a TensorCore sequence feature is fed padded to its length."""
    def cfg(sequence, max_length=None):
        a = {"name": "A", "table": "shared", "separator": "|", "sequence": sequence}
        if max_length:
            a["max_length"] = max_length
        return parse_config({
            "input": {"path": "unused.csv"}, "label": "label", "tables": [{"name": "shared", "dim": 8}],
            "categorical_features": [a, {"name": "B", "table": "shared"}, {"name": "big"}, {"name": "small", "dim": 4}],
            "training": {"embedding": {"size_threshold": 1000}},
        })

    stats = _statistics()
    stats["features"]["A"]["splits"]["train"]["ids_per_example"].update({"p50": 1, "p90": 2.5})
    plan = derive_plan(cfg({"length": 7}), MANIFEST, _typed(stats))
    assert (plan.features["A"].max_sequence_length, plan.features["A"].sequence_length_source) == (7, "config")
    plan = derive_plan(cfg({"percentile": "p90"}), MANIFEST, _typed(stats))
    assert plan.features["A"].max_sequence_length == 3 and "p90" in plan.features["A"].sequence_length_source
    assert derive_plan(cfg({"percentile": "max"}, max_length=2), MANIFEST, _typed(stats)).features["A"].max_sequence_length == 2
    assert plan.features["B"].max_sequence_length == 0 and plan.features["B"].sequence_pooling is None
    with pytest.raises(ValueError, match="sequence feature 'A' has no sequence.length and no statistics"):
        derive_plan(cfg({}), MANIFEST)
    on_tpu = feature_configs(EmbeddingPlan.from_json(plan.to_json()), output_batch=32, on_tpu=True)
    assert (on_tpu["A"].max_sequence_length, on_tpu["A"].output_shape) == (3, None)
    assert on_tpu["B"].output_shape == [32]
    small = derive_plan(cfg({"length": 5}), _manifest({**VOCABULARIES, "shared": {"rows": 11, "size": 10, "num_oov_buckets": 1}}),
                          _typed(stats))
    assert small.tables["shared"].placement == "tensor_core" and small.features["A"].dense_width == 5


def test_wide_part_tables_and_features_beside_every_table_and_feature():
    """training.wide: a one-dimensional table beside each table (same rows and vocabulary, zeros,
    the wide optimizer, placed as its table) and a feature beside each feature reading its IDs;
    counted in the memory; none when disabled; configured names may not take the suffix."""
    from components.config.schema import ConfigError
    from components.config.training_schema import WIDE_SUFFIX

    stats = _statistics()
    stats["features"]["small"] = {"splits": {"train": {"ids_per_example": {"mean": 1.0, "p99": 1, "max": 2}}}}
    plan = derive_plan(_config(wide={"enabled": True, "optimizer": {"name": "ftrl", "learning_rate": 2.0}}), MANIFEST, _typed(stats))
    deep = {"shared", "big", "small"}
    assert set(plan.tables) == deep | {t + WIDE_SUFFIX for t in deep}
    for name in deep:
        t, w = plan.tables[name], plan.tables[name + WIDE_SUFFIX]
        assert (w.rows, w.vocabulary_size, w.num_oov_buckets, w.placement) == (t.rows, t.vocabulary_size, t.num_oov_buckets, t.placement)
        assert w.dim == 1 and w.initializer.name == "zeros" and w.combiner == "sum" and w.wide_of == name
        assert w.optimizer["name"] == "ftrl" and w.optimizer["learning_rate"] == 2.0
        assert w.features == tuple(f + WIDE_SUFFIX for f in t.features)
        assert plan.vocabulary_table(name + WIDE_SUFFIX) == plan.vocabulary_table(name) == name
    # weights + FTRL's two slots, as SparseCore allocates them: 8 columns, rows to a multiple of 64
    assert plan.tables["big" + WIDE_SUFFIX].memory.total_bytes == 100_032 * 8 * 4 * 3
    assert plan.wide_features() == {f + WIDE_SUFFIX: f for f in ("A", "B", "big", "small")}
    assert plan.features["A" + WIDE_SUFFIX].table == "shared" + WIDE_SUFFIX
    assert plan.memory.total_bytes == sum(t.memory.total_bytes for t in plan.tables.values())
    # the input features are the configured ones: a wide feature reads its feature's (padded) IDs
    assert set(dense_id_widths(plan)) == {"small"}
    configs = feature_configs(plan)
    assert configs["A" + WIDE_SUFFIX].table is configs["B" + WIDE_SUFFIX].table
    assert configs["big" + WIDE_SUFFIX].table.dim == 1
    again = EmbeddingPlan.from_json(plan.to_json())
    assert again == plan and again.wide_features() == plan.wide_features()
    off = derive_plan(_config(), MANIFEST)  # off by default
    assert set(off.tables) == deep and not off.wide_features()
    with pytest.raises(ConfigError, match=r"categorical_features\[0\].name: 'A__wide' ends in '__wide'"):
        parse_config({"input": {"path": "x.csv"}, "label": "label", "categorical_features": [{"name": "A__wide"}]})
    with pytest.raises(ConfigError, match=r"training.wide.optimizer.learning_rate"):
        _config(wide={"optimizer": {"name": "ftrl", "learning_rate": 0}})


def test_dense_buckets_come_from_the_statistics_quantiles():
    """training.dense_buckets: boundaries per dense feature from the train quantiles (float32, no
    repeats), in the plan and its JSON; a feature without quantiles stays numeric, named; off,
    or without dense features, nothing; bad settings refused."""
    from components.config.schema import ConfigError

    def config(**buckets):
        raw = {"input": {"path": "x.csv"}, "label": "label", "categorical_features": [{"name": "A"}],
               "dense_features": [{"name": "d1"}, {"name": "d2"}, {"name": "d3"}]}
        if buckets:
            raw["training"] = {"dense_buckets": buckets}
        return parse_config(raw)

    manifest = _manifest({"A": {"rows": 11, "size": 10, "num_oov_buckets": 1}})
    quantiles = {"d1": [float(v) for v in range(101)], "d2": [0.0] * 90 + [5.0] * 11}
    stats = EmbeddingStatistics(64, (8,), {}, {}, {d: {"train": {"quantiles": q}} for d, q in quantiles.items()}, {}, 0, {})
    plan = derive_plan(config(), manifest, stats)
    b = plan.dense_buckets
    assert b.dim == 8 and set(b.boundaries) == {"d1", "d2"}
    assert b.boundaries["d1"] == tuple(float(v) for v in range(5, 100, 5))  # 20 buckets by default
    assert b.boundaries["d2"] == (0.0,) * 17 + (5.0, 5.0)  # repeats kept: 20 buckets in every run
    assert "not bucketed" in b.source and "d3" in b.source
    assert EmbeddingPlan.from_json(plan.to_json()) == plan
    assert derive_plan(config(buckets=4, dim=3), manifest, stats).dense_buckets.boundaries["d1"] == (25.0, 50.0, 75.0)
    assert derive_plan(config(enabled=False), manifest, stats).dense_buckets is None
    assert derive_plan(config(), manifest).dense_buckets is None  # no statistics: numeric only
    for bad, match in (({"buckets": 1}, "buckets: 1 is not a whole number in \\[2, 100\\]"),
                       ({"buckets": 101}, "buckets: 101"), ({"dim": 0}, "dense_buckets.dim")):
        with pytest.raises(ConfigError, match=match):
            config(**bad)


def _one_table(rows=100_000, **topology):
    """One dim-16 table of `rows` rows (default Adagrad) with the wide part (a dim-1 FTRL table
    beside it), every table in TPU embedding, on one chip with 4 SparseCores unless set."""
    cfg = parse_config({
        "input": {"path": "unused.csv"}, "label": "label",
        "categorical_features": [{"name": "items", "dim": 16}],
        "training": {"wide": {"enabled": True, "optimizer": {"name": "ftrl", "learning_rate": 0.1}},
                     "embedding": {"size_threshold": 0,
                                   "topology": {"num_chips": 1, "usable_hbm_fraction": 1.0, **topology}}},
    })
    return cfg, _manifest({"items": {"rows": rows, "size": rows - 1, "num_oov_buckets": 1}})


def test_sizes_follow_each_apis_layout_rule():
    """A dim-1 FTRL table of 100 rows on 2 chips: SparseCore allocates 128 x 8 (rows to 8 x 8
    SparseCores, columns to 8) and 3 variables of it; TPUEmbedding (V1) ceil(100 / 2) rows per
    chip of 4 variables (parameters, 2 slots, gradient accumulators); no embedding engine: whole on
    every chip."""
    from components.planning import sizing

    sc = sizing.table_memory(100, 1, "ftrl", "tpu_embedding", num_chips=2, embedding_api="sparse_core")
    assert (sc.padded_rows, sc.padded_dim, sc.per_chip_rows, sc.per_chip_bytes) == (128, 8, 64, 64 * 8 * 4 * 3)
    assert sc.per_chip_bytes // sc.per_chip_rows == 96  # bytes a row of a wide table takes, against 12 unpadded
    v1 = sizing.table_memory(100, 1, "ftrl", "tpu_embedding", num_chips=2, embedding_api="tpu_embedding_v1")
    assert (v1.padded_rows, v1.per_chip_bytes, v1.total_bytes) == (100, 50 * 1 * 4 * 4, 100 * 4 * 4)
    assert (v1.slots_per_row, v1.gradient_accumulators) == (2, 1)
    v0 = sizing.table_memory(100, 1, "ftrl", "tpu_embedding", num_chips=2, embedding_api="none")
    assert v0.per_chip_bytes == v0.total_bytes == 100 * 4 * 3
    tc = sizing.table_memory(100, 1, "sgd", "tensor_core", num_chips=2, embedding_api="sparse_core")
    assert (tc.padded_dim, tc.per_chip_bytes) == (1, 100 * 4)  # TensorCore tables: unpadded, replicated
    assert sizing.sparse_core_padded_shape(128, 16, 16) == (128, 16) and sizing.sparse_core_padded_shape(129, 17, 16) == (256, 24)


def test_fit_check_refuses_by_the_allocated_size_naming_the_tables():
    """items (100,000 x 16, Adagrad: 12.8 MB) and its wide table (FTRL: 1.2 MB at the unpadded 12
    bytes a row, 9.6 MB at SparseCore's 96) on one chip: 14.0 MB under the unpadded rule, 22.4 MB
    kept, plus 19.2 MB while items' stack is initialized (its whole 6.4 MB table, and the larger of
    one shard of it, 6.4 MB, and its truncated normal's two more copies, 12.8 MB)."""
    budget = 16_000_000 / 2**30  # GiB: the unpadded 14.0 MB would fit
    assert 100_000 * 16 * 4 * 2 + 100_000 * 1 * 4 * 3 < 16_000_000
    cfg, manifest = _one_table(hbm_gib_per_chip=budget)
    with pytest.raises(PlanError) as err:
        derive_plan(cfg, manifest)
    message = str(err.value)
    assert "\n" not in message and "sized for sparse_core" in message
    assert "largest: items (100000x16 padded from 100000x16, adagrad, 0.01 GiB/chip, tpu_embedding), " \
           "items__wide (100000x8 padded from 100000x1, ftrl, 0.01 GiB/chip, tpu_embedding)" in message
    # Kept bytes fit, the initialization transient does not: named too.
    cfg, manifest = _one_table(hbm_gib_per_chip=30_000_000 / 2**30)
    with pytest.raises(PlanError, match=r"\+ 0.02 GiB while SparseCore initializes the stack of items \(whole padded "
                                          r"tables and the initializer's temporaries"):
        derive_plan(cfg, manifest)
    # 36 MB held the old figure (12.8 MB: the table and one shard, no initializer temporaries)
    with pytest.raises(PlanError, match=r"need 0.04 GiB per chip"):
        derive_plan(*_one_table(hbm_gib_per_chip=36_000_000 / 2**30))
    plan = derive_plan(*_one_table(hbm_gib_per_chip=42_000_000 / 2**30))
    m = plan.memory
    assert (m.per_chip_bytes, m.init_transient_bytes, m.init_transient_tables) == (22_400_000, 19_200_000, ("items",))
    assert m.peak_per_chip_bytes == 41_600_000 and m.fits


def test_chips_size_or_refuse_the_plan():
    """training.embedding.topology.chip: its API, SparseCores and HBM size the plan; a chip
    without an embedding engine refuses TPU-embedding tables, naming the way out; without a chip
    the plan says it is sized for SparseCore."""
    from components.config.schema import ConfigError

    with pytest.raises(PlanError, match=r"^training.embedding.topology.chip v5e has no embedding engine .* 2 table\(s\) "
                                          r"are placed in tpu_embedding \(items, items__wide\); set training.embedding."
                                          r"size_threshold: null .* or train on a v5p/v6e \(SparseCore\) or v4"):
        derive_plan(*_one_table(chip="v5e"))
    cfg, manifest = _one_table(chip="v5e")
    cfg.training.embedding.size_threshold = None
    v5e = derive_plan(cfg, manifest)
    # v5e's HBM is 16 GB (10**9 bytes, as Google lists it): 14.9 GiB
    assert (v5e.topology.embedding_api, v5e.topology.hbm_gib_per_chip, v5e.memory.init_transient_bytes) == ("none", 16e9 / 2**30, 0)
    assert v5e.memory.budget_per_chip_bytes == 16_000_000_000  # usable_hbm_fraction 1.0
    assert v5e.memory.per_chip_bytes == 100_000 * 16 * 4 * 2 + 100_000 * 4 * 3  # replicated, unpadded
    v4 = derive_plan(*_one_table(rows=1001, chip="v4", num_chips=4))
    assert (v4.topology.embedding_api, v4.topology.sparse_cores_per_chip) == ("tpu_embedding_v1", 0)
    assert v4.tables["items"].memory.per_chip_bytes == 251 * 16 * 4 * 3  # ceil(1001 / 4) rows, unpadded, + grad. accumulators
    assert v4.tables["items"].sparsecore_limits.source.startswith("not applicable")
    v6e = derive_plan(*_one_table(rows=1001, chip="v6e", num_chips=4))
    assert (v6e.topology.sparse_cores_per_chip, v6e.topology.num_sparse_cores, v6e.topology.hbm_gib_per_chip) == (2, 8, 32e9 / 2**30)
    assert v6e.tables["items"].memory.padded_rows == 1024  # a multiple of 8 x 8 SparseCores
    default = derive_plan(*_one_table(rows=1001))
    assert (default.topology.embedding_api, default.topology.chip, default.topology.sparse_cores_per_chip) == ("sparse_core", None, 4)
    with pytest.raises(ConfigError, match="topology.chip"):
        _one_table(chip="v7")
    with pytest.raises(ConfigError, match=r"sparse_cores_per_chip: 4, but a v6e chip has 2; remove it"):
        _one_table(chip="v6e", sparse_cores_per_chip=4)


def test_an_old_plan_without_the_sizing_fields_loads():
    data = derive_plan(_config(), MANIFEST).to_dict()
    for key in ("embedding_api", "chip", "num_chips_source"):
        del data["topology"][key]
    for key in ("init_transient_bytes", "init_transient_tables", "peak_per_chip_bytes"):
        del data["memory"][key]
    for t in data["tables"].values():
        for key in ("padded_rows", "padded_dim", "per_chip_rows", "gradient_accumulators"):
            del t["memory"][key]
    old = EmbeddingPlan.from_dict(data)
    assert old.topology.embedding_api is None and old.memory.init_transient_tables == ()
    assert old.tables["big"].memory.padded_rows is None and old.tables["big"].memory.gradient_accumulators == 0
    # a plan that does not say where its chips come from is read as configured: a TPU must agree
    assert old.topology.num_chips_source is None and old.topology.num_chips == 2
    with pytest.raises(PlanError, match="num_chips is 2, but the TPU runs 4 replicas"):
        hardware_num_chips(old.topology, "sparse_core", 4)


class _TPU:
    """What plan_for_hardware reads of a TPUStrategy: the hardware feature and the replicas."""

    def __init__(self, feature, sparse_cores=4, replicas=4):
        from types import SimpleNamespace

        feature = getattr(tf.tpu.experimental.HardwareFeature.EmbeddingFeature, feature)
        self.extended = SimpleNamespace(tpu_hardware_feature=SimpleNamespace(
            embedding_feature=feature, num_embedding_devices_per_chip=sparse_cores))
        self.num_replicas_in_sync = replicas


def test_the_plan_is_sized_for_the_api_the_tpu_reports_or_refused():
    """No chip named: re-sized for what the TPU reports (and recorded so by with_run); a named
    chip the TPU contradicts, or TPU-embedding tables on a TPU without an engine: refused."""
    from components.contracts.plan import CheckpointLayout
    from components.embedding_trainer.hardware import plan_for_hardware

    plan = derive_plan(*_one_table(rows=1001, num_chips=4))
    assert plan_for_hardware(plan, None, on_tpu=False) is plan
    assert plan_for_hardware(plan, _TPU("V2"), on_tpu=True) == plan  # sized for SparseCore, 4 per chip already
    v1 = plan_for_hardware(plan, _TPU("V1"), on_tpu=True)
    assert v1.topology.embedding_api == "tpu_embedding_v1" and v1.tables["items"].memory.per_chip_bytes == 251 * 16 * 4 * 3
    recorded = with_run(plan, checkpoint_layout=CheckpointLayout(kind="A", embedding_api="TPUEmbedding", num_replicas=4,
                                                                sparse_cores_per_chip=4, hardware_api="tpu_embedding_v1"))
    assert recorded.tables == v1.tables and recorded.memory == v1.memory
    two = plan_for_hardware(plan, _TPU("V2", sparse_cores=2), on_tpu=True)
    assert two.topology.num_sparse_cores == 8 and two.tables["items"].memory.padded_rows == 1024
    with pytest.raises(PlanError, match=r"^the TPU \(EmbeddingFeature.UNSUPPORTED\) has no embedding engine .*"
                                          r"size_threshold: null"):
        plan_for_hardware(plan, _TPU("UNSUPPORTED"), on_tpu=True)
    cfg, manifest = _one_table(rows=1001, num_chips=4)
    cfg.training.embedding.size_threshold = None
    none = plan_for_hardware(derive_plan(cfg, manifest), _TPU("UNSUPPORTED"), on_tpu=True)
    assert none.topology.embedding_api == "none" and none.memory.per_chip_bytes == none.memory.total_bytes
    v5p = derive_plan(*_one_table(rows=1001, num_chips=4, chip="v5p"))
    with pytest.raises(PlanError, match=r"^training.embedding.topology.chip v5p sized the embedding plan for SparseCore "
                                          r"\(TPUEmbeddingV2\), 4 SparseCores per chip, but the TPU reports EmbeddingFeature.V1"):
        plan_for_hardware(v5p, _TPU("V1"), on_tpu=True)
    with pytest.raises(PlanError, match=r"reports EmbeddingFeature.V2 \(SparseCore \(TPUEmbeddingV2\), 2 SparseCores per chip\)"):
        plan_for_hardware(v5p, _TPU("V2", sparse_cores=2), on_tpu=True)


def test_a_plan_without_num_chips_is_sized_for_8_then_for_the_chips_the_tpu_has():
    """num_chips not set: sized for 8 chips and recorded as the default; on a TPU re-derived for
    the replicas TF shards over (TPUEmbeddingV2: num_replicas_in_sync x SparseCores per chip), and
    recorded so by with_run. A v5p-8 (4 replicas) sized for 8 chips: items' rows padded to 8 x 32
    SparseCores and 128 of them per chip, where TF pads to 8 x 16 and gives each chip 256."""
    from components.contracts.plan import CheckpointLayout
    from components.embedding_trainer.hardware import plan_for_hardware

    plan = derive_plan(*_one_table(rows=1001, num_chips=None))
    topo = plan.topology
    assert (topo.num_chips, topo.num_chips_source, topo.num_sparse_cores) == (8, "default", 32)
    assert (plan.tables["items"].memory.padded_rows, plan.tables["items"].memory.per_chip_rows) == (1024, 128)
    assert EmbeddingPlan.from_json(plan.to_json()) == plan
    sized = plan_for_hardware(plan, _TPU("V2", replicas=4), on_tpu=True)
    assert (sized.topology.num_chips, sized.topology.num_chips_source, sized.topology.num_sparse_cores) == (4, "hardware", 16)
    items = sized.tables["items"].memory
    assert (items.padded_rows, items.per_chip_rows, items.per_chip_bytes) == (1024, 256, 256 * 16 * 4 * 2)
    assert sized.memory.per_chip_bytes > plan.memory.per_chip_bytes
    recorded = with_run(plan, checkpoint_layout=CheckpointLayout(
        kind="B", embedding_api="TPUEmbeddingV2 (SparseCore)", num_replicas=4, sparse_cores_per_chip=4,
        per_replica_batch_size=16, hardware_api="sparse_core"))
    assert (recorded.topology, recorded.tables, recorded.memory) == (sized.topology, sized.tables, sized.memory)
    assert plan_for_hardware(sized, _TPU("V2", replicas=4), on_tpu=True) is sized  # re-deriving again changes nothing
    # SparseCore limits derived for another shard count keep their numbers and say so
    two = derive_plan(_config(), MANIFEST, _typed(_statistics()))  # 2 chips x 4: the statistics' 8 shards
    four = sized_for(two, "sparse_core", 4, 4)
    assert four.tables["big"].sparsecore_limits.max_ids_per_table == 120
    assert "measured for 8 SparseCores, the TPU has 16: add 16 to statistics.shard_counts" in \
        four.tables["big"].sparsecore_limits.source


def test_a_configured_num_chips_the_tpu_contradicts_is_refused_naming_both():
    from components.embedding_trainer.hardware import plan_for_hardware

    eight = derive_plan(*_one_table(rows=1001, num_chips=8))
    assert eight.topology.num_chips_source == "config"
    with pytest.raises(PlanError, match=r"^training.embedding.topology.num_chips is 8, but the TPU runs 4 replicas: 4 chips "
                                          r"\(TPUEmbeddingV2 pads and shards every table over 4 replicas x SparseCores per "
                                          r"chip, one replica a chip\); set num_chips to the TPU's chips, or remove it"):
        plan_for_hardware(eight, _TPU("V2", replicas=4), on_tpu=True)
    assert plan_for_hardware(eight, _TPU("V2", replicas=8), on_tpu=True) == eight
    # TPUEmbedding (V1): a v2/v3 chip is two replicas (one per TensorCore), a v4 chip one
    v3 = derive_plan(*_one_table(rows=1001, num_chips=4, chip="v3"))
    assert plan_for_hardware(v3, _TPU("V1", replicas=8), on_tpu=True).topology.num_chips == 4  # a v3-8
    with pytest.raises(PlanError, match=r"num_chips is 4, but the TPU runs 4 replicas: 2 chips \(a v3 chip is 2 replica"):
        plan_for_hardware(v3, _TPU("V1", replicas=4), on_tpu=True)
    v4 = derive_plan(*_one_table(rows=1001, num_chips=4, chip="v4"))
    assert plan_for_hardware(v4, _TPU("V1", replicas=4), on_tpu=True).topology.num_chips == 4  # a v4-8
    # no chip named: a configured count either kind of V1 chip gives passes; unset, the fewest chips
    # (most rows per chip) are sized for, and a count neither gives is refused
    unnamed = derive_plan(*_one_table(rows=1001, num_chips=8))
    assert plan_for_hardware(unnamed, _TPU("V1", replicas=8), on_tpu=True).topology.num_chips == 8
    assert plan_for_hardware(derive_plan(*_one_table(rows=1001, num_chips=None)), _TPU("V1", replicas=8),
                             on_tpu=True).topology.num_chips == 4
    with pytest.raises(PlanError, match=r"num_chips is 8, but the TPU runs 4 replicas: 2 or 4 chips \(a chip is 1 or 2 replica"):
        plan_for_hardware(unnamed, _TPU("V1", replicas=4), on_tpu=True)


def _long_stats(**means):
    features = {f: {"splits": {"train": {"ids_per_example": {"mean": m, "p99": 2 * m, "max": 3 * m}}}} for f, m in means.items()}
    return EmbeddingStatistics(64, (8,), {}, features, {}, {}, 0, {})


def test_a_long_multi_hot_features_table_sums_and_gets_the_wide_part():
    """Statistics choose the combiner and the wide part of a long multi-hot feature (mean IDs per
    example >= LONG_MULTI_HOT_IDS) where the config states neither; the plan records why."""
    from components.planning.derivation import LONG_MULTI_HOT_IDS
    from components.config.training_schema import WIDE_SUFFIX

    plan = derive_plan(_config(), MANIFEST, _long_stats(big=LONG_MULTI_HOT_IDS + 9.5, A=2.0))
    big = plan.tables["big"]
    assert big.combiner == "sum" and big.combiner_source.startswith("statistics: big has 17.5 IDs per example")
    # shared's combiner defaults too, but its features are short (A: 2.0, B unknown): mean, by default
    assert plan.tables["shared"].combiner == "mean" and plan.tables["shared"].combiner_source.startswith("default")
    assert set(plan.tables) == {"shared", "big", "small", "big" + WIDE_SUFFIX}
    assert plan.wide_features() == {"big" + WIDE_SUFFIX: "big"}
    assert plan.wide_part["features"] == ["big"] and "big 17.5" in plan.wide_part["source"]
    assert plan.tables["big" + WIDE_SUFFIX].wide_source == plan.wide_part["source"]
    # recorded in embedding_plan.json and read back
    assert EmbeddingPlan.from_dict(plan.to_dict()).wide_part == plan.wide_part


def test_the_config_overrides_what_the_statistics_choose():
    stats = _long_stats(big=40.0)
    for override in ({"categorical_defaults": {"combiner": "mean"}},):
        raw = {"input": {"path": "unused.csv"}, "label": "label", "tables": [{"name": "shared", "dim": 8}],
               "categorical_features": [{"name": "A", "table": "shared"}, {"name": "B", "table": "shared"},
                                        {"name": "big"}, {"name": "small", "dim": 4}],
               "training": {"wide": {"enabled": False}}, **override}
        plan = derive_plan(parse_config(raw), MANIFEST, stats)
        assert plan.tables["big"].combiner == "mean" and plan.tables["big"].combiner_source == "config"
        assert not plan.wide_features() and plan.wide_part == {"features": [], "source": "training.wide.enabled: false"}
    plan = derive_plan(_config(), MANIFEST, _long_stats(big=3.0))  # nothing long: no wide part, means
    assert not plan.wide_features() and plan.wide_part["source"] == "statistics: no long multi-hot feature"
    assert {t.combiner for t in plan.tables.values()} == {"mean"}


def test_an_implicit_combiner_stays_implicit_through_the_configs_json():
    """The Trainer reads the config back from JSON: a combiner filled in by default must not become
    a configured one there, or the Trainer's plan would differ from the pipeline's."""
    from components.config.loading import config_from_json

    cfg = _config()
    back = config_from_json(cfg.to_json())
    assert [t.combiner_explicit for t in back.resolved.tables] == [t.combiner_explicit for t in cfg.resolved.tables] == [False] * 3
    stats = _long_stats(big=40.0)
    assert derive_plan(back, MANIFEST, stats).to_dict() == derive_plan(cfg, MANIFEST, stats).to_dict()
