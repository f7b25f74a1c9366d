"""Loading: YAML (or the JSON executors receive) -> a checked, resolved `PipelineConfig`.

Type conversion names the field of every mismatch (`categorical_features[3].dim: expected an
integer, got 'sixteen'`). Nothing here touches TensorFlow, TFX or Beam, so a bad file is rejected
in well under a second, before any work starts.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import typing
from typing import Any, Dict, List

import yaml

from components.config.checks import choice_member
from components.config.choices import Choice
from components.config.schema import ConfigError, PipelineConfig
from components.config.tuning import checked_values
from components.config.validation import resolve

# A configuration file's limits, checked before it is read: a real config (hundreds of features) is
# tens of kilobytes and a few thousand YAML nodes; anchors and aliases may not expand it past
# MAX_CONFIG_NODES (a "billion laughs" file of a few hundred bytes would otherwise take minutes and
# gigabytes to build, then to print).
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_NODES = 100_000
MAX_INT = 2**63 - 1  # an integer field's bound: int64
EXCERPT_CHARS = 80  # the most of a value a message quotes
LONG_TOKEN_CHARS = 300  # a longer run without a space in a message is cut (a path is shorter)
SERIALIZED_SOURCE = "<serialized config>"  # source_file of a config read by config_from_json
# JSON without a "resolved" section carries the derived bindings in each table instead; they are not fields.
_OLD_RESOLVED_KEYS = ("features", "dim_explicit", "combiner_explicit")


def excerpt(value: Any) -> str:
    """A value as a message quotes it: its repr, cut to `EXCERPT_CHARS` characters."""
    text = repr(value)
    return text if len(text) <= EXCERPT_CHARS else f"{text[:EXCERPT_CHARS]}... ({len(text):,} characters)"


def _bounded(message: str) -> str:
    """A message with every long quoted value cut to `EXCERPT_CHARS` characters, and any other run of
    more than `LONG_TOKEN_CHARS` characters without a space (the checks quote names and values, and
    suggest names derived from them; a configuration may hold a megabyte in one string)."""
    quoted = re.sub(r"""(['"])([^'"\n]{%d})[^'"\n]+\1""" % EXCERPT_CHARS, lambda m: f"{m.group(1)}{m.group(2)}...{m.group(1)}", message)
    return re.sub(r"\S{%d}\S{%d,}" % (EXCERPT_CHARS, LONG_TOKEN_CHARS - EXCERPT_CHARS),
                  lambda m: m.group(0)[:EXCERPT_CHARS] + "...", quoted)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _type_name(args[0]) + " or null"
    if origin in (list, List):
        return "a list of " + _type_name(typing.get_args(tp)[0])
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    if _is_choice(tp):
        return "a string"
    if origin in (dict, Dict):
        return "a mapping of " + _type_name(typing.get_args(tp)[1])
    return {int: "an integer", float: "a number", str: "a string", bool: "true/false"}.get(tp, str(tp))


def _convert(value: Any, tp: Any, path: str) -> Any:
    if tp is Any:  # a value its section's check types (tuning.space's entries: components/config/tuning.py)
        return value
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _convert(value, args[0], path)
    if origin in (list, List):
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected {_type_name(tp)}, got {excerpt(value)}")
        return [_convert(v, typing.get_args(tp)[0], f"{path}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, Dict):
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected {_type_name(tp)}, got {excerpt(value)}")
        return {str(k): _convert(v, typing.get_args(tp)[1], f"{path}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping of fields, got {excerpt(value)}")
        return _build(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {excerpt(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {excerpt(value)}")
        if not -MAX_INT <= value <= MAX_INT:  # every integer field ends up in an int64 somewhere
            raise ConfigError(f"{path}: {value} is beyond a 64-bit integer (at most {MAX_INT:,})")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {excerpt(value)}")
        if not math.isfinite(float(value)):  # a NaN fill_value failed as "Expected float32, but got None"
            raise ConfigError(f"{path}: {value} is not a finite number; set a number (null where the field allows none)")
        return float(value)
    if tp is str or _is_choice(tp):
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {excerpt(value)} (quote it in YAML)")
        return choice_member(value, tp, path) if _is_choice(tp) else value
    raise TypeError(f"unsupported config type {tp}")  # a bug in this module, not in the YAML


def _is_choice(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, Choice)


def _build(cls: Any, data: Dict[str, Any], path: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in names:
            raise ConfigError(f"{where}: unknown field; allowed fields here are: {', '.join(names)}")
        kwargs[key] = _convert(value, hints[key], where)
    return cls(**kwargs)


def parse_config(data: Any, source: str = "<config>") -> PipelineConfig:
    """Builds and resolves a config from already-parsed YAML data.

    Args:
      data: the parsed document.
      source: where it came from, the prefix of every message.

    Returns:
      The resolved configuration; closed-set fields hold `Choice` members.

    Raises:
      ConfigError: a field is unknown, has the wrong type or value, or fails a check.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of fields, got {type(data).__name__}")
    try:
        return resolve(_build(PipelineConfig, data, ""), source)
    except ConfigError as e:
        raise ConfigError(f"{source}: {_bounded(str(e))}") from None


def _expanded_nodes(node: yaml.Node, sizes: Dict[int, int], open_nodes: set, path: str) -> int:
    """The nodes `node` stands for once every alias is expanded, counted without expanding any."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_nodes:
        raise ConfigError(f"{path}: an anchor refers to itself (line {node.start_mark.line + 1}); a configuration "
                          f"is a tree: write the values out")
    open_nodes.add(key)
    total = 1
    if isinstance(node, yaml.SequenceNode):
        total += sum(_expanded_nodes(child, sizes, open_nodes, path) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        total += sum(_expanded_nodes(k, sizes, open_nodes, path) + _expanded_nodes(v, sizes, open_nodes, path)
                     for k, v in node.value)
    open_nodes.discard(key)
    sizes[key] = total
    if total > MAX_CONFIG_NODES:
        raise ConfigError(f"{path}: its anchors and aliases expand to more than {MAX_CONFIG_NODES:,} values "
                          f"(from line {node.start_mark.line + 1}); a configuration is far smaller: write it without "
                          f"nested aliases")
    return total


def _safe_load_bounded(text: str, path: str) -> Any:
    """`yaml.safe_load`, refusing a document whose aliases expand past `MAX_CONFIG_NODES` before
    building it: PyYAML composes aliases as shared nodes (cheap), and builds them out in full."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_nodes(node, {}, set(), path)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def load_config(path: str) -> PipelineConfig:
    """Loads a YAML configuration file, checks it and resolves it.

    `input.path` and given vocabulary files are made absolute, relative to the file.

    Args:
      path: the YAML file.

    Returns:
      The resolved configuration.

    Raises:
      ConfigError: the file is missing, empty, not UTF-8 or not YAML, or its content is invalid.
    """
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: configuration file not found; pass an existing YAML file with --config")
    size = os.path.getsize(path)
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: {size:,} bytes, more than a configuration file may hold ({MAX_CONFIG_BYTES:,}); "
                          f"is it the right file?")
    try:
        with open(path, encoding="utf-8") as fh:
            data = _safe_load_bounded(fh.read(), path)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e}); save the configuration as UTF-8") from None
    if data is None:
        raise ConfigError(f"{path}: the file is empty; see configs/README.md for the fields")
    cfg = parse_config(data, path)
    here = os.path.dirname(os.path.abspath(path))

    def absolute(p: str) -> str:
        return p if "://" in p or os.path.isabs(p) else os.path.normpath(os.path.join(here, p))

    cfg.input.path = absolute(cfg.input.path)
    if cfg.bulk_inference.path:
        cfg.bulk_inference.path = absolute(cfg.bulk_inference.path)
    # Given vocabulary files, like input.path, are relative to the config file.
    options = [t.vocabulary for t in cfg.tables] + [f.vocabulary for f in cfg.categorical_features]
    for v in options + [cfg.categorical_defaults.vocabulary]:
        if v is not None and v.file:
            v.file = absolute(v.file)
    return cfg


def config_from_json(text: str) -> PipelineConfig:
    """Reads back `PipelineConfig.to_json` (how the config travels to TFX executors).

    The fields are resolved again, which derives the same `resolved` form.

    Args:
      text: the JSON.

    Returns:
      The resolved configuration.

    Raises:
      ConfigError: the content fails a check (a share of a config that does not stand on its own).
    """
    data = json.loads(text)
    resolved_tables = (data.pop("resolved", None) or {}).get("tables", {})
    # Implicit tables are derived again, so only the tables features name are kept. A dim filled in
    # from categorical_defaults is dropped, so that it stays "not explicit" (read from the table
    # itself in JSON without a "resolved" section); so is a combiner filled in by default.
    explicit = {f.get("table") for f in data.get("categorical_features", []) if f.get("table")}
    tables = []
    for t in data.get("tables", []):
        if t["name"] not in explicit:
            continue
        entry = resolved_tables.get(t["name"], t)
        dropped = {k for k in ("dim", "combiner") if not entry.get(f"{k}_explicit", True)}
        tables.append({k: v for k, v in t.items() if k not in _OLD_RESOLVED_KEYS and k not in dropped})
    data["tables"] = tables
    return parse_config(data, SERIALIZED_SOURCE)


def apply_values(cfg: PipelineConfig, values: Dict[str, Any]) -> PipelineConfig:
    """A copy of the config with tuned values set: a trial's (the Tuner), or the best trial's (the
    Trainer, and the exporter after it).

    Args:
      cfg: a resolved configuration (unchanged).
      values: field path (one of components.config.tuning.TUNABLE) -> value.

    Returns:
      A new resolved configuration; `cfg` itself when `values` is empty.

    Raises:
      ConfigError: a path is not tunable, a value does not fit its field, or the result fails a check.
    """
    if not values:
        return cfg
    data = json.loads(cfg.to_json())
    for path, value in checked_values(values).items():
        *parents, leaf = path.split(".")
        node = data
        for part in parents:
            node = node[part]
        node[leaf] = value
    return config_from_json(json.dumps(data))
