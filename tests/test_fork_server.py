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
