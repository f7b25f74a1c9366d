"""Runs `python -m MODULE ARGS...` commands as forked children of one process that imported the
modules they need once (a zygote, as Android's and Python's own `forkserver` start method do).

The local Kubeflow harness (pipelines/kfp_local.py, `fork_server=True`) starts each container
command of a run in a fresh process; most of each one's time is the same import of TensorFlow,
TFX and this project (about 4 of the 5-7 s). Here the server imports those once, and each command
is a `fork()` of it that runs the module as `__main__` (runpy, as `python -m` does) with the
command's arguments, environment, working directory and log file, and exits with its status.

What a fork does not give a fresh process, and so where a command runs as a subprocess instead
(`ForkServer.can_run`): environment variables that steer imports (`TF_*`, `PYTHON*`, `KERAS_*`)
other than the server's, and a command that is not `python -m`. The server imports nothing but
modules (no op runs, no thread is started by this code) before it forks. Each child starts with
the root logger as a fresh process has it (no handler, WARNING: a module that logs while it is
imported adds a handler, which would make the command's own `logging.basicConfig` a no-op); what
the preloaded modules logged while importing is in the server's stderr, not in each task's log.

Protocol: one JSON line per command on the server's stdin ({"module", "args", "env", "cwd",
"log"}), one JSON line back with {"rc"}.
"""
from __future__ import annotations

import atexit
import importlib
import json
import logging
import os
import subprocess
import sys
from typing import Dict, List, Optional

IMPORT_STEERING = ("TF_", "PYTHON", "KERAS_")


def _child(request: Dict) -> int:
    """The forked child: the command run as `python -m` would, its status returned."""
    import runpy  # lazy: only the forked child runs a module
    import traceback  # lazy: only the forked child reports a crash

    devnull = os.open(os.devnull, os.O_RDONLY)  # not the server's stdin: that carries the requests
    os.dup2(devnull, 0)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    fd = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.argv = [request["module"]] + list(request["args"])
    sys.modules.pop(request["module"], None)  # run afresh as __main__, as `python -m` does (no runpy warning)
    sys.path[0] = request["cwd"]  # `python -m` puts its working directory first, as the server's was
    root = logging.getLogger()  # as a fresh process has it: imports that logged added a handler
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return (e.code or 0) & 0xFF  # an exit status is one byte, as a process's
        print(e.code, file=sys.stderr)  # `sys.exit("message")`: printed, status 1
        return 1
    except BaseException:  # noqa: BLE001 - what `python -m` does with an uncaught exception: print it, exit 1
        traceback.print_exc()
        return 1
    finally:
        atexit._run_exitfuncs()  # what an interpreter runs at exit (os._exit skips it): logging, temporary folders
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (ValueError, OSError):  # a command that closed it (json.tool closes its output)
                pass


def fork(request: Dict) -> int:
    """Forks a child of this process that runs `request` ({"module", "args", "env", "cwd", "log"})
    as `python -m` would and exits with its status; the child's pid (`os.waitpid` it). Several may
    run at once: each has its own environment, working directory and log. The forking process
    should have done nothing but imports (no threads), as the server has."""
    pid = os.fork()
    if pid == 0:
        os._exit(_child(request))
    return pid


def serve(preload: List[str]) -> None:
    """The server's loop: imports `preload`, then forks one child per request line."""
    for name in preload:
        importlib.import_module(name)
    out = sys.stdout
    for line in sys.stdin:
        _, status = os.waitpid(fork(json.loads(line)), 0)
        out.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")
        out.flush()


class ForkServer:
    """A running server and the environment its imports were made under.

    Args:
      preload: the modules to import once.
      env: the server's environment (the tasks' base environment).

    Attributes:
      commands: how many commands it has run.
    """

    def __init__(self, preload: List[str], env: Dict[str, str]):
        self.env = dict(env)
        self.commands = 0
        self.proc = subprocess.Popen([sys.executable, "-m", "pipelines.fork_server", *preload], env=self.env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def can_run(self, cmd: List[str], env: Dict[str, str]) -> bool:
        """Whether a forked child runs `cmd` as a fresh process would: `python -m`, with the
        server's value of every variable that steers imports."""
        if len(cmd) < 3 or cmd[0] != sys.executable or cmd[1] != "-m":
            return False
        keys = {k for k in set(env) | set(self.env) if k.startswith(IMPORT_STEERING)}
        return all(env.get(k) == self.env.get(k) for k in keys) and self.proc.poll() is None

    def run(self, cmd: List[str], env: Dict[str, str], cwd: str, log_path: str) -> int:
        """Runs `cmd` (`can_run`) in a forked child; its exit status."""
        request = {"module": cmd[2], "args": cmd[3:], "env": env, "cwd": cwd, "log": log_path}
        self.commands += 1
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the fork server exited (status {self.proc.wait()}) running {cmd[2]}")
        return int(json.loads(answer)["rc"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def main(argv: Optional[List[str]] = None) -> int:
    serve(list(sys.argv[1:] if argv is None else argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
