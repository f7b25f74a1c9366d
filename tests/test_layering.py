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
