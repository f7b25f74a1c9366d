"""Which changes of the training config a training state may be resumed under.

A run with `training.checkpoint_dir` set (or the rerun of a killed run) resumes the state's last
checkpoint. The state's record (sparsecore_state.write_layout) holds the training config it was
written under (`training_record`: every field of `training` that decides the trained weights,
tuned values applied, and each table's optimizer) and the steps it was to train. Resuming:
- an unfinished state may go on under a change of the fields that only steer the rest of
  training (`STEERING`: learning rates and their schedules, dropout, the run's length, early
  stopping, the embedding gradient multiplier, the dense network's precision); the run says so in one line and records the
  changes in `training_run.json` (`resumed_with_changes`);
- any other change (the batch, the seed, the model, an optimizer's kind or other
  hyperparameters, the shuffle buffer, ...), and any change at all to a finished state, is
  refused before any step: a finished state resumes at its last step and would train nothing of
  the new config, and its old model would be pushed as the new one's.
Fields that never change the weights (`OPERATIONAL`: where and how often checkpoints are written,
the TPU's address, steps per execution, the final evaluation's steps, the topology the plan is
sized for) are not recorded.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

from components.config.schema import PipelineConfig
from components.contracts.plan import EmbeddingPlan
from components.embedding_model.sparsecore_state import LayoutMismatch

OPERATIONAL = ("checkpoint_dir", "checkpoint_every_steps", "tpu", "steps_per_execution", "eval_steps",
               "embedding.topology")
# The dense network's precision steers too: its variables are float32 in either (precision.py), so
# a state written on a TPU in bfloat16 goes on in float32 on a CPU, as a learning rate goes on changed.
STEERING = ("dropout", "input_dropout", "train_steps", "epochs", "early_stopping", "embedding_gradient_multiplier",
            "precision", "precision_used")
STEERING_LEAVES = ("learning_rate", "schedule")  # of any optimizer: the dense, the embedding, the wide, a table's
SHOWN = 6  # changes named in a refusal


class ConfigMismatch(LayoutMismatch):
    """A training state would be resumed under a training config it may not continue under."""


def _flat(value: Any, path: str, out: Dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for k in sorted(value):
            _flat(value[k], f"{path}.{k}" if path else str(k), out)
    else:
        out[path] = value


def training_record(cfg: PipelineConfig, plan: EmbeddingPlan, precision: Optional[str] = None) -> Dict[str, Any]:
    """{field path: value} of the training config that decides the trained weights.

    Args:
      cfg: the run's config (tuned values applied).
      plan: its embedding plan (each table's optimizer).
      precision: the precision the run trains in (`auto` resolved: precision_choice.py), recorded
        as `precision_used` (another is refused on resume, as any other non-steering change).

    Returns:
      `training.*` but OPERATIONAL, and `table_optimizers.<table>.*`, as JSON values.
    """
    out: Dict[str, Any] = {}
    training = json.loads(cfg.to_json())["training"]
    _flat(training, "", out)
    out = {p: v for p, v in out.items() if not any(p == o or p.startswith(o + ".") for o in OPERATIONAL)}
    _flat({"table_optimizers": {n: dict(t.optimizer) for n, t in plan.tables.items()}}, "", out)
    if precision is not None:
        out["precision_used"] = precision
    return json.loads(json.dumps(out))  # as it reads back from the state record


def is_steering(path: str) -> bool:
    """Whether a field only steers the rest of training (STEERING, or an optimizer's STEERING_LEAVES)."""
    head = path.split(".")
    return head[0] in STEERING or any(leaf in head[1:] for leaf in STEERING_LEAVES)


def config_changes(saved: Dict[str, Any], wanted: Dict[str, Any]) -> Tuple[List[str], List[str]]:
    """(steering changes, other changes) from a state's recorded training config to this run's,
    each `path old -> new` (`(absent)` for a field one side lacks)."""
    steering, other = [], []
    for path in sorted(set(saved) | set(wanted)):
        a, b = saved.get(path, "(absent)"), wanted.get(path, "(absent)")
        if a != b:
            (steering if is_steering(path) else other).append(f"{path} {json.dumps(a)} -> {json.dumps(b)}")
    return steering, other


def check_config(state_dir: str, checkpoint: str, record: Optional[Dict[str, Any]], wanted: Dict[str, Any],
                 step: int) -> List[str]:
    """Refuses to resume `checkpoint` (at `step`) under a training config it may not continue under.

    Args:
      state_dir: the training state directory, for the message.
      checkpoint: the checkpoint to resume.
      record: the state's record (`training`, `steps`, `finished`: its run ended, early stopping
        included), or None (a state written before it held them: not checked).
      wanted: this run's `training_record`.
      step: the checkpoint's step.

    Returns:
      The steering changes the resumed run continues under (empty when none).

    Raises:
      ConfigMismatch: a change other than a steering one, or any change to a finished state.
    """
    if not record or "training" not in record:
        return []
    saved = dict(record["training"])
    if "precision_used" not in saved and "precision_used" in wanted:  # written before it: float32 was all there was
        saved["precision_used"] = "float32"
        saved.setdefault("precision", wanted.get("precision"))
    steering, other = config_changes(saved, wanted)
    finished = bool(record.get("finished")) or step >= int(record.get("steps") or 0)
    refused = other + (steering if finished else [])
    if not refused:
        return steering
    shown = "; ".join(refused[:SHOWN]) + (f"; and {len(refused) - SHOWN} more" if len(refused) > SHOWN else "")
    why = ("its training finished, so resuming would train nothing of this config and push that model" if finished else
           "only learning rates, their schedules, dropout, the run's length, early stopping and the precision may change "
           "while a state is unfinished")
    raise ConfigMismatch(
        f"checkpoint {checkpoint} (step {step}) was trained under another training config than this run's: {shown}. "
        f"{why[0].upper() + why[1:]}. To train under this config from the start, point training.checkpoint_dir at a "
        f"fresh directory (or remove {state_dir}); to start from its weights, warm-start from the last blessed model "
        "(continuous.warm_start)")
