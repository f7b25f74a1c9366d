"""The embedding plan as the stages hand it to each other: every table's rows, dim, placement,
optimizer, SparseCore limits and memory, every feature's table, the slice it is sized for, and
what a training run records in it (`embedding_plan.json` beside the model). TensorFlow-free.

This module holds the types only. Their derivation from the config, the vocabulary manifest and
the embedding-ID statistics (`derive_plan`, the rules for dims, placements, optimizers and limits)
is components.planning.derivation's; sizing a plan for an embedding API and a number of chips,
its memory and the checks that refuse what does not fit are components.planning.fitting's. The
trainer renders a plan into TensorFlow objects (components.embedding_model.tf_objects); the
exporter reads it to find and check the trained tables.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

from components.config.choices import BucketEncoding, Combiner, InitializerKind, LayoutKind, Placement, SequencePooling
from components.contracts._json import StoredContract, pick
from components.rules.names import by_name

PLAN_VERSION = 1


class PlanError(ValueError):
    """The embedding plan cannot be built (does not fit, inconsistent inputs); says what to change."""


@dataclass(frozen=True)
class Initializer:
    """A table's initializer, its defaults filled in: truncated_normal / random_normal (mean,
    stddev), random_uniform (minval, maxval) or zeros."""

    name: InitializerKind
    mean: Optional[float] = None
    stddev: Optional[float] = None
    minval: Optional[float] = None
    maxval: Optional[float] = None


@dataclass(frozen=True)
class TableMemory:
    """A float32 table's memory while training (weights + optimizer slots + gradient accumulators),
    in total and per chip, as allocated: `weight_bytes` = padded_rows x padded_dim x 4 (the
    parameters), `total_bytes` = that x (1 + slots_per_row + gradient_accumulators),
    `per_chip_bytes` = what each chip holds of it (its shard, or the whole table where replicated),
    `per_chip_rows` rows of it. `padded_rows`/`padded_dim` equal the table's rows/dim where nothing
    is padded; `gradient_accumulators` is 1 on TPUEmbedding (V1) (`v1_gradient_accumulators`)."""

    weight_bytes: int
    slots_per_row: int
    total_bytes: int
    per_chip_bytes: int
    padded_rows: Optional[int] = None
    padded_dim: Optional[int] = None
    per_chip_rows: Optional[int] = None
    gradient_accumulators: int = 0

    def to_dict(self) -> dict:
        """The memory as plain data.

        Returns:
          Every field by name.
        """
        return {
            "weight_bytes": self.weight_bytes,
            "slots_per_row": self.slots_per_row,
            "total_bytes": self.total_bytes,
            "per_chip_bytes": self.per_chip_bytes,
            "padded_rows": self.padded_rows,
            "padded_dim": self.padded_dim,
            "per_chip_rows": self.per_chip_rows,
            "gradient_accumulators": self.gradient_accumulators,
        }


@dataclass(frozen=True)
class SparseCoreLimits:
    """A table's SparseCore limits, and where they come from (or what to do to get them)."""

    max_ids_per_table: Optional[int]
    max_unique_ids_per_table: Optional[int]
    source: str  # where the numbers come from, or what to do to get them


@dataclass(frozen=True)
class TablePlan:
    """One embedding table as planned: rows, dim, pooling, initializer, optimizer, placement and memory."""

    rows: int
    vocabulary_size: int
    num_oov_buckets: int
    dim: int
    dim_source: str
    combiner: Combiner
    initializer: Initializer
    optimizer: Mapping[str, Any]  # optimizer_spec(...) of the embedding optimizer
    placement: Placement
    features: Tuple[str, ...]
    sparsecore_limits: SparseCoreLimits
    memory: TableMemory
    # A wide (linear) part's table (training.wide): the table whose rows and vocabulary it shares.
    wide_of: Optional[str] = None
    # Where `combiner` comes from: "config", or the statistics (a long multi-hot feature's table)
    combiner_source: str = "config"
    # A wide table: why it is there (training.wide.enabled, or the statistics)
    wide_source: Optional[str] = None


@dataclass(frozen=True)
class FeaturePlan:
    """One categorical feature as planned: its table and how its IDs reach it."""

    table: str
    max_sequence_length: int
    ids_per_example: Optional[Mapping[str, Any]]  # train split's {mean, p99, max}, when known
    dense_width: Optional[int]  # static IDs per example of a TensorCore-table feature on TPU
    validate_weights_and_indices: bool = True  # the config's use_safe_embedding_lookup
    # A sequence feature (max_sequence_length > 0): how its positions are pooled (mean | attention),
    # the attention's candidate feature, and where the length came from.
    sequence_pooling: Optional[SequencePooling] = None
    sequence_query: Optional[str] = None
    sequence_length_source: Optional[str] = None
    # A wide (linear) part's feature (training.wide): the categorical feature whose IDs it reads.
    wide_of: Optional[str] = None


# Where a plan's `topology.num_chips` comes from: the config (training.embedding.topology.num_chips),
# the default (chips.DEFAULT_NUM_CHIPS, not configured: the TPU's count replaces it) or the TPU
# (the replicas it runs, components.embedding_trainer.hardware).
CHIPS_FROM_CONFIG, CHIPS_BY_DEFAULT, CHIPS_FROM_HARDWARE = "config", "default", "hardware"


@dataclass(frozen=True)
class Topology:
    """The TPU slice a plan is sized for."""

    num_chips: int
    hbm_gib_per_chip: float
    sparse_cores_per_chip: int
    num_sparse_cores: int
    usable_hbm_fraction: float
    # What the tables are sized for (chips.EMBEDDING_APIS); None in a plan that does not record
    # it (sized as ceil(rows / chips), unpadded).
    embedding_api: Optional[str] = None
    chip: Optional[str] = None  # training.embedding.topology.chip when set (chips.CHIPS)
    # CHIPS_FROM_CONFIG, CHIPS_BY_DEFAULT or CHIPS_FROM_HARDWARE; None in a plan that does not record
    # it (read as configured).
    num_chips_source: Optional[str] = None


@dataclass(frozen=True)
class PlanMemory:
    """Per-chip bytes: `per_chip_bytes` kept while training, `init_transient_bytes` more while
    SparseCore initializes the largest stack (`init_transient_tables`, sizing.sparse_core_init_transient),
    `gradient_exchange_bytes` more in each step of a run on several replicas (the TensorCore tables'
    gradients summed over `gradient_exchange_replicas` replicas, `gradient_exchange` per table:
    planning.gradient_exchange), `peak_per_chip_bytes` the steady bytes plus the larger transient;
    `fits`: the peak is within the budget."""

    total_bytes: int
    per_chip_bytes: int
    budget_per_chip_bytes: int
    fits: bool
    init_transient_bytes: int = 0
    init_transient_tables: Tuple[str, ...] = ()
    peak_per_chip_bytes: Optional[int] = None
    gradient_exchange_bytes: int = 0
    gradient_exchange_replicas: int = 0
    gradient_exchange: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class SparseCoreConfigNote:
    """Whether the SparseCore limits are passed to TensorFlow, and why not where they are not."""

    available_in_tensorflow: bool
    note: str


@dataclass(frozen=True)
class CheckpointLayout:
    """How a training run's checkpoint holds the TPU-embedding tables (set by the trainer; the
    exporter recomputes a SparseCore layout from it, which TensorFlow 2.16 does not save)."""

    kind: LayoutKind  # A: one variable per table; B: SparseCore stacked/sharded
    embedding_api: str = ""
    num_replicas: Optional[int] = None
    sparse_cores_per_chip: Optional[int] = None
    per_replica_batch_size: Optional[int] = None
    # The API the TPU reported (chips.EMBEDDING_APIS); None off TPU. `planning.fitting.with_run`
    # records the plan sized for it.
    hardware_api: Optional[str] = None


@dataclass(frozen=True)
class DenseBuckets:
    """Dense features that also enter the model as embedded quantile buckets (training.dense_buckets):
    each one's boundaries (non-decreasing float32 values; bucket = how many boundaries are <= the
    value, rulebook B1) and the buckets' embedding width."""

    dim: int
    boundaries: Mapping[str, Tuple[float, ...]]
    source: str
    # embedding: the bucket's row of a [buckets, dim] table; piecewise_linear: the value's encoding
    # over the boundaries' bins times a [bins, dim] matrix (model.piecewise_linear)
    encoding: BucketEncoding = BucketEncoding.EMBEDDING


_OPTIONAL_PLAN_FIELDS = ("checkpoint_layout", "vocabulary_dir", "embedding_gradient_multiplier", "dense_buckets", "wide_part")


@dataclass(frozen=True)
class EmbeddingPlan(StoredContract):
    """Every table's and feature's plan, the slice it is sized for and its memory (`embedding_plan.json`)."""

    CONTRACT = "embedding plan"
    VERSION = PLAN_VERSION
    REWRITE = "retrain the model with this version of the pipeline"
    OMIT_NONE = _OPTIONAL_PLAN_FIELDS

    global_batch_size: int
    size_threshold: Optional[int]
    topology: Topology
    tables: Mapping[str, TablePlan]
    features: Mapping[str, FeaturePlan]
    memory: PlanMemory
    sparse_core_config: SparseCoreConfigNote
    checkpoint_layout: Optional[CheckpointLayout] = None  # set by the trainer for the run
    vocabulary_dir: Optional[str] = None  # set by the trainer: where the vocabulary files are
    # {value, schedule}: every embedding gradient's factor at a step (training.embedding_gradient_multiplier)
    embedding_gradient_multiplier: Optional[Mapping[str, Any]] = None
    dense_buckets: Optional[DenseBuckets] = None  # training.dense_buckets, when the statistics have quantiles
    # {"features": the features the wide part stands beside, "source": why} (training.wide; derive_plan)
    wide_part: Optional[Mapping[str, Any]] = None
    version: int = PLAN_VERSION

    def table(self, name: str) -> TablePlan:
        """One table's plan.

        Args:
          name: the table's name.

        Returns:
          Its `TablePlan`.

        Raises:
          KeyError: the plan has no such table (the message lists its tables).
        """
        return by_name(self.tables, name, "is not in the embedding plan")

    def feature_table(self, feature: str) -> TablePlan:
        """The plan of the table a feature looks up.

        Args:
          feature: the categorical (or wide) feature's name.

        Returns:
          Its table's `TablePlan`.

        Raises:
          KeyError: the plan has no such feature or table.
        """
        return self.table(self.features[feature].table)

    def vocabulary_table(self, name: str) -> str:
        """The table whose vocabulary (manifest entry) gives a table's rows.

        Args:
          name: the table's name.

        Returns:
          `name` itself, or for a wide table the table it stands beside.
        """
        return self.table(name).wide_of or name

    def wide_features(self) -> Dict[str, str]:
        """The wide part's features.

        Returns:
          {wide feature: the categorical feature whose IDs it reads}; empty without a wide part.
        """
        return {n: f.wide_of for n, f in self.features.items() if f.wide_of}

    def tables_placed(self, placement: str) -> Dict[str, TablePlan]:
        """The tables with one placement.

        Args:
          placement: a `Placement`.

        Returns:
          {name: TablePlan} of the tables placed there, in plan order.
        """
        return {n: t for n, t in self.tables.items() if t.placement == placement}

    @classmethod
    def _from_fields(cls, data: Dict[str, Any], source: str) -> "EmbeddingPlan":
        """The plan of its stored fields: topology, tables, features, memory and what a run recorded, typed."""

        def table(name: str, t: Dict[str, Any]) -> TablePlan:
            where = f"{source}: tables.{name}"
            return pick(
                TablePlan, t, where,
                features=tuple(t.get("features", ())),
                initializer=pick(Initializer, t.get("initializer", {}), f"{where}.initializer"),
                sparsecore_limits=pick(SparseCoreLimits, t.get("sparsecore_limits", {}), f"{where}.sparsecore_limits"),
                memory=pick(TableMemory, t.get("memory", {}), f"{where}.memory"),
            )

        layout = data.get("checkpoint_layout")
        buckets = data.get("dense_buckets")
        if buckets:
            buckets = pick(DenseBuckets, buckets, f"{source}: dense_buckets",
                           boundaries={f: tuple(float(v) for v in b) for f, b in buckets.get("boundaries", {}).items()})
        return pick(
            cls, data, source,
            topology=pick(Topology, data.get("topology", {}), f"{source}: topology"),
            tables={n: table(n, t) for n, t in data.get("tables", {}).items()},
            features={n: pick(FeaturePlan, f, f"{source}: features.{n}") for n, f in data.get("features", {}).items()},
            memory=pick(PlanMemory, data.get("memory", {}), f"{source}: memory",
                        init_transient_tables=tuple(data.get("memory", {}).get("init_transient_tables", ()))),
            sparse_core_config=pick(SparseCoreConfigNote, data.get("sparse_core_config", {}), f"{source}: sparse_core_config"),
            checkpoint_layout=pick(CheckpointLayout, layout, f"{source}: checkpoint_layout") if layout else None,
            dense_buckets=buckets or None,
        )




