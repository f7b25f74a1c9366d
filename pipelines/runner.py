"""Running the pipeline locally, as a library: `run(cfg, output_dir)` -> `RunResult`.

`python -m pipelines` (pipelines/__main__.py) is a thin command line over this module; continuous
training (pipelines/continuous.py) and the tests call `run` directly.

With `quiet=True` (what the command line uses) everything TFX, Beam, TensorFlow and Python's
warnings write, in this process and in Beam's worker processes, goes to
`<output_dir>/pipeline.log`; the terminal shows the stages' live progress (components/reporting/progress.py
events, drawn by pipelines/progress_view.py) and nothing else. A failure raises `RunFailed` with one
line naming the component, the cause and the log.
"""
from __future__ import annotations

import logging
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, Optional

from components.reporting import progress
from components.config.schema import PipelineConfig
from components.reporting.errors import one_line
from components.reporting import error_line

DEMO_ROWS = 375_000
LOG_FILE = "pipeline.log"
REPORT_HTML = "run_report.html"


class RunFailed(RuntimeError):
    """A component failed; the message is one line naming it, the cause and the full log."""


@dataclass
class RunResult:
    """What a run did: its summary (pipelines/summary.py `summarize`, also written to
    `<output_dir>/summary.json`) and the exit status it calls for (0 pushed, 3 the gate kept the
    model back, 1 nothing pushed for another reason)."""

    summary: Dict[str, Any]
    output_dir: str

    @property
    def exit_status(self) -> int:
        from pipelines.summary import exit_status

        return exit_status(self.summary)

    @property
    def pushed(self) -> bool:
        return bool(self.summary.get("pushed_by_this_run"))


class _ComponentLog(logging.Handler):
    """Remembers which component TFX's runner started last (the one to name when a run fails
    outside our own code) and which ones it took from the cache (no executor ran: no progress
    events); prints a line for each cached one."""

    def __init__(self, stream):
        super().__init__(logging.INFO)
        self.stream = stream
        self.current: Optional[str] = None

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        m = re.match(r"Component (\S+) is (running|finished)\.", msg)
        if m:
            self.current = m.group(1) if m.group(2) == "running" else self.current
        elif msg.startswith("A cached execution") and self.current:
            print(f"[{time.strftime('%H:%M:%S')}] {self.current} cached (its inputs and settings are unchanged)",
                  file=self.stream, flush=True)


# Where each component's code lives: the innermost matching frame of a failure's traceback names
# the component (the progress log alone cannot: TensorFlow may turn INFO logging down mid-run).
_COMPONENT_CODE = (
    ("components/example_gen/", "EmbeddingExampleGen"),
    ("components/embedding_preprocess/", "EmbeddingPreprocess"),
    ("components/embedding_trainer/", "Trainer"),
    ("tfx/components/trainer/", "Trainer"),
    ("components/embedding_exporter/", "EmbeddingExporter"),
    ("tfx/components/pusher/", "Pusher"),
)


def failed_component(e: BaseException) -> Optional[str]:
    import traceback

    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        path = frame.filename.replace(os.sep, "/")
        for code, name in _COMPONENT_CODE:
            if code in path:
                return name
    return None


def run(cfg: PipelineConfig, output_dir: str, quiet: bool = False, span: Optional[int] = None,
        cache: bool = True, progress_to_stderr: bool = False, extra_components=None) -> RunResult:
    """Runs the pipeline with TFX's LocalDagRunner into `output_dir` and summarizes it.
    `progress_to_stderr`: the quiet run's progress goes to stderr (stdout then carries only what
    the caller prints, e.g. the summary as JSON). `extra_components`: stock components to add
    (pipelines.pipeline.create_pipeline)."""
    output_dir = os.path.abspath(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    if quiet:
        return _run_logged(cfg, output_dir, span, cache, progress_to_stderr, extra_components)
    return _run(cfg, output_dir, span, cache, extra_components)


class _SummaryFailed(RuntimeError):
    """The pipeline ran, but reading back what it did failed."""


def _run(cfg: PipelineConfig, output_dir: str, span: Optional[int], cache: bool, extra_components=None) -> RunResult:
    import json

    from components.data_io.beam_runtime import ensure_local_runner_safe
    from pipelines.pipeline import METADATA_FILE, PIPELINE_ROOT, SERVING_DIR, create_pipeline, run_locally
    from pipelines.summary import summarize

    ensure_local_runner_safe(cfg.beam_pipeline_args())
    p = create_pipeline(
        cfg,
        pipeline_root=os.path.join(output_dir, PIPELINE_ROOT),
        metadata_path=os.path.join(output_dir, METADATA_FILE),
        serving_dir=os.path.join(output_dir, SERVING_DIR),
        span=span,
        enable_cache=cache,
        extra_components=extra_components,
    )
    start = time.time()
    run_locally(p)
    try:
        summary = summarize(cfg, output_dir)
    except Exception as e:  # noqa: BLE001 - named as the summary's failure, not the last component's
        raise _SummaryFailed(f"the run finished, but its summary could not be read back: {type(e).__name__}: {e}") from e
    summary["seconds"] = round(time.time() - start, 1)
    try:
        from pipelines.run_report import write_run_report

        summary["report_html"] = write_run_report(summary, output_dir, os.path.join(output_dir, REPORT_HTML))
    except Exception:  # noqa: BLE001 - the HTML report is a view: the run's outcome does not depend on it
        logging.exception("the HTML run report could not be written")
        summary["report_html"] = None
    with open(os.path.join(output_dir, "summary.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=2, sort_keys=True)
    return RunResult(summary, output_dir)


def _log_handler() -> logging.Handler:
    """Python logging (TFX's, Beam's, ours) into the log: stderr is the log file by then."""
    h = logging.StreamHandler(sys.stderr)
    h.setLevel(logging.INFO)
    h.setFormatter(logging.Formatter("%(levelname).1s%(asctime)s %(name)s %(filename)s:%(lineno)d] %(message)s",
                                     "%m%d %H:%M:%S"))
    return h


def _run_logged(cfg: PipelineConfig, output_dir: str, span: Optional[int] = None, cache: bool = True,
                progress_to_stderr: bool = False, extra_components=None) -> RunResult:
    from pipelines.progress_view import ProgressPrinter, progress_path

    log_path = os.path.join(output_dir, LOG_FILE)
    events = progress_path(output_dir)
    if os.path.exists(events):
        os.remove(events)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    terminal = os.fdopen(os.dup((sys.stderr if progress_to_stderr else sys.stdout).fileno()), "w")
    printer = ProgressPrinter(events, terminal, tty=terminal.isatty() and not os.environ.get("CI"))
    component_log = _ComponentLog(terminal)
    handler = _log_handler()
    root = logging.getLogger()
    old_level = root.level
    old_env = os.environ.get(progress.ENV)
    saved = os.dup(2), os.dup(1)
    sys.stdout.flush(), sys.stderr.flush()
    os.dup2(log_fd, 2), os.dup2(log_fd, 1)  # worker processes inherit these
    os.environ[progress.ENV] = events  # ... and this: their progress events reach the terminal
    root.addHandler(handler), root.addHandler(component_log)
    root.setLevel(min(old_level or logging.INFO, logging.INFO))
    print(f"running {cfg.name}; full log: {log_path}", file=terminal, flush=True)
    printer.start()
    try:
        return _run(cfg, output_dir, span, cache, extra_components)
    except Exception as e:  # noqa: BLE001 - every failure becomes one line; the traceback is in the log
        logging.exception("pipeline run failed")
        if isinstance(e, _SummaryFailed):
            where = "the run summary"
        else:
            printer.drain_quietly()  # the last events name the stage that was running
            where = failed_component(e) or printer.current or component_log.current or "the pipeline"
        raise RunFailed(error_line(one_line(e), where, log_path)[len("error: "):]) from e
    finally:
        # The process's own output first: nothing below may leave it pointing at the log.
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(saved[0], 2), os.dup2(saved[1], 1)
        for fd in (log_fd, *saved):
            os.close(fd)
        root.removeHandler(handler), root.removeHandler(component_log)
        root.setLevel(old_level)
        if old_env is None:
            os.environ.pop(progress.ENV, None)
        else:
            os.environ[progress.ENV] = old_env
        printer.stop()  # never raises: the view is best effort
        terminal.close()
