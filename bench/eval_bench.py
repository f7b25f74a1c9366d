"""Evaluation benchmark on CPU: the Trainer's evaluations against the training input's read rate.

    .venv/bin/python bench/eval_bench.py [--rows 200000] [--steps 100] [--input-batches 300] [--baseline-rows 50000] [--repeats 3]

One process, the demo config (configs/demo.yaml, its training defaults) on generated data
preprocessed by our Beam code in-process (bench/trainer_bench.py's `prepare`, reused as it is).
The held-out slice is set to the default's 50,000 rows (`holdout_fraction` 50,000 / rows). Measured:
- training input: `make_dataset` as the Trainer feeds it (part="train", padded dense IDs, sequence
  lengths, batch 256), consumed inside TensorFlow (`Dataset.reduce`), `--input-batches` batches
  (its shuffle buffer's first fill included, as a run pays it), best of `--repeats`;
- a short training run (`training_loop.train`, `--steps` steps, 5 held-out evaluations): the held-out
  slice's one read, each held-out evaluation's seconds (restore, scoring, keeping the best) and the
  run record's `seconds`;
- the final evaluation (`model_artifact.finish`, as the Trainer runs it) on the train split's rows
  standing in for the eval split (its first trace included), then the same `evaluate` again
  `--repeats` times (best), against the eager loop it replaced (the model called eagerly per batch
  of the training batch size, numpy collected; timed on the first `--baseline-rows` rows);
- the held-out scoring alone, before and after, on the same trained checkpoint: the old path (the
  slice found by `make_dataset(part="holdout")` over the whole train split, its parsed batches
  cached, scored eagerly: the first evaluation reads the split, later ones the cache) and the new
  one (`read_holdout` once, `records_dataset`, `evaluation.evaluate`).
Results go to bench/results/eval.json and print as a markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from components.planning.fitting import with_run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "bench"))
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import components  # noqa: E402,F401
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from components.contracts.plan import CheckpointLayout  # noqa: E402
from components.embedding_model.input import make_dataset, read_holdout, records_dataset  # noqa: E402
from components.embedding_model.restore import (build_serving_model, load_tables, open_checkpoint_tables,
                                                restore_dense)  # noqa: E402
from components.embedding_trainer import model_artifact, resolved_input, training_data, training_loop  # noqa: E402
from tests.stages import examples_uri  # noqa: E402
from components.embedding_trainer.evaluation import compiled_scorer, evaluate, evaluation_batch  # noqa: E402
from components.planning.run_plan import derive_plan  # noqa: E402
from components.rules.metrics import roc_auc  # noqa: E402
from trainer_bench import prepare  # noqa: E402

OLD_HOLDOUT_BATCH = 4096  # the selection's batch before (baseline.EVAL_BATCH)


def eager_evaluate(model, dataset, max_rows=None):
    """The evaluation loop before: the model called eagerly per batch, numpy collected.
    Returns (rows, seconds, auc)."""
    start = time.perf_counter()
    probs, labels, rows = [], [], 0
    for features, label in dataset:
        probs.append(model(features).numpy())
        labels.append(label.numpy())
        rows += len(labels[-1])
        if max_rows is not None and rows >= max_rows:
            break
    seconds = time.perf_counter() - start
    return rows, seconds, roc_auc(np.concatenate(probs).ravel(), np.concatenate(labels).ravel())


def hanley_mcneil(auc: float, positives: int, negatives: int) -> float:
    """The standard error of an AUC over `positives` and `negatives` (Hanley and McNeil, 1982)."""
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    return float(np.sqrt((auc * (1 - auc) + (positives - 1) * (q1 - auc * auc) + (negatives - 1) * (q2 - auc * auc))
                         / (positives * negatives)))


def auc_noise(twin, plan_run, ds, state, resamples=200):
    """The held-out AUC's noise on this slice: its bootstrap standard error (rows resampled) beside
    Hanley-McNeil's, for the state's last two checkpoints, and the paired bootstrap's standard
    error of their difference (what selection compares: two checkpoints on the same rows)."""
    with tf.device("/cpu:0"):
        prefixes = tf.train.get_checkpoint_state(state).all_model_checkpoint_paths[-2:]
        scored = []
        for prefix in prefixes:
            restore_dense(twin, prefix)
            load_tables(twin, open_checkpoint_tables(prefix, plan_run))
            score = compiled_scorer(twin, ds)
            pairs = [score(f, y) for f, y in ds]
            scored.append((np.concatenate([p.numpy() for p, _ in pairs]), np.concatenate([y.numpy() for _, y in pairs])))
    labels = scored[0][1]
    rng = np.random.default_rng(0)
    draws = [rng.integers(0, len(labels), len(labels)) for _ in range(resamples)]
    aucs = np.array([[roc_auc(p[i], labels[i]) for p, _ in scored] for i in draws])
    positives = int(labels.sum())
    out = {"rows": int(len(labels)), "positive_rate": float(labels.mean()), "resamples": resamples,
           "checkpoints": [os.path.basename(p) for p in prefixes]}
    for k, (p, _) in enumerate(scored):
        auc = roc_auc(p, labels)
        out[f"auc_{k}"] = auc
        out[f"bootstrap_se_{k}"] = float(aucs[:, k].std(ddof=1))
        out[f"hanley_mcneil_se_{k}"] = hanley_mcneil(auc, positives, len(labels) - positives)
    if len(scored) == 2:
        out["difference"] = out["auc_1"] - out["auc_0"]
        out["bootstrap_se_difference"] = float((aucs[:, 1] - aucs[:, 0]).std(ddof=1))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--input-batches", type=int, default=300)
    ap.add_argument("--baseline-rows", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", default=None, help="reuse a prepared directory (skips generation and preprocessing)")
    args = ap.parse_args()
    max_holdout = 50_000
    fraction = min(0.5, max_holdout / args.rows)
    workdir = args.workdir or tempfile.mkdtemp(prefix="eval_bench_")
    training = {"train_steps": args.steps, "checkpoint_every_steps": max(1, args.steps // 5),
                "early_stopping": {"holdout_fraction": fraction, "evaluations": 5, "patience": 100}}
    start = time.perf_counter()
    cfg, _ = prepare(args.rows, workdir, training=training)
    prepare_seconds = time.perf_counter() - start
    files = [os.path.join(workdir, "tx", "Split-train", "*")]
    manifest = resolved_input.read_manifest(examples_uri(files))
    plan = with_run(derive_plan(cfg, manifest, resolved_input.read_statistics(examples_uri(files))), vocabulary_dir=manifest.vocabulary_dir)
    t = cfg.training
    out = {"rows": args.rows, "steps": args.steps, "cpus": os.cpu_count(), "batch_size": t.batch_size,
           "eval_batch": evaluation_batch(manifest), "holdout_fraction": fraction, "prepare_seconds": prepare_seconds}

    # 1. The training input, as the Trainer reads it, consumed inside TensorFlow (best of the
    # repeats: the shared machine's other load only ever slows a repeat down).
    train_input = training_data.training_input(files, manifest, plan, t, t.batch_size, 0, 1, fraction)

    def training_rate():
        start = time.perf_counter()
        train_input().take(args.input_batches).reduce(tf.constant(0, tf.int64), lambda a, x: a + 1)
        return args.input_batches * t.batch_size / (time.perf_counter() - start)

    def eval_input_rate():  # the eval batches' reading alone (no model)
        start = time.perf_counter()
        n = make_dataset(files, manifest, evaluation_batch(manifest), training=False).reduce(
            tf.constant(0, tf.int64), lambda a, x: a + tf.shape(x[1], out_type=tf.int64)[0])
        return int(n) / (time.perf_counter() - start)

    out["training_input_rows_per_s_repeats"] = [training_rate() for _ in range(args.repeats)]
    out["training_input_rows_per_s"] = max(out["training_input_rows_per_s_repeats"])
    out["eval_input_rows_per_s_repeats"] = [eval_input_rate() for _ in range(args.repeats)]
    out["eval_input_rows_per_s"] = max(out["eval_input_rows_per_s_repeats"])

    # 2. A short training run with the held-out selection.
    state = os.path.join(workdir, "state")
    if tf.io.gfile.exists(state):
        tf.io.gfile.rmtree(state)
    start = time.perf_counter()
    checkpoint, _, run = training_loop.train(cfg, plan, manifest, files, files, state, train_steps=args.steps, train_rows=args.rows)
    out["train_seconds"] = time.perf_counter() - start
    sel = run["selection"]
    out["run_seconds"] = run["seconds"]
    out["holdout"] = {"rows": sel["holdout_rows"], "slice_rows": sel["holdout_slice_rows"],
                      "read_seconds": sel["holdout_read_seconds"],
                      "evaluation_seconds": [e["seconds"] for e in sel["evaluations"]],
                      "load_seconds": [e["load_seconds"] for e in sel["evaluations"]],
                      "aucs": [e["auc"] for e in sel["evaluations"]]}

    # 3. The final evaluation as the Trainer runs it, and the eager loop it replaced.
    plan_run = with_run(plan, checkpoint_layout=CheckpointLayout(**run["checkpoint_layout"]))
    metrics, model = model_artifact.finish(cfg, plan_run, manifest, checkpoint, files, os.path.join(workdir, "serving"))
    out["final_after"] = {"rows": metrics["examples"], "seconds": metrics["seconds"],
                          "rows_per_s": metrics["examples"] / metrics["seconds"], "auc": metrics["auc"]}
    with tf.device("/cpu:0"):  # the same evaluation again, traced already: the rate past its fixed cost
        eval_ds = make_dataset(files, manifest, evaluation_batch(manifest), training=False)
        again = [evaluate(model, eval_ds) for _ in range(args.repeats)]
    out["final_after"]["repeats_rows_per_s"] = [m["examples"] / m["seconds"] for m in again]
    out["final_after"]["best_rows_per_s"] = max(out["final_after"]["repeats_rows_per_s"])
    with tf.device("/cpu:0"):
        rows, seconds, auc = eager_evaluate(model, make_dataset(files, manifest, t.batch_size, training=False),
                                            args.baseline_rows)
    out["final_before"] = {"rows": rows, "seconds": seconds, "rows_per_s": rows / seconds, "auc_of_those_rows": auc}

    # 4. The held-out scoring alone on the trained checkpoint: before (find by make_dataset, cache
    # parsed batches, eager) and after (read once, records, compiled).
    with tf.device("/cpu:0"):
        old_ds = make_dataset(files, manifest, OLD_HOLDOUT_BATCH, training=False, part="holdout",
                              holdout_fraction=fraction).cache()
        sample = next(iter(records_dataset(read_holdout(files, manifest, fraction, max_holdout).records, manifest,
                                           evaluation_batch(manifest))))[0]
        twin = build_serving_model(plan_run, manifest, cfg, "float32", sample, stacked=False)
        restore_dense(twin, checkpoint)
        load_tables(twin, open_checkpoint_tables(checkpoint, plan_run))
        before = [eager_evaluate(twin, old_ds) for _ in range(2)]
        start = time.perf_counter()
        held = read_holdout(files, manifest, fraction, max_holdout)
        read_seconds = time.perf_counter() - start
        ds = records_dataset(held.records, manifest, evaluation_batch(manifest))
        after = [evaluate(twin, ds) for _ in range(2)]
    out["holdout_auc_noise"] = auc_noise(twin, plan_run, ds, state)
    out["holdout_scoring"] = {
        "before": {"first_seconds": before[0][1], "later_seconds": before[1][1], "rows": before[0][0],
                   "auc": before[0][2]},
        "after": {"read_seconds": read_seconds, "first_seconds": after[0]["seconds"],
                  "later_seconds": after[1]["seconds"], "rows": after[0]["examples"], "auc": after[0]["auc"],
                  "record_megabytes": float(tf.reduce_sum(tf.strings.length(held.records))) / 1e6},
    }
    os.makedirs(os.path.join(REPO, "bench", "results"), exist_ok=True)
    with open(os.path.join(REPO, "bench", "results", "eval.json"), "w") as fh:
        json.dump(out, fh, indent=2)
    _print(out)
    return 0


def _print(out) -> None:
    h, hs, fa, fb = out["holdout"], out["holdout_scoring"], out["final_after"], out["final_before"]
    print(f"| measure ({out['rows']:,} generated rows, demo config, {out['cpus']} CPUs) | figure |")
    print("|---|---|")
    print(f"| training input (batch {out['batch_size']}, Dataset.reduce), best of {len(out['training_input_rows_per_s_repeats'])} "
          f"| {out['training_input_rows_per_s']:,.0f} rows/s |")
    print(f"| eval input alone (batch {out['eval_batch']}, Dataset.reduce), best of {len(out['eval_input_rows_per_s_repeats'])} "
          f"| {out['eval_input_rows_per_s']:,.0f} rows/s |")
    print(f"| final evaluation before (eager, batch {out['batch_size']}, first {fb['rows']:,} rows) | {fb['rows_per_s']:,.0f} rows/s |")
    print(f"| final evaluation after (`finish`, compiled, batch {out['eval_batch']}, {fa['rows']:,} rows, its tracing included) | "
          f"{fa['rows_per_s']:,.0f} rows/s ({fa['rows_per_s'] / fb['rows_per_s']:.1f}x) |")
    print(f"| the same evaluation again, best of {len(fa['repeats_rows_per_s'])} | {fa['best_rows_per_s']:,.0f} rows/s "
          f"({fa['best_rows_per_s'] / fb['rows_per_s']:.1f}x; {fa['best_rows_per_s'] / out['training_input_rows_per_s']:.2f}x "
          f"the training input) |")
    print(f"| held-out scoring before: first (finds the slice) / later (cache), {hs['before']['rows']:,} rows | "
          f"{hs['before']['first_seconds']:.1f} s / {hs['before']['later_seconds']:.1f} s |")
    print(f"| held-out scoring after: one read / first / later, {hs['after']['rows']:,} rows "
          f"({hs['after']['record_megabytes']:.1f} MB of records) | {hs['after']['read_seconds']:.1f} s / "
          f"{hs['after']['first_seconds']:.1f} s / {hs['after']['later_seconds']:.1f} s |")
    print(f"| in the training run: slice read, held-out evaluations (restore + score + keep; of which restore) | "
          f"{h['read_seconds']:.1f} s, {', '.join(f'{s:.1f} ({r:.1f})' for s, r in zip(h['evaluation_seconds'], h['load_seconds']))} s |")
    print(f"| the run record's seconds | {json.dumps(out['run_seconds'])} |")
    n = out.get("holdout_auc_noise")
    if n:
        print(f"| held-out AUC noise, {n['rows']:,} rows at {n['positive_rate']:.3f} positives: bootstrap SE / Hanley-McNeil "
              f"| {n['auc_1']:.4f}: {n['bootstrap_se_1']:.4f} / {n['hanley_mcneil_se_1']:.4f} |")
        if "difference" in n:
            print(f"| two checkpoints ({', '.join(n['checkpoints'])}) on the same rows: AUC difference, paired bootstrap SE "
                  f"| {n['difference']:+.4f}, {n['bootstrap_se_difference']:.4f} |")


if __name__ == "__main__":
    sys.exit(main())
