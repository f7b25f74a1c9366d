"""The TPU smoke test's parity check catches broken TPU steps.

The smoke test's core check (components/tpu_smoke/, `sparsecore_training`)
is run as its CPU dry run does in tests/test_sparsecore_training.py: the Trainer's model (on
`parity_data`: the fewest features that give every table kind the check compares) under the
harness's 2-replica TPU strategy with TF's real `TPUEmbeddingV2`, whose TPU step is broken on
purpose in each of the ways of `tpu_harness.MUTATIONS`. In the SparseCore step (`CpuStepV2`): slots
never written back, each occurrence's g^2 accumulated, replicas averaged or only replica 0's
gradients applied, twice the learning rate, a shard rotation off by one, rows padded for the wrong
number of SparseCores, one stack's learning rate x1.02. In the TensorCore's part of the step, at the last step, where the tables'
values still equal the CPU run's: a TensorCore table's slots not written back, and the dense
network's optimizer step dropped. Each must FAIL the check at its default tolerances, with the
dense network in bfloat16 (the looser tolerances) and, for the two near a tolerance, in float32;
the correct step passes them on the same model (tests/test_sparsecore_training.py). A check that passed any of these would pass a
TPU step broken that way.
"""
import pytest

import components  # noqa: F401
from tests import tpu_harness

REPLICAS, PER_CHIP, STEPS = 2, 4, 3  # as tests/test_sparsecore_training.py's correct step: one CPU reference


def _failures(err) -> list:
    """The failure sentences of a ParityError (before the report that follows ' | ')."""
    return str(err).split(" | ")[0].split("; ")


# Both precisions where float32 judges with a check bfloat16 lacks, or the reverse: one stack's
# learning rate x1.02 (bfloat16's table scale check, 2**-7, catches it; float32 has no scale check,
# its element check must) and the dropped dense step (float32 holds the dense variables element by
# element, bfloat16 only in scale). Every other break fails element checks, and is judged in
# bfloat16 alone, whose element tolerances are the looser (2**-3 for tables, 2**-2 for slots,
# against float32's 1e-2): there each failed 3-59 variables on trainer_data's 8-feature model
# (docs/tpu.md), so failing there is the stronger proof; in float32 each failed too, when every
# case ran in both.
BOTH_PRECISIONS = ("learning_rate_2pct", "dense_step")
CASES = [(m, p) for m in sorted(tpu_harness.MUTATIONS)
         for p in (("float32", "mixed_bfloat16") if m in BOTH_PRECISIONS else ("mixed_bfloat16",))]


@pytest.mark.slow(reason="the smoke test's parity check, 3 steps under the 2-replica SparseCore harness and on CPU, per mutation")
@pytest.mark.parametrize("mutation,precision", CASES)
def test_the_parity_check_fails_a_broken_tpu_step(mutation, precision, parity_data, monkeypatch, tmp_path):
    """In bfloat16 (what a TPU trains in under `training.precision: auto`) and, for the breaks near
    a tolerance, in float32 too, each at its default tolerances (parity.tolerances_for)."""
    from components.tpu_smoke import parity, scenario
    from tests.stages import PARITY_CATEGORICAL, PARITY_REFERENCE, trainer_raw_config

    strategy = tpu_harness.install_sparsecore(monkeypatch, REPLICAS, PER_CHIP, mutation=mutation, mutation_step=STEPS - 1)
    files = [str(parity_data / "tx" / "Split-train" / "*")]
    cfg, plan, manifest = scenario.parity_plan(trainer_raw_config(parity_data, PARITY_CATEGORICAL), str(parity_data))
    with pytest.raises(parity.ParityError) as err:
        parity.sparsecore_training(strategy, cfg, plan, manifest, files, STEPS, str(tmp_path), precision=precision,
                                   reference=PARITY_REFERENCE)
    print(f"MUTATION {mutation}: {err.value}")
    failures = _failures(err.value)
    tensor_core = sorted(plan.tables_placed("tensor_core"))
    if mutation == "tensor_core_slot":  # only slots fail, a TensorCore table's among them: no table's values
        assert all(" slot " in f or "/.OPTIMIZER_SLOT/" in f for f in failures), failures
        assert any(f.startswith(f"{t} slot ") for t in tensor_core for f in failures), failures
    if mutation == "learning_rate_2pct":  # a table of the broken stack (the first by name), by its scale in bfloat16
        broken = strategy.broken_tables
        assert broken and set(broken) <= set(plan.tables_placed("tpu_embedding")), broken
        assert any(f.split(":")[0] in broken for f in failures), (broken, failures)
        if precision == "mixed_bfloat16":  # there only its tables fail
            assert all(f.split(":")[0].split(" slot ")[0] in broken for f in failures), (broken, failures)
            assert any(f.split(":")[0] in broken and "times the CPU run's" in f for f in failures), failures
    if mutation == "dense_step":  # only the dense network and its slots fail
        assert all(f.startswith("model/") for f in failures), failures
        assert any(f.startswith(("model/top_mlp/", "model/bottom_mlp/", "model/cross/")) for f in failures), failures


def test_an_unknown_mutation_is_refused():
    with pytest.raises(ValueError, match="unknown mutation 'typo'"):
        tpu_harness.cpu_step_v2_class(mutation="typo")
    with pytest.raises(ValueError, match="unknown mutation 'no_slot_write': one of tensor_core_slot, dense_step"):
        tpu_harness.break_tensor_core_step(None, "no_slot_write", 0)
