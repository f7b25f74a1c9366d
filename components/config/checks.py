"""The field checks every section uses; each raises `ConfigError` naming the field and the fix."""
from __future__ import annotations

from typing import Optional

from components.config.schema import ConfigError


def check_positive(value: Optional[float], path: str, what: str) -> None:
    """`value` unset or > 0; `what` says what the field is for (part of the message)."""
    if value is not None and value <= 0:
        raise ConfigError(f"{path}: must be positive, got {value} ({what})")


def check_choice(value: Optional[str], choices: tuple, path: str) -> None:
    """`value` unset or one of `choices`."""
    if value is not None and value not in choices:
        raise ConfigError(f"{path}: {value!r} is not one of {', '.join(choices)}")
