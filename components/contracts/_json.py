"""JSON helpers shared by the contracts: dataclasses to plain dicts, and the version check."""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, Iterable


class ContractError(ValueError):
    """A stored contract (manifest, plan, statistics) cannot be read: says which file and what to do."""


def plain(obj: Any, omit_none: Iterable[str] = ()) -> Any:
    """Dataclasses -> dicts, tuples -> lists, recursively; the top-level fields named in `omit_none`
    are left out when None (optional parts a later stage adds)."""
    if dataclasses.is_dataclass(obj):
        skip = set(omit_none)
        out = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if value is None and f.name in skip:
                continue
            out[f.name] = plain(value)
        return out
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    return obj


def dumps(data: Dict[str, Any]) -> str:
    """The one JSON form every contract file is written in (sorted keys, indented, newline)."""
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def check_version(data: Dict[str, Any], expected: int, what: str, fix: str) -> None:
    version = data.get("version")
    if version != expected:
        raise ContractError(f"{what}: version {version!r}, this code reads version {expected}; {fix}")


def pick(cls, data: Dict[str, Any], what: str, **converted: Any):
    """`cls(**fields)` from `data`, with `converted` fields given already typed; a missing field names itself."""
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in converted:
            kwargs[f.name] = converted[f.name]
        elif f.name in data:
            kwargs[f.name] = data[f.name]
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:  # type: ignore[misc]
            raise ContractError(f"{what}: field {f.name!r} missing")
    return cls(**kwargs)
