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

# Event kinds, one per line: {"t": seconds since the epoch, "stage": ..., "event": ..., ...}
START, DONE, FAILED = "start", "done", "failed"
PHASE = "phase"  # {"text"}: the stage moved on to another part of its work
COUNT = "count"  # {"phase", "done", "total" (or null), "unit"}: `done` more units of `phase` finished (a delta)
STEP = "step"  # {"step", "total", "loss", "examples_per_second"}: a training step reached
EVAL = "eval"  # {"step", "metrics"}: an evaluation finished


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def emit(stage: str, event: str, **fields: Any) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    line = json.dumps({"t": round(time.time(), 3), "stage": stage, "event": event, **fields},
                      separators=(",", ":"), default=str)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode("utf-8"))
        finally:
            os.close(fd)
    except OSError:  # progress is a view: never fail a run over it
        pass


def start(stage: str, **fields: Any) -> None:
    emit(stage, START, **fields)


def done(stage: str, **fields: Any) -> None:
    emit(stage, DONE, **fields)


def phase(stage: str, text: str) -> None:
    emit(stage, PHASE, text=text)


def count(stage: str, phase_name: str, done_units: int, total: Optional[int] = None, unit: str = "rows") -> None:
    """`done_units` more units of `phase_name` finished (deltas from any process add up)."""
    emit(stage, COUNT, phase=phase_name, done=int(done_units), total=None if total is None else int(total), unit=unit)


def step(stage: str, step_no: int, total: int, loss: Optional[float] = None,
         examples_per_second: Optional[float] = None) -> None:
    emit(stage, STEP, step=int(step_no), total=int(total),
         loss=None if loss is None else round(float(loss), 5),
         examples_per_second=None if examples_per_second is None else round(float(examples_per_second), 1))


def evaluated(stage: str, step_no: int, metrics: Dict[str, float]) -> None:
    emit(stage, EVAL, step=int(step_no), metrics={k: round(float(v), 5) for k, v in metrics.items()})


@contextlib.contextmanager
def stage(name: str, **fields: Any) -> Iterator[None]:
    """`start` on entry; `done` (with the seconds it took) on a normal exit, `failed` otherwise."""
    began = time.time()
    start(name, **fields)
    try:
        yield
    except BaseException as e:
        emit(name, FAILED, seconds=round(time.time() - began, 1), error=type(e).__name__)
        raise
    done(name, seconds=round(time.time() - began, 1))


def staged(name: str) -> Callable[[Callable], Callable]:
    """Decorates a stage's entry point (an executor's `Do`, the Trainer's `run_fn`) with `stage`."""
    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            with stage(name):
                return fn(*args, **kwargs)
        return inner
    return wrap
