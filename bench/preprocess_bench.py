"""Preprocessing benchmark: our component vs tf.Transform vs a single-process pyarrow floor.

    .venv/bin/python bench/preprocess_bench.py --rows 1000000 [--workers 2] [--skip-tft]

One run, one machine, the same CSV and the same DirectRunner settings (multi-processing, N
workers) for every Beam contender:
- ours, analysis only (`--analyze-only`): the 26 exact vocabularies and their statistics, what
  tf.Transform's `tft.vocabulary` analysis computes, so the throughput ratio compares like with like;
- ours, full: vocabularies, transformed examples and all embedding-ID statistics;
- tf.Transform: `tft.vocabulary(..., store_frequency=True)` for the same 26 columns in
  `tft_beam.AnalyzeDataset` (bench/tft_vocab.py);
- floor: pyarrow reads the CSV and runs `value_counts` on the 26 columns in one process.
Each contender runs as its own process tree; wall time includes process and worker start-up,
peak memory is the largest sum of RSS over the tree, sampled every 0.2 s. Vocabulary contents
(token -> count) of ours and tf.Transform's are compared exactly. Results go to
bench/results/preprocess.json and are printed as a markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Dict, List, Tuple

import psutil
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from components.example_gen.synthetic_data import NUM_CATEGORICAL, NUM_DENSE, GeneratorSpec, ensure_dataset  # noqa: E402

CATEGORICAL = [f"C{c + 1}" for c in range(NUM_CATEGORICAL)]


def run_measured(cmd: List[str]) -> Tuple[float, int, str]:
    """(wall seconds, peak RSS of the process tree in bytes, output)."""
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    root = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            rss = sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
            peak = max(peak, rss)
        except psutil.Error:
            pass
        time.sleep(0.2)
    out = proc.stdout.read().decode("utf-8", "replace")
    seconds = time.time() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-4000:]}")
    return seconds, peak, out


def bench_config(path: str, data: str, workers: int) -> None:
    """26 single-valued exact vocabularies (min_frequency 1), as tft.vocabulary computes by default."""
    cfg = {
        "name": "preprocess-bench",
        "input": {"path": data, "format": "csv"},
        "label": "label",
        "dense_features": [{"name": f"I{j + 1}"} for j in range(NUM_DENSE)],
        "categorical_defaults": {"dim": 16, "vocabulary": {"min_frequency": 1, "num_oov_buckets": 1}},
        "categorical_features": [{"name": c} for c in CATEGORICAL],
        "training": {"batch_size": 4096},
        "beam": {"direct_running_mode": "multi_processing", "direct_num_workers": workers},
    }
    with open(path, "w") as fh:
        yaml.safe_dump(cfg, fh)


def read_counts(path: str) -> Dict[bytes, int]:
    out = {}
    with open(path, "rb") as fh:
        for line in fh.read().split(b"\n"):
            if line:
                count, token = line.split(b" ", 1)
                out[token] = int(count)
    return out


def pyarrow_floor(data: str) -> Tuple[float, Dict[str, int]]:
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyarrow import csv

    start = time.time()
    table = csv.read_csv(
        data,
        convert_options=csv.ConvertOptions(
            include_columns=CATEGORICAL, column_types={c: pa.string() for c in CATEGORICAL}
        ),
    )
    distinct = {}
    for c in CATEGORICAL:
        col = table.column(c).combine_chunks()
        counts = pc.value_counts(col.filter(pc.not_equal(col, "")))  # empty cells are not tokens
        distinct[c] = len(counts)
    return time.time() - start, distinct


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--work-dir", default=os.path.join(REPO, "data", "bench"))
    p.add_argument("--skip-tft", action="store_true", help="tf.Transform takes minutes per million rows")
    args = p.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    data = os.path.join(args.work_dir, f"criteo_like_{args.rows}.csv")
    t = time.time()
    meta = ensure_dataset(data, GeneratorSpec(rows=args.rows))
    print(f"data: {data} ({meta['rows']} rows, generated or reused in {time.time() - t:.0f}s)", flush=True)
    cfg = os.path.join(args.work_dir, "bench.yaml")
    bench_config(cfg, data, args.workers)
    py = sys.executable
    results: Dict[str, Dict] = {}

    floor_s, distinct = pyarrow_floor(data)
    results["pyarrow floor (1 process)"] = {"seconds": floor_s, "peak_rss_mb": None}
    print(f"floor: {floor_s:.1f}s", flush=True)

    ours = os.path.join(args.work_dir, "ours")
    for name, extra in (("ours, analysis only", ["--analyze-only"]), ("ours, full component", [])):
        s, rss, out = run_measured(
            [py, "-m", "components.embedding_preprocess", "--config", cfg, "--input", data, "--output", ours,
             "--format", "csv", "--overwrite", *extra]
        )
        results[name] = {"seconds": s, "peak_rss_mb": rss / 2**20}
        print(f"{name}: {s:.1f}s, peak {rss / 2**20:.0f} MiB", flush=True)
    ours_vocab = {c: read_counts(os.path.join(ours, "vocabulary", f"{c}.counts.txt")) for c in CATEGORICAL}
    assert {c: len(v) for c, v in ours_vocab.items()} == distinct, "our vocabularies disagree with pyarrow's count"

    identical = None
    if not args.skip_tft:
        tft_out = os.path.join(args.work_dir, "tft")
        shutil.rmtree(tft_out, ignore_errors=True)
        s, rss, _ = run_measured([py, os.path.join(REPO, "bench", "tft_vocab.py"), "--input", data, "--output",
                                  tft_out, "--workers", str(args.workers)])
        results["tf.Transform (tft.vocabulary x 26)"] = {"seconds": s, "peak_rss_mb": rss / 2**20}
        print(f"tf.Transform: {s:.1f}s, peak {rss / 2**20:.0f} MiB", flush=True)
        assets = os.path.join(tft_out, "transform_fn", "assets")
        identical = all(read_counts(os.path.join(assets, c)) == ours_vocab[c] for c in CATEGORICAL)

    for r in results.values():
        r["rows_per_s"] = args.rows / r["seconds"]
    base = results.get("tf.Transform (tft.vocabulary x 26)")
    floor = results["pyarrow floor (1 process)"]
    report = {
        "rows": args.rows,
        "workers": args.workers,
        "machine": f"{psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB",
        "distinct_per_feature": distinct,
        "vocabulary_contents_identical_to_tft": identical,
        "results": results,
    }
    lines = ["| contender | seconds | rows/s | peak memory | vs tf.Transform | vs pyarrow floor |", "|---|---|---|---|---|---|"]
    for name, r in results.items():
        ratio = f"{r['rows_per_s'] / base['rows_per_s']:.1f}x" if base else "–"
        slower = f"{floor['rows_per_s'] / r['rows_per_s']:.1f}x slower" if r is not floor else "1x"
        mem = f"{r['peak_rss_mb']:.0f} MiB" if r["peak_rss_mb"] else "–"
        lines.append(f"| {name} | {r['seconds']:.1f} | {r['rows_per_s']:,.0f} | {mem} | {ratio} | {slower} |")
    table = "\n".join(lines)
    report["table"] = table
    os.makedirs(os.path.join(REPO, "bench", "results"), exist_ok=True)
    with open(os.path.join(REPO, "bench", "results", "preprocess.json"), "w") as fh:
        json.dump(report, fh, indent=2)
    print(table)
    print(f"rows: {args.rows}; vocabulary contents identical to tf.Transform: {identical}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
