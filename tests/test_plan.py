"""Embedding plan: derivation from config + statistics, rendering to TF configs, optimizer mapping."""
import math

import pytest

import components  # noqa: F401
import tensorflow as tf

from components.config import OptimizerConfig, ScheduleConfig, parse_config
from components.contracts.manifest import VocabularyEntry, VocabularyManifest
from components.contracts.plan import EmbeddingPlan
from components.contracts.statistics import EmbeddingStatistics
from components.embedding_trainer import plan as P


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
    plan = P.derive_plan(cfg, MANIFEST, _typed(_statistics())).to_dict()  # the JSON form the artifact holds
    t = plan["tables"]
    assert t["big"]["placement"] == "tpu_embedding" and t["shared"]["placement"] == "tpu_embedding"
    assert t["small"]["placement"] == "tensor_core"  # 11 rows <= size_threshold 1000
    assert (t["shared"]["dim"], t["big"]["dim"], t["small"]["dim"]) == (8, 16, 4)
    assert t["big"]["initializer"]["stddev"] == pytest.approx(0.2 / math.sqrt(16))
    assert plan["features"]["A"]["table"] == plan["features"]["B"]["table"] == "shared"
    assert t["shared"]["features"] == ["A", "B"]
    # adagrad (the default embedding optimizer): one slot; big is sharded over 2 chips, small replicated
    assert t["big"]["memory"]["total_bytes"] == 100_010 * 16 * 4 * 2
    assert t["big"]["memory"]["per_chip_bytes"] == 50_005 * 16 * 4 * 2
    assert t["small"]["memory"]["per_chip_bytes"] == 11 * 4 * 4 * 2
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
    plan = P.derive_plan(_config(embedding={"dim_rule": "fourth_root"}), MANIFEST).to_dict()
    assert plan["tables"]["big"]["dim"] == P.fourth_root_dim(100_010) == 8 * math.ceil(6 * 100_010 ** 0.25 / 8)
    assert plan["tables"]["big"]["dim_source"] == "fourth_root rule"
    assert plan["tables"]["shared"]["dim"] == 8 and plan["tables"]["small"]["dim"] == 4  # explicit
    assert P.fourth_root_dim(10 ** 12) == P.MAX_RULE_DIM


def test_size_threshold_extremes():
    all_tpu = P.derive_plan(_config(embedding={"size_threshold": 0}), MANIFEST).to_dict()
    assert {t["placement"] for t in all_tpu["tables"].values()} == {"tpu_embedding"}
    none_tpu = P.derive_plan(_config(embedding={"size_threshold": None}), MANIFEST).to_dict()
    assert {t["placement"] for t in none_tpu["tables"].values()} == {"tensor_core"}


def test_dense_id_widths_of_tensor_core_features():
    """TensorCore-table features get a static width for the TPU step: max_length, else the most IDs
    per train example (statistics); a feature with neither is refused with the fix named."""
    stats = _statistics()
    stats["features"]["small"] = {"splits": {"train": {"ids_per_example": {"mean": 1.0, "p99": 1, "max": 1}}}}
    stats["features"]["A"]["splits"]["train"]["ids_per_example"]["max"] = 7
    plan = P.derive_plan(_config(embedding={"size_threshold": None}), MANIFEST, _typed(stats))
    with pytest.raises(ValueError, match="'B' uses TensorCore table 'shared'.*set max_length"):
        P.dense_id_widths(plan)  # B has no statistics and no max_length
    stats["features"]["B"] = {"splits": {"train": {"ids_per_example": {"mean": 1.0, "p99": 1, "max": 0}}}}
    stats["features"]["big"] = stats["features"]["small"]
    plan = P.derive_plan(_config(embedding={"size_threshold": None}), MANIFEST, _typed(stats))
    assert P.dense_id_widths(plan) == {"A": 7, "B": 1, "big": 1, "small": 1}  # an all-empty feature: width 1
    # Only TensorCore tables are padded; TPU-embedding features stay SparseTensors.
    assert set(P.dense_id_widths(P.derive_plan(_config(), MANIFEST, _typed(stats)))) == {"small"}


def test_plan_that_cannot_fit_is_refused_naming_the_tables():
    cfg = _config(embedding={"topology": {"num_chips": 1, "hbm_gib_per_chip": 0.01}})
    with pytest.raises(P.PlanError, match=r"per chip.*largest: big"):
        P.derive_plan(cfg, MANIFEST)


def test_missing_vocabulary_is_refused():
    with pytest.raises(P.PlanError, match="'small' has no vocabulary"):
        P.derive_plan(_config(), _manifest({k: v for k, v in VOCABULARIES.items() if k != "small"}))


def test_table_and_feature_configs_render_the_plan():
    plan = P.derive_plan(_config(), MANIFEST)
    features = P.feature_configs(plan)
    assert features["A"].table is features["B"].table  # one shared TableConfig object
    assert features["big"].table.vocabulary_size == 100_010 and features["big"].table.dim == 16
    assert features["A"].table.combiner == "mean" and features["A"].max_sequence_length == 0


def test_clipping_and_schedules_map_to_both_apis():
    opt = OptimizerConfig(
        name="adagrad", learning_rate=0.1, clipvalue=2.0,
        schedule=ScheduleConfig(name="exponential", warmup_steps=10, decay_steps=100, decay_rate=0.5),
    )
    # Which update each platform applies, clipping included: tests/test_optimizer_rules.py.
    from components.embedding_model import optimizers as O

    spec = P.optimizer_spec(opt)
    keras = O.keras_optimizer(spec, P.learning_rate(spec))
    assert keras.clipvalue is None  # the trainer clips embedding gradients itself (TPU rule)
    sched = keras.learning_rate
    assert float(sched(0)) == pytest.approx(0.1 / 10)  # warm-up
    assert float(sched(9)) == pytest.approx(0.1)
    assert float(sched(110)) == pytest.approx(0.1 * 0.5)  # 100 steps after warm-up: one halving
    step = tf.Variable(110, dtype=tf.int64)
    tpu = O.tpu_optimizer(spec, P.learning_rate(spec), step_fn=lambda: step)
    assert (tpu.clip_gradient_min, tpu.clip_gradient_max) == (-2.0, 2.0)
    assert float(tpu.learning_rate()) == pytest.approx(0.05)
    cosine = P.learning_rate(P.optimizer_spec(OptimizerConfig(
        learning_rate=1.0, schedule=ScheduleConfig(name="cosine", decay_steps=10, alpha=0.1))))
    assert float(cosine(0)) == pytest.approx(1.0) and float(cosine(10)) == pytest.approx(0.1)
    assert float(cosine(5)) == pytest.approx(0.1 + 0.9 * 0.5)


def test_plan_round_trips_through_its_json_and_refuses_other_versions():
    plan = P.derive_plan(_config(), MANIFEST, _typed(_statistics()))
    assert EmbeddingPlan.from_json(plan.to_json()) == plan
    run = plan.with_run(vocabulary_dir="/vocab")
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
    plan = EmbeddingPlan.from_json(P.derive_plan(cfg, MANIFEST).to_json())
    init = {n: t.initializer for n, t in plan.tables.items()}
    assert (init["shared"].name, init["shared"].minval, init["shared"].maxval) == ("random_uniform", 0.1, 1 / math.sqrt(8))
    assert init["big"].name == "zeros" and init["big"].stddev is None
    assert (init["small"].name, init["small"].mean, init["small"].stddev) == ("random_normal", 1.0, pytest.approx(0.2 / math.sqrt(4)))
    on_tpu = P.feature_configs(plan, on_tpu=True)
    assert [on_tpu[n].validate_weights_and_indices for n in ("A", "B", "big")] == [False, True, True]
    features = P.feature_configs(plan)  # CPU/GPU: TF 2.16's unchecked CPU lookup drops empty trailing rows
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
    data = P.derive_plan(_config(), MANIFEST).to_dict()
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
    from components.embedding_trainer import trainer_module as tm

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
    plan = EmbeddingPlan.from_json(P.derive_plan(cfg, MANIFEST).to_json())
    spec = {n: t.optimizer for n, t in plan.tables.items()}
    assert (spec["shared"]["name"], spec["shared"]["learning_rate"], spec["shared"]["beta_1"]) == ("adam", 0.01, 0.9)
    assert (spec["big"]["name"], spec["small"]["name"], spec["small"]["learning_rate"]) == ("sgd", "adagrad", 0.2)
    assert spec["small"]["initial_accumulator_value"] == 0.1  # inherited from training.embedding_optimizer
    assert [plan.tables[n].memory.slots_per_row for n in ("shared", "big", "small")] == [2, 0, 1]
    multiplier = P.gradient_multiplier(plan.embedding_gradient_multiplier)
    assert [float(multiplier(s)) for s in (0, 10, 20)] == pytest.approx([2.0, 1.0, 0.5])
    # One optimizer pair per distinct spec; tables with the default spec keep the layer's.
    default = P.optimizer_spec(cfg.training.embedding_optimizer)
    opts = tm.table_optimizers(plan, default)
    assert sorted(opts) == ["big", "shared", "small"] and len({id(o) for o in opts.values()}) == 3
    assert tm.table_optimizers(plan, dict(plan.tables["small"].optimizer)).keys() == {"big", "shared"}
    configs = P.table_configs(plan, {n: o.tpu for n, o in opts.items()})
    assert isinstance(configs["shared"].optimizer, tf.tpu.experimental.embedding.Adam)
    assert isinstance(configs["big"].optimizer, tf.tpu.experimental.embedding.SGD)
    assert P.table_configs(plan)["big"].optimizer is None  # no override given: the layer's optimizer
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
    plan = P.derive_plan(cfg({"length": 7}), MANIFEST, _typed(stats))
    assert (plan.features["A"].max_sequence_length, plan.features["A"].sequence_length_source) == (7, "config")
    plan = P.derive_plan(cfg({"percentile": "p90"}), MANIFEST, _typed(stats))
    assert plan.features["A"].max_sequence_length == 3 and "p90" in plan.features["A"].sequence_length_source
    assert P.derive_plan(cfg({"percentile": "max"}, max_length=2), MANIFEST, _typed(stats)).features["A"].max_sequence_length == 2
    assert plan.features["B"].max_sequence_length == 0 and plan.features["B"].sequence_pooling is None
    with pytest.raises(ValueError, match="sequence feature 'A' has no sequence.length and no statistics"):
        P.derive_plan(cfg({}), MANIFEST)
    on_tpu = P.feature_configs(EmbeddingPlan.from_json(plan.to_json()), output_batch=32, on_tpu=True)
    assert (on_tpu["A"].max_sequence_length, on_tpu["A"].output_shape) == (3, None)
    assert on_tpu["B"].output_shape == [32]
    small = P.derive_plan(cfg({"length": 5}), _manifest({**VOCABULARIES, "shared": {"rows": 11, "size": 10, "num_oov_buckets": 1}}),
                          _typed(stats))
    assert small.tables["shared"].placement == "tensor_core" and small.features["A"].dense_width == 5


def test_wide_part_tables_and_features_beside_every_table_and_feature():
    """training.wide: a one-dimensional table beside each table (same rows and vocabulary, zeros,
    the wide optimizer, placed as its table) and a feature beside each feature reading its IDs;
    counted in the memory; none when disabled; configured names may not take the suffix."""
    from components.config import WIDE_SUFFIX, ConfigError

    stats = _statistics()
    stats["features"]["small"] = {"splits": {"train": {"ids_per_example": {"mean": 1.0, "p99": 1, "max": 2}}}}
    plan = P.derive_plan(_config(wide={"enabled": True, "optimizer": {"name": "ftrl", "learning_rate": 2.0}}), MANIFEST, _typed(stats))
    deep = {"shared", "big", "small"}
    assert set(plan.tables) == deep | {t + WIDE_SUFFIX for t in deep}
    for name in deep:
        t, w = plan.tables[name], plan.tables[name + WIDE_SUFFIX]
        assert (w.rows, w.vocabulary_size, w.num_oov_buckets, w.placement) == (t.rows, t.vocabulary_size, t.num_oov_buckets, t.placement)
        assert w.dim == 1 and w.initializer.name == "zeros" and w.combiner == t.combiner and w.wide_of == name
        assert w.optimizer["name"] == "ftrl" and w.optimizer["learning_rate"] == 2.0
        assert w.features == tuple(f + WIDE_SUFFIX for f in t.features)
        assert plan.vocabulary_table(name + WIDE_SUFFIX) == plan.vocabulary_table(name) == name
    assert plan.tables["big" + WIDE_SUFFIX].memory.total_bytes == 100_010 * 1 * 4 * 3  # weights + FTRL's two slots
    assert plan.wide_features() == {f + WIDE_SUFFIX: f for f in ("A", "B", "big", "small")}
    assert plan.features["A" + WIDE_SUFFIX].table == "shared" + WIDE_SUFFIX
    assert plan.memory.total_bytes == sum(t.memory.total_bytes for t in plan.tables.values())
    # the input features are the configured ones: a wide feature reads its feature's (padded) IDs
    assert set(P.dense_id_widths(plan)) == {"small"}
    configs = P.feature_configs(plan)
    assert configs["A" + WIDE_SUFFIX].table is configs["B" + WIDE_SUFFIX].table
    assert configs["big" + WIDE_SUFFIX].table.dim == 1
    again = EmbeddingPlan.from_json(plan.to_json())
    assert again == plan and again.wide_features() == plan.wide_features()
    off = P.derive_plan(_config(), MANIFEST)  # off by default
    assert set(off.tables) == deep and not off.wide_features()
    with pytest.raises(ConfigError, match=r"categorical_features\[0\].name: 'A__wide' ends in '__wide'"):
        parse_config({"input": {"path": "x.csv"}, "label": "label", "categorical_features": [{"name": "A__wide"}]})
    with pytest.raises(ConfigError, match=r"training.wide.optimizer.learning_rate"):
        _config(wide={"optimizer": {"name": "ftrl", "learning_rate": 0}})


def test_dense_buckets_come_from_the_statistics_quantiles():
    """training.dense_buckets: boundaries per dense feature from the train quantiles (float32, no
    repeats), in the plan and its JSON; a feature without quantiles stays numeric, named; off,
    or without dense features, nothing; bad settings refused."""
    from components.config import ConfigError

    def config(**buckets):
        raw = {"input": {"path": "x.csv"}, "label": "label", "categorical_features": [{"name": "A"}],
               "dense_features": [{"name": "d1"}, {"name": "d2"}, {"name": "d3"}]}
        if buckets:
            raw["training"] = {"dense_buckets": buckets}
        return parse_config(raw)

    manifest = _manifest({"A": {"rows": 11, "size": 10, "num_oov_buckets": 1}})
    quantiles = {"d1": [float(v) for v in range(101)], "d2": [0.0] * 90 + [5.0] * 11}
    stats = EmbeddingStatistics(64, (8,), {}, {}, {d: {"train": {"quantiles": q}} for d, q in quantiles.items()}, {}, 0, {})
    plan = P.derive_plan(config(), manifest, stats)
    b = plan.dense_buckets
    assert b.dim == 8 and set(b.boundaries) == {"d1", "d2"}
    assert b.boundaries["d1"] == tuple(float(v) for v in range(5, 100, 5))  # 20 buckets by default
    assert b.boundaries["d2"] == (0.0,) * 17 + (5.0, 5.0)  # repeats kept: 20 buckets in every run
    assert "not bucketed" in b.source and "d3" in b.source
    assert EmbeddingPlan.from_json(plan.to_json()) == plan
    assert P.derive_plan(config(buckets=4, dim=3), manifest, stats).dense_buckets.boundaries["d1"] == (25.0, 50.0, 75.0)
    assert P.derive_plan(config(enabled=False), manifest, stats).dense_buckets is None
    assert P.derive_plan(config(), manifest).dense_buckets is None  # no statistics: numeric only
    for bad, match in (({"buckets": 1}, "buckets: 1 is not a whole number in \\[2, 100\\]"),
                       ({"buckets": 101}, "buckets: 101"), ({"dim": 0}, "dense_buckets.dim")):
        with pytest.raises(ConfigError, match=match):
            config(**bad)
