"""A configuration as plain data: the dict and the JSON that `loading.config_from_json` reads back.

A leaf module (it imports no other part of the configuration, not even for type hints), so that
the schema's `PipelineConfig.to_dict` / `to_json` use it without an import cycle with the loader.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict


def config_to_dict(cfg: Any) -> Dict[str, Any]:
    """The fields as resolved, plus what resolution derived.

    Args:
      cfg: a `PipelineConfig`, resolved or not.

    Returns:
      The dataclass fields as nested dicts and lists (implicit tables listed, defaults filled in;
      closed-set values are `Choice` members, which serialize as their strings), and, for a
      resolved config, `ResolvedConfig.to_dict()` under "resolved".
    """
    d = dataclasses.asdict(cfg)
    r = cfg.__dict__.get("_resolved")  # attached by validation.resolve; not a dataclass field
    if r is not None:
        d["resolved"] = r.to_dict()
    return d


def config_to_json(cfg: Any) -> str:
    """The configuration as one line of JSON (sorted keys): how it travels to TFX executors.

    Args:
      cfg: a `PipelineConfig`, resolved or not.

    Returns:
      `json.dumps` of `config_to_dict(cfg)` with sorted keys; `loading.config_from_json` reads it back.
    """
    return json.dumps(config_to_dict(cfg), sort_keys=True)
