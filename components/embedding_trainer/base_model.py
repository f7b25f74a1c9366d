"""The last blessed model a run starts from (continuous training): the push destination as the
Trainer knows it, TFX's `base_model` resolved through the model registry, and the drift from that
model's data (warm_start.py carries its weights over).

Drift (`continuous.drift` limits, checked before training): per table, the share of the new
vocabulary the previous one held and the share of in-vocabulary train occurrences on tokens it
lacked; per feature, the mean IDs per example; per dense feature, the mean of the model's input in
the previous run's standard deviations. A limit crossed stops the run (DriftStop) naming the
feature, both figures and the config field.
"""
from __future__ import annotations

import json
import math
from typing import Any, Dict, List, Optional

from absl import logging

from components.config.schema import PipelineConfig
from components.contracts.manifest import VocabularyManifest
from components.contracts.statistics import EmbeddingStatistics
from components.embedding_trainer.warm_start import (TOKEN_KINDS, PreviousModel, WarmStartError, previous_model,
                                                     table_counts, table_tokens)
from components.model_registry.registry import read_lookup
from components.tfx_wiring.component_keys import SERVING_DIR_KEY


def serving_dir_of(fn_args) -> Optional[str]:
    """The push destination as the Trainer knows it: its custom_config's SERVING_DIR_KEY, else the
    LastBlessedModel lookup that TFX hands it as `base_model`; None when neither says."""
    given = (getattr(fn_args, "custom_config", None) or {}).get(SERVING_DIR_KEY)
    if given:
        return given
    base_model = getattr(fn_args, "base_model", None)
    found = read_lookup(base_model) if base_model else None
    return found.serving_dir if found is not None else None


def continuous_start(cfg: PipelineConfig, base_model: Optional[str], manifest: VocabularyManifest,
                     statistics: Optional[EmbeddingStatistics]) -> Dict[str, Any]:
    """Before training: the last blessed model (TFX's `base_model`: the pipeline's LastBlessedModel
    output, which points at the Trainer model of the version served at the push destination; or a
    Trainer model itself) and the drift from its data, which stops the run past `continuous.drift`
    (warm_start.py).

    Args:
      cfg: the pipeline config (`continuous`).
      base_model: TFX's `base_model`, None or empty on a first run.
      manifest: this run's manifest.
      statistics: this run's statistics.

    Returns:
      The record of `continuous.json`: base_model, drift, registry and a note, with `previous`
      (a PreviousModel) when warm-starting.

    Raises:
      DriftStop: the data drifted past `continuous.drift`.
      WarmStartError: `base_model` is not a usable Trainer Model (and no registry
        lookup stands behind it).
    """
    if not base_model:
        return {"base_model": None, "drift": None, "note": "no blessed model yet: trained from scratch"}
    found = read_lookup(base_model)
    registry = None
    if found is not None:
        registry = {"served_model": found.served_model, "version": found.version, "skipped": found.skipped}
        if not found.found:
            return {"base_model": None, "drift": None, "registry": registry,
                    "note": f"{found.note}: trained from scratch"}
        if found.warm_start_model is None:
            logging.warning("%s", found.warm_start_note)
            return {"base_model": None, "drift": None, "registry": registry, "note": found.warm_start_note}
        base_model = found.warm_start_model
    try:
        prev = previous_model(base_model)
    except WarmStartError as e:
        if found is None:
            raise
        # The served version's Trainer model is there but incomplete (cleaned up in part, or not
        # this pipeline's): the gate still compares with the served model; this run starts fresh.
        note = f"{e}; the served version's Trainer model cannot start this run: trained from scratch"
        logging.warning("%s", note)
        return {"base_model": None, "drift": None, "registry": registry, "note": note}
    figures = drift(prev, manifest, statistics)
    logging.info("drift from %s: %s", prev.uri, json.dumps(figures, sort_keys=True))
    check_drift(figures, cfg, prev.uri)
    out: Dict[str, Any] = {"base_model": prev.uri, "drift": figures, "registry": registry}
    if cfg.continuous.warm_start:
        out["previous"] = prev
    else:
        out["note"] = "continuous.warm_start is false: trained from scratch"
    return out


class DriftStop(RuntimeError):
    """This run's data moved further from the last blessed model's than `continuous.drift` allows."""


def drift(prev: PreviousModel, manifest: VocabularyManifest, statistics: Optional[EmbeddingStatistics]) -> Dict[str, Any]:
    """This run's data against the previous model's (module docstring); figures only.

    Args:
      prev: the last blessed model.
      manifest: this run's manifest.
      statistics: this run's statistics, None when it has none.

    Returns:
      {"tables", "features", "dense_features"} figures, with "unknown" or "unknown_tables" saying
      what could not be compared.
    """
    out: Dict[str, Any] = {"tables": {}, "features": {}, "dense_features": {}}
    for table, entry in sorted(manifest.vocabularies.items()):
        if table not in prev.manifest.vocabularies or entry.kind not in TOKEN_KINDS:
            continue
        try:
            old = set(table_tokens(prev.manifest, table) or ())
        except WarmStartError as err:  # the old vocabulary is gone: this table's drift is unknown
            out.setdefault("unknown_tables", {})[table] = str(err)
            continue
        new = table_tokens(manifest, table) or []
        counts = table_counts(manifest, table)
        row: Dict[str, Any] = {"vocabulary_overlap": _share(sum(t in old for t in new), len(new))}
        if counts:
            total = sum(counts.values())
            row["new_token_share"] = _share(sum(c for t, c in counts.items() if t not in old), total)
        out["tables"][table] = row
    old_stats = prev.statistics
    if statistics is None or old_stats is None:
        out["unknown"] = "the last blessed model has no statistics copy (trained before continuous training)" \
            if statistics is not None else "this run has no statistics"
        return out
    for name, f in sorted(statistics.features.items()):
        before = old_stats.features.get(name)
        if not before:
            continue
        a, b = _ids_mean(before), _ids_mean(f)
        if a is not None and b is not None:
            out["features"][name] = {"ids_per_example": b, "previous": a,
                                     "change": abs(b - a) / a if a > 0 else (0.0 if b == 0 else math.inf)}
    for name, d in sorted(statistics.dense_features.items()):
        before = old_stats.dense_features.get(name, {}).get("train", {})
        now = d.get("train", {})
        if "input_mean" in before and "input_mean" in now:
            std = before.get("input_std", 0.0)
            delta = abs(now["input_mean"] - before["input_mean"])
            out["dense_features"][name] = {"mean": now["input_mean"], "previous": before["input_mean"],
                                           "shift_in_std": delta / std if std > 0 else (0.0 if delta == 0 else math.inf)}
    return out


def _ids_mean(feature: Dict[str, Any]) -> Optional[float]:
    train = feature.get("splits", {}).get("train", {})
    return train.get("ids_per_example", {}).get("mean")


def _share(part: float, whole: float) -> float:
    return float(part) / whole if whole else 0.0


def drift_violations(figures: Dict[str, Any], cfg: PipelineConfig) -> List[str]:
    """Each `continuous.drift` limit this run crosses.

    Args:
      figures: `drift`'s figures.
      cfg: the pipeline config (`continuous.drift`).

    Returns:
      One sentence per limit crossed, naming the figure and the config field.
    """
    d = cfg.continuous.drift
    out: List[str] = []
    for table, row in figures["tables"].items():
        if d.max_new_token_share is not None and row.get("new_token_share", 0.0) > d.max_new_token_share:
            out.append(f"table {table!r}: {row['new_token_share']:.3f} of occurrences on tokens new to the vocabulary "
                       f"> continuous.drift.max_new_token_share {d.max_new_token_share}")
        if d.min_vocabulary_overlap is not None and row["vocabulary_overlap"] < d.min_vocabulary_overlap:
            out.append(f"table {table!r}: vocabulary overlap {row['vocabulary_overlap']:.3f} "
                       f"< continuous.drift.min_vocabulary_overlap {d.min_vocabulary_overlap}")
    for name, row in figures["features"].items():
        if d.max_ids_per_example_change is not None and row["change"] > d.max_ids_per_example_change:
            out.append(f"feature {name!r}: IDs per example {row['previous']:.3f} -> {row['ids_per_example']:.3f} "
                       f"(change {row['change']:.2f} > continuous.drift.max_ids_per_example_change {d.max_ids_per_example_change})")
    for name, row in figures["dense_features"].items():
        if d.max_dense_mean_shift is not None and row["shift_in_std"] > d.max_dense_mean_shift:
            out.append(f"dense feature {name!r}: mean input {row['previous']:.4f} -> {row['mean']:.4f} "
                       f"({row['shift_in_std']:.2f} std > continuous.drift.max_dense_mean_shift {d.max_dense_mean_shift})")
    return out


def check_drift(figures: Dict[str, Any], cfg: PipelineConfig, prev_uri: str) -> None:
    """Stops the run when the data drifted past `continuous.drift`.

    Args:
      figures: `drift`'s figures.
      cfg: the pipeline config.
      prev_uri: the last blessed model (named in the error).

    Raises:
      DriftStop: a limit is crossed; the message lists each one and the way out.
    """
    violations = drift_violations(figures, cfg)
    if violations:
        raise DriftStop(
            f"the data drifted from the last blessed model's ({prev_uri}) beyond continuous.drift: "
            + "; ".join(violations)
            + ". Check the input (a broken upstream job?); if the change is real, raise the limit (or null) for this run"
        )
