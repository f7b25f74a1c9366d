"""The embedding plan's derivation: every table's rows, dim, placement, optimizer, SparseCore limits
and memory from the config, the vocabulary manifest and the embedding-ID statistics.

`derive_plan(cfg, manifest, statistics, sparsecore_config_available)` returns the
`EmbeddingPlan` (components.contracts.plan) written as `embedding_plan.json` beside the model; a
training run adds what only it knows (run_plan.py). Nothing in the plan is guessed by the user:
rows come from the vocabulary manifest (vocabulary + OOV buckets), SparseCore limits and sequence
lengths from the statistics, memory from sizing.py through fitting.py.

Rules (documented in configs/README.md):
- dim: the configured dim; with `training.embedding.dim_rule: fourth_root`, tables without an
  explicit dim get 8 * ceil(6 * rows^0.25 / 8) (the 6 x fourth-root rule of thumb, rounded up to
  a multiple of 8 for TPU lanes), capped at 256.
- optimizer: the table's (`tables[].optimizer` merged over `training.embedding_optimizer`,
  config.binding.table_optimizer); memory counts that optimizer's slots.
- initializer: the table's (`tables[].initializer`, `categorical_defaults.initializer`), unset
  fields filled in; by default a truncated normal, mean 0, stddev 0.2/sqrt(dim) (a fifth of the seeds').
- placement: rows > `size_threshold` -> `tpu_embedding` (sharded over all chips), otherwise
  `tensor_core` (a Keras embedding replicated on every chip), as PartialTPUEmbedding decides.
- SparseCore limits: the statistics' suggestion for num_chips x sparse_cores_per_chip shards
  (busiest SparseCore in any full batch, with headroom); `SparseCoreEmbeddingConfig` exists from
  TensorFlow 2.17, so on 2.16 they are reported in the plan and not passed.
- memory: what TensorFlow allocates for the embedding API and chips the plan is sized for
  (`topology.embedding_api`: the chip's, `training.embedding.topology.chip`; without a chip
  `sparse_core`; `topology.num_chips`: the configured chips, else 8 until the TPU says; the
  trainer re-sizes the plan for the API, SparseCores and replicas the TPU reports, refusing a
  configured num_chips the TPU contradicts: `hardware_num_chips`), by planning.sizing:
  on SparseCore padded shapes x (1 + the optimizer's slots), padded rows / chips per chip; on
  TPUEmbedding (V1) ceil(rows / chips) per chip x (1 + slots + the gradient accumulators);
  TensorCore tables replicated. The fit check adds SparseCore's initialization transient (the
  stack's whole padded tables, its slices and the initializer's temporaries:
  sizing.sparse_core_init_transient) to the steady bytes; a plan whose per-chip peak exceeds
  hbm_gib_per_chip x usable_hbm_fraction is refused, naming the tables that take most with their
  padded shapes. A chip without an embedding engine (v5e) with a table placed in `tpu_embedding` is
  refused.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from components.config.binding import table_optimizer
from components.config.choices import (
    Combiner,
    DimRule,
    InitializerKind,
    OptimizerName,
    Placement,
)
from components.config.schema import PipelineConfig
from components.config.training_schema import OptimizerConfig, WIDE_SUFFIX
from components.contracts.manifest import VocabularyManifest
from components.contracts.plan import (CHIPS_FROM_CONFIG, CHIPS_BY_DEFAULT, DenseBuckets, EmbeddingPlan, FeaturePlan,
                                       Initializer, PlanError, SparseCoreConfigNote, SparseCoreLimits, TablePlan, Topology)
from components.contracts.statistics import EmbeddingStatistics
from components.planning.fitting import check_embedding_api, check_fits, plan_memory, sized_table_memory
from components.rules.chips import (DEFAULT_EMBEDDING_API, DEFAULT_HBM_GIB_PER_CHIP, DEFAULT_NUM_CHIPS,
                                    DEFAULT_SPARSE_CORES_PER_CHIP, chip_facts)


MAX_RULE_DIM = 256


# Each optimizer's hyperparameters beyond the learning rate and clipping; the Keras (legacy) and the
# TPU embedding optimizers take them under the same names.
HYPERPARAMETERS = {
    OptimizerName.SGD: (),
    OptimizerName.ADAGRAD: ("initial_accumulator_value",),
    OptimizerName.ADAM: ("beta_1", "beta_2", "epsilon"),
    OptimizerName.FTRL: ("initial_accumulator_value", "l1_regularization_strength", "l2_regularization_strength"),
}


def fourth_root_dim(rows: int) -> int:
    """The dim of the `fourth_root` rule: 8 * ceil(6 * rows^0.25 / 8), at most MAX_RULE_DIM.

    Args:
      rows: the table's rows.

    Returns:
      A multiple of 8 (TPU lanes).
    """
    return int(min(MAX_RULE_DIM, 8 * math.ceil(6 * max(rows, 1) ** 0.25 / 8)))


def optimizer_spec(o: OptimizerConfig) -> Dict[str, Any]:
    """An optimizer config as the JSON-able spec the plan stores and the trainer's builders take.

    Args:
      o: the optimizer config.

    Returns:
      {name, learning_rate, schedule, clipping where set, the optimizer's HYPERPARAMETERS, and for
      Adam `lazy_adam` (the embedding optimizer's rule; dense Adam ignores it)}.
    """
    spec: Dict[str, Any] = {"name": o.name, "learning_rate": o.learning_rate, "schedule": dict(vars(o.schedule))}
    if o.clipvalue is not None:
        spec["clipvalue"] = o.clipvalue
    if o.clipnorm is not None:
        spec["clipnorm"] = o.clipnorm
    spec.update({k: getattr(o, k) for k in HYPERPARAMETERS[o.name]})
    if o.name == OptimizerName.ADAM:
        spec["lazy_adam"] = o.lazy_adam  # the embedding optimizer's rule (optimizers.py); dense Adam ignores it
    return spec


# A normal initializer's default stddev is DEFAULT_STDDEV_SCALE / sqrt(dim) (0.05 at the default dim
# 16), a fifth of the seeds' 1/sqrt(dim): a row seen ten times in a run keeps most of its random
# start, which the model reads as signal, and with the default embedding optimizer (Adagrad 0.1)
# the smaller start raised eval AUC on most public datasets (bench/README.md "Defaults on real data").
DEFAULT_STDDEV_SCALE = 0.2


def initializer_for(options: Any, dim: int) -> Initializer:
    """A table's initializer with its defaults filled in.

    Args:
      options: the config's `InitializerOptions`; None: the default truncated normal.
      dim: the table's dim (the defaults scale with 1/sqrt(dim)).

    Returns:
      The initializer.
    """
    scale = 1.0 / math.sqrt(dim)
    name = options.name if options is not None else InitializerKind.TRUNCATED_NORMAL
    if name in (InitializerKind.TRUNCATED_NORMAL, InitializerKind.RANDOM_NORMAL):
        mean = options.mean if options is not None and options.mean is not None else 0.0
        stddev = options.stddev if options is not None and options.stddev is not None else DEFAULT_STDDEV_SCALE * scale
        return Initializer(name, mean=float(mean), stddev=float(stddev))
    if name == InitializerKind.RANDOM_UNIFORM:
        low = options.minval if options.minval is not None else -scale
        high = options.maxval if options.maxval is not None else scale
        return Initializer(name, minval=float(low), maxval=float(high))
    return Initializer(name)


def _dense_width(max_length: Optional[int], observed_max: Optional[float]) -> Optional[int]:
    """Static width of a TensorCore-table feature's padded dense IDs (the TPU step's input form):
    the configured `max_length` (preprocessing keeps no more), else the most IDs any train example
    had (statistics), else unknown (the trainer then asks for `max_length`)."""
    if observed_max is not None:
        observed = max(1, int(observed_max))
        return min(observed, max_length) if max_length else observed
    return max_length or None


def _sparsecore_limits(statistics: EmbeddingStatistics, table: str, num_sc: int) -> SparseCoreLimits:
    if num_sc < 1:
        return SparseCoreLimits(None, None, "not applicable: the chip has no SparseCores (training.embedding.topology.chip)")
    s = statistics.suggested_sparsecore_limits(table, num_sc)
    if s:
        return SparseCoreLimits(
            s["max_ids_per_table"], s["max_unique_ids_per_table"],
            f"statistics: {s['basis']}, {num_sc} SparseCores, headroom {s['headroom']}",
        )
    return SparseCoreLimits(
        None, None,
        f"no statistics for {num_sc} shards (num_chips x sparse_cores_per_chip); add {num_sc} to "
        "statistics.shard_counts and rerun preprocessing",
    )


# A categorical feature with at least this many IDs per example on the train split (their mean) is
# a long multi-hot feature (a text's words, a long history), whose defaults differ: its table sums
# its IDs (a mean weighs each of 50 words 1/50) and the wide part stands beside it (training.wide
# null). bench/README.md "Defaults on real data": what each did on two public text datasets; the
# public datasets' other multi-hot feature (MovieLens genres) has 2.3.
LONG_MULTI_HOT_IDS = 8.0


def long_multi_hot(cfg: PipelineConfig, statistics: EmbeddingStatistics) -> Dict[str, float]:
    """The long multi-hot features: {feature: its mean IDs per example on the train split} for every
    categorical feature that is no sequence feature and has at least LONG_MULTI_HOT_IDS.

    Args:
      cfg: a resolved configuration.
      statistics: preprocessing's statistics (empty: none is long).

    Returns:
      The features, in config order.
    """
    out: Dict[str, float] = {}
    for f in cfg.categorical_features:
        mean = statistics.ids_per_example(f.name, "train").get("mean")
        if f.sequence is None and mean is not None and float(mean) >= LONG_MULTI_HOT_IDS:
            out[f.name] = float(mean)
    return out


def _combiner(cfg: PipelineConfig, name: str, long: Mapping[str, float]) -> Tuple[Combiner, str]:
    """A table's combiner and its source: the config's, or `sum` for a table a long multi-hot
    feature looks up when no combiner is configured for it."""
    t = cfg.table(name)
    if cfg.resolved.table(name).combiner_explicit:
        return t.combiner, "config"
    reads = [f for f in cfg.resolved.table(name).features if f in long]
    if not reads:
        return t.combiner, "default (no long multi-hot feature)"
    f = reads[0]
    return Combiner.SUM, (f"statistics: {f} has {long[f]:.1f} IDs per example on the train split (at least "
                          f"{LONG_MULTI_HOT_IDS:g}: long multi-hot), so its IDs are summed, a bag")


def table_dim(cfg: PipelineConfig, name: str, rows: int) -> Tuple[int, str]:
    """A table's dim and where it comes from: the fourth-root rule for a table without a dim of its
    own under `training.embedding.dim_rule: fourth_root`, else the configured dim.

    Args:
      cfg: a resolved configuration.
      name: the table.
      rows: its rows.

    Returns:
      (dim, source).
    """
    if cfg.training.embedding.dim_rule == DimRule.FOURTH_ROOT and not cfg.resolved.table(name).dim_explicit:
        return fourth_root_dim(rows), "fourth_root rule"
    return int(cfg.table(name).dim), "config"


def table_placement(cfg: PipelineConfig, rows: int) -> str:
    """Where a table of `rows` rows trains: TPU embedding above `training.embedding.size_threshold`
    (none: every table on the TensorCore), else the TensorCore."""
    threshold = cfg.training.embedding.size_threshold
    return Placement.TPU_EMBEDDING if threshold is not None and rows > threshold else Placement.TENSOR_CORE


def _table_plan(cfg: PipelineConfig, name: str, manifest: VocabularyManifest, statistics: EmbeddingStatistics,
                topology: Topology, long: Mapping[str, float]) -> TablePlan:
    t = cfg.table(name)
    if name not in manifest.vocabularies:
        raise PlanError(f"table {name!r} has no vocabulary in the manifest; rerun preprocessing with this config")
    v = manifest.vocabularies[name]
    rows = int(v.rows)
    dim, dim_source = table_dim(cfg, name, rows)
    placement = table_placement(cfg, rows)
    optimizer = table_optimizer(cfg, name)  # tables[].optimizer over training.embedding_optimizer
    combiner, combiner_source = _combiner(cfg, name, long)
    return TablePlan(
        rows=rows,
        vocabulary_size=int(v.size),
        num_oov_buckets=int(v.num_oov_buckets),
        dim=dim,
        dim_source=dim_source,
        combiner=combiner,
        combiner_source=combiner_source,
        initializer=initializer_for(t.initializer, dim),
        optimizer=optimizer_spec(optimizer),
        placement=placement,
        features=tuple(cfg.resolved.table(name).features),
        sparsecore_limits=_sparsecore_limits(statistics, name, topology.num_sparse_cores),
        memory=sized_table_memory(rows, dim, optimizer.name, placement, topology),
    )


def _feature_plans(cfg: PipelineConfig, tables: Mapping[str, TablePlan], statistics: EmbeddingStatistics) -> Dict[str, FeaturePlan]:
    features: Dict[str, FeaturePlan] = {}
    for f in cfg.categorical_features:
        table = cfg.feature_table(f).name
        pooling = statistics.ids_per_example(f.name, "train")
        length, source = _sequence_length(f, pooling)
        width = None
        if tables[table].placement == Placement.TENSOR_CORE:
            width = length or _dense_width(f.max_length, pooling.get("max"))
        features[f.name] = FeaturePlan(
            table=table,
            # Features are pooled by their table's combiner; a sequence feature keeps one vector per
            # position (max_sequence_length > 0), pooled by the model's sequence layer.
            max_sequence_length=length,
            ids_per_example={k: pooling.get(k) for k in ("mean", "p99", "max")} if pooling else None,
            dense_width=width,
            validate_weights_and_indices=f.use_safe_embedding_lookup,
            sequence_pooling=f.sequence.pooling if f.sequence else None,
            sequence_query=f.sequence.query if f.sequence else None,
            sequence_length_source=source,
        )
    return features


def _wide_part_for(cfg: PipelineConfig, long: Mapping[str, float]) -> Tuple[Optional[List[str]], str]:
    """The features the wide part stands beside and why: all (training.wide.enabled true), none
    (false, or null without a long multi-hot feature: an empty list), or the long multi-hot ones."""
    enabled = cfg.training.wide.enabled
    if enabled is not None:
        return ([f.name for f in cfg.categorical_features] if enabled else []), f"training.wide.enabled: {str(enabled).lower()}"
    why = ", ".join(f"{f} {m:.1f}" for f, m in long.items())
    return list(long), (f"statistics: long multi-hot features (IDs per example on the train split, at least "
                        f"{LONG_MULTI_HOT_IDS:g}): {why}" if long else "statistics: no long multi-hot feature")


def _with_wide_part(cfg: PipelineConfig, tables: Dict[str, TablePlan], features: Dict[str, FeaturePlan],
                    topology: Topology, beside: Optional[List[str]] = None, source: str = "training.wide.enabled: true"):
    """The plan's tables and features with the wide part's beside them (training.wide): per table a
    one-dimensional table of the same rows and vocabulary (`<table>__wide`), initialized to zeros,
    updated by the wide optimizer and placed as its table is; per categorical feature a feature of
    that table reading the same IDs (`<feature>__wide`; a sequence feature's reads the same
    positions). The model adds their pooled values to its logit (model.py). `beside`: the features
    (and so the tables) it stands beside, None for all; `source`: why, recorded on its tables."""
    wide = cfg.training.wide.optimizer
    spec = optimizer_spec(wide)
    out_tables, out_features = dict(tables), dict(features)
    if beside is not None:
        features = {n: f for n, f in features.items() if n in beside}
        tables = {n: t for n, t in tables.items() if n in {f.table for f in features.values()}}
    for name, t in tables.items():
        out_tables[name + WIDE_SUFFIX] = dataclasses.replace(
            # A linear model's feature is a bag of its IDs: the wide part sums them (as the baseline
            # does), whatever the deep table's combiner; a mean would weigh each of a long text's
            # words 1/n (bench/README.md "Defaults on real data").
            t, dim=1, dim_source="wide part (training.wide)", combiner=Combiner.SUM,
            initializer=Initializer(InitializerKind.ZEROS), optimizer=spec, combiner_source="wide part: a bag of IDs",
            wide_source=source, features=tuple(f + WIDE_SUFFIX for f in t.features if f in features),
            memory=sized_table_memory(t.rows, 1, wide.name, t.placement, topology), wide_of=name)
    for name, f in features.items():
        out_features[name + WIDE_SUFFIX] = dataclasses.replace(
            f, table=f.table + WIDE_SUFFIX, sequence_pooling=None, sequence_query=None, wide_of=name)
    return out_tables, out_features


def bucket_boundaries(quantiles: Tuple[float, ...], buckets: int) -> Tuple[float, ...]:
    """Bucket boundaries of about equal rows from a dense feature's train quantiles.

    Repeats are kept (a value many rows hold repeats a boundary; the buckets between equal
    boundaries stay empty), so a feature has the same number of buckets in every run and a warm
    start carries their embeddings (tests/test_continuous.py).

    Args:
      quantiles: the feature's 101 train quantiles (statistics).
      buckets: how many buckets.

    Returns:
      `buckets - 1` non-decreasing float32 values (the model's values and TF's Bucketize
      boundaries are float32), the quantiles at every 100/buckets percent.
    """
    points = len(quantiles) - 1
    picked = np.asarray([quantiles[int(round(j * points / buckets))] for j in range(1, buckets)], np.float32)
    return tuple(float(v) for v in np.maximum.accumulate(picked))  # non-decreasing, as Bucketize needs


def _dense_buckets(cfg: PipelineConfig, statistics: EmbeddingStatistics) -> Optional[DenseBuckets]:
    """The dense features' bucket boundaries from the statistics' train quantiles; features without
    quantiles (statistics written before they were measured) stay numeric only, named in `source`."""
    db = cfg.training.dense_buckets
    if not db.enabled or not cfg.dense_features:
        return None
    boundaries, missing = {}, []
    for d in cfg.dense_features:
        q = statistics.dense_quantiles(d.name)
        if q is None:
            missing.append(d.name)
        else:
            boundaries[d.name] = bucket_boundaries(q, db.buckets)
    if not boundaries:
        return None
    source = f"train-split quantiles (statistics), {db.buckets} buckets"
    if missing:
        source += f"; not bucketed (no quantiles in the statistics: rerun preprocessing): {', '.join(missing)}"
    return DenseBuckets(dim=db.dim, boundaries=boundaries, source=source, encoding=db.encoding)


def _sequence_length(f, pooling: Mapping[str, Any]) -> Tuple[int, Optional[str]]:
    """(max_sequence_length, where it came from) of a sequence feature; (0, None) otherwise: the
    configured length, else the train split's percentile of IDs per example (at least 1, at most
    max_length)."""
    q = f.sequence
    if q is None:
        return 0, None
    if q.length is not None:
        return int(q.length), "config"
    value = (pooling or {}).get(q.percentile)
    if value is None:
        raise PlanError(
            f"categorical_features: sequence feature {f.name!r} has no sequence.length and no statistics of its "
            "IDs per example; set sequence.length or train from preprocessing output with embedding_statistics.json"
        )
    length = max(1, int(math.ceil(value)))
    if f.max_length:
        length = min(length, int(f.max_length))
    return length, f"statistics: train {q.percentile} of IDs per example ({value})"


def _gradient_multiplier(cfg: PipelineConfig) -> Optional[Dict[str, Any]]:
    m = cfg.training.embedding_gradient_multiplier
    return None if m is None else {"value": m.value, "schedule": dict(vars(m.schedule))}


def resolve_topology(cfg: PipelineConfig) -> Topology:
    """The plan's topology from `training.embedding.topology`.

    A chip's facts (CHIPS) fill what is not set; without a chip, the plan is sized for
    SparseCore (DEFAULT_EMBEDDING_API) with 16 GiB and 4 SparseCores per chip unless set;
    without num_chips, for DEFAULT_NUM_CHIPS chips, recorded as the default (on a TPU the
    trainer re-sizes it for the chips the TPU has).

    Args:
      cfg: a resolved configuration.

    Returns:
      The topology.
    """
    topo = cfg.training.embedding.topology
    chip = chip_facts(topo.chip) if topo.chip else None
    api = chip.embedding_api if chip else DEFAULT_EMBEDDING_API
    hbm = topo.hbm_gib_per_chip if topo.hbm_gib_per_chip is not None else (
        chip.hbm_gib_per_chip if chip else DEFAULT_HBM_GIB_PER_CHIP)
    per_chip = topo.sparse_cores_per_chip if topo.sparse_cores_per_chip is not None else (
        chip.sparse_cores_per_chip if chip else DEFAULT_SPARSE_CORES_PER_CHIP)
    chips = int(topo.num_chips) if topo.num_chips is not None else DEFAULT_NUM_CHIPS
    return Topology(
        num_chips=chips,
        hbm_gib_per_chip=float(hbm),
        sparse_cores_per_chip=int(per_chip),
        num_sparse_cores=chips * int(per_chip),
        usable_hbm_fraction=topo.usable_hbm_fraction,
        embedding_api=api,
        chip=topo.chip,
        num_chips_source=CHIPS_FROM_CONFIG if topo.num_chips is not None else CHIPS_BY_DEFAULT,
    )


def derive_plan(
    cfg: PipelineConfig,
    manifest: VocabularyManifest,
    statistics: Optional[EmbeddingStatistics] = None,
    sparsecore_config_available: bool = False,
) -> EmbeddingPlan:
    """The plan for a configuration's tables, sized by the vocabulary manifest and the statistics.

    Args:
      cfg: a resolved configuration.
      manifest: what preprocessing built (each table's rows).
      statistics: what preprocessing measured (SparseCore limits, sequence lengths, dense
        quantiles); None: nothing measured.
      sparsecore_config_available: whether the installed TensorFlow has SparseCoreEmbeddingConfig.

    Returns:
      The plan.

    Raises:
      PlanError: a table has no vocabulary, a sequence length is unknown, the chip has no embedding
        engine for a TPU-embedding table, or the tables do not fit the slice.
    """
    emb = cfg.training.embedding
    topology = resolve_topology(cfg)
    statistics = statistics or EmbeddingStatistics.empty()
    long = long_multi_hot(cfg, statistics)  # read once: the tables' combiners and the wide part follow it
    tables = {t.name: _table_plan(cfg, t.name, manifest, statistics, topology, long) for t in cfg.tables}
    features = _feature_plans(cfg, tables, statistics)
    beside, wide_source = _wide_part_for(cfg, long)
    if beside:
        tables, features = _with_wide_part(cfg, tables, features, topology, beside, wide_source)
    budget = int(topology.hbm_gib_per_chip * (1 << 30) * topology.usable_hbm_fraction)
    memory = plan_memory(tables, topology, budget)
    plan = EmbeddingPlan(
        global_batch_size=cfg.training.batch_size,
        size_threshold=emb.size_threshold,
        topology=topology,
        tables=tables,
        features=features,
        memory=memory,
        embedding_gradient_multiplier=_gradient_multiplier(cfg),
        dense_buckets=_dense_buckets(cfg, statistics),
        wide_part={"features": list(beside), "source": wide_source},
        sparse_core_config=SparseCoreConfigNote(
            available_in_tensorflow=sparsecore_config_available,
            note=(
                "passed to SparseCoreEmbeddingConfig"
                if sparsecore_config_available
                else "tf.tpu.experimental.embedding.SparseCoreEmbeddingConfig needs TensorFlow 2.17+; the "
                "limits above are reported, not passed (TensorFlow 2.16 sizes SparseCore buffers itself)"
            ),
        ),
    )
    if topology.chip:
        check_embedding_api(plan, f"training.embedding.topology.chip {topology.chip}")
    check_fits(plan)
    return plan


def _hand_built_table(rows: int, dim: int, placement: str, combiner: Combiner, optimizer: Mapping[str, Any],
                      features: Tuple[str, ...], topology: Topology) -> TablePlan:
    """A table of `hand_built_plan`: its whole vocabulary given, nothing measured."""
    memory = sized_table_memory(rows, dim, optimizer["name"], placement, topology)  # refuses an unknown placement first
    return TablePlan(
        rows=rows, vocabulary_size=rows, num_oov_buckets=0, dim=dim, dim_source="given", combiner=combiner,
        initializer=initializer_for(None, dim), optimizer=dict(optimizer), placement=Placement(placement),
        features=features, sparsecore_limits=SparseCoreLimits(None, None, "not measured"), memory=memory,
    )


def hand_built_plan(
    tables: Mapping[str, Tuple[int, int, str]],
    features: Optional[Mapping[str, str]] = None,
    global_batch_size: int = 64,
    num_chips: int = 1,
    sparse_cores_per_chip: int = 4,
    optimizer: Optional[Mapping[str, Any]] = None,
    combiner: Combiner = Combiner.MEAN,
    optimizers: Optional[Mapping[str, Mapping[str, Any]]] = None,
    embedding_api: str = DEFAULT_EMBEDDING_API,
    num_chips_source: str = CHIPS_FROM_CONFIG,
) -> EmbeddingPlan:
    """A plan for tables this pipeline did not derive (hand-built checkpoints in tests and benchmarks).

    Sizes come from planning.sizing for `embedding_api`; nothing is checked against a memory budget.

    Args:
      tables: {name: (rows, dim, placement)}.
      features: {feature: table}; default one feature `f_<table>` per table.
      global_batch_size: the plan's global batch size.
      num_chips: chips the tables are sharded over.
      sparse_cores_per_chip: SparseCores per chip.
      optimizer: the optimizer spec of every table without its own; default Adagrad 0.1.
      combiner: every table's combiner.
      optimizers: {table: spec} of tables with their own optimizer.
      embedding_api: what the tables are sized for (EMBEDDING_APIS).
      num_chips_source: where `num_chips` comes from (CHIPS_FROM_CONFIG: a TPU that contradicts
        it is refused; CHIPS_BY_DEFAULT: the TPU's count replaces it).

    Returns:
      A plan whose budget is its own peak (so it fits).

    Raises:
      ValueError: a placement, optimizer, combiner or embedding API is not one this code knows.
    """
    optimizer = dict(optimizer or {"name": OptimizerName.ADAGRAD, "learning_rate": 0.1})
    optimizers = optimizers or {}
    features = dict(features or {f"f_{n}": n for n in tables})
    num_sc = num_chips * sparse_cores_per_chip
    topology = Topology(num_chips, 0.0, sparse_cores_per_chip, num_sc, 1.0, embedding_api=embedding_api,
                        num_chips_source=num_chips_source)
    plans = {
        n: _hand_built_table(r, d, p, Combiner(combiner), optimizers.get(n, optimizer),
                             tuple(f for f, t in features.items() if t == n), topology)
        for n, (r, d, p) in tables.items()
    }
    memory = plan_memory(plans, topology, 0)
    return EmbeddingPlan(
        global_batch_size=global_batch_size,
        size_threshold=None,
        topology=topology,
        tables=plans,
        features={f: FeaturePlan(t, 0, None, None) for f, t in features.items()},
        memory=dataclasses.replace(memory, budget_per_chip_bytes=memory.peak_per_chip_bytes, fits=True),
        sparse_core_config=SparseCoreConfigNote(False, "hand-built plan"),
    )
