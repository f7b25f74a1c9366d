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

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import socket
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Iterator, Optional, TextIO

from components.config.checks import check_checkpoint_dir
from components.config.schema import ConfigError, PipelineConfig
from components.planning.capacity import available_host_bytes, check_host_floor, check_tpu_floor
from components.data_io.beam_runtime import ensure_local_runner_safe
from components.data_io.out_of_space import OutOfSpaceError, store_full
from components.data_io.out_of_space import message as space_message
from components.data_io.safe_files import NO_FOLLOW, new_file, replace_text
from components.reporting import progress
from components.reporting.errors import one_line
from components.reporting.report import error_line
from pipelines.pipeline import METADATA_FILE, PIPELINE_ROOT, SERVING_DIR, create_pipeline, run_locally
from pipelines.progress_view import ProgressPrinter, progress_path
from pipelines.run_report import write_run_report
from pipelines.summary import exit_status, readonly_store, run_artifacts, summarize

if TYPE_CHECKING:
    from ml_metadata.metadata_store.metadata_store import MetadataStore

DEMO_ROWS = 375_000
LOG_FILE = "pipeline.log"
REPORT_HTML = "run_report.html"
SUMMARY_FILE = "summary.json"
LOCK_FILE = ".run.lock"  # held (flock) by the run using the output directory; says who holds it
_HELD = set()  # output directories this process holds: a run inside `continuous`'s lock takes it again


class RunFailed(RuntimeError):
    """A component failed; the message is one line naming it, the cause and the full log."""


class RunInterrupted(RunFailed):
    """Ctrl-C or SIGTERM stopped the run; the message is one line naming the stage and how to resume.

    Attributes:
      status: the exit status a shell gives a process its signal ended (128 + the signal's number).
    """

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C is (`on_sigterm`)."""


def on_sigterm(signum, frame) -> None:
    """A SIGTERM handler: ends the run as Ctrl-C would, with the same cleanup and one line."""
    raise Terminated()


@dataclass
class RunResult:
    """What a run did.

    Attributes:
      summary: the run's summary (pipelines/summary.py `summarize`, also written to
        `<output_dir>/summary.json`).
      output_dir: the run's output folder.
    """

    summary: Dict[str, Any]
    output_dir: str

    @property
    def exit_status(self) -> int:
        """The exit status the run calls for: 0 pushed, 3 the gate kept the model back, 1 nothing
        pushed for another reason."""
        return exit_status(self.summary)

    @property
    def pushed(self) -> bool:
        """Whether this run pushed its model."""
        return bool(self.summary.get("pushed_by_this_run"))


class _ComponentLog(logging.Handler):
    """Prints a line for each component TFX's runner took from the cache (no executor ran, so no
    progress events come for it), and remembers which component the runner started last.

    TFX's LocalDagRunner logs `Component <id> is running.` before each component and the launcher
    `A cached execution <n> is used.` when it reuses one: the only live signal of a cached step.

    Args:
      stream: where the cached lines go (the terminal).
    """

    def __init__(self, stream: TextIO):
        super().__init__(logging.INFO)
        self.stream = stream
        self.current: Optional[str] = None

    def emit(self, record: logging.LogRecord) -> None:
        """Notes a component's start, or prints its cached line.

        Args:
          record: any record that reaches the root logger.
        """
        msg = record.getMessage()
        m = re.match(r"Component (\S+) is (running|finished)\.", msg)
        if m:
            self.current = m.group(1) if m.group(2) == "running" else self.current
        elif msg.startswith("A cached execution") and self.current:
            print(f"[{time.strftime('%H:%M:%S')}] {self.current} cached (its inputs and settings are unchanged)",
                  file=self.stream, flush=True)


def failed_node(store: MetadataStore, since_ms: int) -> Optional[str]:
    """Names the pipeline node whose execution failed, as TFX recorded it in ML Metadata.

    TFX's launcher marks an execution FAILED when its executor raises
    (tfx/orchestration/portable/launcher.py `launch`), and associates every execution with its
    node's context, named `<pipeline name>.<node id>` (tfx/dsl/compiler/compiler_utils.py
    `node_context_name`). Without a FAILED execution, the latest execution left NEW or RUNNING names
    the node: one whose driver or publishing raised.

    Args:
      store: the run's ML Metadata store.
      since_ms: the run's start, in milliseconds since the epoch: executions created before it
        belong to earlier runs into the same store.

    Returns:
      The node id (e.g. `Trainer`), or None when no execution of this run failed or was left
      unfinished.
    """
    # lazy: keeps TFX and ML Metadata off the command line's config path
    from ml_metadata.proto.metadata_store_pb2 import Execution
    from tfx.dsl.compiler.constants import NODE_CONTEXT_TYPE_NAME, PIPELINE_CONTEXT_TYPE_NAME

    runs = [e for e in store.get_executions() if e.create_time_since_epoch >= since_ms]
    # NEW or RUNNING: registered and never finished, as when its driver or the publishing of its
    # outputs raised (the launcher marks FAILED only what its executor raised).
    failed = ([e for e in runs if e.last_known_state == Execution.FAILED]
              or [e for e in runs if e.last_known_state in (Execution.NEW, Execution.RUNNING)])
    if not failed:
        return None
    contexts = store.get_contexts_by_execution(max(failed, key=lambda e: e.id).id)
    pipeline_names = [c.name for c in contexts if c.type == PIPELINE_CONTEXT_TYPE_NAME]
    for c in contexts:
        if c.type == NODE_CONTEXT_TYPE_NAME:
            prefix = f"{pipeline_names[0]}." if pipeline_names else ""
            return c.name[len(prefix):] if c.name.startswith(prefix) else c.name
    return None


def failed_component(metadata_path: str, since: float) -> Optional[str]:
    """Names the component that failed in the run that started at `since`, read from its ML Metadata.

    Args:
      metadata_path: the run's SQLite ML Metadata file (opened read-only; it may not exist yet
        when the run failed before TFX started).
      since: when the run started (`time.time()`).

    Returns:
      The component's node id, or None when ML Metadata names none (or cannot be read).
    """
    try:
        store = readonly_store(metadata_path)
        return failed_node(store, int(since * 1000)) if store is not None else None
    except Exception:  # noqa: BLE001 - naming the component is best effort: the run's own error must come through
        logging.exception("ML Metadata could not say which component failed")
        return None


class OutputDirInUse(ConfigError):
    """Another run holds the output directory."""


def _holder(lock_path: str) -> str:
    try:
        with open(lock_path, encoding="utf-8") as fh:
            h = json.load(fh)
        return (f"process {h['pid']} on {h['host']} since {h['started']} (`{h['command']}`)")
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


@contextlib.contextmanager
def output_dir_lock(output_dir: str) -> Iterator[str]:
    """Creates the output directory if needed and holds it for one run: a second run into the same
    directory is refused while the first holds it (its log, progress and summary would mix).

    A run inside a lock this process already holds (each span of `continuous`) runs under it.
    The lock is an advisory `flock` on `<output_dir>/.run.lock`, which the kernel releases when the
    holder exits, however it exits (a `kill -9` leaves no stale lock); the file says who holds it.

    Args:
      output_dir: the run's output directory.

    Yields:
      The directory, absolute.

    Raises:
      ConfigError: the path is a file, or the directory cannot be created or written (one line).
      OutputDirInUse: another run holds it (naming the holder).
    """
    output_dir = os.path.abspath(output_dir)
    if output_dir in _HELD:
        yield output_dir
        return
    try:
        os.makedirs(output_dir, exist_ok=True)
        fd = os.open(os.path.join(output_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT | NO_FOLLOW, 0o644)
    except (FileExistsError, NotADirectoryError):
        raise ConfigError(f"--output-dir {output_dir}: it, or a folder above it, is a file; name a directory "
                          f"(it is created when missing)") from None
    except OSError as e:
        if e.errno == errno.ELOOP:  # a link planted at the lock's name: the lock is never taken through it
            raise ConfigError(f"--output-dir {output_dir}: {LOCK_FILE} there is a symbolic link (to "
                              f"{os.readlink(os.path.join(output_dir, LOCK_FILE))}); remove it and rerun") from None
        reason = "not writable" if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else e.strerror
        raise ConfigError(f"--output-dir {output_dir}: cannot write there ({reason}); choose a directory you can "
                          f"write to") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputDirInUse(f"--output-dir {output_dir} is in use by another run: "
                                 f"{_holder(os.path.join(output_dir, LOCK_FILE))}; wait for it to finish, or "
                                 f"choose another --output-dir") from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "command": " ".join(sys.argv)[:200]}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode("utf-8"), 0)
        _HELD.add(output_dir)
        try:
            yield output_dir
        finally:
            _HELD.discard(output_dir)
    finally:
        os.close(fd)  # releases the flock


def run(cfg: PipelineConfig, output_dir: str, quiet: bool = False, span: Optional[int] = None,
        cache: bool = True, progress_to_stderr: bool = False, extra_components=None) -> RunResult:
    """Runs the pipeline with TFX's LocalDagRunner into `output_dir` and summarizes it.

    Args:
      cfg: the resolved configuration.
      output_dir: where the pipeline root, ML Metadata, the serving models, the log and the summary go.
      quiet: send everything TFX, Beam, TensorFlow and Python's warnings write to
        `<output_dir>/pipeline.log`; the terminal shows the stages' progress only.
      span: with a span input, read this span instead of the latest.
      cache: reuse the outputs of components whose inputs and settings are unchanged.
      progress_to_stderr: the quiet run's progress goes to stderr (stdout then carries only what
        the caller prints, e.g. the summary as JSON).
      extra_components: stock components to add (pipelines.pipeline.create_pipeline).

    Returns:
      The run's summary and output folder.

    Raises:
      RunFailed: (quiet only) a component failed; one line names it, the cause and the log.
      ConfigError: the output directory cannot be used, or another run holds it (`output_dir_lock`);
        or the tables the config fixes cannot fit a TPU chip or this machine (planning/capacity.py);
        or training.checkpoint_dir is inside the push destination.
    """
    check_tpu_floor(cfg)  # what can never fit, refused before the data stages run
    check_host_floor(cfg, available_host_bytes())
    check_checkpoint_dir(cfg.training.checkpoint_dir, os.path.join(os.path.abspath(output_dir), SERVING_DIR))
    with output_dir_lock(output_dir) as output_dir:
        check_push_destination(os.path.join(output_dir, SERVING_DIR))
        if quiet:
            return _run_logged(cfg, output_dir, span, cache, progress_to_stderr, extra_components)
        return _run(cfg, output_dir, span, cache, extra_components)


def check_push_destination(serving_dir: str) -> None:
    """Refuses, before any stage runs, a push destination the Pusher could not write (it was found
    only at the Pusher, after the whole run): a file in its place, or a folder not writable.

    Args:
      serving_dir: the local push destination (inside the output directory, which the run's lock
        already proved writable: a missing one is created by the Pusher).

    Raises:
      ConfigError: one line naming it and what to change.
    """
    if os.path.lexists(serving_dir) and not os.path.isdir(serving_dir):
        raise ConfigError(f"the push destination {serving_dir} is a file, not a folder; move it away (the run pushes "
                          "its models there) or choose another --output-dir")
    if not os.path.isdir(serving_dir):
        return
    probe = os.path.join(serving_dir, f".write-probe-{os.getpid()}")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NO_FOLLOW, 0o644))
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"the push destination {serving_dir} cannot be written ({e.strerror}); make it writable "
                          "or choose another --output-dir") from None


class _SummaryFailed(RuntimeError):
    """The pipeline ran, but reading back what it did failed."""


def _run(cfg: PipelineConfig, output_dir: str, span: Optional[int], cache: bool, extra_components=None) -> RunResult:
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
    metadata = os.path.join(output_dir, METADATA_FILE)
    try:
        run_locally(p)
    except Exception as e:  # noqa: BLE001 - only ML Metadata's full store is renamed; others pass unchanged
        if not store_full(e):
            raise
        raise OutOfSpaceError(space_message("ML Metadata", metadata, errno.ENOSPC), errno.ENOSPC) from e
    try:
        summary = summarize(cfg, output_dir, run_artifacts(os.path.join(output_dir, METADATA_FILE), start))
    except Exception as e:  # noqa: BLE001 - named as the summary's failure, not the last component's
        raise _SummaryFailed(f"the run finished, but its summary could not be read back: {type(e).__name__}: {e}") from e
    summary["seconds"] = round(time.time() - start, 1)
    try:
        summary["report_html"] = write_run_report(summary, output_dir, os.path.join(output_dir, REPORT_HTML))
    except Exception:  # noqa: BLE001 - the HTML report is a view: the run's outcome does not depend on it
        logging.exception("the HTML run report could not be written")
        summary["report_html"] = None
    replace_text(os.path.join(output_dir, SUMMARY_FILE), json.dumps(summary, indent=2, sort_keys=True))
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
    log_path = os.path.join(output_dir, LOG_FILE)
    events = progress_path(output_dir)
    if os.path.lexists(events):  # a link too: removed, not followed
        os.remove(events)
    new_file(log_path).close()  # a link planted at the log's name is removed, not written through
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | NO_FOLLOW)
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
    started = time.time()
    try:
        return _run(cfg, output_dir, span, cache, extra_components)
    except Exception as e:  # noqa: BLE001 - every failure becomes one line; the traceback is in the log
        logging.exception("pipeline run failed")
        if isinstance(e, _SummaryFailed):
            where = "the run summary"
        else:
            printer.drain_quietly()  # the last events name the stage that was running
            where = (failed_component(os.path.join(output_dir, METADATA_FILE), started) or printer.current
                     or component_log.current or "the pipeline")
        raise RunFailed(error_line(one_line(e), where, log_path)[len("error: "):]) from e
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM through `on_sigterm`: one line, not a traceback
        logging.exception("pipeline run interrupted")
        printer.drain_quietly()
        where = printer.current or component_log.current or "the pipeline"
        signal_name, status = ("SIGTERM", 143) if isinstance(e, Terminated) else ("Ctrl-C (SIGINT)", 130)
        raise RunInterrupted(f"{signal_name} stopped the run while {where} ran; rerun the same command to continue "
                             "(finished stages are taken from the cache, training resumes from its last checkpoint); "
                             f"full log: {log_path}", status) from None
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
