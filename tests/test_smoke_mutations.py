"""The TPU smoke test's parity check catches broken SparseCore updates.

The smoke test's core check (components/tpu_smoke/, `sparsecore_training`)
is run as its CPU dry run does in tests/test_sparsecore_training.py: the Trainer's model under the
harness's 2-replica TPU strategy with TF's real `TPUEmbeddingV2`, whose SparseCore step
(tests/tpu_harness.py, `CpuStepV2`) here is broken on purpose in each of the ways of
`tpu_harness.MUTATIONS` (slots never written back, each occurrence's g^2 accumulated, replicas
averaged or only replica 0's gradients applied, twice the learning rate, a shard rotation off by
one, rows padded for the wrong number of SparseCores). Each must FAIL the check at its default
tolerance; the correct step passes it (tests/test_sparsecore_training.py). A check that passed any
of these would pass a TPU kernel broken that way.
"""
import pytest

import components  # noqa: F401

from tests import tpu_harness

REPLICAS, PER_CHIP, STEPS = 2, 4, 3


@pytest.mark.slow(reason="the smoke test's parity check, 3 steps under the 2-replica SparseCore harness and on CPU, per mutation")
@pytest.mark.parametrize("mutation", sorted(tpu_harness.MUTATIONS))
def test_the_parity_check_fails_a_broken_sparsecore_step(mutation, trainer_data, monkeypatch, tmp_path):
    from components.tpu_smoke import parity, scenario
    from tests.stages import trainer_raw_config

    strategy = tpu_harness.install_sparsecore(monkeypatch, REPLICAS, PER_CHIP,
                                              v2_class=tpu_harness.cpu_step_v2_class(mutation=mutation))
    files = [str(trainer_data / "tx" / "Split-train" / "*")]
    cfg, plan, manifest = scenario.parity_plan(trainer_raw_config(trainer_data), str(trainer_data))
    with pytest.raises(parity.ParityError) as err:
        parity.sparsecore_training(strategy, cfg, plan, manifest, files, STEPS, str(tmp_path))
    print(f"MUTATION {mutation}: {err.value}")


def test_an_unknown_mutation_is_refused():
    with pytest.raises(ValueError, match="unknown mutation 'typo'"):
        tpu_harness.cpu_step_v2_class(mutation="typo")
