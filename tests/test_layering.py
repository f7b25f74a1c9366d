"""The model layer sits below the trainer and the exporter: they import it and never each other.

Checked on the source (every import statement, including those inside functions), so a lazy import
that would tie the trainer to the exporter again fails here before it ships."""
import ast
import functools
import pathlib
import re

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


def test_the_tpu_smoke_package_ships_without_tests_or_bench():
    """The TPU image installs components/ only (docker/Dockerfile.tpu): the smoke test must run there."""
    files = sorted((ROOT / "tpu_smoke").glob("*.py"))
    found = [(f.name, n) for f in files for n in _imports(f) if n.split(".")[0] in ("tests", "bench")]
    assert files and not found, found


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


# ---- one home for every name, no import cycles (docs/development.md, "Layout") ---------------------

REPO = TESTS.parent
PRODUCT = ("components", "pipelines")
TREE = ("components", "pipelines", "tests", "bench", "scripts")
# Package __init__ files that define names of their own (not re-exports): the legacy-Keras switch and
# the artifact types' lazy names, and the pipeline CLI's side-effect registrations.
INIT_WITH_CODE = {"components/__init__.py", "pipelines/__init__.py"}


@functools.lru_cache(maxsize=None)
def _parse(path: pathlib.Path) -> ast.Module:
    """Each file parsed once per session: several checks walk the same trees."""
    return ast.parse(path.read_text(), str(path))


def _py_files(tops):
    return sorted(p for top in tops for p in (REPO / top).rglob("*.py"))


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_block(node) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _executed_imports(tree):
    """(import node, inside a function) for every import that runs (not under `if TYPE_CHECKING:`)."""
    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            if _type_checking_block(child):
                for sub in child.orelse:
                    yield from walk(ast.Module(body=[sub], type_ignores=[]), in_function)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            yield from walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    yield from walk(tree, False)


def _targets(node, module: str, is_package: bool):
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        here = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
    return [base] + [f"{base}.{a.name}" for a in node.names]


@functools.lru_cache(maxsize=None)
def import_graph():
    """module -> the product modules it imports (imports inside functions included)."""
    files = _py_files(PRODUCT)
    modules = {_module_name(p): p for p in files}

    def owner(name):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, path in modules.items():
        tree = _parse(path)
        edges = set()
        for node, _ in _executed_imports(tree):
            for target in _targets(node, name, path.name == "__init__.py"):
                hit = owner(target)
                if hit and hit != name:
                    edges.add(hit)
        graph[name] = edges
    return graph


def find_cycles(graph):
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


# The packages from the bottom up (docs/development.md, "Layout"): a package imports only packages
# of a lower layer, never one of its own layer or above, even lazily. `components` itself (the
# legacy-Keras switch and the artifact types' lazy names) is outside the layers.
LAYERS = (
    ("components.rules", "components.reporting"),
    ("components.config",),
    ("components.contracts",),
    ("components.planning",),
    ("components.rows", "components.data_io"),
    ("components.tfx_wiring",),
    ("components.example_gen", "components.embedding_model", "components.model_registry", "components.tf_example_copy"),
    ("components.embedding_preprocess",),
    ("components.embedding_trainer", "components.embedding_exporter"),
    ("components.tpu_smoke",),
    ("pipelines",),
)


def package_of(module: str) -> str:
    """`components.<package>` of a module under components/, `pipelines` for pipelines/."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "components" and len(parts) > 1 else parts[0]


def arrows_against_layers(graph, layers=LAYERS):
    """(importer, imported) module pairs whose packages do not run downward through `layers`, and
    the packages `layers` leaves out."""
    rank = {p: i for i, layer in enumerate(layers) for p in layer}
    packages = {package_of(m) for m in graph} - {"components"}
    wrong = sorted((a, b) for a, targets in graph.items() for b in targets
                   if package_of(a) != package_of(b) and "components" not in (package_of(a), package_of(b))
                   and rank.get(package_of(b), -1) >= rank.get(package_of(a), -1))
    return wrong, sorted(packages - set(rank))


def test_packages_import_only_lower_layers():
    """config/ no longer imports contracts/ (the names and chips they share live in rules/), the
    plan's derivation lives in planning/ above the contracts, the TPU smoke test above the Trainer."""
    wrong, unplaced = arrows_against_layers(import_graph())
    assert wrong == [] and unplaced == []


def test_the_layer_check_sees_an_arrow_up_and_one_within_a_layer():
    graph = {"components.config.schema": {"components.contracts.plan"},
             "components.rows.x": {"components.data_io.y"}, "components.data_io.y": set(),
             "components.contracts.plan": {"components.config.choices"}, "components.config.choices": set()}
    assert arrows_against_layers(graph)[0] == [("components.config.schema", "components.contracts.plan"),
                                               ("components.rows.x", "components.data_io.y")]


def test_no_import_cycles():
    """A package imports a package below it, never one that imports it back, even lazily."""
    assert find_cycles(import_graph()) == []


def test_the_cycle_check_sees_a_cycle_through_a_function_level_import():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    tree = ast.parse("def f():\n    from components.x import y\nif TYPE_CHECKING:\n    import components.z\n")
    assert [(type(n).__name__, inner) for n, inner in _executed_imports(tree)] == [("ImportFrom", True)]


def _has_reason(line: str) -> bool:
    comment = line.partition("# lazy:")[2]
    return len(comment.strip()) > 3


def _lazy_reason(lines, node, import_lines) -> bool:
    """A function-level import carries `# lazy: <reason>` on its line or on the line directly above
    it; a comment above a run of consecutive import statements covers the run."""
    if _has_reason(lines[node.lineno - 1]):
        return True
    k = node.lineno - 2
    while k >= 0 and k + 1 in import_lines:  # 1-based: line k + 1 belongs to an import above
        k -= 1
    return k >= 0 and lines[k].strip().startswith("# lazy:") and _has_reason(lines[k])


def function_level_imports_without_reason(paths, root=REPO):
    found = []
    for path in paths:
        lines = path.read_text().splitlines()
        imports = list(_executed_imports(_parse(path)))
        import_lines = {n for node, _ in imports for n in range(node.lineno, node.end_lineno + 1)}
        for node, in_function in imports:
            if in_function and not _lazy_reason(lines, node, import_lines):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_every_function_level_import_says_why():
    """An import inside a function hides a dependency: it stays only for an optional dependency or a
    heavy import kept off a light path, and says which in a `# lazy:` comment."""
    assert function_level_imports_without_reason(_py_files(PRODUCT)) == []


def test_the_reason_check_refuses_a_bare_lazy_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    import json\n\n\ndef g():\n    # lazy: keeps TensorFlow off the config path\n"
                     "    import tensorflow as tf\n    from x import (\n        a,\n    )\n\n\n"
                     "def h():\n    import tensorflow  # lazy: heavy\n\n\n"
                     "def i():\n    # lazy: keeps TensorFlow off the config path\n    import tensorflow\n"
                     "    y = f(a,\n          b)\n    import json\n    import csv  # lazy:\n")
    assert function_level_imports_without_reason([probe], tmp_path) == ["probe.py:2", "probe.py:22", "probe.py:23"]


def test_no_one_letter_module_aliases():
    """`import plan as P` means a different module in every file: names are spelled out."""
    found = [f"{p.relative_to(REPO)}:{node.lineno} {a.name} as {a.asname}"
             for p in _py_files(TREE) for node, _ in _executed_imports(_parse(p))
             for a in node.names if a.asname and len(a.asname) == 1]
    assert found == []


def test_every_name_is_imported_from_its_home():
    """No module re-exports another's names, and a package's __init__ holds its docstring only."""
    found = []
    for p in _py_files(PRODUCT):
        rel = str(p.relative_to(REPO))
        text = p.read_text()
        if "re-export" in text.lower() and "noqa: F401" in text:
            found.append(f"{rel}: re-exports")
        if p.name == "__init__.py" and rel not in INIT_WITH_CODE:
            body = ast.parse(text).body
            if body[1:] or (body and not (isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant))):
                found.append(f"{rel}: holds more than its docstring")
    assert found == []


def documented_modules():
    """Module paths in docs/development.md's layout block: a folder line (`config/`) opens a level,
    each deeper line (two more spaces) is a module of it (`schema.py  the dataclasses ...`)."""
    text = (REPO / "docs" / "development.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    listed, folders = set(), []
    for line in block.splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2
        name = line.split()[0]
        folders = folders[:depth]
        if name.endswith("/"):
            folders.append(name)
        elif name.endswith(".py") and len(folders) == depth:
            listed.add("".join(folders) + name)
    return listed


def test_the_documented_layout_matches_the_tree():
    """docs/development.md lists every module of components/ and pipelines/, one line each, and no
    module that does not exist."""
    tree = {str(p.relative_to(REPO)) for p in _py_files(PRODUCT)}
    listed = documented_modules()
    assert sorted(tree - listed) == [] and sorted(listed - tree) == []


# A word of README.md's layout block that names a path: a folder (`config/`), a file with a suffix
# (`kfp_local.py`, `Dockerfile.tpu`, `README.md`) or a Dockerfile.
_PATH_WORD = re.compile(r"[\w./-]+/|[\w./-]+\.(?:py|yaml|yml|md|json|lock|in|txt|sh|tpu)|Dockerfile[\w.]*")


def readme_layout():
    """README.md's layout block (under "**Layout**") as [(folder, [paths it names])]: a line at
    column 0 opens an entry with its folder (`components/`), and so does `;  folder/` on that line
    (`tests/ ...;  bench/ ...`); indented lines continue the entry. Every word of an entry's text
    that names a path (`_PATH_WORD`: `config/`, `rules/rulebook.py`, `README.md`) is a path under
    the entry's folder."""
    text = (REPO / "README.md").read_text()
    block = text.split("- **Layout**", 1)[1].split("```", 2)[1]
    entries = []
    for line in block.splitlines():
        if not line.strip():
            continue
        if line.startswith(" "):
            entries[-1][1].append(line.strip())
            continue
        for part in re.split(r";\s{2,}(?=\S+/\s)", line):
            folder, _, rest = part.partition(" ")
            entries.append((folder, [rest.strip()]))
    return [(folder, [w for w in (word.strip("(),;:") for word in " ".join(rest).split()) if _PATH_WORD.fullmatch(w)])
            for folder, rest in entries]


def test_the_readmes_layout_block_matches_the_tree():
    """README.md's short layout block names only paths that exist where it puts them (before, it put
    rulebook.py and synthetic_data.py at components/ root, long after they moved to rules/ and
    example_gen/). Where docs/development.md lists every module, this block is an overview, so its
    completeness rule is one level deep: the components/ entry names every package of components/."""
    entries = readme_layout()
    folders = [folder for folder, _ in entries]
    assert "components/" in folders and "pipelines/" in folders, folders
    missing = [folder for folder in folders if not (REPO / folder).is_dir()]
    missing += [f"{folder}{path}" for folder, paths in entries for path in paths if not (REPO / folder / path).exists()]
    assert missing == []
    named = {path for folder, paths in entries if folder == "components/" for path in paths}
    packages = {f"{p.name}/" for p in (REPO / "components").iterdir() if (p / "__init__.py").is_file()}
    assert sorted(packages - named) == []
