"""Live progress of a local run: every stage says where it is, from its own code.

Stages call `start` / `done` around their work and `count`, `phase`, `step` and `evaluated` on the
way. Each call appends one JSON line to the file named by the environment variable
`TPU_EMBEDDING_PROGRESS` when it is set, and does nothing otherwise (on Kubeflow, Dataflow or in a
test, where no terminal watches). A file rather than a logger or a queue: Beam's worker processes
inherit the environment and append to the same file, and the lines reach the terminal whatever
TensorFlow or absl do to Python logging mid-run. `ProgressPrinter` (pipelines/progress_view.py)
tails the file and draws the terminal view. Lines are short (well under the 4 KB that one append
writes atomically on a local filesystem), so concurrent writers never interleave.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from typing import Any, Callable, Dict, Iterator, Optional

ENV = "TPU_EMBEDDING_PROGRESS"

# The stages, by their pipeline node ids (pipelines/pipeline.py names the nodes with these).
EXAMPLE_GEN = "EmbeddingExampleGen"
PREPROCESS = "EmbeddingPreprocess"
TRAINER = "Trainer"
EXPORTER = "EmbeddingExporter"
LAST_BLESSED = "LastBlessedModel"
PUSHER = "Pusher"
TUNER = "Tuner"  # TFX's stock Tuner with our executor: its trials are the Trainer's training
BULK_INFERRER = "BulkInferrer"
SERVING_CHECK = "ServingCheck"  # serving_check.enabled (embedding_exporter/serving_check_step.py)
FILE_SCORING = "FileScoring"  # bulk_inference.path (embedding_exporter/scoring_step.py)

# Stages whose events go out under another stage's name (`reported_as`): a Tuner trial runs the
# Trainer's training code, whose events then read "Tuner".
_ALIASES: Dict[str, str] = {}

# Event kinds, one per line: {"t": seconds since the epoch, "stage": ..., "event": ..., ...}
START, DONE, FAILED = "start", "done", "failed"
PHASE = "phase"  # {"text"}: the stage moved on to another part of its work
COUNT = "count"  # {"phase", "done", "total" (or null), "unit"}: `done` more units of `phase` finished (a delta)
STEP = "step"  # {"step", "total", "loss", "examples_per_second"}: a training step reached
EVAL = "eval"  # {"step", "metrics", "kept" (the kept model's evaluation only)}: an evaluation finished


def enabled() -> bool:
    """Whether a watcher asked for progress events (`TPU_EMBEDDING_PROGRESS` is set)."""
    return bool(os.environ.get(ENV))


def emit(stage: str, event: str, **fields: Any) -> None:
    """Appends one event line to the progress file; does nothing when no file is set.

    Args:
      stage: the stage's node id (e.g. `TRAINER`).
      event: the event kind (`START`, `DONE`, `FAILED`, `PHASE`, `COUNT`, `STEP`, `EVAL`).
      **fields: the event's fields, as JSON.
    """
    path = os.environ.get(ENV)
    if not path:
        return
    stage = _ALIASES.get(stage, stage)
    line = json.dumps({"t": round(time.time(), 3), "stage": stage, "event": event, **fields},
                      separators=(",", ":"), default=str)
    try:
        # Never through a link planted at its name (the run removed what was there before it started).
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            os.write(fd, (line + "\n").encode("utf-8"))
        finally:
            os.close(fd)
    except OSError:  # progress is a view: never fail a run over it
        pass


@contextlib.contextmanager
def reported_as(stage: str, other: str) -> Iterator[None]:
    """Within the block, `stage`'s events go out as `other`'s.

    Args:
      stage: the stage whose code runs (e.g. TRAINER, in a Tuner trial).
      other: the stage the events are shown under (TUNER).
    """
    before = _ALIASES.get(stage)
    _ALIASES[stage] = other
    try:
        yield
    finally:
        if before is None:
            _ALIASES.pop(stage, None)
        else:
            _ALIASES[stage] = before


def start(stage: str, **fields: Any) -> None:
    """Emits the stage's start.

    Args:
      stage: the stage's node id.
      **fields: extra fields of the event.
    """
    emit(stage, START, **fields)


def done(stage: str, **fields: Any) -> None:
    """Emits the stage's end.

    Args:
      stage: the stage's node id.
      **fields: extra fields of the event (e.g. `seconds`).
    """
    emit(stage, DONE, **fields)


def phase(stage: str, text: str) -> None:
    """Emits that the stage moved on to another part of its work.

    Args:
      stage: the stage's node id.
      text: what it does now, as the terminal shows it.
    """
    emit(stage, PHASE, text=text)


def count(stage: str, phase_name: str, done_units: int, total: Optional[int] = None, unit: str = "rows") -> None:
    """Emits that `done_units` more units of `phase_name` finished (deltas from any process add up).

    Args:
      stage: the stage's node id.
      phase_name: the count's name (e.g. `counting values`).
      done_units: units finished since this process last reported.
      total: the phase's total when known.
      unit: what is counted.
    """
    emit(stage, COUNT, phase=phase_name, done=int(done_units), total=None if total is None else int(total), unit=unit)


def step(stage: str, step_no: int, total: int, loss: Optional[float] = None,
         examples_per_second: Optional[float] = None) -> None:
    """Emits a training step reached.

    Args:
      stage: the stage's node id.
      step_no: the step reached.
      total: the run's steps.
      loss: the latest training loss.
      examples_per_second: the training throughput.
    """
    emit(stage, STEP, step=int(step_no), total=int(total),
         loss=None if loss is None else round(float(loss), 5),
         examples_per_second=None if examples_per_second is None else round(float(examples_per_second), 1))


def evaluated(stage: str, step_no: int, metrics: Dict[str, float], kept: Optional[str] = None) -> None:
    """Emits a finished evaluation.

    Args:
      stage: the stage's node id.
      step_no: the step of the checkpoint evaluated.
      metrics: metric name -> value.
      kept: for the evaluation of the model a run kept, how that checkpoint was chosen
        (report.KEPT_BEST, report.KEPT_LAST); the view then names it as the kept model.
    """
    fields: Dict[str, Any] = {"kept": kept} if kept else {}
    # Unrounded: the view prints 4 decimals as the summary does; rounding here first would round twice
    # (0.84254962 -> 0.84255 -> "0.8426" against the summary's "0.8425").
    emit(stage, EVAL, step=int(step_no), metrics={k: float(v) for k, v in metrics.items()}, **fields)


@contextlib.contextmanager
def stage(name: str, **fields: Any) -> Iterator[None]:
    """Brackets a stage's work with progress events, as a context manager.

    Emits `start` on entry; `done` (with the seconds it took) on a normal exit, `failed` (with
    the error's type and seconds) when an exception leaves, which is re-raised.

    Args:
      name: the stage's node id.
      **fields: extra fields of the start event.

    Yields:
      None.
    """
    began = time.time()
    start(name, **fields)
    try:
        yield
    except BaseException as e:
        emit(name, FAILED, seconds=round(time.time() - began, 1), error=type(e).__name__)
        raise
    done(name, seconds=round(time.time() - began, 1))


def staged(name: str) -> Callable[[Callable], Callable]:
    """Decorates a stage's entry point (an executor's `Do`, the Trainer's `run_fn`) with `stage`.

    Args:
      name: the stage's node id.

    Returns:
      The decorator.
    """
    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            with stage(name):
                return fn(*args, **kwargs)
        return inner
    return wrap
