"""JSON shared by the contracts: the stored-contract mixin (`to_dict`, `to_json`, `from_dict`,
`from_json`, written once), dataclasses to plain dicts, the version check and typed fields back."""
from __future__ import annotations

import dataclasses
import functools
import json
import typing
from typing import Any, Dict, Iterable, Optional, Tuple

from components.config.choices import Choice


class ContractError(ValueError):
    """A stored contract (manifest, plan, statistics) cannot be read: says which file and what to do."""


class StoredContract:
    """Mixin of a contract stored as JSON (the manifest, the statistics, the plan): how it is written
    and read back, once for all of them.

    A contract (a frozen dataclass) sets `CONTRACT` (its name in messages, and the default source),
    `VERSION` (the version this code writes and reads), `REWRITE` (what to do when another version
    wrote it), `OMIT_NONE` (optional top-level fields left out while unset) and `_from_fields`
    (its stored fields typed back; `pick` does the flat ones). `from_dict` refuses another version
    before anything is typed.
    """

    CONTRACT = "contract"
    VERSION = 0
    REWRITE = "rerun the stage that wrote it with this version of the pipeline"
    OMIT_NONE: Tuple[str, ...] = ()

    def to_dict(self) -> Dict[str, Any]:
        """The contract as plain data, as its file holds it (unset optional parts left out)."""
        return plain(self, omit_none=self.OMIT_NONE)

    def to_json(self) -> str:
        """The contract as its file holds it: the contracts' JSON form (`dumps`)."""
        return dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: Dict[str, Any], source: Optional[str] = None):
        """Reads the contract back from plain data; closed-set fields become `Choice` members.

        Args:
          data: what `to_dict` wrote.
          source: the file, for messages (default: the contract's name).

        Returns:
          The contract.

        Raises:
          ContractError: another version wrote it, a field is missing, or a closed-set field holds
            another value (the message names the file and the field).
        """
        source = source or cls.CONTRACT
        check_version(data, cls.VERSION, source, cls.REWRITE)
        return cls._from_fields(data, source)

    @classmethod
    def from_json(cls, text: str, source: Optional[str] = None):
        """Reads the contract back from its file's text (`from_dict`)."""
        return cls.from_dict(json.loads(text), source)

    @classmethod
    def _from_fields(cls, data: Dict[str, Any], source: str):
        """The contract of its stored fields, the version checked already (each contract's own)."""
        raise NotImplementedError


def plain(obj: Any, omit_none: Iterable[str] = ()) -> Any:
    """A contract as plain data: dataclasses to dicts, tuples to lists, recursively.

    Args:
      obj: a dataclass, dict, list, tuple or leaf value.
      omit_none: top-level fields left out when None (optional parts a later stage adds).

    Returns:
      The same data in JSON-able containers; `Choice` members stay members (they serialize as strings).
    """
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
    """The one JSON form every contract file is written in.

    Args:
      data: plain data (`plain`).

    Returns:
      Indented JSON with sorted keys and a final newline.
    """
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def check_version(data: Dict[str, Any], expected: int, what: str, fix: str) -> None:
    """Refuses a stored contract written in another version.

    Args:
      data: the stored contract's top level.
      expected: the version this code reads.
      what: the contract, for the message.
      fix: what to do about it, for the message.

    Raises:
      ContractError: `data`'s version is not `expected`.
    """
    version = data.get("version")
    if version != expected:
        raise ContractError(f"{what}: version {version!r}, this code reads version {expected}; {fix}")


def pick(cls: Any, data: Dict[str, Any], what: str, **converted: Any) -> Any:
    """Builds a contract dataclass from its stored fields.

    Args:
      cls: the dataclass.
      data: the stored fields (from JSON); a field typed as a `Choice` is converted to its member.
      what: where `data` comes from, for messages (e.g. "embedding plan: tables.t").
      **converted: fields given already typed (nested dataclasses, tuples), used instead of `data`'s.

    Returns:
      `cls(**fields)`.

    Raises:
      ContractError: a field without a default is missing, or a closed-set field holds another value.
    """
    kwargs = {}
    choices = _choice_fields(cls)
    for f in dataclasses.fields(cls):
        if f.name in converted:
            kwargs[f.name] = converted[f.name]
        elif f.name in data:
            kwargs[f.name] = _member(data[f.name], choices.get(f.name), f"{what}: field {f.name!r}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:  # type: ignore[misc]
            raise ContractError(f"{what}: field {f.name!r} missing")
    return cls(**kwargs)


@functools.lru_cache(maxsize=None)
def _choice_fields(cls: Any) -> Dict[str, type]:
    """{field: its Choice type} of a dataclass's fields typed `SomeChoice` or `Optional[SomeChoice]`."""
    out = {}
    for name, hint in typing.get_type_hints(cls).items():
        args = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_origin(hint) is typing.Union else [hint]
        if len(args) == 1 and isinstance(args[0], type) and issubclass(args[0], Choice):
            out[name] = args[0]
    return out


def _member(value: Any, choices: Optional[type], what: str) -> Any:
    if choices is None or value is None:
        return value
    try:
        return choices(value)
    except ValueError:
        raise ContractError(f"{what}: {value!r} is not one of {', '.join(choices.values())}") from None
