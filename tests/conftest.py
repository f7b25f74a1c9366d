"""Session fixtures, the test tiers, the worker groups and the per-test reset of global state.

The rule for each (docs/development.md, "Test tiers"):
- **Tiers.** A test that runs a stage end to end (a pipeline, a Trainer run, an export with
  parity, a Beam pipeline in several processes, a fresh Python process that loads TensorFlow)
  carries `@pytest.mark.slow(reason="...")` beside it and runs only in `make test-all` (CI). Every
  other test is fast (`make test`): it checks one rule on a fixture small enough to write out.
  A slow mark without a reason, or a test that uses a fixture below marked slow without the mark,
  stops collection.
- **Groups.** Workers are pytest-xdist's (`--dist loadgroup`); a test's `xdist_group` is derived
  here from the fixtures it uses: the expensive session fixtures below are built once, in one
  worker, and a module-scoped fixture once per module; tests that share none run wherever a worker
  is free. No hand-kept list of tests or seconds.
- **State.** Before each test the random generators are seeded; after it, the environment and
  TensorFlow's global state (Keras' dtype policy, eager mode, grappler's passes) are put back.
  TensorFlow is configured here only once a test module has imported it: a config or rulebook test
  never loads it. Beam, once imported, works out DoFn specs once per DoFn as every entry point has
  it do (components/data_io/beam_dofn_specs.py), in the pipelines tests build themselves too.
"""
import atexit
import gc
import os
import random
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# XLA's CPU backend stands in for the TPU's compiler (the steps compiled with jit_compile): what is
# under test is that a step compiles and what its HLO computes, not how fast LLVM's CPU code runs.
# LLVM at -O0 compiled tests/test_xla_step.py's steps in 27 s instead of 37 s, every test passing;
# XLA's HLO passes run as before; results differ from -O2's by float32 rounding (a sum's order:
# at most 4e-7 relative on a probe of matmuls, reductions and an Adagrad-like update).
XLA_OPT = "--xla_backend_optimization_level=0"
if XLA_OPT not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {XLA_OPT}".strip()
sys.path.insert(0, REPO)

import pytest  # noqa: E402

LOGICAL_CPUS = 4

# Session fixtures whose users share one worker (the fixture is built once): name -> why it costs.
GROUPED = {
    "chain": "ExampleGen -> Preprocess -> Trainer -> Exporter -> Pusher executors on 2,500 rows",
    "pipeline_run": "the whole pipeline on the demo config and 100k rows",
    "features_run": "the whole pipeline on configs/features.yaml (every feature kind), 3,000 rows",
    "parity_data": "trainer_data's rows preprocessed with the parity check's few features",
}
# Session fixtures built in each worker that uses them: in the whole suite their many users spread
# over the workers. The fast tier (`-m "not slow"`, `make test`) has few (21 of trainer_data's 82),
# and there they share a worker instead: one build (about 4 s) instead of two.
PER_WORKER = {"trainer_data": "3,000 + 600 generated rows preprocessed for the Trainer"}
# Fixtures that make every test using them slow.
SLOW_FIXTURES = {"chain", "features_run", "pipeline_run", "kfp_runs"}


def _logical_cpus(n: int) -> None:
    """Several replicas on CPU: `n` logical CPU devices (tests/tpu_harness.py's TPU strategy and
    MirroredStrategy run one replica on each), configured before TensorFlow initializes its
    runtime. Tests that use no strategy run on the first."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")
    if len(tf.config.get_logical_device_configuration(cpu[0]) or ()) == n:
        return
    tf.config.set_logical_device_configuration(cpu[0], [tf.config.LogicalDeviceConfiguration()] * n)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow(reason): the full tier only (make test-all): runs a stage end to end")
    # In an xdist worker (xdist's `workerinput`, not the PYTEST_XDIST_WORKER variable, which
    # processes the tests start inherit): registered before the tests import anything, so their
    # exit handlers run before it.
    if hasattr(config, "workerinput"):
        atexit.register(_leave_without_teardown)


# Python's cyclic garbage collector, tuned for a test process: TensorFlow's graphs allocate
# millions of small objects, and at the default thresholds (700, 10, 10) the collector ran ~6,000
# times in tests/test_tpu_conformance.py alone (7.5 s of 90). At these it ran ~1,400 times (4.3 s),
# with the same peak memory (3.0 GB over the TPU conformance and smoke tests either way); what the
# imports created is moved out of its sight (gc.freeze) once collection is done.
GC_THRESHOLDS = (50_000, 20, 100)


def pytest_collection_finish(session):
    if "tensorflow" in sys.modules:  # some collected module imported it: before any test runs
        _logical_cpus(LOGICAL_CPUS)
    if "apache_beam" in sys.modules:  # Beam as every entry point runs it, tests' own pipelines too
        from components.data_io.beam_dofn_specs import cache_dofn_specs

        cache_dofn_specs()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _leave_without_teardown():
    """An xdist worker's last act: its results are reported (pytest-cov saves a worker's coverage
    data at the session's end, before this), and every exit handler registered after this one has
    run (atexit runs them in reverse order: those of what the tests imported, Beam's and
    multiprocessing's joins among them); Python's own finalization, which frees a whole session's
    TensorFlow graphs object by object while the controller waits, is skipped: about 10 s at the
    end of the whole suite, 3 s after 37 TPU-harness, export and Trainer tests."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ---- session fixtures: stage outputs several files need (tests/stages.py builds them) ------------

@pytest.fixture(scope="session")
def trainer_data(tmp_path_factory):
    """3,000 + 600 generated rows preprocessed for the Trainer with a few features of each kind
    (tests/stages.py, preprocess_trainer_data: a shared table, multi-hot, a sequence feature and its
    query, tables on both placements); shared read-only by the trainer, replica, early-stopping and
    TPU tests, each writing its runs under a name of its own."""
    from tests.stages import preprocess_trainer_data

    return preprocess_trainer_data(tmp_path_factory.mktemp("trainer"))


@pytest.fixture(scope="session")
def parity_data(tmp_path_factory):
    """trainer_data's rows preprocessed with PARITY_CATEGORICAL only (tests/stages.py): the TPU smoke
    test's parity check and the broken steps it must fail, on the smallest model that has every
    table kind it compares."""
    from tests.stages import PARITY_CATEGORICAL, preprocess_trainer_data

    return preprocess_trainer_data(tmp_path_factory.mktemp("parity"), categorical=PARITY_CATEGORICAL)


@pytest.fixture(scope="session")
def chain(tmp_path_factory):
    """(config, {name: artifact}, root): every executor's Do() in order on 2,500 rows
    (tests/stages.py, make_chain)."""
    from tests.stages import make_chain

    return make_chain(tmp_path_factory.mktemp("executors"))


@pytest.fixture(scope="session")
def features_run(tmp_path_factory):
    """(config, {name: artifact}, root): the pipeline run on configs/features.yaml
    (tests/stages.py, make_features_run); the feature-kind and BulkInferrer tests'."""
    from tests.stages import make_features_run

    return make_features_run(tmp_path_factory.mktemp("features"))


@pytest.fixture(scope="session")
def pipeline_run(tmp_path_factory):
    """(config, output dir, summary, data metadata): the real pipeline on configs/demo.yaml, on 100k
    generated rows for a third of the demo's steps (tests/stages.py, run_demo_pipeline)."""
    from tests.stages import run_demo_pipeline

    return run_demo_pipeline(tmp_path_factory.mktemp("e2e"))


# ---- global state: seeded before each test, put back after it ----------------------------------

@pytest.fixture(autouse=True)
def _fresh_global_state():
    """Seeds Python's, NumPy's and (when loaded) TensorFlow's random state, so that what a test
    draws does not depend on what ran before it in the same worker; afterwards restores the
    environment and TensorFlow's Keras dtype policy, eager mode and grappler's passes."""
    environ = dict(os.environ)
    random.seed(0)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(0)
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        tf.random.set_seed(0)
    yield
    if os.environ != environ:
        os.environ.clear()
        os.environ.update(environ)
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        tf.config.run_functions_eagerly(False)
        keras = sys.modules.get("tf_keras")
        if keras is not None and keras.mixed_precision.global_policy().name != "float32":
            keras.mixed_precision.set_global_policy("float32")
        if tf.config.optimizer.get_experimental_options().get("disable_meta_optimizer"):  # the TPU harness's
            tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": False})


# ---- tiers and groups --------------------------------------------------------------------------

def _fixture_defs(item):
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return {}
    return {name: defs[-1] for name, defs in info.name2fixturedefs.items() if defs}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    errors = []
    parent = {}  # union-find over groups: tests sharing a grouped fixture or a module fixture

    def find(x):
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    fast_tier = (config.getoption("markexpr") or "").split() == ["not", "slow"]
    item_groups, slow_items, heavy_items = {}, set(), set()  # computed once per item, used twice
    for item in items:
        path = item.nodeid.split("::")[0]
        marks = list(item.iter_markers("slow"))
        for m in marks:
            if not (m.kwargs.get("reason") or m.args):
                errors.append(f"{item.nodeid}: @pytest.mark.slow needs reason=\"...\"")
        defs = _fixture_defs(item)
        slow_uses = sorted(n for n in SLOW_FIXTURES if n in defs)
        if slow_uses and not marks:
            errors.append(f"{item.nodeid} uses {', '.join(slow_uses)}: mark it @pytest.mark.slow(reason=...)")
        if marks:
            slow_items.add(item)
        if slow_uses:
            heavy_items.add(item)
        groups = []
        for name, fd in defs.items():
            if fd.scope == "session" and (name in GROUPED or fast_tier and name in PER_WORKER) and fd.baseid in ("", "tests"):
                groups.append(name)
            elif fd.scope == "module" and fd.baseid and fd.baseid == path:
                groups.append(path)
        if groups:
            first = find(groups[0])
            for g in groups[1:]:
                parent[find(g)] = first
            item_groups[item] = groups[0]
    if errors:
        raise pytest.UsageError("\n".join(errors))
    for item, g in item_groups.items():
        item.add_marker(pytest.mark.xdist_group(find(g).replace("/", "_").replace(".", "_")))
    # Units using a slow fixture (the costliest: each runs stages end to end before its first test)
    # first, then the other units holding a slow test (a group, or a single test), then the other
    # groups (a module fixture and its tests), then single tests; each group kept together, so that
    # its module fixtures are built once: the long units are handed out first and the short ones
    # even out the workers' ends (--no-loadscope-reorder).
    unit, position, heavy_units, slow_units = {}, {}, set(), set()
    for i, item in enumerate(items):
        unit[i] = find(item_groups[item]) if item in item_groups else ("single", i)
        position.setdefault(unit[i], i)
        if item in slow_items:
            slow_units.add(unit[i])
        if item in heavy_items:
            heavy_units.add(unit[i])
    ranked = sorted(range(len(items)), key=lambda i: (
        unit[i] not in heavy_units, unit[i] not in slow_units, isinstance(unit[i], tuple), position[unit[i]], i))
    items[:] = [items[i] for i in ranked]
