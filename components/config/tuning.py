"""The `tuning` section's search space: which fields a space may name, and its checks (of the space,
and of the values of a trial or of the best trial).

A space names training fields by their dotted path (`training.embedding_optimizer.learning_rate`).
Only fields that change the model or its optimizers are tunable (`TUNABLE`): a trial may never
change the plan's tables (their rows, dims or placement) nor anything the data stages read
(ExampleGen and preprocessing ran once, before the Tuner), so every trial and the Trainer after it
train on the same transformed examples with the same tables. A field that is not tunable is refused
naming it and why (`NOT_TUNABLE`), an unknown one naming the tunable ones.

Each entry is a list of values (KerasTuner's Choice), `{min: a, max: b}` (Int or Float, uniform)
or `{log: [lo, hi]}` (Float or Int on a log scale): `parse_space`. `loading.apply_values` sets a
trial's values over a copy of a config.
"""
from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any, Dict, List, Optional, Tuple

from components.config.schema import ConfigError, PipelineConfig

# Bounds of a value: (lowest, whether the lowest is allowed, highest (excluded), what it is).
_RATE = (0.0, True, 1.0, "a rate in [0, 1)")
_POSITIVE = (0.0, False, None, "positive")
_NON_NEGATIVE = (0.0, True, None, "zero or more")
_OPTIMIZER_FIELDS = {
    "learning_rate": (float, _POSITIVE),
    "clipvalue": (float, _POSITIVE),
    "initial_accumulator_value": (float, _POSITIVE),
    "beta_1": (float, _RATE),
    "beta_2": (float, _RATE),
    "epsilon": (float, _POSITIVE),
    "l1_regularization_strength": (float, _NON_NEGATIVE),
    "l2_regularization_strength": (float, _NON_NEGATIVE),
}
_SCHEDULE_FIELDS = {
    "warmup_steps": (int, _NON_NEGATIVE),
    "decay_steps": (int, _POSITIVE),
    "decay_rate": (float, _POSITIVE),
    "alpha": (float, _NON_NEGATIVE),
}

# field path -> (type, bounds): the fields a trial may set.
TUNABLE: Dict[str, Tuple[type, Tuple[float, bool, Optional[float], str]]] = {
    "training.dropout": (float, _RATE),
    "training.input_dropout": (float, _RATE),
    "training.cross_layers": (int, _POSITIVE),
    "training.cross_projection_dim": (int, _POSITIVE),
    **{f"training.{opt}.{name}": spec for opt in ("embedding_optimizer", "dense_optimizer", "wide.optimizer")
       for name, spec in _OPTIMIZER_FIELDS.items()},
    "training.dense_optimizer.clipnorm": (float, _POSITIVE),
    # Layer widths: a space lists whole lists ([[64, 16], [128, 32]]), which KerasTuner holds as
    # their JSON text (its Choice takes scalars); `_checked_value` reads either form.
    "training.bottom_mlp": (list, _POSITIVE),
    "training.top_mlp": (list, _POSITIVE),
    **{f"training.{opt}.schedule.{name}": spec for opt in ("embedding_optimizer", "dense_optimizer")
       for name, spec in _SCHEDULE_FIELDS.items()},
}

_PLAN = "sets the plan's tables (their rows, dims or placement), which no trial may change"
_DATA = "the data stages read it (ExampleGen and preprocessing run once, before the Tuner)"
# Field path prefixes that are not tunable -> why (the first that matches a path answers).
NOT_TUNABLE: Tuple[Tuple[str, str], ...] = (
    ("tables", _PLAN),
    ("categorical_features", _PLAN),
    ("categorical_defaults", _PLAN),
    ("training.embedding", _PLAN),  # size_threshold, dim_rule, topology (not embedding_optimizer: listed above)
    ("training.dense_buckets", _PLAN),
    ("training.wide.enabled", _PLAN),
    ("training.embedding_optimizer.name", "the optimizer's slots size the tables' memory and so their placement"),
    ("training.batch_size", _DATA + ": per-batch statistics and the SparseCore limits"),
    ("training.", "it changes how the run is trained, checkpointed or placed, not the model or its optimizers"),
    ("", "only training fields that change the model or its optimizers are tuned"),
)


def _field_type(path: str) -> Optional[Any]:
    """The type of the config field at a dotted `path` ([i] / [*] on list fields ignored), None when
    no field is there."""
    tp: Any = PipelineConfig
    for part in path.split("."):
        part = part.split("[", 1)[0]
        while True:  # Optional[X] -> X, List[X] -> X
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if typing.get_origin(tp) in (typing.Union, list, List) and args:
                tp = args[0]
            else:
                break
        if not dataclasses.is_dataclass(tp):
            return None
        hints = typing.get_type_hints(tp)
        if part not in hints:
            return None
        tp = hints[part]
    return tp


def _refusal(path: str) -> str:
    where = f"tuning.space.{path}"
    allowed = ", ".join(TUNABLE)
    if _field_type(path) is None:
        return f"{where}: unknown field; a space names config fields by their dotted path; tunable fields: {allowed}"
    canonical = ".".join(p.split("[", 1)[0] for p in path.split("."))
    why = next(reason for prefix, reason in NOT_TUNABLE if prefix == "" or canonical == prefix
               or canonical.startswith(prefix if prefix.endswith(".") else prefix + "."))
    return f"{where}: not tunable: {why}; tunable fields: {allowed}"


def _checked_widths(value: Any, path: str, where: str) -> List[int]:
    """A list field's value (a list of layer widths, or its JSON text as KerasTuner holds it)."""
    widths = value
    if isinstance(value, str):
        try:
            widths = json.loads(value)
        except ValueError:
            widths = None
    if not isinstance(widths, list) or any(isinstance(w, bool) or not isinstance(w, int) for w in widths):
        raise ConfigError(f"{where}: {value!r} is not a list of layer widths (integers); a space lists whole lists, "
                          "e.g. [[64, 16], [128, 32]]")
    if any(w <= 0 for w in widths):
        raise ConfigError(f"{where}: {widths!r}: layer widths are positive")
    if not widths and path == "training.bottom_mlp":
        raise ConfigError(f"{where}: empty; the bottom MLP needs at least one layer")
    return list(widths)


def _checked_value(value: Any, path: str, what: str) -> Any:
    tp, (lo, lo_ok, hi, bound) = TUNABLE[path]
    where = f"tuning.space.{path}{what}"
    if tp is list:
        return _checked_widths(value, path, where)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (tp is int and not isinstance(value, int)):
        kind = "an integer" if tp is int else "a number"
        raise ConfigError(f"{where}: {value!r} is not {kind}")
    if value < lo or (value == lo and not lo_ok) or (hi is not None and value >= hi):
        raise ConfigError(f"{where}: {value!r} is not {bound}")
    return tp(value)


def parse_space(space: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Checks a search space and puts each entry in one form.

    Args:
      space: `tuning.space`: field path -> a list of values, {min, max} or {log: [lo, hi]}.

    Returns:
      field path -> {"kind": "choice", "type", "values"} or {"kind": "range", "type", "min", "max",
      "log"}, in the space's order.

    Raises:
      ConfigError: the space is empty, names a field that is unknown or not tunable, or an entry's
        values do not fit the field (type, bounds, min < max).
    """
    if not space:
        raise ConfigError("tuning.space: empty; name at least one field to search, e.g. "
                          "training.dropout: [0.1, 0.3] (or remove the tuning section)")
    out: Dict[str, Dict[str, Any]] = {}
    for path, entry in space.items():
        if path not in TUNABLE:
            raise ConfigError(_refusal(path))
        tp = TUNABLE[path][0]
        where = f"tuning.space.{path}"
        if isinstance(entry, list):
            if not entry:
                raise ConfigError(f"{where}: an empty list; list the values to try")
            values = [_checked_value(v, path, f"[{i}]") for i, v in enumerate(entry)]
            unique = list({json.dumps(v): v for v in values}.values())  # in order; lists are not hashable
            out[path] = {"kind": "choice", "type": tp.__name__, "values": unique}
            continue
        if tp is list:
            raise ConfigError(f"{where}: expected a list of layer-width lists, e.g. [[64, 16], [128, 32]], got {entry!r}")
        if isinstance(entry, dict) and set(entry) == {"min", "max"}:
            lo, hi, log = _checked_value(entry["min"], path, ".min"), _checked_value(entry["max"], path, ".max"), False
        elif isinstance(entry, dict) and set(entry) == {"log"}:
            ends = entry["log"]
            if not isinstance(ends, list) or len(ends) != 2:
                raise ConfigError(f"{where}.log: expected [lowest, highest], got {ends!r}")
            lo, hi, log = _checked_value(ends[0], path, ".log[0]"), _checked_value(ends[1], path, ".log[1]"), True
            if lo <= 0:
                raise ConfigError(f"{where}.log: {lo!r} is not positive (a log scale starts above 0)")
        else:
            raise ConfigError(f"{where}: expected a list of values, {{min: a, max: b}} or {{log: [lo, hi]}}, "
                              f"got {entry!r}")
        if not lo < hi:
            raise ConfigError(f"{where}: the lowest value {lo!r} is not below the highest {hi!r}")
        out[path] = {"kind": "range", "type": tp.__name__, "min": lo, "max": hi, "log": log}
    return out


def check_tuning(cfg: PipelineConfig) -> None:
    """The `tuning` section's check (components.config.validation.resolve runs it).

    Args:
      cfg: the configuration.

    Raises:
      ConfigError: trials, steps_per_trial or parallel_trials not positive, more parallel trials
        than trials, or a bad space (`parse_space`).
    """
    tu = cfg.tuning
    if tu is None:
        return
    for name in ("trials", "steps_per_trial", "parallel_trials"):
        if getattr(tu, name) <= 0:
            raise ConfigError(f"tuning.{name}: must be positive, got {getattr(tu, name)}")
    if tu.parallel_trials > tu.trials:
        raise ConfigError(f"tuning.parallel_trials: {tu.parallel_trials} machines for {tu.trials} trials would leave "
                          f"{tu.parallel_trials - tu.trials} idle; set it to {tu.trials} or fewer")
    parse_space(tu.space)


def values_of(hyperparameters: Any) -> Dict[str, Any]:
    """The values of TFX's `best_hyperparameters` (the Trainer's `fn_args.hyperparameters`: a
    KerasTuner HyperParameters config, {"space": [...], "values": {...}}), or of a plain mapping.

    Args:
      hyperparameters: the config, a mapping of values, or None.

    Returns:
      field path -> value; empty for None.
    """
    if not hyperparameters:
        return {}
    if isinstance(hyperparameters, dict) and isinstance(hyperparameters.get("values"), dict):
        return dict(hyperparameters["values"])
    return dict(hyperparameters)

def checked_values(values: Dict[str, Any]) -> Dict[str, Any]:
    """Tuned values (a trial's, or the best trial's) checked against their fields.

    Args:
      values: field path (one of `TUNABLE`) -> value.

    Returns:
      field path -> the value as its field's type.

    Raises:
      ConfigError: a path is not tunable, or a value does not fit its field.
    """
    out = {}
    for path, value in values.items():
        if path not in TUNABLE:
            raise ConfigError(_refusal(path))
        out[path] = _checked_value(value, path, "")
    return out
