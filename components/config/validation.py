"""Resolution: the cross-field checks of every section, in order, and the binding of features to tables.

`resolve` runs one small check per section (input, label, features and tables, training and its
optimizers, export, statistics, Beam), then the checks other packages register (pipelines/
registers the `kubeflow` section's: which runners and component ids exist is the pipeline's
knowledge). The first problem raises `ConfigError` naming the field and the fix; a config that
passes gets its frozen `ResolvedConfig`.
"""
from __future__ import annotations

import math

from typing import Callable, Dict, Optional

from components.config.binding import bind_tables, optimizer_path, table_optimizer
from components.config.checks import check_choice, check_positive, choice_member
from components.config.resolved import ResolvedConfig
from components.config.choices import TRANSFORMED_FORMATS
from components.rules.names import PIPELINE_NAME_MAX, PIPELINE_NAME_RULE, is_pipeline_name, serving_name
from components.rules.chips import CHIPS
from components.config.training_schema import DENSE_QUANTILE_POINTS as QUANTILE_POINTS
from components.config.choices import BucketEncoding, LayoutKind, ModelType, PartitionStrategy, TableDtype
from components.config.schema import ConfigError, ExportConfig, PipelineConfig
from components.config.training_schema import OptimizerConfig, ScheduleConfig
from components.config.tuning import check_tuning

Check = Callable[[PipelineConfig], None]
_REGISTERED: Dict[str, Check] = {}


def register_check(name: str, check: Check) -> None:
    """Adds a check `resolve` runs after this package's sections.

    pipelines/kubeflow_config.py registers "kubeflow" when pipelines/ loads: which runners and
    component ids exist is the pipeline's knowledge.

    Args:
      name: the check's name; registering a name again replaces its check.
      check: a function of the config that raises `ConfigError` on a problem.
    """
    _REGISTERED[name] = check


def resolve(cfg: PipelineConfig, source_file: Optional[str] = None) -> PipelineConfig:
    """Checks every section and binds every categorical feature to one table.

    Args:
      cfg: a configuration as the loader built it; its `tables` are completed in place.
      source_file: where it was read from, kept for messages.

    Returns:
      `cfg` itself, with its derived `ResolvedConfig` attached (`cfg.resolved`).

    Raises:
      ConfigError: the first problem found, naming the field and the fix.
    """
    for check in (_check_name, _check_input, _check_label, _check_input_health, _check_label_rule):
        check(cfg)
    tables = bind_tables(cfg)
    for check in (
        _check_allow_invalid,
        _check_sequences,
        _check_column_roles,
        _check_training,
        _check_seed,
        _check_embedding_optimizer,
        _check_embedding_plan,
        _check_dense_optimizer,
        lambda c: check_export_config(c.export),
        _check_validation,
        _check_continuous,
        _check_statistics,
        _check_transformed_examples,
        _check_beam,
        check_tuning,
        *_REGISTERED.values(),
    ):
        check(cfg)
    cfg._resolved = ResolvedConfig(tables=tables, source_file=source_file)  # PipelineConfig.resolved
    return cfg


def _check_name(cfg: PipelineConfig) -> None:
    if not is_pipeline_name(cfg.name):
        shown = cfg.name if len(cfg.name) <= 60 else cfg.name[:60] + "..."
        raise ConfigError(f"name: {shown!r} is not a valid pipeline name ({PIPELINE_NAME_RULE}): it names the run's "
                          f"ML Metadata contexts, its Kubeflow pipeline and its registry entries; e.g. "
                          f"{serving_name(cfg.name)[:PIPELINE_NAME_MAX]!r}")


def _check_input(cfg: PipelineConfig) -> None:
    if not cfg.input.path:
        raise ConfigError("input.path: missing; set the CSV, TFRecord or Parquet file, directory or glob to read")
    check_positive(cfg.input.train_buckets, "input.train_buckets", "hash buckets for the train split")
    check_positive(cfg.input.eval_buckets, "input.eval_buckets", "hash buckets for the eval split")
    check_positive(cfg.input.range_mb, "input.range_mb", "MiB per byte range of a CSV file (or row-group unit of a Parquet file) that ExampleGen reads")


def _check_label(cfg: PipelineConfig) -> None:
    if not cfg.label:
        raise ConfigError("label: missing; name the column that holds the 0/1 click label")


def _check_input_health(cfg: PipelineConfig) -> None:
    i = cfg.input
    for name in ("max_invalid_share", "warn_invalid_share"):
        if not 0 <= getattr(i, name) <= 1:
            raise ConfigError(f"input.{name}: {getattr(i, name)} is not a share in [0, 1]; e.g. 0.5")
    if i.warn_invalid_share > i.max_invalid_share:
        raise ConfigError(
            f"input.warn_invalid_share: {i.warn_invalid_share} is above input.max_invalid_share "
            f"({i.max_invalid_share}); the warning level must not exceed the stop level"
        )


def _check_label_rule(cfg: PipelineConfig) -> None:
    rule = cfg.label_rule
    if rule is None:
        return
    if not rule.column:
        raise ConfigError("label_rule.column: missing; name the numeric column the label is derived from")
    if rule.column == cfg.label:
        raise ConfigError(
            f"label_rule.column: {rule.column!r} is also the label's name; the derived label "
            "is written under `label`, so give it another name (e.g. label: clicked)"
        )


def _check_allow_invalid(cfg: PipelineConfig) -> None:
    names = {d.name for d in cfg.dense_features} | {f.name for f in cfg.categorical_features}
    label = cfg.label_source()  # the label column is held to the same share (example_gen/label_limits.py)
    for j, name in enumerate(cfg.input.allow_invalid):
        if name not in names | {label}:
            raise ConfigError(
                f"input.allow_invalid[{j}]: {name!r} is not a dense or categorical feature or the label column; "
                f"features are: {', '.join(sorted(names))}; the label column is {label!r}"
            )


def _check_sequences(cfg: PipelineConfig) -> None:
    """An attention query is another, pooled categorical feature of the sequence's dim."""
    by_name = {f.name: f for f in cfg.categorical_features}
    for i, f in enumerate(cfg.categorical_features):
        q = f.sequence
        if q is None or q.query is None:
            continue
        path = f"categorical_features[{i}].sequence.query"
        other = by_name.get(q.query)
        if other is None or other is f:
            raise ConfigError(f"{path}: {q.query!r} is not another categorical feature; name the candidate "
                              f"feature the sequence attends from (features: {', '.join(by_name)})")
        if other.sequence is not None:
            raise ConfigError(f"{path}: {q.query!r} is a sequence feature; the query must be one pooled vector")
        mine, theirs = cfg.feature_table(f).dim, cfg.feature_table(other).dim
        if mine != theirs:
            raise ConfigError(f"{path}: {q.query!r} has dim {theirs}, {f.name!r} dim {mine}; attention compares "
                              "the two vectors, so give their tables one dim (or share a table)")


def _check_column_roles(cfg: PipelineConfig) -> None:
    both = sorted(set(cfg.numeric_columns()) & set(cfg.categorical_columns()))
    if both:
        raise ConfigError(
            f"categorical_features: column(s) {both} are also read as numbers (dense feature, label or "
            "vocabulary or ID weight); ingestion types each column once, so read it in one role only"
        )


def _check_training(cfg: PipelineConfig) -> None:
    tr = cfg.training
    for name in ("batch_size", "train_steps", "eval_steps", "checkpoint_every_steps", "steps_per_execution",
                 "shuffle_buffer_rows"):
        check_positive(getattr(tr, name), f"training.{name}", "set a positive integer")
    check_positive(tr.epochs, "training.epochs", "passes over the train split when train_steps is unset, e.g. 3")
    if tr.checkpoint_every_steps % tr.steps_per_execution or (tr.train_steps or 0) % tr.steps_per_execution:
        raise ConfigError(
            f"training.steps_per_execution: {tr.steps_per_execution} must divide checkpoint_every_steps "
            f"({tr.checkpoint_every_steps}) and train_steps ({tr.train_steps}) so checkpoints fall on whole executions"
        )
    if tr.model == ModelType.DCN_V2:
        check_positive(tr.cross_layers, "training.cross_layers", "set at least one cross layer")
        if tr.cross_projection_dim is not None:
            check_positive(tr.cross_projection_dim, "training.cross_projection_dim", "set a positive rank or null")
    for name in ("bottom_mlp", "top_mlp"):
        for j, width in enumerate(getattr(tr, name)):
            check_positive(width, f"training.{name}[{j}]", "layer widths are positive")
    for name in ("dropout", "input_dropout"):
        rate = getattr(tr, name)
        if not 0.0 <= rate < 1.0:
            raise ConfigError(f"training.{name}: {rate} is not a rate in [0, 1); set e.g. 0.3, or 0 for none")
    if not tr.bottom_mlp:
        raise ConfigError("training.bottom_mlp: empty; list at least one layer width")
    es = tr.early_stopping
    if not isinstance(es.enabled, bool):
        raise ConfigError(f"training.early_stopping.enabled: {es.enabled!r} is not true or false")
    if not 0.0 < es.holdout_fraction < 1.0:
        raise ConfigError(f"training.early_stopping.holdout_fraction: {es.holdout_fraction} is not a share in (0, 1); "
                          "set e.g. 0.1, or enabled: false to train on the whole split")
    for name in ("max_holdout_rows", "evaluations", "patience"):
        check_positive(getattr(es, name), f"training.early_stopping.{name}", "set a positive integer")
    if not 0.0 <= es.min_improvement < 1.0:
        raise ConfigError(f"training.early_stopping.min_improvement: {es.min_improvement} is not an AUC gain in [0, 1)")
    db = tr.dense_buckets
    if not isinstance(db.enabled, bool):
        raise ConfigError(f"training.dense_buckets.enabled: {db.enabled!r} is not true or false")
    if not isinstance(db.buckets, int) or not 2 <= db.buckets <= QUANTILE_POINTS:
        raise ConfigError(f"training.dense_buckets.buckets: {db.buckets!r} is not a whole number in [2, {QUANTILE_POINTS}] "
                          f"(preprocessing records {QUANTILE_POINTS} quantile intervals)")
    check_positive(db.dim, "training.dense_buckets.dim", "set a positive embedding width, e.g. 8")
    if db.encoding == BucketEncoding.PIECEWISE_LINEAR and db.enabled and db.buckets < 3:
        raise ConfigError(f"training.dense_buckets.buckets: {db.buckets} buckets have {db.buckets - 1} boundary, no bin "
                          "between two for the piecewise_linear encoding; set at least 3, or encoding: embedding")
    wide = tr.wide
    if wide.enabled is not None and not isinstance(wide.enabled, bool):
        raise ConfigError(f"training.wide.enabled: {wide.enabled!r} is not true, false or null (null: beside long "
                          "multi-hot features only)")
    _check_optimizer(wide.optimizer, "training.wide.optimizer")
    if wide.optimizer.clipnorm is not None:
        raise ConfigError("training.wide.optimizer.clipnorm: TPU embedding optimizers cannot clip by norm; use clipvalue")


# training.seed seeds NumPy (whose seeds are 32-bit), Python, TensorFlow and the input dropout's
# stateless key (seed x 1,000,003 in int64): 2**70 failed deep in the Trainer.
MAX_SEED = 2**32 - 1


def _check_seed(cfg: PipelineConfig) -> None:
    seed = cfg.training.seed
    if not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"training.seed: {seed} is not a whole number in [0, {MAX_SEED:,}] (NumPy's seeds are "
                          "32-bit); set e.g. 42")


def _check_optimizer(o: OptimizerConfig, path: str) -> None:
    check_positive(o.learning_rate, f"{path}.learning_rate", "set a positive learning rate")
    check_positive(o.clipnorm, f"{path}.clipnorm", "set a positive clipping norm or remove it")
    check_positive(o.clipvalue, f"{path}.clipvalue", "set a positive clipping limit or remove it")
    _check_schedule(o.schedule, f"{path}.schedule")


def _check_schedule(sc: ScheduleConfig, path: str) -> None:
    if sc.warmup_steps < 0:
        raise ConfigError(f"{path}.warmup_steps: must be 0 or more, got {sc.warmup_steps}")
    check_positive(sc.decay_steps, f"{path}.decay_steps", "steps over which the rate decays")
    if not 0 < sc.decay_rate <= 1:
        raise ConfigError(f"{path}.decay_rate: must be in (0, 1], got {sc.decay_rate}")
    if not 0 <= sc.alpha <= 1:
        raise ConfigError(f"{path}.alpha: must be in [0, 1], got {sc.alpha}")


def _check_embedding_optimizer(cfg: PipelineConfig) -> None:
    _check_optimizer(cfg.training.embedding_optimizer, "training.embedding_optimizer")
    if cfg.training.embedding_optimizer.clipnorm is not None:
        raise ConfigError(
            "training.embedding_optimizer.clipnorm: TPU embedding optimizers cannot clip by norm (the "
            "tables are updated on the TPU, row by row); use clipvalue instead"
        )
    for t in cfg.tables:
        if t.optimizer is not None:
            _check_optimizer(table_optimizer(cfg, t.name), optimizer_path(cfg, t.name))
    m = cfg.training.embedding_gradient_multiplier
    if m is not None:
        path = "training.embedding_gradient_multiplier"
        if not (m.value > 0 and m.value < float("inf")):
            raise ConfigError(f"{path}.value: must be a positive number, got {m.value} (1.0 leaves gradients as they are)")
        _check_schedule(m.schedule, f"{path}.schedule")


def _check_embedding_plan(cfg: PipelineConfig) -> None:
    emb = cfg.training.embedding
    if emb.size_threshold is not None and emb.size_threshold < 0:
        raise ConfigError("training.embedding.size_threshold: must be 0 (all tables in TPU embedding), a row count, or null")
    topo = emb.topology
    for name in ("num_chips", "hbm_gib_per_chip", "sparse_cores_per_chip"):
        if getattr(topo, name) is not None:
            check_positive(getattr(topo, name), f"training.embedding.topology.{name}", "describe the TPU slice")
    if topo.chip is not None:
        check_choice(topo.chip, tuple(CHIPS), "training.embedding.topology.chip")
        facts = CHIPS[topo.chip]
        if topo.sparse_cores_per_chip is not None and topo.sparse_cores_per_chip != facts.sparse_cores_per_chip:
            raise ConfigError(
                f"training.embedding.topology.sparse_cores_per_chip: {topo.sparse_cores_per_chip}, but a {topo.chip} chip "
                f"has {facts.sparse_cores_per_chip}; remove it (the chip gives it) or change chip")
    if not 0 < emb.topology.usable_hbm_fraction <= 1:
        raise ConfigError("training.embedding.topology.usable_hbm_fraction: must be in (0, 1], e.g. 0.7")


def _check_dense_optimizer(cfg: PipelineConfig) -> None:
    _check_optimizer(cfg.training.dense_optimizer, "training.dense_optimizer")


def check_export_config(e: ExportConfig) -> None:
    """Checks the `export` section and holds its closed-set fields as members.

    The exporter CLI runs it again after its options override the section (they set plain strings).

    Args:
      e: the `export` section; `table_dtype`, `layout.kind` and `layout.partition_strategy` are
        converted to their `Choice` members in place.

    Raises:
      ConfigError: a field is out of range, or layout C lacks its partition strategy.
    """
    check_positive(e.parity_tolerance, "export.parity_tolerance", "e.g. 1e-5")
    check_positive(e.parity_sample_size, "export.parity_sample_size", "e.g. 512")
    e.table_dtype = choice_member(e.table_dtype, TableDtype, "export.table_dtype")
    check_positive(e.auc_sample_size, "export.auc_sample_size", "e.g. 20000")
    if not 0 <= e.max_auc_drop < 1:
        raise ConfigError(f"export.max_auc_drop: {e.max_auc_drop} is not in [0, 1); e.g. 0.005")
    lay = e.layout
    lay.kind = choice_member(lay.kind, LayoutKind, "export.layout.kind")
    lay.partition_strategy = choice_member(lay.partition_strategy, PartitionStrategy, "export.layout.partition_strategy")
    for name in ("num_partitions", "num_sparse_cores", "sparse_cores_per_chip"):
        check_positive(getattr(lay, name), f"export.layout.{name}", "leave it unset when not needed")
    if lay.kind == LayoutKind.C and lay.partition_strategy is None:
        raise ConfigError("export.layout.kind: C needs export.layout.partition_strategy (div or mod, as in training)")
    check_positive(e.store.max_file_mib, "export.store.max_file_mib", "e.g. 128")
    if e.store.enabled and not e.write_tables:
        raise ConfigError("export.store.enabled: true needs export.write_tables: true (the row files are written "
                          "from tables/)")


def _check_validation(cfg: PipelineConfig) -> None:
    v = cfg.validation
    _check_optimizer(v.baseline.optimizer, "validation.baseline.optimizer")
    check_positive(v.baseline.train_steps, "validation.baseline.train_steps", "leave it unset to use epochs")
    check_positive(v.baseline.epochs, "validation.baseline.epochs", "passes over the train split, or null for max_rows")
    for name, hint in (("max_rows", "rows trained on when epochs is null, e.g. 2000000"),
                       ("max_epochs", "e.g. 20"), ("min_steps", "e.g. 1000"), ("batch_size", "e.g. 1024")):
        check_positive(getattr(v.baseline, name), f"validation.baseline.{name}", hint)
    if not v.baseline.l2:
        raise ConfigError("validation.baseline.l2: empty; list at least one L2 strength, e.g. [0.0, 0.5, 1.5, 5.0, 15.0]")
    for j, x in enumerate(v.baseline.l2):
        if not (isinstance(x, (int, float)) and math.isfinite(x) and x >= 0):
            raise ConfigError(f"validation.baseline.l2[{j}]: {x!r} is not an L2 strength >= 0; e.g. 1.5")
    for name in ("baseline_margin", "regression_margin"):
        m = getattr(v, name)
        if m is not None and not (isinstance(m, (int, float)) and -1 < m < 1):
            raise ConfigError(f"validation.{name}: {m!r} is not an AUC difference in (-1, 1); e.g. 0.002, or null for no check")
    if v.baseline_margin is not None and not v.baseline.enabled:
        raise ConfigError("validation.baseline_margin: the baseline is disabled (validation.baseline.enabled: false); "
                          "set baseline_margin: null or enable the baseline")


def _check_continuous(cfg: PipelineConfig) -> None:
    d = cfg.continuous.drift
    for name, high in (("max_new_token_share", 1.0), ("min_vocabulary_overlap", 1.0),
                       ("max_ids_per_example_change", None), ("max_dense_mean_shift", None)):
        v = getattr(d, name)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v >= 0 and (high is None or v <= high)):
            limit = f"in [0, {high}]" if high is not None else "a number >= 0"
            raise ConfigError(f"continuous.drift.{name}: {v!r} is not {limit}; or null for no limit")


def _check_statistics(cfg: PipelineConfig) -> None:
    st = cfg.statistics
    for j, n in enumerate(st.shard_counts):
        check_positive(n, f"statistics.shard_counts[{j}]", "number of SparseCores or hosts to model")
    if st.headroom < 0:
        raise ConfigError(f"statistics.headroom: must be 0 or more, got {st.headroom} (e.g. 0.2 for 20%)")
    check_positive(st.top_values, "statistics.top_values", "how many hottest values to list")


def _check_transformed_examples(cfg: PipelineConfig) -> None:
    t = cfg.transformed_examples
    check_choice(t.format, TRANSFORMED_FORMATS, "transformed_examples.format")
    if isinstance(t.block_rows, bool) or not isinstance(t.block_rows, int) or t.block_rows < 1:
        raise ConfigError(f"transformed_examples.block_rows: {t.block_rows!r} is not a whole number of rows >= 1; "
                          "64 (the default) lets a training batch mix rows from several blocks")
    n = t.rows_per_file
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError(f"transformed_examples.rows_per_file: {n!r} is not a whole number of rows >= 0; "
                          "65536 (the default) writes files the trainer can read in a mixed order, 0 leaves "
                          "the file count to the Beam runner (one file per bundle)")


def _check_beam(cfg: PipelineConfig) -> None:
    if cfg.beam.hot_key_fanout < 0:
        raise ConfigError("beam.hot_key_fanout: must be 0 (off) or a positive number of intermediate keys")
    b = cfg.beam.value_count_buckets
    if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= 4096:
        raise ConfigError(f"beam.value_count_buckets: {b!r} is not a whole number from 1 to 4096; 16 (the default) "
                          "keeps each merge of the vocabulary counts to about 1/16 of the distinct values")
    if cfg.beam.direct_num_workers < 0:
        raise ConfigError("beam.direct_num_workers: must be 0 (one per core) or a positive count")
