"""Resolution of categorical features onto tables: every feature gets exactly one table.

A feature without `table` gets a table of its own (named after it); features naming a declared
table share it, and a dim or combiner set on one of them fills in the table's. Then every table
takes what it still lacks from `categorical_defaults`. The bindings come back as `ResolvedTable`s.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Dict, List, Optional, Tuple

from components.config.checks import check_column, check_positive
from components.config.choices import Combiner, InitializerKind, SequencePooling, VocabularyKind
from components.config.resolved import ResolvedTable
from components.config.schema import (CategoricalDefaults, CategoricalFeature, ConfigError, InitializerOptions,
                                      PipelineConfig, TableConfig, VocabularyOptions)
from components.config.training_schema import OptimizerConfig, OptimizerOverride, WIDE_SUFFIX
from components.rules.names import SAFE_NAME_RULE, is_safe_name, serving_name
from components.rules.rulebook import token_invalid_reason


def bind_tables(cfg: PipelineConfig) -> Tuple[ResolvedTable, ...]:
    """Binds every categorical feature to one table and completes the tables.

    Checks the features and tables, then completes `cfg.tables` in place: implicit tables appended,
    dim, combiner, vocabulary and initializer filled in from `categorical_defaults`.

    Args:
      cfg: the configuration being resolved (its `tables` are replaced).

    Returns:
      Each table's binding, in the order of the completed `cfg.tables`.

    Raises:
      ConfigError: a feature or table is invalid, two features clash, or a table is unused.
    """
    if not cfg.categorical_features:
        raise ConfigError("categorical_features: empty; list at least one categorical feature")
    names = _FeatureNames(cfg.label)
    for i, d in enumerate(cfg.dense_features):
        names.claim(d.name, f"dense_features[{i}]", d.column)
    _check_defaults(cfg.categorical_defaults)
    declared = _check_declared_tables(cfg.tables)
    bound: Dict[str, List[str]] = {t.name: [] for t in cfg.tables}
    implicit: List[TableConfig] = []
    origins: Dict[tuple, str] = {}  # (table, attr) -> the feature field that set it, for messages
    for i, f in enumerate(cfg.categorical_features):
        path = f"categorical_features[{i}]"
        names.claim(f.name, path, f.column)
        _check_feature(f, path)
        if f.table is not None:
            _join_shared_table(f, path, cfg.tables, declared, origins)
            bound[f.table].append(f.name)
        else:
            implicit.append(_own_table(f, path, declared))
            bound[f.name] = [f.name]
    for i, t in enumerate(cfg.tables):
        _check_not_wide_name(t.name, f"tables[{i}].name")
        if not bound[t.name]:
            raise ConfigError(f"tables: table {t.name!r} is used by no feature; remove it or point a feature at it")
    cfg.tables = list(cfg.tables) + implicit
    resolved = tuple(ResolvedTable(t.name, tuple(bound[t.name]), dim_explicit=t.dim is not None,
                                   combiner_explicit=t.combiner is not None or cfg.categorical_defaults.combiner is not None)
                     for t in cfg.tables)
    for t in cfg.tables:
        _fill_defaults(t, cfg.categorical_defaults)
        _check_uniform_range(t)
    return resolved


def _check_uniform_range(t: TableConfig) -> None:
    """A random_uniform range with one end left to its default (+-1/sqrt(dim)) must still be a range."""
    init = t.initializer
    if init is None or init.name != InitializerKind.RANDOM_UNIFORM or t.dim is None:
        return
    scale = 1.0 / t.dim ** 0.5
    low = init.minval if init.minval is not None else -scale
    high = init.maxval if init.maxval is not None else scale
    if not low < high:
        raise ConfigError(
            f"table {t.name!r}: initializer random_uniform from {low!r} to {high!r} is empty (an unset end is "
            f"+-1/sqrt(dim) = {scale:.4g} for dim {t.dim}); set both minval and maxval"
        )


def _check_not_wide_name(name: str, path: str) -> None:
    if name.endswith(WIDE_SUFFIX):
        raise ConfigError(f"{path}: {name!r} ends in {WIDE_SUFFIX!r}, which names the wide part's table and feature "
                          "beside each table and feature (training.wide); rename it")


class _FeatureNames:
    """Feature names claimed so far: unique across dense and categorical features, never the label."""

    def __init__(self, label: str):
        self.label = label
        self.seen: Dict[str, str] = {}

    def claim(self, name: str, path: str, column: Optional[str]) -> None:
        if not name:
            raise ConfigError(f"{path}.name: missing; give every feature a name")
        check_column(column, f"{path}.column", "remove the field to read the column named like the feature")
        if not is_safe_name(name):
            example = json.dumps(column if column is not None else name, ensure_ascii=False)
            raise ConfigError(
                f"{path}.name: {name!r} is not a valid feature name ({SAFE_NAME_RULE}); name the feature and read "
                f"the column by `column`: {{name: {serving_name(name)}, column: {example}}}"
            )
        if name in self.seen:
            raise ConfigError(f"{path}.name: {name!r} is already used by {self.seen[name]}; feature names must be unique")
        if name == self.label:
            raise ConfigError(f"{path}.name: {name!r} is the label column; remove it from the features")
        _check_not_wide_name(name, f"{path}.name")
        self.seen[name] = path


# The fields each vocabulary kind takes (the others must be left at their defaults).
_VOCABULARY_FIELDS = {
    VocabularyKind.COUNTED: ("top_k", "min_frequency", "num_oov_buckets", "weight_column"),
    VocabularyKind.LIST: ("values", "num_oov_buckets"),
    VocabularyKind.FILE: ("file", "num_oov_buckets"),
    VocabularyKind.HASHED: ("num_buckets",),
    VocabularyKind.IDENTITY: ("num_buckets", "default_value"),
}
# The fields each initializer kind takes (the others must be left unset).
_INITIALIZER_FIELDS = {
    InitializerKind.TRUNCATED_NORMAL: ("mean", "stddev"),
    InitializerKind.RANDOM_NORMAL: ("mean", "stddev"),
    InitializerKind.RANDOM_UNIFORM: ("minval", "maxval"),
    InitializerKind.ZEROS: (),
}


def check_vocabulary(v: Optional[VocabularyOptions], path: str) -> None:
    """Checks a table's vocabulary options: the fields its kind takes, and their values.

    Args:
      v: the options, or None when unset.
      path: the field's path in the config, e.g. `tables[0].vocabulary`.

    Raises:
      ConfigError: a field the kind does not take is set, or a value is out of range or missing.
    """
    if v is None:
        return
    defaults = VocabularyOptions()
    takes = _VOCABULARY_FIELDS[v.kind]
    for attr in ("top_k", "min_frequency", "num_oov_buckets", "weight_column", "values", "file", "num_buckets",
                 "default_value"):
        if attr not in takes and getattr(v, attr) != getattr(defaults, attr):
            raise ConfigError(f"{path}.{attr}: vocabulary kind {v.kind} takes {', '.join(takes)}; remove {attr} or change kind")
    check_positive(v.top_k, f"{path}.top_k", "keep at least one value, or remove top_k to keep all")
    check_positive(v.min_frequency, f"{path}.min_frequency", "use 1 to keep every value seen")
    check_positive(v.num_oov_buckets, f"{path}.num_oov_buckets", "at least one row for unseen values")
    if v.weight_column == "":
        raise ConfigError(f"{path}.weight_column: empty; name a numeric column or remove the field")
    if v.kind in (VocabularyKind.HASHED, VocabularyKind.IDENTITY):
        if v.num_buckets is None:
            raise ConfigError(f"{path}.num_buckets: missing; a {v.kind} column needs its number of rows")
        check_positive(v.num_buckets, f"{path}.num_buckets", "the table's rows")
    if v.default_value is not None and not 0 <= v.default_value < v.num_buckets:
        raise ConfigError(
            f"{path}.default_value: {v.default_value} is not a row of the table (0 to {v.num_buckets - 1}); "
            "set a row for out-of-range IDs, or remove it to drop them"
        )
    if v.kind == VocabularyKind.LIST:
        if not v.values:
            raise ConfigError(f"{path}.values: missing or empty; list the vocabulary, one value per row")
        check_vocabulary_values([t.encode("utf-8") for t in v.values], f"{path}.values", "item")
    if v.kind == VocabularyKind.FILE and not v.file:
        raise ConfigError(f"{path}.file: missing; name the vocabulary file (one value per line)")


def check_vocabulary_values(tokens: List[bytes], where: str, unit: str) -> None:
    """Checks the values of a given vocabulary: tokens (rulebook T5-T6: non-empty, UTF-8, no line break), each once.

    Args:
      tokens: the values, in row order.
      where: the list's field path or the file, for messages.
      unit: what a position in `where` is called: "item" of a list (counted from 0) or "line" of a
        file (counted from 1).

    Raises:
      ConfigError: a value is not a token, or repeats an earlier one.
    """
    seen: Dict[bytes, int] = {}
    for i, token in enumerate(tokens):
        reason = "empty" if not token else token_invalid_reason(token)
        if reason is not None:
            raise ConfigError(f"{where}: {unit} {i + (unit == 'line')} ({token[:40]!r}) is not a token ({reason}); "
                              "every value must be non-empty UTF-8 text without line breaks")
        if token in seen:
            raise ConfigError(f"{where}: {unit} {i + (unit == 'line')} repeats {token[:40]!r} ({unit} "
                              f"{seen[token] + (unit == 'line')}); each value may appear once")
        seen[token] = i


def check_initializer(init: Optional[InitializerOptions], path: str) -> None:
    """Checks an initializer's fields: those its kind takes, and their values.

    Args:
      init: the options, or None when unset.
      path: the field's path in the config.

    Raises:
      ConfigError: a parameter the kind does not take is set, or the values are no distribution.
    """
    if init is None:
        return
    takes = _INITIALIZER_FIELDS[init.name]
    for attr in ("mean", "stddev", "minval", "maxval"):
        if getattr(init, attr) is not None and attr not in takes:
            uses = f"takes {', '.join(takes)}" if takes else "takes no parameters"
            raise ConfigError(f"{path}.{attr}: {init.name} {uses}; remove {attr} or change name")
    if init.stddev is not None and not init.stddev > 0:
        raise ConfigError(f"{path}.stddev: {init.stddev!r}; a standard deviation must be positive")
    if init.minval is not None and init.maxval is not None and not init.minval < init.maxval:
        raise ConfigError(f"{path}: minval {init.minval!r} is not below maxval {init.maxval!r}")


def _check_defaults(defaults: CategoricalDefaults) -> None:
    check_positive(defaults.dim, "categorical_defaults.dim", "set a positive embedding dimension")
    check_vocabulary(defaults.vocabulary, "categorical_defaults.vocabulary")
    check_initializer(defaults.initializer, "categorical_defaults.initializer")


def _check_declared_tables(tables: List[TableConfig]) -> Dict[str, int]:
    """The `tables` section's own checks; returns name -> index."""
    declared: Dict[str, int] = {}
    for i, t in enumerate(tables):
        path = f"tables[{i}]"
        if not t.name:
            raise ConfigError(f"{path}.name: missing; give every table a name")
        if not is_safe_name(t.name):
            raise ConfigError(
                f"{path}.name: {t.name!r} is not a valid table name ({SAFE_NAME_RULE}): it names the table's "
                f"vocabulary file and variables; rename it, e.g. {serving_name(t.name)}, in its features' `table` too"
            )
        if t.name in declared:
            raise ConfigError(f"{path}.name: table {t.name!r} is declared twice (also tables[{declared[t.name]}])")
        declared[t.name] = i
        check_positive(t.dim, f"{path}.dim", "set a positive embedding dimension")
        check_vocabulary(t.vocabulary, f"{path}.vocabulary")
        check_initializer(t.initializer, f"{path}.initializer")
    return declared


def _check_feature(f: CategoricalFeature, path: str) -> None:
    """One categorical feature's own fields (before it is bound)."""
    check_positive(f.dim, f"{path}.dim", "set a positive embedding dimension")
    check_vocabulary(f.vocabulary, f"{path}.vocabulary")
    check_initializer(f.initializer, f"{path}.initializer")
    if not isinstance(f.use_safe_embedding_lookup, bool):
        raise ConfigError(f"{path}.use_safe_embedding_lookup: {f.use_safe_embedding_lookup!r}; use true or false")
    check_positive(f.max_length, f"{path}.max_length", "keep at least one value per example")
    if f.separator == "":
        raise ConfigError(f"{path}.separator: empty; set the multi-hot separator (e.g. '|') or remove it")
    if f.weight_column == "":
        raise ConfigError(f"{path}.weight_column: empty; name the numeric column that weighs this feature's IDs or remove it")
    if f.weight_column is not None and f.weight_column == f.source:
        raise ConfigError(f"{path}.weight_column: {f.weight_column!r} is the feature's own column; name another, numeric column")
    if f.sequence is not None:
        q = f.sequence
        check_positive(q.length, f"{path}.sequence.length", "positions kept per example")
        if f.combiner is not None:
            raise ConfigError(f"{path}.combiner: {f.name!r} is a sequence feature, whose positions are pooled by "
                              "sequence.pooling, not by a combiner; remove combiner")
        if f.weight_column is not None:
            raise ConfigError(f"{path}.weight_column: a sequence feature keeps one vector per position; weights "
                              "apply to pooled features only")
        if (q.pooling == SequencePooling.ATTENTION) != (q.query is not None):
            raise ConfigError(f"{path}.sequence.query: attention pooling needs the candidate feature it attends "
                              "from (query), and only attention takes one")
    if f.max_length is not None and f.separator is None:
        raise ConfigError(f"{path}.max_length: only applies to multi-hot features; set separator too")


def _join_shared_table(
    f: CategoricalFeature, path: str, tables: List[TableConfig], declared: Dict[str, int], origins: Dict[tuple, str]
) -> None:
    """Binds `f` to the declared table it names; its dim / combiner fill in the table's or must agree."""
    if f.table not in declared:
        known = ", ".join(sorted(declared)) or "none declared"
        raise ConfigError(
            f"{path}.table: {f.table!r} is not in tables ({known}); declare it under tables "
            "or remove the field to give the feature a table of its own"
        )
    t = tables[declared[f.table]]
    tpath = f"tables[{declared[f.table]}]"
    for attr in ("vocabulary", "initializer", "optimizer"):
        if getattr(f, attr) is not None:
            raise ConfigError(
                f"{path}.{attr}: {f.name!r} uses table {t.name!r}, whose {attr} is shared; "
                f"set the options under {tpath}.{attr} instead"
            )
    for attr in ("dim", "combiner"):
        mine, theirs = getattr(f, attr), getattr(t, attr)
        if mine is None:
            continue
        if theirs is None:
            setattr(t, attr, mine)
            origins[(t.name, attr)] = f"{path}.{attr}"
        elif mine != theirs:
            origin = origins.get((t.name, attr), f"{tpath}.{attr}")
            raise ConfigError(
                f"{path}.{attr}: {mine!r} conflicts with {theirs!r} from {origin} for shared "
                f"table {t.name!r}; features sharing a table must agree"
            )


def _own_table(f: CategoricalFeature, path: str, declared: Dict[str, int]) -> TableConfig:
    """The implicit table of a feature without `table`."""
    if f.name in declared:
        raise ConfigError(
            f"{path}.table: a table named {f.name!r} is declared under tables; set table: {f.name} "
            "to use it, or rename the feature"
        )
    return TableConfig(
        name=f.name, dim=f.dim, combiner=f.combiner, vocabulary=f.vocabulary, initializer=f.initializer,
        optimizer=f.optimizer,
    )


def _fill_defaults(t: TableConfig, defaults: CategoricalDefaults) -> None:
    t.dim = t.dim if t.dim is not None else defaults.dim
    # null everywhere: mean here; the plan may choose another from the statistics (combiner_explicit)
    t.combiner = t.combiner or defaults.combiner or Combiner.MEAN
    t.vocabulary = t.vocabulary or dataclasses.replace(defaults.vocabulary)
    t.initializer = t.initializer or dataclasses.replace(defaults.initializer)


def merge_optimizer(base: OptimizerConfig, override: Optional[OptimizerOverride], path: str) -> OptimizerConfig:
    """A table's embedding optimizer: its override merged over `training.embedding_optimizer`.

    An override naming another optimizer starts from that optimizer's defaults instead (nothing is
    inherited: one optimizer's hyperparameters and rates mean nothing to another) and must set its
    learning rate.

    Args:
      base: `training.embedding_optimizer`.
      override: the table's override, or None.
      path: where the override is written, for messages.

    Returns:
      `base` itself without an override, else a new optimizer config.

    Raises:
      ConfigError: the override names another optimizer without a learning rate.
    """
    if override is None:
        return base
    fields = {k: v for k, v in dataclasses.asdict(override).items() if v is not None}
    if "schedule" in fields:
        fields["schedule"] = override.schedule
    if override.name is None or override.name == base.name:
        return dataclasses.replace(base, **fields)
    if override.learning_rate is None:
        raise ConfigError(
            f"{path}.learning_rate: missing; a table whose optimizer ({override.name}) differs from "
            f"training.embedding_optimizer ({base.name}) inherits nothing from it, so set its learning_rate"
        )
    return OptimizerConfig(**fields)


def table_optimizer(cfg: PipelineConfig, table: str) -> OptimizerConfig:
    """The embedding optimizer of a resolved table (`merge_optimizer` of its override).

    Args:
      cfg: a resolved configuration.
      table: the table's name.

    Returns:
      The optimizer config the table trains with.

    Raises:
      KeyError: no table is named `table`.
      ConfigError: the override names another optimizer without a learning rate.
    """
    return merge_optimizer(cfg.training.embedding_optimizer, cfg.table(table).optimizer, optimizer_path(cfg, table))


def optimizer_path(cfg: PipelineConfig, table: str) -> str:
    """Where a table's optimizer override is written, for messages.

    Args:
      cfg: a resolved configuration.
      table: the table's name.

    Returns:
      `categorical_features[i].optimizer` for a feature's own table, else `tables[i].optimizer`.
    """
    for i, f in enumerate(cfg.categorical_features):
        if f.table is None and f.name == table:
            return f"categorical_features[{i}].optimizer"
    for i, t in enumerate(cfg.tables):
        if t.name == table:
            return f"tables[{i}].optimizer"
    return f"table {table!r} optimizer"
