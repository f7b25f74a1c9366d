"""TPU smoke test: what only a TPU can show, in one command on a single-host TPU VM.

The checks of components/tpu_smoke in order, one `PASS` / `FAIL` / `SKIP` line each, then a summary;
`python -m components.tpu_smoke` runs `main`."""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import traceback
from typing import Any, Callable, List, Optional, Tuple

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import numpy as np
import tensorflow as tf

from components.config.loading import parse_config
from components.contracts import artifacts
from components.embedding_trainer import trainer_module
from components.embedding_trainer.precision_choice import choose_precision
from components.tpu_smoke.parity import DEFAULT_TOLERANCE, describe, sparsecore_training
from components.tpu_smoke.scenario import (base_raw_config, config_path, coverage, derived_plan, eval_records, parity_plan,
                                           prepare_data, sparsecore_optimizer, split_files, trainer_fn_args,
                                           trainer_raw_config)


RESULTS: List[Tuple[str, str]] = []  # (name, "PASS" | "FAIL" | "SKIP")
# tf.distribute.TPUStrategy is class TPUStrategyV2 at runtime (tensorflow/python/distribute/
# tpu_strategy.py); the trainer records type(strategy).__name__.
TPU_STRATEGY_NAMES = ("TPUStrategy", "TPUStrategyV2")
NO_TPU = "needs the TPU runtime (--dry-run)"


def check(name: str, fn: Callable[[], Any]):
    """Runs one check and prints its `PASS` or `FAIL` line; a failure is reported, never raised.

    Args:
      name: the check's name, as printed and recorded in RESULTS.
      fn: the check; returns its detail line, or (detail line, value to hand on).

    Returns:
      The value handed on (the detail itself when `fn` returns no pair), None when the check failed.
    """
    start = time.time()
    try:
        detail = fn()
        RESULTS.append((name, "PASS"))
        text = detail[0] if isinstance(detail, tuple) else detail
        print(f"PASS {name}: {text} ({time.time() - start:.0f} s)", flush=True)
        return detail[1] if isinstance(detail, tuple) else detail
    except Exception as err:  # noqa: BLE001 - report every failure and go on
        RESULTS.append((name, "FAIL"))
        print(f"FAIL {name}: {type(err).__name__}: {err}", flush=True)
        traceback.print_exc(limit=3)
        return None


def skip(name: str, why: str) -> None:
    """Records and prints a `SKIP name: why` line."""
    RESULTS.append((name, "SKIP"))
    print(f"SKIP {name}: {why}", flush=True)


def tpu_init(args):
    """Initialises the TPU runtime under TPUStrategy and reads the embedding hardware it reports.

    Args:
      args: the parsed command line (`--tpu`: the TPU's name or address).

    Returns:
      (the facts as a JSON line, (strategy, facts)): facts hold the strategy's class, TPU cores,
      replicas, the embedding feature, whether it is SparseCore (V2) and SparseCores per chip.
    """
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=args.tpu)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    strategy = tf.distribute.TPUStrategy(resolver)  # a TPUStrategyV2, as the trainer builds it
    hw = strategy.extended.tpu_hardware_feature
    v2 = hw.embedding_feature == tf.tpu.experimental.HardwareFeature.EmbeddingFeature.V2
    facts = {
        "strategy": type(strategy).__name__,
        "tpu_cores": len(tf.config.list_logical_devices("TPU")),
        "replicas": strategy.num_replicas_in_sync,
        "embedding_feature": str(hw.embedding_feature),
        "v2": bool(v2),
        "sparse_cores_per_chip_reported": int(getattr(hw, "num_embedding_devices_per_chip", 0)),
        # TPUEmbeddingV2 (and the trainer's recorded layout) take 4 when the hardware does not say.
        "sparse_cores_per_chip": int(getattr(hw, "num_embedding_devices_per_chip", 0) or 4),
    }
    return json.dumps(facts), (strategy, facts)


def trainer_tpu(args, root: str, expect_v2: bool) -> str:
    """The whole Trainer under TPUStrategy: run_fn completes and its artifact is complete.

    Args:
      args: the parsed command line (`--tpu`, `--steps`).
      root: the work directory holding the transformed splits.
      expect_v2: whether the TPU has SparseCore (the checkpoint layout must then be B).

    Returns:
      One line: the steps, strategy, layout and eval AUC.

    Raises:
      AssertionError: the run used another strategy, ended at another step, recorded another
        layout, saved a SparseCore plan sized for another number of chips than its replicas, or its
        SavedModel scores non-finite probabilities.
    """
    cfg = parse_config(trainer_raw_config(args, root, args.tpu))
    model_uri = os.path.join(root, "Trainer", "model", "tpu")
    trainer_module.run_fn(trainer_fn_args(cfg, root, "tpu"))

    def read(name):
        with open(os.path.join(model_uri, name), encoding="utf-8") as fh:
            return json.load(fh)

    run, plan, metrics = read(artifacts.TRAINING_RUN_FILE), read("embedding_plan.json"), read(artifacts.EVAL_METRICS_FILE)
    kind = "B" if expect_v2 else "A"
    if run["strategy"] not in TPU_STRATEGY_NAMES:
        raise AssertionError(f"trained under {run['strategy']}, not a TPU strategy ({' or '.join(TPU_STRATEGY_NAMES)})")
    if run["final_step"] != args.steps:
        raise AssertionError(f"training ended at step {run['final_step']}, expected {args.steps}")
    if plan["checkpoint_layout"]["kind"] != kind:
        raise AssertionError(f"recorded checkpoint layout {plan['checkpoint_layout']}, expected kind {kind}")
    if expect_v2 and plan["topology"]["num_chips"] != run["replicas"]:  # a SparseCore chip is one replica
        raise AssertionError(f"the plan saved with the model is sized for {plan['topology']['num_chips']} chips, "
                             f"the run had {run['replicas']} replicas (hardware.plan_for_hardware re-sizes it)")
    probs = tf.saved_model.load(os.path.join(model_uri, "Format-Serving")).signatures["serving_default"](
        examples=tf.constant(eval_records(root)))["probabilities"].numpy()
    if not np.isfinite(probs).all():
        raise AssertionError("the SavedModel scores non-finite probabilities")
    return (f"{run['final_step']} steps under {run['strategy']}, checkpoint layout {kind}, artifact complete, "
            f"eval AUC {metrics['auc']:.4f} (completion only: training parity is sparsecore_training)")


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the checks and prints their lines and a summary.

    Args:
      argv: the command line without the program name; None reads sys.argv.

    Returns:
      The exit status: 1 on any failure, else 0.
    """
    args = _parser().parse_args(argv)
    RESULTS.clear()
    root = args.workdir or tempfile.mkdtemp(prefix="tpu_smoke_")
    os.makedirs(root, exist_ok=True)
    mode = "dry run (no TPU)" if args.dry_run else f"TPU {args.tpu}"
    print(f"tensorflow {tf.__version__}; {mode}; config {config_path(args.config)}; work dir {root}", flush=True)
    placed = _tpu_or_dry_run(args)
    if placed is None:
        return summary(args)
    data = check("data", lambda: prepare_data(args, root))
    if data is None:
        for name in ("sparsecore_optimizer", "plan", "sparsecore_training", "trainer_tpu"):
            skip(name, "needs the data step, which failed")
        return summary(args)
    _plan_and_training_checks(args, root, *placed)
    return summary(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tpu", default="local", help="TPU name or grpc address (local: this TPU VM)")
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--steps", type=int, default=200, help="trainer_tpu's training steps")
    parser.add_argument("--parity-steps", type=int, default=3, help="sparsecore_training's steps on each platform")
    parser.add_argument("--parity-tolerance", type=float, default=None,
                        help="sparsecore_training: largest difference of a table's or slot's change, TPU against CPU, "
                             f"as a fraction of the CPU run's change (default: {DEFAULT_TOLERANCE:g} in float32, "
                             "2**-3 in bfloat16, with scale checks: parity.tolerances_for)")
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--pipelining", action="store_true",
                        help="trainer_tpu with pipeline_execution_with_tensor_core (sparsecore_training runs without)")
    parser.add_argument("--size-threshold", type=int, default=None,
                        help="training.embedding.size_threshold (default: the config's)")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--dry-run", action="store_true",
                        help="no TPU: run every step that does not need the TPU runtime on CPU, skip the others")
    parser.add_argument("--dry-replicas", type=int, default=2, help="--dry-run: replicas of the SparseCore layout")
    parser.add_argument("--dry-sparse-cores-per-chip", type=int, default=4,
                        help="--dry-run: SparseCores per chip of the SparseCore layout")
    return parser


def _tpu_or_dry_run(args):
    """(strategy, replicas, SparseCores per chip, SparseCore or not): the TPU's, or --dry-run's
    stand-ins with no strategy; None when the TPU did not initialise."""
    if args.dry_run:
        skip("tpu_init", NO_TPU)
        return None, args.dry_replicas, args.dry_sparse_cores_per_chip, True
    init = check("tpu_init", lambda: tpu_init(args))
    if init is None:
        return None
    strategy, facts = init
    return strategy, facts["replicas"], facts["sparse_cores_per_chip"], facts["v2"]


def _plan_and_training_checks(args, root: str, strategy, replicas: int, per_chip: int, v2: bool) -> None:
    """Checks 3 to 6 of the module docstring, on the preprocessed data under `root`."""

    def plan_step():
        raw = base_raw_config(args, root)
        cfg, plan, manifest = parity_plan(raw, root)
        return coverage(plan, replicas, per_chip, derived_plan(raw, root)), (cfg, plan, manifest)

    parity = check("plan", plan_step)
    if parity is None:
        skip("sparsecore_optimizer", "needs the plan step, which failed")
    else:
        check("sparsecore_optimizer", lambda: sparsecore_optimizer(parity[1]))
    if args.dry_run:
        skip("sparsecore_training", f"the TPU run {NO_TPU}; tests/test_sparsecore_training.py runs this check with a "
                                    "CPU SparseCore step in place of the TPU")
        skip("trainer_tpu", NO_TPU)
        return
    if parity is None:
        skip("sparsecore_training", "needs the plan step, which failed")
    else:
        cfg, plan, manifest = parity
        # In the precision the Trainer trains in on this TPU (training.precision; auto: bfloat16), judged by its tolerances.
        precision, _ = choose_precision(cfg.training.precision, "tpu")
        check("sparsecore_training", lambda: describe(sparsecore_training(
            strategy, cfg, plan, manifest, split_files(root, "train"), args.parity_steps,
            os.path.join(root, "parity"), args.parity_tolerance, precision=precision)))
    check("trainer_tpu", lambda: trainer_tpu(args, root, v2))


def summary(args) -> int:
    """Prints the passed, skipped and failed checks and the verdict.

    Args:
      args: the parsed command line (`--dry-run` changes the verdict's wording).

    Returns:
      The exit status: 1 on any failure, else 0.
    """
    by = {s: [n for n, status in RESULTS if status == s] for s in ("PASS", "FAIL", "SKIP")}
    print(f"passed: {', '.join(by['PASS']) or '-'}", flush=True)
    if by["SKIP"]:
        print(f"skipped: {', '.join(by['SKIP'])}", flush=True)
    if by["FAIL"]:
        print(f"failed: {', '.join(by['FAIL'])}", flush=True)
    elif args.dry_run:
        print("dry run passed: every step that needs no TPU; run without --dry-run on a TPU VM for the rest", flush=True)
    else:
        print("all checks passed", flush=True)
    return 1 if by["FAIL"] else 0
