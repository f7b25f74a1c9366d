"""Closes a data-loss race in Beam's local runner before any Beam pipeline of this project runs.

The race (Apache Beam 2.59, read in the installed source):
- `apache_beam/runners/portability/fn_api_runner/worker_handlers.py` line 88 sets
  `DATA_BUFFER_TIME_LIMIT_MS = 1000`; the runner's data server (`BeamFnDataServicer`, line 502)
  and the in-process workers of `multi_threading` mode (line 663) hand it to the data plane.
- `apache_beam/runners/worker/data_plane.py` lines 114-122 then build a
  `TimeBasedBufferingClosableOutputStream` (lines 185-231) for every stream the runner sends to a
  worker: a periodic thread calls `flush()`, which, under `_flush_lock`, hands `get()` to the gRPC
  callback and then calls `_clear()` (lines 151-182).
- `write()` is the Cython `OutputStream.write` (`apache_beam/coders/stream.pyx`): it takes no
  lock. A chunk the runner writes (`fn_runner.py` lines 1217-1225) between the flush's `get()` and
  its `_clear()` is wiped without ever being sent; the bundle still succeeds and no counter notices.

The workaround, narrow and in-process (no installed file is edited):
1. `DATA_BUFFER_TIME_LIMIT_MS = 0`: the data plane then builds size-based streams, which flush
   only on the writing thread itself (`maybe_flush`, `close`), so nothing can interleave. A batch
   pipeline loses nothing by it: streams are flushed when they close. This covers the runner side
   and the in-process workers of `multi_threading` mode, whose encoders write through Cython
   methods that no Python override can reach. Subprocess workers (`multi_processing`) already run
   with Beam's own default of 0 (`sdk_worker_main._get_data_buffer_time_limit_ms`), unless
   `--experiments=data_buffer_time_limit_ms=N` is given, which `ensure_local_runner_safe` refuses.
2. `TimeBasedBufferingClosableOutputStream.write` takes `_flush_lock`, so a time-based stream made
   anyway (another caller setting the limit) cannot lose a `write()` either.

A second hazard of the same runner, a hang (issue 63): when a bundle fails, the SDK harness's
`SdkHarness._execute` (`apache_beam/runners/worker/sdk_worker.py` lines 303-321) first
`print()`s the traceback to the worker's `sys.stderr`, and only then puts the failure response
that the runner waits for. A local run's workers write stderr into the run's log file; when the
disk is full (the very failure being reported: ENOSPC, or EFBIG past a file-size limit) that print
raises, the response is never sent, and the runner waits on the bundle forever (`fn_runner.py`
line 1375 `input_elements`: its abort callback only looks at that response). The fix
(`report_bundle_failures`) wraps `_execute` so that the task it runs never raises: a failure
becomes the same error response, logged instead of printed (Python's logging swallows a failed
write). It is applied in this process by `ensure_local_runner_safe` (the in-process workers of
`in_memory` and `multi_threading` mode) and in every subprocess worker of `multi_processing` mode
by `components/data_io/beam_worker.py`, which `add_worker_plugin` names to Beam's
`--beam_plugins` option (a worker imports its plugins before it takes any work,
`sdk_worker_main.py` line 151).

`ensure_local_runner_safe()` also has Beam work out each DoFn's state and timer specs once
(`components/data_io/beam_dofn_specs.py`: a speed-up, not a fix). It is idempotent and is called
by every entry point that runs Beam
(ExampleGen and EmbeddingPreprocess executors, the preprocessing CLI, the pipeline CLI, the Kubeflow
task entry point). It refuses to run on a Beam version this was not verified for: the lines above
must be read again before the version pin moves.

`skip_tfx_sdist_for_local_runners()` wraps a second piece, TFX's Beam dependency flags, so that a
local run does not build and leave behind a copy of tfx per Beam component (see the function).
"""
from __future__ import annotations

import logging
import threading
import traceback
from typing import List, Optional

from components.data_io.beam_dofn_specs import cache_dofn_specs

VERIFIED_BEAM_VERSIONS = ("2.59.0",)

_applied = False
_lock = threading.Lock()


class UnverifiedBeamError(RuntimeError):
    """The installed Beam is not one the workaround was verified against."""


def _check_version(version: str) -> None:
    if version not in VERIFIED_BEAM_VERSIONS:
        raise UnverifiedBeamError(
            f"apache-beam {version} is installed, but the local-runner data-loss workaround in "
            f"components/data_io/beam_runtime.py was verified only for {', '.join(VERIFIED_BEAM_VERSIONS)}; "
            "install the pinned requirements.lock, or re-read the data plane source named there and "
            "add the version to VERIFIED_BEAM_VERSIONS"
        )


def _locked_write(base_write):
    def write(self, b, nested=False):
        with self._flush_lock:
            base_write(self, b, nested)

    write.__doc__ = "OutputStream.write under the stream's flush lock (components/data_io/beam_runtime.py)."
    write._tpu_embedding_locked = True  # marks the patch, for idempotence and tests
    return write


WORKER_PLUGIN = "components.data_io.beam_worker"  # imported by each SDK worker process at its start
_reporting = False


def _reporting_execute(base_execute, response_type):
    def _execute(self, task, request):
        def task_reporting_failure():
            try:
                return task()
            except:  # noqa: E722 - as Beam's own `_execute`: any failure becomes the bundle's error response
                text = traceback.format_exc()
                logging.getLogger("apache_beam.runners.worker.sdk_worker").error(
                    "Error processing instruction %s. Original traceback is\n%s\n", request.instruction_id, text)
                return response_type(instruction_id=request.instruction_id, error=text)

        base_execute(self, task_reporting_failure, request)

    _execute.__doc__ = "SdkHarness._execute whose task never raises (components/data_io/beam_runtime.py)."
    _execute._tpu_embedding_reports = True  # marks the patch, for idempotence and tests
    return _execute


def report_bundle_failures() -> None:
    """Makes this process's Beam SDK harness report every failed bundle to the runner, even when
    its `sys.stderr` cannot be written (a full disk): see the module docstring. Idempotent.

    Raises:
      UnverifiedBeamError: the installed Beam is not in `VERIFIED_BEAM_VERSIONS`, or its harness is
        not shaped as expected.
    """
    global _reporting
    with _lock:
        if _reporting:
            return
        # lazy: keeps Beam off the command line's config path (the runner imports this module)
        import apache_beam
        from apache_beam.portability.api import beam_fn_api_pb2
        from apache_beam.runners.worker import sdk_worker

        _check_version(apache_beam.__version__)
        harness = sdk_worker.SdkHarness
        if not callable(getattr(harness, "_execute", None)):
            raise UnverifiedBeamError("Beam's SDK harness is not shaped as components/data_io/beam_runtime.py expects")
        if not getattr(harness._execute, "_tpu_embedding_reports", False):
            harness._execute = _reporting_execute(harness._execute, beam_fn_api_pb2.InstructionResponse)
        _reporting = True


def add_worker_plugin(options) -> None:
    """Makes every SDK worker process of a pipeline import `WORKER_PLUGIN` at its start, which
    applies `report_bundle_failures` there. Call it before the pipeline runs.

    Args:
      options: the pipeline's `PipelineOptions` (`pipeline.options`); its `--beam_plugins` gains
        `WORKER_PLUGIN` unless it names it already. A worker that cannot import it (a remote
        image without this project) logs a warning and runs on.
    """
    # lazy: keeps Beam off the command line's config path (the runner imports this module)
    from apache_beam.options.pipeline_options import SetupOptions

    setup = options.view_as(SetupOptions)
    plugins = list(setup.beam_plugins or [])
    if WORKER_PLUGIN not in plugins:
        setup.beam_plugins = plugins + [WORKER_PLUGIN]


def ensure_local_runner_safe(beam_args: Optional[List[str]] = None) -> None:
    """Applies the data-loss workaround once per process; call it before running any Beam pipeline.

    Idempotent: later calls only set `DATA_BUFFER_TIME_LIMIT_MS` back to 0.

    Args:
      beam_args: the pipeline's Beam options, checked for options that re-open the race.

    Raises:
      ValueError: an option sets `data_buffer_time_limit_ms` (timed flushing in subprocess workers).
      UnverifiedBeamError: the installed Beam is not in `VERIFIED_BEAM_VERSIONS`, or its data
        plane is not shaped as expected.
    """
    global _applied
    for a in beam_args or []:
        if "data_buffer_time_limit_ms" in a:
            raise ValueError(
                f"Beam option {a!r} turns on timed flushing in the SDK workers, which can lose data "
                "(see components/data_io/beam_runtime.py); remove it"
            )
    with _lock:
        if _applied:
            # Set again on every call: anything in the process may have raised it since, and any
            # limit above 0 lets multi_threading workers corrupt their output ("Invalid PaneInfoEncoding").
            # lazy: keeps Beam off the command line's config path (the runner imports this module)
            from apache_beam.runners.portability.fn_api_runner import worker_handlers

            worker_handlers.DATA_BUFFER_TIME_LIMIT_MS = 0
            return
        # lazy: keeps Beam off the command line's config path (the runner imports this module)
        import apache_beam
        from apache_beam.runners.portability.fn_api_runner import worker_handlers
        from apache_beam.runners.worker import data_plane

        _check_version(apache_beam.__version__)
        cls = data_plane.TimeBasedBufferingClosableOutputStream
        if not hasattr(worker_handlers, "DATA_BUFFER_TIME_LIMIT_MS") or not hasattr(cls, "flush"):
            raise UnverifiedBeamError("Beam's data plane is not shaped as components/data_io/beam_runtime.py expects")
        worker_handlers.DATA_BUFFER_TIME_LIMIT_MS = 0
        if not getattr(cls.write, "_tpu_embedding_locked", False):
            cls.write = _locked_write(data_plane.ClosableOutputStream.write)
        _applied = True
    report_bundle_failures()
    cache_dofn_specs()


# TFX's BaseBeamExecutor.__init__ (tfx/dsl/components/base/base_beam_executor.py line 83) calls
# `dependency_utils.make_beam_dependency_flags` whenever Beam options are given. Unless one of
# --extra_package(s), --setup_file, --requirements_file or a worker/SDK container image is set, that
# repackages the whole installed tfx into an sdist (`build_ephemeral_package`, tfx/utils/
# dependency_utils.py lines 88-135): a 49 MB copy under `tempfile.mkdtemp()` that is never removed,
# and about 3 s of `setup.py sdist`, for every Beam component of every run. Remote workers need a
# package; a DirectRunner's own workers are this machine's Python (in-process threads or subprocesses
# of `sys.executable`, fn_api_runner/worker_handlers.py), which never read it. A local pipeline of four
# Beam components left 200 MB in /tmp per run and filled a test machine's disk.
# Beam's names for them, lower case and without "Runner" (Beam's create_runner accepts either form)
_LOCAL_RUNNERS = ("direct", "switchingdirect", "bundlebaseddirect")
# Worker environments that run in this Python (threads) or as subprocesses of it; DOCKER, PROCESS and
# EXTERNAL workers are started elsewhere and are served the staged packages, so they keep TFX's.
_LOCAL_ENVIRONMENTS = (None, "", "EMBEDDED", "LOOPBACK")
_dependency_wrapped = False


def runs_on_this_machine(beam_args: List[str]) -> bool:
    """Whether Beam options pick a runner whose workers are this machine's Python: a DirectRunner
    with its own workers (no `--environment_type`, or EMBEDDED / LOOPBACK).

    Args:
      beam_args: Beam's options as a command line; no `--runner` means Beam's default.

    Returns:
      True for DirectRunner (named, as `direct`, or by default), SwitchingDirectRunner and
      BundleBasedDirectRunner, unless an environment type starts the workers elsewhere.
    """
    # lazy: keeps Beam off the command line's config path (the runner imports this module)
    from apache_beam.options.pipeline_options import PipelineOptions, PortableOptions, StandardOptions

    options = PipelineOptions(flags=list(beam_args))
    if (options.view_as(PortableOptions).environment_type or "").upper() not in _LOCAL_ENVIRONMENTS:
        return False
    runner = options.view_as(StandardOptions).runner or StandardOptions.DEFAULT_RUNNER
    if not isinstance(runner, str):  # a runner object passed programmatically
        runner = type(runner).__name__
    name = runner.rsplit(".", 1)[-1].lower()
    return (name[: -len("runner")] if name.endswith("runner") else name) in _LOCAL_RUNNERS


def skip_tfx_sdist_for_local_runners() -> None:
    """Stops TFX's Beam executors from building an unused tfx sdist when the runner is local.

    Wraps `tfx.utils.dependency_utils.make_beam_dependency_flags` (what BaseBeamExecutor calls) once
    per process: options that pick a DirectRunner come back unchanged; any other runner's go to
    TFX's own function, which adds its package as before. Idempotent.
    """
    global _dependency_wrapped
    with _lock:
        if _dependency_wrapped:
            return
        # lazy: TFX loads TensorFlow
        from tfx.utils import dependency_utils

        tfx_flags = dependency_utils.make_beam_dependency_flags

        def make_beam_dependency_flags(beam_pipeline_args: List[str]) -> List[str]:
            if runs_on_this_machine(beam_pipeline_args):
                return list(beam_pipeline_args)  # a new list, as TFX's: the executor appends to it
            return tfx_flags(beam_pipeline_args)

        make_beam_dependency_flags.tfx_original = tfx_flags
        dependency_utils.make_beam_dependency_flags = make_beam_dependency_flags
        _dependency_wrapped = True
