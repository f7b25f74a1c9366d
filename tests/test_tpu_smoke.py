"""bench/tpu_smoke.py without a TPU: its `--dry-run` runs every step that needs no TPU runtime
(config, generated data, preprocessing, plan, the embedding rule's reference and read-back, a CPU
Trainer run, the exporter's conversion of a layout-B checkpoint) and says which TPU steps it
skipped; and the pieces the reviewer found broken (strategy class name, the reference's table
size) on their own.
"""
import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import components  # noqa: F401
import tensorflow as tf

from components.embedding_model import layouts as L
from components.embedding_trainer import trainer_module as tm

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(REPO, "bench", "tpu_smoke.py")
NON_TPU = ["sparsecore_optimizer", "embedding_rule_readback", "data", "plan", "trainer_cpu", "export_layout_b"]
TPU_ONLY = ["tpu_init", "embedding_rule", "trainer_tpu", "cpu_vs_tpu"]


def _smoke_module():
    spec = importlib.util.spec_from_file_location("tpu_smoke", SMOKE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tpu_strategy_is_recognised_by_its_runtime_class():
    S = _smoke_module()
    from tensorflow.python.distribute import tpu_strategy

    assert tf.distribute.TPUStrategy is tpu_strategy.TPUStrategyV2  # what the trainer records
    assert tf.distribute.TPUStrategy.__name__ == "TPUStrategyV2"
    assert tf.distribute.TPUStrategy.__name__ in S.TPU_STRATEGY_NAMES


def test_reference_is_sized_for_the_smoke_table():
    """The reference (tests/optimizer_reference.py, sized by the table it is given) at the smoke
    test's 64 x 8 table: one clipped Adagrad step, computed here by hand."""
    S = _smoke_module()

    spec, _, tpu_opt = S.rule_optimizers(sparse_core=False)
    init, ids = S.rule_inputs(replicas=2)
    assert init.shape == (64, 8) and ids.max() >= 12  # rows a 12-row reference could not hold
    got = S.rule_reference(spec, tpu_opt, init, ids, 0.3)
    count = np.bincount(ids, minlength=64).astype(np.float64)[:, None]
    g = np.clip(0.3 * count, -0.5, 0.5) * np.ones((1, 8))
    acc = 0.1 + g * g
    want = np.where(count > 0, init - 0.1 * g / np.sqrt(acc), init)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)
    assert (count > 1).any()  # a repeated row: clipped after the sum



@pytest.mark.parametrize("replicas", [2, 4])
def test_rule_table_built_by_tf_sparsecore_api_reads_back_at_the_model_path(replicas, monkeypatch, tmp_path):
    """embedding_rule's TPUEmbeddingV2, up to the SparseCore step: TF's own constructor and build
    on CPU (tests/tpu_harness.py; at 4 replicas x 4 SparseCores the 64-row table is padded to 128),
    saved where the model keeps it and read back by the exporter's reader from a hand-built plan."""
    from tests import tpu_harness as H

    S = _smoke_module()
    cls = H.recording_strategy_class(replicas, sparse_cores_per_chip=4)
    H.let_pass_type_check(monkeypatch, cls)
    init, _ = S.rule_inputs(replicas)
    spec, _, mid = S.build_rule_mid(cls(), True, init)
    assert "clipvalue" not in spec
    path = S.at_model_path(mid).save(str(tmp_path / "ckpt"))
    shapes = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    assert shapes[L.table_key("t", "tpu_embedding")] == [64 if replicas == 2 else 128, 8]
    table, source = S.read_rule_table(path, S.rule_plan(spec, replicas, 4, True))
    assert source.kind == "B"
    np.testing.assert_array_equal(table, init)

@pytest.mark.slow(reason="the TPU smoke script's whole dry run")
def test_dry_run_passes_every_step_that_needs_no_tpu(tmp_path):
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, SMOKE, "--dry-run", "--rows", "2000", "--steps", "20", "--size-threshold", "100",
         "--workdir", str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-4000:]
    status = {m.group(2): (m.group(1), m.group(3)) for m in re.finditer(r"^(PASS|FAIL|SKIP) (\w+): (.*)$", out, re.M)}
    assert sorted(status) == sorted(NON_TPU + TPU_ONLY), out
    for name in NON_TPU:
        assert status[name][0] == "PASS", (name, status[name])
    for name in TPU_ONLY:
        assert status[name][0] == "SKIP" and "needs the TPU runtime" in status[name][1], (name, status[name])
    assert f"skipped: {', '.join(TPU_ONLY)}" in out
    rule = status["embedding_rule_readback"][1]
    assert "layout B" in rule and "layout A" in rule and "clipvalue 0.5" in rule
    assert "adagrad with clipvalue 0.5 refused" in status["sparsecore_optimizer"][1]

    # The exported tables are the trained (logical) tables, read from the CPU model's own checkpoint.
    model_uri = tmp_path / "Trainer" / "model" / "cpu"
    plan = tm.read_plan(str(model_uri))
    tpu_tables = sorted(plan.tables_placed("tpu_embedding"))
    assert len(tpu_tables) >= 2 and len(plan.tables) > len(tpu_tables)
    trained = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_uri / tm.CHECKPOINT_DIR)))
    logical = {n: trained.get_tensor(L.table_key(n, t.placement)) for n, t in plan.tables.items()}
    for name in plan.tables:
        exported = np.load(tmp_path / "export_layout_b" / "tables" / f"{name}.npy")
        np.testing.assert_array_equal(exported, logical[name], err_msg=name)

    # ... and they were read out of SparseCore stacks, not copied: the layout-B checkpoint holds no
    # TPU-embedding table as trained, but stacks of the shape the recomputed layout says.
    layout_b = tf.train.load_checkpoint(str(tmp_path / "export_layout_b" / "checkpoint" / "ckpt"))
    shapes = layout_b.get_variable_to_shape_map()
    for name in tpu_tables:
        key = L.table_key(name, "tpu_embedding")
        rows, dim = logical[name].shape
        assert key not in shapes or not np.array_equal(layout_b.get_tensor(key)[:rows, :dim], logical[name]), name
    layouts = L.plan_sparse_core_layouts(plan, 2, 4, plan.global_batch_size // 2)
    for layout in layouts.values():
        key = L.TPU_PREFIX + L.escape_name(layout.stacked_table_name) + L.ATTR
        assert shapes[key] == [layout.num_sparse_cores * layout.total_rows_per_sparse_core_shard,
                               layout.unsharded_padded_shape[1]]
    for name in plan.tables_placed("tensor_core"):  # TensorCore tables stay one variable each
        np.testing.assert_array_equal(layout_b.get_tensor(L.table_key(name, "tensor_core")), logical[name])

