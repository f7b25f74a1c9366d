"""The defaults' training step in mixed_bfloat16 against float32, side by side in one process.

    .venv/bin/python bench/precision_bench.py [--rows 50000] [--examples 400000] [--repeats 3] [--batches 256,4096]

The model a config gets when it states no field of the model's shape (bench/trainer_bench.py
`DEFAULT_MODEL`: dcn_v2, two rank-32 cross layers, input dropout, the dense features' buckets) on
the demo's generated rows preprocessed by our Beam code, built twice per batch size, with
`training.precision: float32` and `mixed_bfloat16`, and trained alternately on the same batches
cached in memory (the step, not the input), `--examples` examples a fit (whole steps), after a
warm-up, `--repeats` times; each fit's examples per wall-clock second and per CPU-second of the
process (the steadier figure on a shared machine); then one forward and backward pass of the whole
model against the dense network alone on the same batch (`dense_share`: what bfloat16 can speed
up). Prints the CPU's
bfloat16 flags and oneDNN's ISA cap (`ONEDNN_MAX_CPU_ISA`: rerun with e.g. `AVX512_CORE` to
emulate a CPU without bfloat16 units), each contender's best and median examples/s and the ratio;
results go to bench/results/precision.json. The quality side (eval AUC, 3 seeds, on the demo and
public datasets) is bench/defaults_sweep.py with `{"training": {"precision": ..., "seed": ...}}`
candidates (bench/README.md "Precision").
"""
from __future__ import annotations

import argparse
import json
import os
import statistics as st
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import components  # noqa: E402,F401
import tensorflow as tf  # noqa: E402

from bench.trainer_bench import examples_per_second, prepare, variant_config  # noqa: E402
from components.embedding_model import tf_objects  # noqa: E402
from components.embedding_model.input import make_dataset  # noqa: E402
from components.embedding_trainer import model_building, resolved_input  # noqa: E402
from components.embedding_trainer.precision_choice import BF16_FLAGS, choose_precision, cpu_flags  # noqa: E402
from components.planning.run_plan import derive_plan  # noqa: E402
from tests.stages import examples_uri  # noqa: E402

PRECISIONS = ("float32", "mixed_bfloat16")


def _models(cfg, files, batch_size):
    """{precision: compiled model} of the default model at `batch_size`, and the cached batches."""
    manifest = resolved_input.read_manifest(examples_uri(files))
    statistics = resolved_input.read_statistics(examples_uri(files))
    models = {}
    for precision in PRECISIONS:
        vcfg = variant_config(cfg, {"precision": precision, "batch_size": batch_size})
        plan = derive_plan(vcfg, manifest, statistics)
        model = model_building.build_model(plan, manifest, vcfg, for_training=True, precision=precision)
        model.compile(optimizer=model.dense_optimizer, loss=tf.keras.losses.BinaryCrossentropy())
        models[precision] = model
    widths = tf_objects.dense_id_widths(plan)
    batches = make_dataset(files, manifest, batch_size, training=True, seed=vcfg.training.seed,
                           dense_id_widths=widths).take(16).cache().repeat()
    for _ in batches.take(16):  # fill the cache
        pass
    return models, batches


def _seconds(fn, args, repeats=20):
    """The best of a few means of `repeats` calls of a tf.function (after a traced warm-up)."""
    import time  # lazy: only this profile times calls one by one

    fn(*args)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            fn(*args)
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


def dense_share(model, features, labels):
    """Seconds of one forward and backward pass of the whole model, and of its dense network alone
    (the cross layers and MLPs on the pooled vectors, which the policy casts to bfloat16): what
    bfloat16 can speed up is the second, the rest (lookups, pooling, casts' share aside) it cannot."""
    loss_fn = tf.keras.losses.BinaryCrossentropy()
    tower = model.dense_tower

    @tf.function
    def whole(f, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(f, training=True))
        return tape.gradient(loss, model.trainable_variables)

    dense, buckets, _ = tower.bottom(features)
    embedded = tower.pool_sequences(model.embed(features), features)
    embedded = {k: tf.constant(v) for k, v in embedded.items()}

    @tf.function
    def dense_only(f, y):
        with tf.GradientTape() as tape:
            d, b, bottom = tower.bottom(f)
            loss = loss_fn(y, tower.top(bottom, d, b, embedded, training=True))
        return tape.gradient(loss, tower.variables())

    return {"step_forward_backward_s": _seconds(whole, (features, labels)),
            "dense_network_s": _seconds(dense_only, (features, labels))}


def _ratios(rates, cpu, steps):
    """Best and median examples/s per precision, wall-clock and per CPU-second, and bf16's ratios."""
    out = {"steps": steps, "examples_per_second": rates, "examples_per_cpu_second": cpu}
    for name, figures in (("", rates), ("cpu_", cpu)):
        best = {p: max(v) for p, v in figures.items()}
        med = {p: st.median(v) for p, v in figures.items()}
        out.update({f"{name}best": best, f"{name}median": med,
                    f"{name}bf16_vs_float32": best["mixed_bfloat16"] / best["float32"],
                    f"{name}median_bf16_vs_float32": med["mixed_bfloat16"] / med["float32"]})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--examples", type=int, default=400_000, help="examples a fit (steps = examples / batch)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", default="256,4096")
    args = ap.parse_args()
    flags = cpu_flags()
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA")
    print(f"CPU bf16 flags: {', '.join(f for f in BF16_FLAGS if f in flags) or 'none'}; "
          f"ONEDNN_MAX_CPU_ISA={isa or '(unset)'}; auto picks: {choose_precision('auto', 'cpu')}", flush=True)
    out = {"rows": args.rows, "examples": args.examples, "repeats": args.repeats, "cpus": os.cpu_count(),
           "bf16_flags": [f for f in BF16_FLAGS if f in flags], "onednn_max_cpu_isa": isa, "batches": {}}
    with tempfile.TemporaryDirectory() as work:
        cfg, _ = prepare(args.rows, work)
        files = [os.path.join(work, "tx", "Split-train", "*")]
        for batch_size in (int(b) for b in args.batches.split(",")):
            models, batches = _models(cfg, files, batch_size)
            steps = -(-args.examples // batch_size)
            rates, cpu = {p: [] for p in PRECISIONS}, {p: [] for p in PRECISIONS}
            for r in range(args.repeats):
                for p, model in models.items():
                    rates[p].append(examples_per_second(model, batches, steps, batch_size, r == 0, cpu[p]))
                print(f"batch {batch_size}, repeat {r + 1}: " + ", ".join(
                    f"{p} {v[-1]:,.0f} ({cpu[p][-1]:,.0f} a CPU-s)" for p, v in rates.items()), flush=True)
            out["batches"][batch_size] = _ratios(rates, cpu, steps)
            features, labels = next(iter(batches))
            out["batches"][batch_size]["profile"] = {p: dense_share(m, features, labels) for p, m in models.items()}
            print(f"batch {batch_size}, one forward and backward pass (s): {out['batches'][batch_size]['profile']}",
                  flush=True)
    os.makedirs(os.path.join(REPO, "bench", "results"), exist_ok=True)
    name = "precision.json" if not isa else f"precision_{isa.lower()}.json"
    with open(os.path.join(REPO, "bench", "results", name), "w") as fh:
        json.dump(out, fh, indent=2)
    print(f"| batch | float32 examples/s (best of {args.repeats}; median) | mixed_bfloat16 | bf16 / float32 (best; median) "
          "| the same a CPU-second |")
    print("|---|---|---|---|---|")
    for b, v in out["batches"].items():
        print(f"| {b} | {v['best']['float32']:,.0f}; {v['median']['float32']:,.0f} | "
              f"{v['best']['mixed_bfloat16']:,.0f}; {v['median']['mixed_bfloat16']:,.0f} | "
              f"{v['bf16_vs_float32']:.2f}; {v['median_bf16_vs_float32']:.2f} | "
              f"{v['cpu_bf16_vs_float32']:.2f}; {v['cpu_median_bf16_vs_float32']:.2f} |")
    print("| batch | precision | forward + backward, whole model (ms) | the dense network alone (ms) | its share |")
    print("|---|---|---|---|---|")
    for b, v in out["batches"].items():
        for p, f in v["profile"].items():
            print(f"| {b} | {p} | {f['step_forward_backward_s'] * 1e3:.1f} | {f['dense_network_s'] * 1e3:.1f} | "
                  f"{f['dense_network_s'] / f['step_forward_backward_s']:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
