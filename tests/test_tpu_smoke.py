"""The TPU smoke test (components/tpu_smoke/) without a TPU.

- It ships where users run it: the module imports nothing from tests/ or bench/ (the TPU image
  copies neither), and the image build imports it (docker/Dockerfile.tpu).
- Its judgement of the parity check on hand-written tables: equal changes pass; a table that never
  trained, one read back permuted, one whose change is off by more than the tolerance (a fraction
  of the change), a slot never written back or one that moved twice as far fail.
- Its `--dry-run` (`python -m components.tpu_smoke`, from outside the checkout)
  runs every step that needs no TPU runtime (generated data, preprocessing, the parity plan and what
  it covers on 2 replicas x 4 SparseCores, the SparseCore optimizer check) and says which TPU steps
  it skipped.
The parity check itself (`sparsecore_training`) runs in tests/test_sparsecore_training.py with the
harness's 2-replica strategy and CPU SparseCore step in place of the TPU.
"""
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SMOKE = REPO / "components" / "tpu_smoke"
NON_TPU = ["data", "plan", "sparsecore_optimizer"]
TPU_ONLY = ["tpu_init", "sparsecore_training", "trainer_tpu"]


def test_the_tpu_image_installs_and_imports_the_smoke_module():
    """It ships in components/ (what the image copies; tests/test_layering.py: it imports no test
    or bench code), and the image's build imports it."""
    dockerfile = (REPO / "docker" / "Dockerfile.tpu").read_text()
    assert "COPY components/ components/" in dockerfile and "components.tpu_smoke" in dockerfile

def test_tpu_strategy_is_recognised_by_its_runtime_class():
    from tensorflow.python.distribute import tpu_strategy

    import tensorflow as tf
    from components.tpu_smoke import cli
    assert tf.distribute.TPUStrategy is tpu_strategy.TPUStrategyV2  # what the trainer records
    assert tf.distribute.TPUStrategy.__name__ in cli.TPU_STRATEGY_NAMES


def test_judge_compares_changes_and_fails_untrained_permuted_distant_and_unwritten():
    """The verdict compares each table's and slot's change from the start, relative to the CPU
    run's change: an Adagrad accumulator that moved 3e-5 and was never written back fails (an
    absolute 1e-4 on values passed it), and so does one that moved twice as far."""
    from components.tpu_smoke import parity
    start = np.arange(12, dtype=np.float32).reshape(6, 2) / 10
    cpu = start.copy()
    cpu[[1, 4]] -= 0.25  # the CPU run moved rows 1 and 4
    acc0 = np.full((6, 2), 0.1, np.float32)
    acc = acc0.copy()
    acc[[1, 4]] += 3e-5
    tables = {"same": cpu, "untrained": start, "permuted": cpu[[1, 0, 2, 3, 4, 5]],
              "distant": start + (cpu - start) * np.float32(1.05), "unwritten": cpu, "doubled": cpu}
    report, failures = parity.judge(
        tables, {n: cpu for n in tables}, {n: start for n in tables}, parity.DEFAULT_TOLERANCE,
        slots={"same": {"accumulator": (acc, acc, acc0)}, "unwritten": {"accumulator": (acc0, acc, acc0)},
               "doubled": {"accumulator": (acc0 + 2 * (acc - acc0), acc, acc0)}})
    assert report["same"]["change_diff"] == 0 and report["same"]["rows_moved"] == 2 and report["same"]["slots"] == {"accumulator": 0}
    text = "; ".join(failures)
    assert "untrained: never trained" in text and "permuted: its change differs from the CPU run's by 0.2 " in text, text
    assert re.search(r"distant: its change differs from the CPU run's by 0\.05 ", text), text
    assert "unwritten slot accumulator: never trained" in text, text
    assert re.search(r"doubled slot accumulator: its change differs from the CPU run's by 1 ", text), text
    assert not any(f.startswith("same") for f in failures) and len(failures) == 5, failures
    # within the tolerance: a change 0.5% off passes
    _, failures = parity.judge({"t": start + (cpu - start) * np.float32(1.005)}, {"t": cpu}, {"t": start}, 1e-2)
    assert failures == []
    # summed in another order, an accumulator of 0.1 moved by 3.7e-5 may land one float32 step
    # (7.45e-9, 2e-4 of its change) from the CPU's: that passes even at 1e-4; ten steps do not
    moved = acc0 + np.float32(3.67e-5)
    for off, fails in ((1, False), (10, True)):
        near = moved.copy()
        near[0, 0] += off * np.spacing(near[0, 0])
        _, failures = parity.judge({"t": cpu}, {"t": cpu}, {"t": start}, 1e-4, slots={"t": {"accumulator": (near, moved, acc0)}})
        assert bool(failures) == fails, (off, failures)
    # a change float32 cannot resolve (values near 1 moved by 1e-7, about one step) is not passed
    big0 = np.ones((6, 2), np.float32)
    big = big0.copy()
    big[0, 0] = np.nextafter(np.float32(1), np.float32(2))
    _, failures = parity.judge({"t": big}, {"t": big}, {"t": big0}, 1e-2)
    assert len(failures) == 1 and "t: float32 cannot resolve its change" in failures[0], failures
    # a table read back in another shape is named as such
    _, failures = parity.judge({"t": cpu[:5]}, {"t": cpu}, {"t": start}, 1e-2)
    assert failures == ["t: read back as (5, 2) against the CPU's (6, 2) (start (6, 2))"], failures
    # a table the CPU run did not move either is untested, not passed
    _, failures = parity.judge({"t": start}, {"t": start}, {"t": start}, 1e-2)
    assert failures == ["t: the CPU run left it where it started (not looked up: untested)"]


def test_variables_outside_the_tables_are_judged_by_change_and_kept_ones_must_stay_kept():
    """The dense network, its slots and the step counters: a variable the CPU run trained must
    change as much on the TPU (never trained, half trained or absent fail); one the CPU run kept
    (a hyperparameter) must be kept; one absent from the TPU checkpoint that the CPU run kept is
    an optimizer's hyperparameter the TPU run never built."""
    from components.tpu_smoke import parity
    start = np.zeros((2, 3), np.float32)
    cpu = start + np.float32(0.1)
    k = "/.ATTRIBUTES/VARIABLE_VALUE"
    beta = np.float32(0.9)
    report, failures = parity.judge_variables({
        "model/top_mlp/kernel" + k: (cpu, cpu, start),
        "model/dense_optimizer/beta_1" + k: (beta, beta, beta),
        "model/table_embedding_optimizers/C24/decay" + k: (None, beta, beta),
        "model/cross/0/bias" + k: (start, cpu, start),
        "model/bottom_mlp/bias" + k: (start + np.float32(0.05), cpu, start),
        "model/dense_optimizer/beta_2" + k: (beta + 1, beta, beta),
        "model/wide_dense/kernel" + k: (None, cpu, start),
    }, parity.DEFAULT_TOLERANCE)
    assert report == {"compared": 7, "trained": 3, "max_change_diff": pytest.approx(1, rel=1e-5), "worst": "model/cross/0/bias",
                      "max_scale_off": pytest.approx(1, rel=1e-5), "worst_scale": "model/cross/0/bias"}
    assert failures == [
        "model/bottom_mlp/bias: its change differs from the CPU run's by 0.5 of that change (max |diff| 0.05, "
        "the CPU run moved it up to 0.1) > 0.01",
        "model/cross/0/bias: never trained (equal to its start), the CPU run moved it",
        "model/dense_optimizer/beta_2: the CPU run left it where it started, the TPU run moved it by up to 1",
        "model/wide_dense/kernel: the CPU run trained it; the TPU checkpoint lacks it",
    ], failures


def test_coverage_needs_a_tensor_core_table_and_what_the_users_plan_trains(trainer_data):
    """The parity plan must train a TensorCore table (its updates are the XLA row rules) and every
    (placement, optimizer) the user's own plan trains; the trainer data's config has both
    placements (size_threshold 400)."""
    import copy

    from components.tpu_smoke import scenario
    from tests.stages import trainer_raw_config

    raw, root = trainer_raw_config(trainer_data), str(trainer_data)
    _, plan, _ = scenario.parity_plan(raw, root)
    line = scenario.coverage(plan, 2, 4, scenario.derived_plan(raw, root))
    assert re.search(r"; \d+ TensorCore tables \(adam, ftrl\)$", line), line  # the wide part's lazy Adam, FTRL
    everything_in_tpu_embedding = copy.deepcopy(raw)
    everything_in_tpu_embedding["training"]["embedding"]["size_threshold"] = 0
    _, no_tensor_core, _ = scenario.parity_plan(everything_in_tpu_embedding, root)
    with pytest.raises(AssertionError, match=r"lack a TensorCore table \(raise --size-threshold"):
        scenario.coverage(no_tensor_core, 2, 4)
    # a user's TensorCore table with an optimizer of its own that the parity plan does not train
    users = copy.deepcopy(raw)
    small = sorted(plan.tables_placed("tensor_core"))[0]
    next(f for f in users["categorical_features"] if f["name"] == small)["optimizer"] = {"name": "sgd", "learning_rate": 0.1}
    with pytest.raises(AssertionError, match=f"a tensor_core table trained by sgd \\(as the config's {small}\\)"):
        scenario.coverage(plan, 2, 4, scenario.derived_plan(users, root))


def test_parity_config_turns_off_what_differs_by_design_and_adds_adagrad():
    from components.tpu_smoke import scenario
    from tests.stages import demo_raw_config

    raw = demo_raw_config()
    raw["training"].update(dropout=0.3, pipeline_execution_with_tensor_core=True)
    parity = scenario.parity_raw_config(raw)
    assert raw["training"]["dropout"] == 0.3 and "wide" not in raw["training"]  # a copy
    t = parity["training"]
    assert (t["dropout"], t["input_dropout"], t["pipeline_execution_with_tensor_core"], t["wide"]["enabled"]) == (0, 0, False, True)


def _sorted_eval_split(root, fmt, rows=400, block_rows=4):
    """A transformed eval split under `root/tx` in `fmt`, its rows sorted by `I1` (= the row's number)."""
    import pyarrow as pa
    import tensorflow as tf
    from tfx_bsl.coders import example_coder

    from components.contracts import artifacts
    from components.contracts.manifest import DenseFeatureEntry, VocabularyManifest
    from components.data_io.blocks import to_blocks

    manifest = VocabularyManifest("unused", "label", {}, (DenseFeatureEntry("I1", "I1", 0.0),), (), {},
                                  transformed_format=fmt, block_rows=block_rows if fmt == "blocks" else 0)
    tx = root / "tx"
    (tx / "Split-eval").mkdir(parents=True)
    (tx / artifacts.EMBEDDING_MANIFEST_FILE).write_text(manifest.to_json())
    one = pa.array(np.arange(rows + 1, dtype=np.int32))
    rb = pa.RecordBatch.from_arrays([pa.ListArray.from_arrays(one, pa.array(np.arange(rows) % 2, pa.float32())),
                                     pa.ListArray.from_arrays(one, pa.array(np.arange(rows), pa.float32()))],
                                    ["label", "I1"])
    if fmt == "blocks":
        rb = to_blocks(manifest, rb, block_rows)
    with tf.io.TFRecordWriter(str(tx / "Split-eval" / "transformed_examples-00000-of-00001")) as w:
        for record in example_coder.RecordBatchToExamplesEncoder().encode(rb):
            w.write(record)


@pytest.mark.parametrize("fmt", ["blocks", "examples"])
def test_the_saved_models_eval_rows_are_drawn_across_the_split_not_its_first_rows(tmp_path, fmt):
    """trainer_tpu scores `eval_records`: a sample across the eval split (data_io/sampling.py), so a
    split sorted by a value gives rows from its whole range, whatever transformed_examples.format."""
    import tensorflow as tf
    from components.tpu_smoke import scenario
    _sorted_eval_split(tmp_path, fmt)

    def values(records):
        return [tf.train.Example.FromString(r).features.feature["I1"].float_list.value[0] for r in records]

    sample = values(scenario.eval_records(str(tmp_path), 16))
    assert len(sample) == len(set(sample)) == 16
    assert min(sample) < 100 and max(sample) >= 300, sample  # the first 16 rows are 0-15
    assert values(scenario.eval_records(str(tmp_path), 16)) == sample  # the same for a seed
    assert sorted(values(scenario.eval_records(str(tmp_path), 1000))) == list(range(400))  # small split: all rows


@pytest.mark.slow(reason="the TPU smoke module's dry run in a subprocess: generated data through Beam preprocessing")
def test_dry_run_passes_every_step_that_needs_no_tpu(tmp_path):
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-m", "components.tpu_smoke", "--dry-run", "--rows", "2000",
         "--size-threshold", "100", "--config", str(REPO / "configs" / "demo.yaml"), "--workdir", str(tmp_path / "w")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-4000:]
    status = {m.group(2): (m.group(1), m.group(3)) for m in re.finditer(r"^(PASS|FAIL|SKIP) (\w+): (.*)$", out, re.M)}
    assert sorted(status) == sorted(NON_TPU + TPU_ONLY), out
    for name in NON_TPU:
        assert status[name][0] == "PASS", (name, status[name])
    for name in TPU_ONLY:
        assert status[name][0] == "SKIP" and "needs the TPU runtime" in status[name][1], (name, status[name])
    plan = status["plan"][1]
    assert "adagrad, adam, ftrl" in plan and "stacks of several: " in plan and "dim-1 wide tables: " in plan, plan
    assert re.search(r"; [1-9]\d* TensorCore tables \(", plan), plan  # the XLA row rules' tables are trained too
    assert "adagrad with clipvalue 0.5 refused" in status["sparsecore_optimizer"][1]


def test_in_bfloat16_a_change_scaled_by_2pct_fails_by_its_scale_while_rounding_passes():
    """tolerances_for("mixed_bfloat16"): elements within 2**-3 of the change (rounding of 8-bit
    mantissas passes), each table's scale within 2**-7 (a learning rate x1.02 fails)."""
    from components.tpu_smoke import parity

    rng = np.random.default_rng(0)
    start = rng.normal(size=(50, 4)).astype(np.float32)
    reference = start + rng.normal(scale=0.01, size=start.shape).astype(np.float32)
    change = reference - start
    rounded = start + change * (1 + rng.uniform(-2**-8, 2**-8, size=start.shape)).astype(np.float32)
    scaled = start + change * np.float32(1.02)
    bf16 = parity.tolerances_for("mixed_bfloat16")
    assert (bf16.element, bf16.scale, bf16.dense_element, bf16.dense_scale, bf16.slot_scale, bf16.slot_element) == (
        2**-3, 2**-7, None, 2**-4, 2**-3, 2**-2)
    assert parity.tolerances_for("float32") == parity.Tolerances(parity.DEFAULT_TOLERANCE, None, parity.DEFAULT_TOLERANCE, None)
    assert abs(parity.change_difference(scaled, reference, start)["scale"] - 1.02) < 1e-4
    _, ok = parity.judge({"t": rounded}, {"t": reference}, {"t": start}, bf16.element, scale=bf16.scale)
    _, failed = parity.judge({"t": scaled}, {"t": reference}, {"t": start}, bf16.element, scale=bf16.scale)
    assert ok == [] and len(failed) == 1 and "its change is 1.02 times the CPU run's" in failed[0], failed


def test_in_bfloat16_a_slot_element_off_by_a_fifth_passes_where_a_table_element_fails():
    """A slot's elements are held within 2**-2 of its change in bfloat16 (an FTRL `linear` slot's
    near-zero gradients round apart: 13.7% seen on one CPU), a table's within 2**-3."""
    from components.tpu_smoke import parity

    start = np.zeros((4, 2), np.float32)
    reference = np.ones((4, 2), np.float32)
    off = reference.copy()
    off[0, 0] = 1.2  # 0.2 of the largest change
    bf16 = parity.tolerances_for("mixed_bfloat16")
    slots = {"t": {"linear": (off, reference, start)}}
    _, failed = parity.judge({"t": off}, {"t": reference}, {"t": start}, bf16.element, slots, None, None, bf16.slot_element)
    assert len(failed) == 1 and failed[0].startswith("t: its change differs"), failed
    far = reference.copy()
    far[0, 0] = 1.3
    _, failed = parity.judge({"t": reference}, {"t": reference}, {"t": start}, bf16.element,
                             {"t": {"linear": (far, reference, start)}}, None, None, bf16.slot_element)
    assert len(failed) == 1 and failed[0].startswith("t slot linear: its change differs") and "> 0.25" in failed[0], failed
