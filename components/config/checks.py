"""The field checks every section uses; each raises `ConfigError` naming the field and the fix."""
from __future__ import annotations

import os
from typing import Optional, Type, TypeVar

from components.config.choices import Choice
from components.config.schema import ConfigError

ChoiceT = TypeVar("ChoiceT", bound=Choice)


def check_positive(value: Optional[float], path: str, what: str) -> None:
    """Checks that a number is unset or above zero.

    Args:
      value: the field's value, or None when unset.
      path: the field's path in the config, e.g. `training.batch_size`.
      what: what the field is for (part of the message).

    Raises:
      ConfigError: `value` is set and not positive.
    """
    if value is not None and value <= 0:
        raise ConfigError(f"{path}: must be positive, got {value} ({what})")


def check_choice(value: Optional[str], choices: tuple, path: str) -> None:
    """Checks that a string is unset or one of a set of values (sets not typed as a `Choice`).

    Args:
      value: the field's value, or None when unset.
      choices: the allowed values.
      path: the field's path in the config.

    Raises:
      ConfigError: `value` is set and not among `choices`.
    """
    if value is not None and value not in choices:
        raise ConfigError(f"{path}: {value!r} is not one of {', '.join(choices)}")


def choice_member(value: Optional[str], choices: Type[ChoiceT], path: str) -> Optional[ChoiceT]:
    """Converts a string to the member of a closed set whose value it is.

    Args:
      value: the field's value (a string or already a member), or None when unset.
      choices: the closed set, a `Choice` subclass.
      path: the field's path in the config.

    Returns:
      The member of `choices` equal to `value`; None when `value` is None.

    Raises:
      ConfigError: `value` is set and not one of `choices`' values.
    """
    if value is None:
        return None
    try:
        return choices(value)
    except ValueError:
        raise ConfigError(f"{path}: {value!r} is not one of {', '.join(choices.values())}") from None


def check_column(value: Optional[str], path: str, fix: str) -> None:
    """Checks that a configured input column is unset or non-empty (any other text names a column:
    spaces, dots, slashes, non-ASCII letters, a leading digit).

    Args:
      value: the field's value, or None when unset.
      path: the field's path in the config, e.g. `dense_features[0].column`.
      fix: what to do instead of an empty value (part of the message).

    Raises:
      ConfigError: `value` is the empty string.
    """
    if value is not None and value == "":
        raise ConfigError(f"{path}: empty; name the input column to read (any text, e.g. \"Class Name\"), or {fix}")


def _normal_path(path: str) -> str:
    """A local path made absolute and resolved, a URI (gs://...) normalised: for comparing places."""
    if "://" in path:
        scheme, rest = path.split("://", 1)
        return scheme + "://" + os.path.normpath("/" + rest).lstrip("/")
    return os.path.realpath(os.path.abspath(path))


def check_checkpoint_dir(checkpoint_dir: Optional[str], serving_dir: Optional[str]) -> None:
    """Refuses a `training.checkpoint_dir` at or inside the push destination (where TF Serving and
    the model registry look): the checkpoints it keeps would be left among the served versions.

    Args:
      checkpoint_dir: `training.checkpoint_dir` (None: the state lives under the pipeline root).
      serving_dir: the push destination (the pipelines' `<output_dir>/serving`, the Pusher's
        destination), None when not known.

    Raises:
      ConfigError: `checkpoint_dir` is `serving_dir` or inside it; the message names both.
    """
    if not checkpoint_dir or not serving_dir:
        return
    ckpt, serving = _normal_path(checkpoint_dir), _normal_path(serving_dir).rstrip("/")
    if ckpt == serving or ckpt.startswith(serving + "/"):
        raise ConfigError(
            f"training.checkpoint_dir {checkpoint_dir} is inside the push destination {serving_dir}: its checkpoints "
            "would be left among the served versions; point training.checkpoint_dir outside it (or leave it unset: "
            "the state then lives under the pipeline root and is removed when the Trainer finishes)")
