"""pipelines/fork_server.py: `python -m` commands as forks of one pre-imported process, each with
its own arguments, environment, working directory, log and exit status, or refused to it."""
import os
import sys

from pipelines.fork_server import ForkServer


def test_commands_run_as_forks_with_their_own_status_log_and_environment(tmp_path):
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1")
    server = ForkServer(["json.tool"], env)
    try:
        good = tmp_path / "good.json"
        good.write_text('{"b": 1, "a": [2]}')
        log = tmp_path / "task.log"
        assert server.run([sys.executable, "-m", "json.tool", "--sort-keys", good.name], env, str(tmp_path), str(log)) == 0
        assert '"a": [' in log.read_text()  # the child's stdout went to its log; it ran in its cwd
        assert server.run([sys.executable, "-m", "json.tool", "missing.json"], env, str(tmp_path), str(log)) == 2
        assert "No such file or directory" in log.read_text()  # argparse's error, exit 2, as `python -m`
        script = tmp_path / "probe.py"
        script.write_text("import os, sys\nprint(os.environ['TASK_ONLY'])\nsys.exit(int(os.environ['CODE']))\n")
        task_env = dict(env, TASK_ONLY="seen", CODE="7", PYTHONPATH=str(tmp_path))
        assert server.can_run([sys.executable, "-m", "probe"], dict(env, TASK_ONLY="x"))
        assert not server.can_run([sys.executable, "-m", "probe"], task_env)  # PYTHONPATH steers imports
        assert server.run([sys.executable, "-m", "probe"], dict(env, TASK_ONLY="seen", CODE="7"), str(tmp_path), str(log)) == 7
        assert log.read_text().rstrip().endswith("seen")
        (tmp_path / "message.py").write_text("import atexit, sys\natexit.register(lambda: open('exited', 'w').close())\n"
                                             "sys.exit('refused: a message')\n")
        assert server.run([sys.executable, "-m", "message"], env, str(tmp_path), str(log)) == 1
        assert log.read_text().rstrip().endswith("refused: a message") and (tmp_path / "exited").exists()
        assert not server.can_run([sys.executable, "script.py"], env)
        assert not server.can_run([sys.executable, "-m", "probe"], dict(env, TF_USE_LEGACY_KERAS="0"))
    finally:
        server.close()
    assert server.proc.returncode == 0


def test_forks_run_at_once_each_with_its_own_environment_log_and_status(tmp_path):
    """`fork` without the server: two children running together (the Vertex job's two replicas in
    tests/test_tuner.py), each seeing the other's start. Run from a small process of its own: a fork
    of pytest's would run pytest's exit functions."""
    import json
    import subprocess

    (tmp_path / "replica.py").write_text(
        "import os, sys, time\n"
        "open(os.environ['MINE'], 'w').close()\n"
        "deadline = time.time() + 30\n"
        "while not os.path.exists(os.environ['OTHER']) and time.time() < deadline:\n"
        "    time.sleep(0.01)\n"
        "print(os.environ['NAME'], os.path.exists(os.environ['OTHER']), os.getcwd())\n"
        "sys.exit(int(os.environ['CODE']))\n")
    requests = [{"module": "replica", "args": [], "cwd": str(tmp_path), "log": str(tmp_path / f"{name}.log"),
                 "env": dict(os.environ, NAME=name, CODE=code, MINE=str(tmp_path / name), OTHER=str(tmp_path / other))}
                for name, code, other in (("a", "0", "b"), ("b", "5", "a"))]
    driver = ("import json, os, sys\nfrom pipelines.fork_server import fork\n"
              "pids = [fork(r) for r in json.loads(sys.argv[1])]\n"
              "print(json.dumps([os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]))\nprint(os.getcwd())\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", driver, json.dumps(requests)], cwd=root, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    statuses, cwd = r.stdout.splitlines()
    assert json.loads(statuses) == [0, 5] and cwd == root  # the forking process stays where it was
    assert [(tmp_path / f"{name}.log").read_text().split() for name in "ab"] == [
        ["a", "True", str(tmp_path)], ["b", "True", str(tmp_path)]]
