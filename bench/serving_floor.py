"""How fast can a serving model on raw tf.Examples be, next to the trainer's SavedModel? (issue 17)

    .venv/bin/python bench/serving_floor.py [--batches 1024] [--rounds 6] [--calls 40]   # after `make demo`

The issue's target is serving p50 <= 1.25x the trainer's SavedModel (preprocessed tf.Examples) at
batch 1, 64 and 1024. This bench bounds what the raw-feature transform can reach at all: the demo
model is exported by the exporter once as it is and once per variant with a part of the transform
taken out (the rulebook no longer kept: these variants score wrongly, which is the point: their
parity check is off), then all are timed side by side against the trainer's SavedModel:
- `full`: the product (what `export_bench.py latency` times).
- `no_misses`: vocabulary misses not handled: no OOV rows, no T5-T6 validity checks, no
  invalid-token drop (a missed token reads row 0 of its table).
- `no_misses_no_t7`: and no `max_length` truncation (T7).
- `hash_not_lookup`: and no vocabulary lookup either: each token's row is its
  `to_hash_bucket_fast` bucket (one op per feature, about a third of a string lookup's time).
  What is left is the raw tf.Example parsing, the multi-hot splitting, the stacking of the IDs and
  the fused pooling: the floor of any model that takes the raw strings.
- `hash_no_split`: and the four multi-hot columns not split (each cell one token: 30% fewer IDs).
Each variant is exported in a child process (the stubs replace `RawFeatureTransform` methods
there only). Timing: `--rounds` rounds of `--calls` calls, the trainer's SavedModel and every
variant alternating call by call on the same 1024 (or `--batches`) rows; the ratio is each round's
p50 over the trainer's p50 in that round, reported as the median over rounds (the machine's speed
moves between rounds: this 2-core VM shows up to 50% steal). CPU time per call (process time, both
threads, spinning included) is reported too: it is steadier than wall time.
Results go to bench/results/serving_floor.json and print as a markdown table.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

RESULTS = os.path.join(REPO, "bench", "results")
VARIANTS = ("full", "no_misses", "no_misses_no_t7", "hash_not_lookup", "hash_no_split")
TRAINER = "trainer's SavedModel"


def _stub(variant: str) -> None:
    """Takes the variant's parts out of `RawFeatureTransform` (in this process only)."""
    import tensorflow as tf

    from components.embedding_exporter import serving

    if variant == "full":
        return
    if variant in ("hash_not_lookup", "hash_no_split"):
        def lookup(self, table, flat, offset=0):
            rows = max(self._manifest.vocabularies[table].size, 1)
            if flat.dtype != tf.string:
                return tf.zeros_like(flat) + offset
            return tf.strings.to_hash_bucket_fast(flat, rows) + offset

        serving.RawFeatureTransform.lookup = lookup
    if variant == "hash_no_split":
        serving.split_values = lambda values, separator: values

    def categorical(self, column, batch, from_json, order, fused=None):
        if fused is None:  # features outside the fused groups: as in the product
            return full_categorical(self, column, batch, from_json, order, fused)
        offset = {n: o for part in fused[1] for n, o in zip(part.features, part.offsets)}
        tokens = [self._tokens(column(f.column), f, from_json) for f in order]
        ids = serving.stack_rows([t.with_flat_values(self.lookup(f.table, t.flat_values, offset.get(f.name, 0)))
                                  for f, t in zip(order, tokens)])
        limits = [f.max_length for f in order] if variant == "no_misses" else [None] * len(order)
        flat = tf.maximum(ids.flat_values, 0)
        return self._fused_apply(flat, self._fused_plan(flat, ids.row_splits, batch, limits, *fused), fused[0])

    full_categorical = serving.RawFeatureTransform._categorical
    serving.RawFeatureTransform._categorical = categorical


def export_child(variant: str, model_dir: str, examples: str, out: str) -> None:
    from components.config.loading import config_from_json
    from components.embedding_exporter.export import export_serving_model
    from components.contracts.artifacts import TRAINER_CONFIG_FILE

    _stub(variant)
    cfg = config_from_json(open(os.path.join(model_dir, TRAINER_CONFIG_FILE)).read())
    cfg.export.compare_compression = False
    cfg.export.table_dtype = "float32"
    if variant != "full":
        cfg.export.parity_tolerance = float("inf")  # the stubs score wrongly by design
    report = export_serving_model(cfg, model_dir, examples, out)
    print(json.dumps({"parity_max_abs_diff": report["parity"]["max_abs_diff"]}))


def _records(pattern: str, n: int):
    import tensorflow as tf

    from components.data_io.examples_io import serialized_examples

    return tf.constant(serialized_examples(pattern, n))


def run(args) -> dict:
    model_dir = args.model or max(glob.glob(os.path.join(REPO, "output/demo/pipeline_root/Trainer/model/*")), key=os.path.getmtime)
    root = os.path.dirname(os.path.dirname(os.path.dirname(model_dir)))  # the pipeline root
    raw = glob.glob(os.path.join(root, "EmbeddingExampleGen/examples/*/Split-eval"))[0] + "/*"
    preprocessed = max(glob.glob(os.path.join(root, "EmbeddingPreprocess/transformed_examples/*/Split-eval")), key=os.path.getmtime) + "/*"
    out = tempfile.mkdtemp(prefix="serving_floor_")
    try:
        parity = {}
        for v in args.variants:
            proc = subprocess.run([sys.executable, __file__, "_export_child", v, model_dir, raw, os.path.join(out, v)],
                                  capture_output=True, text=True)
            if proc.returncode:
                raise SystemExit(f"exporting the {v} variant failed:\n{proc.stderr[-3000:]}")
            parity[v] = json.loads(proc.stdout.strip().splitlines()[-1])["parity_max_abs_diff"]
            print(f"exported {v}: parity max |diff| {parity[v]:.3g}", flush=True)
        import tensorflow as tf

        fns = {TRAINER: (tf.saved_model.load(os.path.join(model_dir, "Format-Serving")).signatures["serving_default"], preprocessed)}
        for v in args.variants:
            fns[v] = (tf.saved_model.load(os.path.join(out, v, "Format-Serving")).signatures["serving_default"], raw)
        rows = []
        for batch in args.batches:
            data = {k: _records(pattern, batch) for k, (_, pattern) in fns.items()}
            for k, (fn, _) in fns.items():
                for _ in range(10):
                    fn(examples=data[k])
            ratios = {k: [] for k in fns}
            wall = {k: [] for k in fns}
            cpu = {k: [] for k in fns}
            for _ in range(args.rounds):
                this = {k: [] for k in fns}
                for _ in range(args.calls):
                    for k, (fn, _) in fns.items():
                        c, t = time.process_time(), time.perf_counter()
                        fn(examples=data[k])
                        this[k].append((time.perf_counter() - t) * 1e3)
                        cpu[k].append((time.process_time() - c) * 1e3)
                base = np.median(this[TRAINER])
                for k in fns:
                    ratios[k].append(float(np.median(this[k]) / base))
                    wall[k] += this[k]
            for k in fns:
                rows.append({"batch": batch, "model": k, "p50_ms": float(np.median(wall[k])),
                             "p50_vs_trainer_median_of_rounds": float(np.median(ratios[k])),
                             "p50_vs_trainer_rounds": ratios[k], "cpu_ms_per_call": float(np.median(cpu[k]))})
                print(f"batch {batch:5d} {k}: p50 {rows[-1]['p50_ms']:.2f} ms, "
                      f"{rows[-1]['p50_vs_trainer_median_of_rounds']:.2f}x, cpu {rows[-1]['cpu_ms_per_call']:.1f} ms", flush=True)
        return {"model": model_dir, "parity": parity, "rows": rows, "rounds": args.rounds, "calls": args.calls,
                "machine": {"cpus": os.cpu_count()}}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_export_child":
        export_child(*sys.argv[2:6])
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a Trainer Model artifact (default: the newest under output/demo)")
    p.add_argument("--batches", type=int, nargs="+", default=[1024])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--calls", type=int, default=40)
    args = p.parse_args()
    result = run(args)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "serving_floor.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("\n| batch | serving model | p50 ms | p50 / trainer's (median of rounds) | CPU ms per call |")
    print("|---|---|---|---|---|")
    for r in result["rows"]:
        print(f"| {r['batch']} | {r['model']} | {r['p50_ms']:.2f} | {r['p50_vs_trainer_median_of_rounds']:.2f}x | {r['cpu_ms_per_call']:.1f} |")


if __name__ == "__main__":
    main()
