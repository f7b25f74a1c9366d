"""The `training` section's schema: the ranking model, its optimizers and their schedules, the TPU
embedding and its topology, early stopping, the wide part, dense buckets and the run's length.
One dataclass per YAML mapping, as in schema.py, whose `PipelineConfig` holds a `TrainingConfig`;
the optimizer configs serve the tables' overrides and the baseline too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional

from components.config.choices import (BucketEncoding, BucketsInto, DimRule, DropoutMask, ModelType, OptimizerName,
                                       Precision, ScheduleName)


@dataclass
class ScheduleConfig:
    """Learning rate as a function of the step: `learning_rate` x decay, after an optional linear warm-up."""

    name: ScheduleName = ScheduleName.CONSTANT
    warmup_steps: int = 0  # linear ramp from 0 to learning_rate over these steps
    decay_steps: int = 1000  # exponential: rate^(step/decay_steps); cosine: to alpha over decay_steps
    decay_rate: float = 0.96  # exponential
    alpha: float = 0.0  # cosine: final fraction of the learning rate


@dataclass
class OptimizerConfig:
    """An optimizer (training.embedding_optimizer / training.dense_optimizer) and its schedule."""

    name: OptimizerName = OptimizerName.ADAGRAD
    learning_rate: float = 0.05
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    clipnorm: Optional[float] = None  # dense optimizer only (TPU embedding optimizers cannot clip by norm)
    clipvalue: Optional[float] = None  # clip each gradient value to [-clipvalue, clipvalue]
    initial_accumulator_value: float = 0.1  # adagrad / ftrl
    beta_1: float = 0.9  # adam
    beta_2: float = 0.999  # adam
    epsilon: float = 1e-7  # adam
    l1_regularization_strength: float = 0.0  # ftrl
    l2_regularization_strength: float = 0.0  # ftrl
    # adam, embedding optimizer: update only the rows looked up in a step (the TPU embedding Adam's
    # default; CPU/GPU follow the same rule). false: every row's moments decay every step.
    lazy_adam: bool = True


@dataclass
class OptimizerOverride:
    """A table's own embedding optimizer (`tables[].optimizer`, or `optimizer` on a feature with a
    table of its own): TF2's `TableConfig.optimizer`, the seeds' per-column `learning_rate_fn`.
    Fields left unset take `training.embedding_optimizer`'s when `name` is unset or the same;
    naming another optimizer inherits nothing (that optimizer's defaults) and needs a learning_rate.
    Merged by `components.config.binding.table_optimizer`."""

    name: Optional[OptimizerName] = None
    learning_rate: Optional[float] = None
    schedule: Optional[ScheduleConfig] = None
    clipvalue: Optional[float] = None
    initial_accumulator_value: Optional[float] = None
    beta_1: Optional[float] = None
    beta_2: Optional[float] = None
    epsilon: Optional[float] = None
    l1_regularization_strength: Optional[float] = None
    l2_regularization_strength: Optional[float] = None
    lazy_adam: Optional[bool] = None


@dataclass
class GradientMultiplierConfig:
    """The seeds' `experimental_gradient_multiplier_fn`: every embedding gradient multiplied by
    `value` x the schedule's factor at the step (the same warm-up / decay shapes as a learning rate)."""

    value: float = 1.0
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)


@dataclass
class TopologyConfig:
    """The TPU slice the embedding plan is sized for (defaults: 8 chips sized as SparseCore, 16 GiB
    HBM and 4 SparseCores each; contracts.chips.CHIPS has each chip's facts)."""

    # v2 | v3 | v4 (TPUEmbedding) | v5e (no embedding engine: every table must be on the TensorCore,
    # size_threshold: null) | v5p | v6e (SparseCore); null: sized for SparseCore, and the trainer
    # re-sizes the plan for the embedding API the TPU reports.
    chip: Optional[str] = None
    # Chips the TPU-embedding tables are sharded over. null: sized for 8 until the hardware says (on a
    # TPU the trainer re-sizes the plan for the chips its replicas are); set: a TPU with another count
    # is refused, naming both.
    num_chips: Optional[int] = None
    hbm_gib_per_chip: Optional[float] = None  # null: the chip's HBM, else 16
    sparse_cores_per_chip: Optional[int] = None  # null: the chip's (v5p: 4, v6e: 2, none before v5p), else 4
    usable_hbm_fraction: float = 0.7  # share of HBM the embedding tables may take (the rest: dense part, activations)


@dataclass
class EmbeddingConfig:
    """How tables become TPU embedding configs (the embedding plan)."""

    # Tables with more rows than this go to TPU embedding (sharded over the chips); smaller ones are
    # Keras embeddings on the TensorCore, as tensorflow-recommenders' PartialTPUEmbedding places them.
    # 0: every table in TPU embedding; null: none.
    size_threshold: Optional[int] = 0
    dim_rule: DimRule = DimRule.CONFIG  # config: the configured dim; fourth_root: tables without an explicit dim get 8*ceil(6*rows^0.25/8)
    topology: TopologyConfig = field(default_factory=TopologyConfig)


@dataclass
class EarlyStoppingConfig:
    """`training.early_stopping`: the model kept is the checkpoint with the best AUC on a held-out
    slice of the train split (never the eval split, which the validation gate reads), and training
    stops when that AUC has not improved for `patience` evaluations."""

    enabled: bool = True
    holdout_fraction: float = 0.1  # at most this share of the train split's records is held out...
    max_holdout_rows: int = 50_000  # ...and at most about this many rows (the rest is trained on)
    evaluations: int = 10  # holdout evaluations over the run's length (at checkpoints)
    patience: int = 3  # evaluations without improvement before training stops
    min_improvement: float = 0.0  # holdout AUC gain over the best so far that counts as one


# The wide part's table and feature beside each table and categorical feature are named after it
# with this suffix (contracts.plan); configured names may not end in it.
WIDE_SUFFIX = "__wide"


@dataclass
class WideConfig:
    """`training.wide`: a linear (wide) part trained jointly with the deep model (Wide & Deep): one
    weight per embedding row (a one-dimensional table beside a table, same rows, same vocabulary,
    each feature a bag of its IDs) and one per dense feature and bucket, added to the deep part's
    logit. Its tables have their own optimizer and are placed like their deep tables (TPU embedding
    or TensorCore).

    `enabled`: true: beside every table; false: none; null (default): beside the tables of long
    multi-hot features only (mean IDs per example >= planning.derivation.LONG_MULTI_HOT_IDS: a text's
    words), where a bag of words is what a linear model does best: with it the defaults beat
    scikit-learn's logistic regression on two public text datasets, and everywhere it did not help
    consistently (bench/README.md "Defaults on real data"). The plan records which and why."""

    enabled: Optional[bool] = None
    optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(OptimizerName.ADAM, 0.01))


# A dense feature's train-split quantiles as preprocessing records them (contracts.statistics:
# dense_features.<f>.train.quantiles): the 0th, 1st, ..., 100th percentiles of its filled values,
# from a quantiles sketch (preprocessing's statistics.py); training.dense_buckets.buckets is at most this.
DENSE_QUANTILE_POINTS = 100


@dataclass
class DenseBucketsConfig:
    """`training.dense_buckets`: every dense feature also enters the model as an embedded
    categorical, its quantile bucket on the train split (boundaries from preprocessing's quantiles
    sketch, recorded in the plan, applied inside the model so that training and serving bucket
    alike), beside its numeric input (signed log1p)."""

    enabled: bool = True
    buckets: int = 20  # this many buckets of about equal train rows (a boundary repeats where many rows hold one value)
    dim: int = 8  # each bucket's embedding width (projected to the interaction width for dlrm)
    # embedding: the value's bucket looks up a [buckets, dim] table; piecewise_linear: the value's
    # piecewise-linear encoding over the same boundaries (each bin between two boundaries 0 below
    # it, 1 above it, the fraction inside it) times a [bins, dim] matrix: neighbouring values get
    # neighbouring vectors (Gorishniy et al. 2022, "On embeddings for numerical features").
    encoding: BucketEncoding = BucketEncoding.EMBEDDING
    # Where the bucket vectors enter the model: `interaction` beside the categorical features'
    # vectors (into the cross layers or the dot interaction, under input dropout); `bottom_mlp`
    # beside the dense values as the bottom MLP's input, which keeps the cross layers / interaction
    # as wide as without buckets (bench/README.md "Trainer": what each costs).
    into: BucketsInto = BucketsInto.INTERACTION


# The default training length (training.epochs unset) from the train split's size: DEFAULT_EPOCHS
# passes over splits of up to DEFAULT_EPOCHS_ROWS rows, then fewer as sqrt(DEFAULT_EPOCHS_ROWS /
# rows) (about 9.8 at 236k rows, 4.7 at 1M, 1.5 at 10M), never under MIN_DEFAULT_EPOCHS. Chosen on
# four public datasets (bench/README.md "Defaults on real data"): more passes suit small data, and
# early stopping ends a run whose held-out AUC has peaked, so a length on the long side costs time,
# not accuracy.
DEFAULT_EPOCHS = 15.0


DEFAULT_EPOCHS_ROWS = 100_000


MIN_DEFAULT_EPOCHS = 1.0


def default_epochs(train_rows: int) -> float:
    """Passes over the rows trained on (TrainingConfig.trained_rows) when `training.epochs` is unset.

    Args:
      train_rows: rows of the train split.

    Returns:
      DEFAULT_EPOCHS up to DEFAULT_EPOCHS_ROWS rows, then fewer as sqrt(DEFAULT_EPOCHS_ROWS / rows),
      never under MIN_DEFAULT_EPOCHS; rounded to two decimals.
    """
    scaled = DEFAULT_EPOCHS * math.sqrt(DEFAULT_EPOCHS_ROWS / max(int(train_rows), 1))
    return round(max(MIN_DEFAULT_EPOCHS, min(DEFAULT_EPOCHS, scaled)), 2)


@dataclass
class TrainingConfig:
    """The `training` section: the model, its optimizers, steps, checkpoints and the embedding plan."""

    # The defaults (model, embedding optimizer, input dropout, length) were chosen on four real public datasets
    # with configs that state only their schema (bench/README.md "Defaults on real data"). The cross
    # layers' shape and the input dropout's mask: two rank-32 cross layers with the byte mask train
    # at 2.1-2.3x the rate of three full-rank ones with the float mask (the defaults before), within
    # 0.002 eval AUC of them on the public datasets (bench/README.md "Trainer").
    model: ModelType = ModelType.DCN_V2  # dcn_v2: cross layers; dlrm: dot interaction
    # The dense network's precision: float32; mixed_bfloat16 (Keras' policy: float32 variables,
    # bfloat16 matmuls, the logit, loss and metrics in float32; tables and their optimizers stay
    # float32); auto: mixed_bfloat16 on a TPU, as Model Garden trains, float32 elsewhere unless
    # measured faster (embedding_trainer/precision_choice.py says the rule and the figures).
    precision: Precision = Precision.AUTO
    batch_size: int = 256  # global batch size (split evenly over the replicas)
    cross_layers: int = 2  # dcn_v2: number of cross layers
    cross_projection_dim: Optional[int] = 32  # dcn_v2: low-rank cross layers of this rank; null: full rank
    # Training length: train_steps when set; else `epochs` passes over the rows trained on (the train
    # split, its row count from the preprocessing statistics, less the held-out slice: `trained_rows`),
    # rounded up to whole steps_per_execution; epochs unset: `default_epochs` of the train split's
    # row count (more passes over small data, fewer over large).
    train_steps: Optional[int] = None
    epochs: Optional[float] = None
    eval_steps: int = 50
    bottom_mlp: List[int] = field(default_factory=lambda: [64, 16])
    top_mlp: List[int] = field(default_factory=lambda: [64, 32])
    dropout: float = 0.0  # dropout rate after each hidden top-MLP layer in training (0: none)
    # Dropout rate in training on every categorical feature's and dense bucket's vector where it
    # enters the cross layers (DCN) or the interaction (DLRM), not on the bottom MLP's output; 0:
    # none. It keeps the per-ID vectors of rarely seen IDs from being fitted alone; 0.2 with the
    # longer default length it needs did more in sum than 0.1 or 0.3 (bench/README.md "Defaults on real data").
    input_dropout: float = 0.2
    # How the input dropout's stateless mask is drawn: float (one random float an entry) or byte
    # (one random byte an entry, the rate rounded to a multiple of 1/256; a quarter of the draws).
    input_dropout_mask: DropoutMask = DropoutMask.BYTE
    embedding_optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(OptimizerName.ADAGRAD, 0.1))
    dense_optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(OptimizerName.ADAM, 0.001))
    # Every embedding gradient times this factor (a schedule of the step) on CPU/GPU and TPU alike;
    # null: none. Applied to each feature's pooled-vector gradient, so before clipping.
    embedding_gradient_multiplier: Optional[GradientMultiplierConfig] = None
    seed: int = 42
    tpu: Optional[str] = None  # TPU name or grpc:// address: train under TPUStrategy; None: CPU/GPU
    # Where checkpoints of an unfinished run are kept (e.g. gs://...); null: <pipeline root>/Trainer/training_state/<key>
    checkpoint_dir: Optional[str] = None
    checkpoint_every_steps: int = 500  # checkpoint every this many steps (and at the end); a restarted run resumes
    steps_per_execution: int = 1  # training steps per tf.function call (Keras compile); divides checkpoint_every_steps
    # The training shuffle buffer in rows (at least 16 batches): input ordered by time needs a wide
    # one (embedding_model/input.DEFAULT_SHUFFLE_ROWS says what it changed on real data).
    shuffle_buffer_rows: int = 65_536
    # TPU only: overlap the embedding lookups with the TensorCore step (faster; the lookups then see
    # tables one step old, so results differ slightly from CPU/GPU and from false). CPU/GPU ignore it.
    pipeline_execution_with_tensor_core: bool = False
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    wide: WideConfig = field(default_factory=WideConfig)
    dense_buckets: DenseBucketsConfig = field(default_factory=DenseBucketsConfig)

    def holdout_fraction(self, train_rows: Optional[int]) -> float:
        """The share of the train split's records held out for early stopping.

        Args:
          train_rows: rows of the train split, or None when unknown.

        Returns:
          0 when early stopping is off; else `early_stopping.holdout_fraction`, less where that would
          hold out more than `max_holdout_rows` rows.
        """
        es = self.early_stopping
        if not es.enabled:
            return 0.0
        if not train_rows:
            return es.holdout_fraction
        return min(es.holdout_fraction, es.max_holdout_rows / train_rows)

    def epochs_for(self, train_rows: int) -> float:
        """The passes over the rows trained on (`trained_rows`) when `train_steps` is unset.

        Args:
          train_rows: rows of the train split.

        Returns:
          `epochs` when set, else `default_epochs(train_rows)`.
        """
        return self.epochs if self.epochs is not None else default_epochs(train_rows)

    def trained_rows(self, train_rows: int) -> int:
        """The rows an epoch passes over: the train split less the held-out slice.

        The one definition of an epoch: the planned length (`steps_for_epochs`, and the source
        run_plan.training_steps records for it) and the epochs a run trained (`epochs_trained`:
        the summary, the run report) all count these rows.

        Args:
          train_rows: rows of the train split.

        Returns:
          `train_rows` less its held-out share (`holdout_fraction`), to the nearest row; all of
          them when early stopping is off.
        """
        rows = int(train_rows)
        return rows - round(rows * self.holdout_fraction(rows))

    def epochs_trained(self, steps: int, train_rows: int) -> float:
        """The passes over the rows trained on that `steps` steps of `batch_size` make.

        Args:
          steps: training steps.
          train_rows: rows of the train split.

        Returns:
          steps x batch_size / `trained_rows(train_rows)`.
        """
        return steps * self.batch_size / max(self.trained_rows(train_rows), 1)

    def steps_for_epochs(self, train_rows: int, epochs: Optional[float] = None) -> int:
        """The training length in steps when `train_steps` is unset.

        Args:
          train_rows: rows of the train split (its held-out slice is not trained on).
          epochs: passes over the rows trained on; None: `epochs_for(train_rows)`.

        Returns:
          ceil(epochs x `trained_rows(train_rows)` / batch_size), at least 1, rounded up to whole
          `steps_per_execution`.
        """
        epochs = self.epochs_for(train_rows) if epochs is None else epochs
        steps = max(1, math.ceil(epochs * self.trained_rows(train_rows) / self.batch_size))
        return self._whole_executions(steps)

    def evaluation_every(self, total_steps: int) -> int:
        """Steps between holdout evaluations.

        Args:
          total_steps: the training length.

        Returns:
          `total_steps / early_stopping.evaluations`, rounded up to whole `steps_per_execution`.
        """
        return self._whole_executions(max(1, math.ceil(total_steps / self.early_stopping.evaluations)))

    def _whole_executions(self, steps: int) -> int:
        return math.ceil(steps / self.steps_per_execution) * self.steps_per_execution
