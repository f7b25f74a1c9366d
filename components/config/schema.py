"""The configuration schema: one dataclass per YAML section, with the values each field allows.

These are the fields a user writes (configs/README.md documents them) and nothing else: what
resolution derives (which features share a table, whether a dim was set, where the file came from)
is the frozen `ResolvedConfig` (`components.config.resolved`), reached as `PipelineConfig.resolved`.
Loading is `components.config.loading`, the checks `components.config.validation`, and the closed sets
a field takes its value from `components.config.choices`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from components.config.choices import (Combiner, Compression, DirectRunningMode, InitializerKind, InputFormat,
                                       LabelRuleOp, LayoutKind, OptimizerName, PartitionStrategy, SequencePercentile,
                                       SequencePooling, TableDtype, TuningAlgorithm, VocabularyKind)
from components.config.resolved import ResolvedConfig
from components.config.serialization import config_to_dict, config_to_json
from components.rules.names import by_name
from components.config.training_schema import OptimizerConfig, OptimizerOverride, TrainingConfig

# The values the exporter's command line offers for the `export` fields it overrides.
TABLE_DTYPES = TableDtype.values()
LAYOUT_KINDS = LayoutKind.values()
PARTITION_STRATEGIES = PartitionStrategy.values()


class ConfigError(ValueError):
    """A configuration problem, with the field and the fix in its message."""


@dataclass
class VocabularyOptions:
    """How a table's values become rows (the column kind, rulebook V1-V4): a vocabulary counted on
    the training split (`counted`, the default), one given as a list (`list`) or a file (`file`),
    hashing without a vocabulary (`hashed`), or integer IDs used as rows (`identity`)."""

    kind: VocabularyKind = VocabularyKind.COUNTED
    top_k: Optional[int] = None  # counted: keep the k most frequent values; None keeps all
    min_frequency: int = 1  # counted: drop values seen fewer times
    num_oov_buckets: int = 1  # counted, list, file: out-of-vocabulary values hash into this many rows after the vocabulary
    weight_column: Optional[str] = None  # counted: count each value by this numeric column's value (tft's `weights`)
    values: Optional[List[str]] = None  # list: the vocabulary, row i = values[i]
    file: Optional[str] = None  # file: a vocabulary file, one value per line (relative to the config file)
    num_buckets: Optional[int] = None  # hashed: rows (Fingerprint64 % num_buckets); identity: IDs 0..num_buckets-1
    default_value: Optional[int] = None  # identity: the row of out-of-range / non-integer values; null: dropped, counted


@dataclass
class LabelRule:
    """Derives the binary label from another column: 1 where `column op value` holds, else 0."""

    column: str = ""  # a numeric column of the input, e.g. rating
    op: LabelRuleOp = LabelRuleOp.GE
    value: float = 0.0  # e.g. 4 for "positive when rating >= 4"


# TFX's span specs in `input.path` (`{SPAN}`, `{SPAN:n}`, `{VERSION}`, `{YYYY}{MM}{DD}`): a span
# input, whose span ExampleGen's driver picks.
SPAN_SPEC = re.compile(r"\{(SPAN(:\d+)?|VERSION(:\d+)?|YYYY|MM|DD)\}")


@dataclass
class InputConfig:
    """The `input` section: where the examples are, how they split, and the feature-health limits."""

    path: str = ""  # file, directory or glob; relative paths are relative to the config file
    # csv | tfrecord (gzipped or plain TFRecord of tf.Example) | parquet (flat or list columns;
    # files named _* or .* beside them, such as _SUCCESS, are not read)
    format: InputFormat = InputFormat.CSV
    train_buckets: int = 4  # ExampleGen hash split: train gets train_buckets / (train+eval)
    eval_buckets: int = 1
    # ExampleGen reads an uncompressed CSV file in byte ranges of this many MiB, spread over the
    # workers (a compressed or TFRecord file is one range), and a Parquet file in units of
    # consecutive row groups of about this many MiB uncompressed (at least one row group each);
    # smaller ranges spread small files wider.
    range_mb: float = 64.0
    # Feature health (docs/ingestion.md "Feature health"): a feature whose share of train rows with a missing or
    # invalid value is above max_invalid_share stops the run before training; above
    # warn_invalid_share it is flagged in the summary and the report. allow_invalid: exempt features.
    max_invalid_share: float = 0.5
    warn_invalid_share: float = 0.05
    allow_invalid: List[str] = field(default_factory=list)

    def directory_files(self) -> str:
        """The files `path` reads where it names a directory: its `*.csv` files (csv), every file
        otherwise."""
        return "*.csv" if self.format == InputFormat.CSV else "*"


@dataclass
class DenseFeature:
    """A numeric feature read from one column."""

    name: str = ""
    column: Optional[str] = None  # source column; defaults to name
    fill_value: float = 0.0  # used when the value is missing or NaN

    @property
    def source(self) -> str:
        """The input column the feature is read from (`column`, else `name`)."""
        return self.column or self.name


@dataclass
class InitializerOptions:
    """How a table's rows start (`TableConfig.initializer` on TPU, the Keras initializer elsewhere).
    Unset fields take the defaults: truncated normal, mean 0, stddev 0.2/sqrt(dim) (a fifth of the
    seeds' 1/sqrt(dim): planning.derivation.DEFAULT_STDDEV_SCALE says why)."""

    name: InitializerKind = InitializerKind.TRUNCATED_NORMAL
    mean: Optional[float] = None  # normal kinds; default 0
    stddev: Optional[float] = None  # normal kinds; default 0.2/sqrt(dim)
    minval: Optional[float] = None  # random_uniform; default -1/sqrt(dim)
    maxval: Optional[float] = None  # random_uniform; default 1/sqrt(dim)


@dataclass
class SequenceOptions:
    """A sequence feature (the seeds' max_sequence_length / sequence_categorical_column_*): its
    lookup keeps one vector per position, [batch, length, dim] (the first `length` IDs of a row,
    zeros after them), and the model pools the positions with `pooling`."""

    length: Optional[int] = None  # max_sequence_length; null: the train split's `percentile` of IDs per example
    percentile: SequencePercentile = SequencePercentile.P99  # when length is null
    pooling: SequencePooling = SequencePooling.MEAN  # mean: over the row's positions; attention: DIN-style, against `query`
    query: Optional[str] = None  # attention: the candidate feature (not a sequence; the same dim)


@dataclass
class CategoricalFeature:
    """A categorical feature, embedded through its table (its own, or a shared one from `tables`)."""

    name: str = ""
    column: Optional[str] = None  # source column; defaults to name
    table: Optional[str] = None  # a table from `tables`; defaults to a table of its own named after the feature
    dim: Optional[int] = None  # embedding dim; for a table of its own, or must equal the shared table's dim
    combiner: Optional[Combiner] = None  # for a table of its own
    separator: Optional[str] = None  # multi-hot: split the raw string on this separator
    max_length: Optional[int] = None  # multi-hot: keep at most this many values per example
    vocabulary: Optional[VocabularyOptions] = None  # for a table of its own
    initializer: Optional[InitializerOptions] = None  # for a table of its own
    optimizer: Optional[OptimizerOverride] = None  # for a table of its own
    # The seeds' `use_safe_embedding_lookup` (TF2: FeatureConfig.validate_weights_and_indices):
    # false skips the checks for negative IDs and weights on TPU and in TensorCore tables' CPU/GPU
    # lookups (rows without IDs still pool to zeros). Preprocessing never emits a negative ID.
    use_safe_embedding_lookup: bool = True
    # Weighted IDs (the seeds' weighted_categorical_column; the `weights` of an embedding lookup):
    # a numeric column whose first value in a row is the weight of each of the row's IDs (rulebook
    # W1). The table's combiner then pools sum(w x) / sum(w) (mean), sum(w x) (sum) or
    # sum(w x) / sqrt(sum(w^2)) (sqrtn).
    weight_column: Optional[str] = None
    sequence: Optional[SequenceOptions] = None  # a sequence feature (positions kept); null: pooled by the combiner

    @property
    def source(self) -> str:
        """The input column the feature is read from (`column`, else `name`)."""
        return self.column or self.name


@dataclass
class TableConfig:
    """One embedding table and its vocabulary; features that share it share both.

    After resolution every table is listed (the implicit ones of features without `table` too) and
    dim, combiner and vocabulary are filled in; its features are `PipelineConfig.resolved`'s."""

    name: str = ""
    dim: Optional[int] = None
    combiner: Optional[Combiner] = None
    vocabulary: Optional[VocabularyOptions] = None
    initializer: Optional[InitializerOptions] = None
    optimizer: Optional[OptimizerOverride] = None  # this table's embedding optimizer; null: training.embedding_optimizer


@dataclass
class CategoricalDefaults:
    """Dim, combiner, vocabulary and initializer of tables that do not set them."""

    dim: int = 16
    # null: mean, except for a table a long multi-hot feature looks up (a text's words: mean IDs per
    # example on the train split >= planning.derivation.LONG_MULTI_HOT_IDS), which sums its IDs; the
    # plan records which and why (`combiner_source`). Set it (here, on a table or a feature) to fix one.
    combiner: Optional[Combiner] = None
    vocabulary: VocabularyOptions = field(default_factory=VocabularyOptions)
    initializer: InitializerOptions = field(default_factory=InitializerOptions)


@dataclass
class ExportLayoutConfig:
    """How the training checkpoint holds its tables, where the checkpoint cannot say (docs/export.md)."""

    kind: LayoutKind = LayoutKind.AUTO  # auto: detected per table from the checkpoint and the plan
    partition_strategy: Optional[PartitionStrategy] = None  # C: as training partitioned the tables
    num_partitions: Optional[int] = None  # C, tables saved as slices of one key: the host count
    num_sparse_cores: Optional[int] = None  # B without a layout record: overrides the plan's topology
    sparse_cores_per_chip: Optional[int] = None
    table_keys: Dict[str, str] = field(default_factory=dict)  # table -> checkpoint key (other trainers)


@dataclass
class StoreExportConfig:
    """`export.store`: the tables as row files for a key-value store, their delta against the last
    pushed version, and a dense model that takes looked-up vectors (docs/export.md, "Serving from a store")."""

    enabled: bool = False
    max_file_mib: int = 128  # a row file's size bound (shards are doubled until each file fits)
    beam: bool = False  # the row files and their delta by Beam pipelines of the `beam` section's options (Dataflow)


@dataclass
class ExportConfig:
    """The `export` section: how the serving model is checked, compressed and written."""

    parity_tolerance: float = 1e-5  # max |trained - serving| click probability on the parity sample
    parity_sample_size: int = 512  # eval examples scored by both models before the export is accepted
    table_dtype: TableDtype = TableDtype.FLOAT32  # the serving model's tables (int8: with a per-row scale)
    compare_compression: bool = True  # report size and AUC change of float16 and int8 even if not chosen
    max_auc_drop: float = 0.005  # a compressed serving model losing more eval AUC is refused
    auc_sample_size: int = 20000  # eval examples the AUC (and its change under compression) is measured on
    write_tables: bool = True  # also write each table as a row-aligned .npy with a manifest
    layout: ExportLayoutConfig = field(default_factory=ExportLayoutConfig)
    store: StoreExportConfig = field(default_factory=StoreExportConfig)


@dataclass
class BaselineConfig:
    """`validation.baseline`: the logistic regression the trainer fits beside the model (one weight
    per embedding row, a bag of each feature's IDs, one weight per dense feature, a bias) on the
    same transformed examples, its regularization chosen on the held-out slice (baseline.py)."""

    enabled: bool = True
    # Lazy Adam at 0.01 with the defaults below comes within 0.005 AUC of scikit-learn's converged
    # fit on every public dataset (bench/README.md "Defaults on real data").
    optimizer: OptimizerConfig = field(
        default_factory=lambda: OptimizerConfig(OptimizerName.ADAM, 0.01))
    # The candidates' L2 strengths (mean log loss + l2 x |w|^2 / rows: scikit-learn's C = 1 / (2 l2)),
    # fitted at once; the best on the held-out slice is kept.
    l2: List[float] = field(default_factory=lambda: [0.0, 0.5, 1.5, 5.0, 15.0])
    # Length: train_steps when set; else `epochs` over the train split less its held-out slice
    # when set; else max_rows rows (at most max_epochs passes; on a large split part of one, its
    # files in a seeded random order), and at least min_steps steps (a small split: a streamed fit
    # needs steps, not epochs, to converge).
    train_steps: Optional[int] = None
    epochs: Optional[float] = None
    max_rows: int = 2_000_000
    max_epochs: float = 20.0
    min_steps: int = 1000
    batch_size: int = 1024


@dataclass
class ValidationConfig:
    """The `validation` section: when a trained model is blessed (and so pushed)."""

    baseline: BaselineConfig = field(default_factory=BaselineConfig)
    # Blessed only when the model's eval AUC >= the baseline's - baseline_margin (null: no check) ...
    baseline_margin: Optional[float] = 0.0
    # ... and its serving model's AUC >= the last blessed serving model's on the same raw eval rows
    # - regression_margin (null: no check).
    regression_margin: Optional[float] = 0.002


@dataclass
class DriftLimits:
    """`continuous.drift`: how far this run's data may move from the last blessed model's before the
    Trainer stops the run (null: no limit). Measured on the train split (trainer warm_start.py)."""

    # Per table: share of its in-vocabulary occurrences on tokens the previous vocabulary lacked.
    max_new_token_share: Optional[float] = 0.5
    # Per table: share of the new vocabulary's tokens that the previous vocabulary held.
    min_vocabulary_overlap: Optional[float] = None
    # Per feature: relative change of the mean IDs per example, |new - old| / old.
    max_ids_per_example_change: Optional[float] = 1.0
    # Per dense feature: |mean change| of the model's input (signed log1p), in the previous run's
    # standard deviations.
    max_dense_mean_shift: Optional[float] = 3.0


@dataclass
class ContinuousConfig:
    """The `continuous` section: daily retraining on spans (docs/continuous.md)."""

    # Start from the last blessed model (the one served at the push destination, from its model
    # registry): embedding rows carried by token, OOV buckets when their count is unchanged, dense
    # weights and optimizer slots where shapes match.
    warm_start: bool = True
    # With warm_start: also carry the optimizer slots (embedding accumulators with their rows, the
    # dense network's moments). false: weights only, every slot fresh.
    carry_slots: bool = True
    drift: DriftLimits = field(default_factory=DriftLimits)


@dataclass
class StatisticsConfig:
    """Embedding-ID statistics that size TPU embedding tables (preprocessing)."""

    shard_counts: List[int] = field(default_factory=lambda: [8, 32, 128])  # SparseCores or hosts to model
    headroom: float = 0.2  # suggested SparseCore limits = busiest observed shard-batch x (1 + headroom)
    top_values: int = 10  # hottest values listed per vocabulary


@dataclass
class TransformedExamplesConfig:
    """How preprocessing writes the transformed examples the trainer reads."""

    # none: plain TFRecords (default: gzip at Beam's fixed level 6 costs about a third of the
    # preprocessing CPU, and every training host pays again to inflate them); gzip: ~4.8x smaller.
    compression: Compression = Compression.NONE
    # blocks: one record per block of `block_rows` rows, parsed by the trainer a block at a time
    # (see contracts.manifest); examples: one tf.Example per row, for TFX components that read
    # transformed examples row by row (StatisticsGen, Evaluator).
    format: str = "blocks"
    block_rows: int = 64
    # At most about this many rows per file (whole read batches of about 16,384 rows each). The
    # trainer reads the train split's files in a new seeded order every epoch, INTERLEAVE_CYCLE at
    # a time, so smaller files let the first batches of a time-ordered split draw from across its
    # whole range rather than from its start (bench/README.md "Input order").
    rows_per_file: int = 65_536


@dataclass
class BeamConfig:
    """Beam of a local run (the `beam` section); `PipelineConfig.beam_pipeline_args` turns it into options."""

    direct_running_mode: DirectRunningMode = DirectRunningMode.MULTI_PROCESSING
    direct_num_workers: int = 0  # 0: one per core
    # CombinePerKey hot-key fan-out for merging the vocabulary pass's bucket summaries per table
    # (intermediate keys per table); >1 spreads a table's merges when there are many buckets
    # (`value_count_buckets`). 0 or 1: off.
    hot_key_fanout: int = 0
    # The vocabulary pass spills each bundle's value counts to files in this many hash buckets of
    # values (under the statistics output, deleted when the run ends); one worker adds up one
    # bucket, so the largest merge holds about 1/buckets of the distinct values and no count
    # passes through the runner's shuffle.
    value_count_buckets: int = 16
    extra_args: List[str] = field(default_factory=list)  # e.g. --runner=DataflowRunner --project=...


@dataclass
class KubeflowBeamConfig:
    """Beam for the pipeline's Beam components (ExampleGen, EmbeddingPreprocess) on Kubeflow."""

    runner: str = "direct"  # direct (inside the task's pod) | dataflow | flink | spark
    args: List[str] = field(default_factory=list)  # Beam options, e.g. --project=... --region=...; not --runner


@dataclass
class TolerationConfig:
    """A Kubernetes toleration of one component's task (open-source KFP only)."""

    key: str = ""
    operator: str = "Equal"  # Equal | Exists
    value: Optional[str] = None
    effect: Optional[str] = None  # NoSchedule | PreferNoSchedule | NoExecute; null: all


@dataclass
class KubeflowComponentConfig:
    """What one component's task asks of the cluster."""

    cpu: Optional[float] = None  # CPU limit (cores)
    memory_gb: Optional[float] = None  # memory limit (GB)
    cpu_request: Optional[float] = None
    memory_request_gb: Optional[float] = None
    # Open-source KFP: a Kubernetes resource name (nvidia.com/gpu, google.com/tpu);
    # Vertex AI: a Vertex accelerator type (NVIDIA_TESLA_T4, NVIDIA_L4, ...).
    accelerator_type: Optional[str] = None
    accelerator_count: int = 1
    # Open-source KFP only (Kubernetes platform spec; Vertex ignores it): e.g. a GKE TPU node pool's
    # cloud.google.com/gke-tpu-accelerator / cloud.google.com/gke-tpu-topology labels.
    node_selector: Dict[str, str] = field(default_factory=dict)
    tolerations: List[TolerationConfig] = field(default_factory=list)


@dataclass
class VertexTrainingConfig:
    """Train in a Vertex AI custom job (TFX's google_cloud_ai_platform Trainer), e.g. on a TPU VM.

    The pipeline's Trainer task then only submits the job and waits; the job runs the same trainer
    (run_fn) in the pipeline's image on this machine. Works from Vertex AI Pipelines and from
    open-source KFP (the task needs credentials for Vertex AI).
    """

    project: str = ""
    region: str = ""
    machine_type: str = ""  # e.g. cloud-tpu (TPU v2/v3: 8 cores, 4 chips), n1-standard-8 with a GPU
    accelerator_type: Optional[str] = None  # e.g. TPU_V3, NVIDIA_TESLA_T4 (Vertex has none for v5p, v6e); null: none
    accelerator_count: int = 1
    # The Trainer's job is one machine: the trainer is not a multi-worker program (no TF_CONFIG
    # cluster, no multi-host slice). The Tuner's job is `tuning.parallel_trials` of them (CPU or GPU
    # machines only), each training whole trials.


@dataclass
class KubeflowConfig:
    """Compiling for Kubeflow Pipelines (`python -m pipelines compile`; docs/kubeflow.md)."""

    pipeline_root: Optional[str] = None  # where artifacts go (gs://...); --pipeline-root overrides
    serving_dir: Optional[str] = None  # the Pusher's destination; null: <pipeline_root>/serving
    beam: KubeflowBeamConfig = field(default_factory=KubeflowBeamConfig)
    # Component id (as in the pipeline: EmbeddingExampleGen, EmbeddingPreprocess, Tuner,
    # Trainer, EmbeddingExporter, Pusher, ...) -> what its task asks for. The Tuner, when not
    # given, asks for what the Trainer does (its trials train as the Trainer does).
    components: Dict[str, KubeflowComponentConfig] = field(default_factory=dict)
    vertex_training: Optional[VertexTrainingConfig] = None  # set: the Trainer runs as a Vertex AI custom job
    # The image that trains on a TPU route (TPU resources on components.Trainer, or a TPU
    # vertex_training): one built from docker/Dockerfile.tpu. `compile --tpu-image` overrides it.
    tpu_trainer_image: Optional[str] = None


@dataclass
class EvaluatorConfig:
    """The `evaluator` section: TFX's stock Evaluator (TFMA) on the serving model, before the Pusher.

    On: the pipeline adds a tf.Example copy of the eval split (TFMA feeds a TensorFlow model raw
    serialized records, which Parquet examples do not carry) and the Evaluator, whose EvalConfig
    comes from this section (pipelines/evaluation.py); its blessing is required for a push."""

    enabled: bool = False
    # The blessing's AUC lower bound (overall slice), strictly inside (0, 1): TFX's Evaluator
    # blesses nothing without a threshold.
    min_auc: float = 0.5
    # [lower, upper] of TFMA's calibration (sum of predictions / sum of labels) for a blessing;
    # null: calibration is reported, not required.
    calibration_bounds: Optional[List[float]] = None
    # Input columns (numeric or categorical, not the label) to slice the metrics by, one slice per value.
    slice_features: List[str] = field(default_factory=list)


@dataclass
class BulkInferenceConfig:
    """The `bulk_inference` section: TFX's stock BulkInferrer scores ExampleGen splits with the
    exporter's serving model when the exporter blesses it (pipelines/bulk_inference.py).

    On: the pipeline adds a tf.Example copy of the named splits (BulkInferrer feeds the model raw
    serialized records, which Parquet examples do not carry) and the BulkInferrer, whose
    `inference_result` holds one PredictionLog per row."""

    enabled: bool = False
    splits: List[str] = field(default_factory=lambda: ["eval"])  # ExampleGen splits to score: train, eval
    # A CSV or Parquet file to score too (`FileScoring`, as `python -m pipelines score` does; relative
    # to the config file), with these input columns copied beside each score; null: none.
    path: Optional[str] = None
    carry: List[str] = field(default_factory=list)


@dataclass
class ServingCheckConfig:
    """The `serving_check` section: after the exporter, the serving model loaded and answered as a
    stock TF Serving binary would, in a fresh process with only TensorFlow
    (components/embedding_exporter/serving_check.py, `python -m pipelines check-serving`); its
    blessing is required for a push."""

    enabled: bool = False


@dataclass
class TuningConfig:
    """The `tuning` section: TFX's stock Tuner searches `space` with KerasTuner before the Trainer,
    each trial training `steps_per_trial` steps with its values over the config and scored by AUC on
    the held-out slice the Trainer selects on; the Trainer applies the best trial's values
    (components/config/tuning.py: the fields a space may name; docs in configs/README.md).

    Present: on. `space`: a dotted training field -> a list of values, {min: a, max: b} or
    {log: [lo, hi]} (sampled on a log scale). Only fields that change the model or its optimizers
    may be tuned, never the plan's tables (dims, placement) or what the data stages read."""

    trials: int = 8
    steps_per_trial: int = 500  # training steps of each trial
    algorithm: TuningAlgorithm = TuningAlgorithm.RANDOM
    space: Dict[str, Any] = field(default_factory=dict)
    # Trials trained at once, each on its own machine: with `kubeflow.vertex_training`, the Tuner
    # runs as one Vertex AI custom job of this many replicas of the Trainer's machine (TFX's
    # google_cloud_ai_platform Tuner, KerasTuner's chief oracle); not on a TPU machine. A local run
    # trains its trials one at a time; a compile without vertex_training refuses more than 1.
    parallel_trials: int = 1


@dataclass
class PipelineConfig:
    """A whole configuration file. Loaded and resolved by `components.config.load_config`,
    `parse_config` or `config_from_json`; only a resolved config has `resolved`."""

    name: str = "tpu-embedding-demo"
    input: InputConfig = field(default_factory=InputConfig)
    label: str = "label"
    label_rule: Optional[LabelRule] = None  # derive the label from another column (else: the label column, 0/1)
    dense_features: List[DenseFeature] = field(default_factory=list)
    categorical_defaults: CategoricalDefaults = field(default_factory=CategoricalDefaults)
    categorical_features: List[CategoricalFeature] = field(default_factory=list)
    tables: List[TableConfig] = field(default_factory=list)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    continuous: ContinuousConfig = field(default_factory=ContinuousConfig)
    statistics: StatisticsConfig = field(default_factory=StatisticsConfig)
    transformed_examples: TransformedExamplesConfig = field(default_factory=TransformedExamplesConfig)
    beam: BeamConfig = field(default_factory=BeamConfig)
    kubeflow: KubeflowConfig = field(default_factory=KubeflowConfig)
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)
    tuning: Optional[TuningConfig] = None  # set: the Tuner searches training fields before the Trainer
    bulk_inference: BulkInferenceConfig = field(default_factory=BulkInferenceConfig)
    serving_check: ServingCheckConfig = field(default_factory=ServingCheckConfig)

    @property
    def resolved(self) -> ResolvedConfig:
        """What resolution derived: each table's features and dim origin, the source file."""
        r = self.__dict__.get("_resolved")  # set once by validation.resolve; not a dataclass field
        if r is None:
            raise RuntimeError("this PipelineConfig was not resolved; build it with load_config, parse_config or config_from_json")
        return r

    # --- derived views, valid after resolution ---
    def table(self, name: str) -> TableConfig:
        """A table by name (after resolution every table is listed, implicit ones too).

        Args:
          name: the table's name.

        Returns:
          Its `TableConfig`.

        Raises:
          KeyError: no table is named `name`.
        """
        return by_name(self.tables, name, "is not in the configuration")

    def feature_table(self, feature: CategoricalFeature) -> TableConfig:
        """The table a categorical feature looks up (after resolution).

        Args:
          feature: one of `categorical_features`.

        Returns:
          The named table, or the feature's own.

        Raises:
          KeyError: the table does not exist (the config is not resolved).
        """
        return self.table(feature.table or feature.name)

    def label_source(self) -> str:
        """The input column the label is read from.

        Returns:
          The label rule's column when the label is derived, else `label`.
        """
        return self.label_rule.column if self.label_rule is not None else self.label

    def numeric_columns(self) -> List[str]:
        """Input columns typed as numbers at ingestion.

        A column named both numeric and categorical is refused when loading.

        Returns:
          The label's source, dense features' columns and weight columns, each once, in that order.
        """
        cols = [self.label_source()] + [d.source for d in self.dense_features] + self.weight_columns()
        return list(dict.fromkeys(cols))

    def categorical_columns(self) -> List[str]:
        """Input columns read as categorical values.

        Returns:
          The categorical features' source columns, each once, in config order.
        """
        return list(dict.fromkeys(f.source for f in self.categorical_features))

    def weight_columns(self) -> List[str]:
        """Numeric columns that weigh values: vocabulary counts' and features' IDs'.

        Returns:
          The column names, sorted.
        """
        counts = {t.vocabulary.weight_column for t in self.tables if t.vocabulary.weight_column}
        return sorted(counts | {f.weight_column for f in self.categorical_features if f.weight_column})

    def beam_pipeline_args(self) -> List[str]:
        """Beam options of a local run from the `beam` section.

        Component CLIs (`python -m components.embedding_preprocess`) run Beam from a config without
        the pipeline, so these live with the config; Kubeflow's Beam options are
        pipelines/kubeflow_config.py's.

        Returns:
          `--runner=DirectRunner` with the configured running mode and workers, then
          `beam.extra_args`; a `--runner` among `extra_args` replaces the DirectRunner options.
        """
        args = [
            "--runner=DirectRunner",  # named explicitly: newer Beam would pick Prism and download it
            f"--direct_running_mode={self.beam.direct_running_mode}",
            f"--direct_num_workers={self.beam.direct_num_workers}",
        ]
        if any(a.startswith("--runner") for a in self.beam.extra_args):
            args = []
        return args + list(self.beam.extra_args)

    def to_dict(self) -> Dict[str, Any]:
        """The fields, plus the resolved form under "resolved".

        Returns:
          `components.config.serialization.config_to_dict(self)`.
        """
        return config_to_dict(self)

    def to_json(self) -> str:
        """What `config_from_json` reads back (how the config travels to TFX executors).

        Returns:
          `components.config.serialization.config_to_json(self)`.
        """
        return config_to_json(self)
