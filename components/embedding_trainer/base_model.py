"""The last blessed model a run starts from (continuous training): the push destination as the
Trainer knows it, TFX's `base_model` resolved through the model registry, and the drift from that
model's data, which stops the run past `continuous.drift` (warm_start.py)."""
from __future__ import annotations

import json
from typing import Any, Dict, Optional

from absl import logging

from components.config.schema import PipelineConfig
from components.contracts.manifest import VocabularyManifest
from components.contracts.statistics import EmbeddingStatistics
from components.embedding_trainer import warm_start
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
      (a warm_start.PreviousModel) when warm-starting.

    Raises:
      warm_start.DriftStop: the data drifted past `continuous.drift`.
      warm_start.WarmStartError: `base_model` is not a usable Trainer Model (and no registry
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
        prev = warm_start.previous_model(base_model)
    except warm_start.WarmStartError as e:
        if found is None:
            raise
        # The served version's Trainer model is there but incomplete (cleaned up in part, or not
        # this pipeline's): the gate still compares with the served model; this run starts fresh.
        note = f"{e}; the served version's Trainer model cannot start this run: trained from scratch"
        logging.warning("%s", note)
        return {"base_model": None, "drift": None, "registry": registry, "note": note}
    figures = warm_start.drift(prev, manifest, statistics)
    logging.info("drift from %s: %s", prev.uri, json.dumps(figures, sort_keys=True))
    warm_start.check_drift(figures, cfg, prev.uri)
    out: Dict[str, Any] = {"base_model": prev.uri, "drift": figures, "registry": registry}
    if cfg.continuous.warm_start:
        out["previous"] = prev
    else:
        out["note"] = "continuous.warm_start is false: trained from scratch"
    return out
