"""The model layer sits below the trainer and the exporter: they import it and never each other.

Checked on the source (every import statement, including those inside functions), so a lazy import
that would tie the trainer to the exporter again fails here before it ships."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "components"
FORBIDDEN = {
    "embedding_trainer": ("components.embedding_exporter",),
    "embedding_exporter": ("components.embedding_trainer",),
    "embedding_model": ("components.embedding_trainer", "components.embedding_exporter", "components.model_registry"),
}


def _imports(path: pathlib.Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)


def test_the_tpu_smoke_module_ships_without_tests_or_bench():
    """The TPU image installs components/ only (docker/Dockerfile.tpu): the smoke test must run there."""
    found = [n for n in _imports(ROOT / "embedding_trainer" / "tpu_smoke.py") if n.split(".")[0] in ("tests", "bench")]
    assert not found, found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_what_is_below_it(package):
    files = sorted((ROOT / package).glob("*.py"))
    assert files, package
    found = [(f.name, name) for f in files for name in _imports(f)
             if any(name == p or name.startswith(p + ".") for p in FORBIDDEN[package])]
    assert not found, f"components/{package} imports {found}"


def test_the_checker_sees_imports_inside_functions(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from components.embedding_exporter.restore import x\n")
    assert "components.embedding_exporter.restore" in set(_imports(probe))


# ---- the test suite's own layering (docs/development.md, "Test tiers") ----------------------------

TESTS = pathlib.Path(__file__).resolve().parent


def test_no_test_file_imports_another():
    """Shared helpers and stage outputs live in tests/stages.py (and tests/tpu_harness.py), session
    fixtures in tests/conftest.py: a test file never imports another test file or the conftest."""
    found = [(f.name, name) for f in sorted(TESTS.glob("*.py")) for name in _imports(f)
             if name.startswith("tests.test_") or name.startswith("tests.conftest")]
    assert not found, found


def test_the_conftest_and_the_config_tests_leave_tensorflow_unloaded():
    """`pytest tests/test_config.py` (or the rulebook's Arrow cases) never pays for TensorFlow:
    the conftest, the shared stages module, the configuration and the rulebook import none of it."""
    import subprocess
    import sys

    code = ("import sys; import tests.conftest, tests.stages, components.config, components.rules.rulebook, "
            "components.contracts.plan; loaded = [m for m in ('tensorflow', 'tfx', 'apache_beam') if m in sys.modules]; "
            "assert not loaded, loaded")
    r = subprocess.run([sys.executable, "-c", code], cwd=TESTS.parent, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


def test_xdist_groups_keep_a_group_in_one_worker(tmp_path):
    """The tiers rely on pytest-xdist's `--dist loadgroup`: the tests of one `xdist_group` run in one
    worker. xdist 3.8 marks the group by rewriting `item._nodeid`, which pytest 9 no longer reads
    (there every group falls apart into single tests): requirements.in pins pytest below 9, and
    this fails the day that pin and this behaviour part."""
    import subprocess
    import sys

    (tmp_path / "test_probe.py").write_text(
        "import os, pytest\n"
        "@pytest.mark.parametrize('i', range(12))\n"
        "@pytest.mark.xdist_group('one')\n"
        "def test_grouped(i):\n"
        "    with open(os.path.join(os.path.dirname(__file__), 'workers.txt'), 'a') as fh:\n"
        "        fh.write(os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n"
        "@pytest.mark.parametrize('i', range(12))\n"
        "def test_single(i):\n"
        "    pass\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                        "--dist", "loadgroup", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:]
    workers = (tmp_path / "workers.txt").read_text().split()
    assert len(workers) == 12 and len(set(workers)) == 1, workers
