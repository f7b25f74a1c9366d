"""Input order: the same public data sorted by time and shuffled, through the whole pipeline.

    .venv/bin/python bench/input_order.py [--config configs/public/flights.yaml]
        [--sort-by year month day sched_dep_time] [--work-dir /tmp/input_order] [--seed 0]

Production logs arrive ordered by time, and transformed rows keep their input's order. This
writes two copies of a config's CSV, one sorted by the `--sort-by` columns (stable) and one
shuffled (seeded), runs `python -m pipelines run` on each with the config otherwise unchanged,
and reports both runs' eval AUC, the built-in baseline's AUC, the train split's transformed file
count and the held-out AUC of the kept checkpoint. The eval split is a hash of each row's content,
so both runs are scored on the same rows. Target: the two eval AUCs within 0.003.
Results go to bench/results/input_order.json.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
from typing import Dict, List

import numpy as np
import pandas as pd
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_orders(config_path: str, sort_by: List[str], work: str, seed: int) -> Dict[str, str]:
    """{order: config path}: the config's CSV sorted by `sort_by` and shuffled, each with a config."""
    with open(config_path) as fh:
        raw = yaml.safe_load(fh)
    data = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(config_path)), raw["input"]["path"]))
    frame = pd.read_csv(data, dtype=str, keep_default_na=False)
    numeric = frame[sort_by].apply(pd.to_numeric, errors="coerce")
    orders = {
        "sorted": frame.iloc[np.lexsort([numeric[c].to_numpy() for c in reversed(sort_by)])],
        "shuffled": frame.iloc[np.random.default_rng(seed).permutation(len(frame))],
    }
    configs = {}
    for name, rows in orders.items():
        csv = os.path.join(work, f"{name}.csv")
        rows.to_csv(csv, index=False)
        raw["input"]["path"] = csv
        configs[name] = os.path.join(work, f"{name}.yaml")
        with open(configs[name], "w") as fh:
            yaml.safe_dump(raw, fh, sort_keys=False)
    return configs


def run(config: str, out: str) -> Dict[str, object]:
    """One `pipelines run`: its summary's AUCs, the kept checkpoint and the train split's files."""
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    start = time.time()
    proc = subprocess.run([sys.executable, "-m", "pipelines", "run", "--config", config, "--output-dir", out],
                          capture_output=True, text=True, env=env, cwd=REPO)
    if proc.returncode not in (0, 3):  # 3: the gate kept the model back, the run itself finished
        raise RuntimeError(f"pipelines run failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    with open(os.path.join(out, "summary.json")) as fh:
        summary = json.load(fh)
    train_files = glob.glob(os.path.join(out, "**", "transformed_examples", "*", "Split-train", "transformed_examples-*"),
                            recursive=True)
    return {"eval_auc": summary.get("eval_auc"), "baseline_auc": summary.get("baseline_auc"),
            "training": summary.get("training"), "train_files": len(train_files),
            "seconds": round(time.time() - start, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=os.path.join(REPO, "configs", "public", "flights.yaml"))
    ap.add_argument("--sort-by", nargs="+", default=["year", "month", "day", "sched_dep_time"])
    ap.add_argument("--work-dir", default="/tmp/input_order")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", default=os.path.join(REPO, "bench", "results", "input_order.json"))
    args = ap.parse_args(argv)
    os.makedirs(args.work_dir, exist_ok=True)
    configs = write_orders(args.config, args.sort_by, args.work_dir, args.seed)
    results = {name: run(cfg, os.path.join(args.work_dir, f"out_{name}")) for name, cfg in configs.items()}
    gap = abs(results["sorted"]["eval_auc"] - results["shuffled"]["eval_auc"])
    print("| input order | eval AUC | baseline AUC | train files | seconds |\n|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['eval_auc']:.4f} | {r['baseline_auc']:.4f} | {r['train_files']} | {r['seconds']} |")
    print(f"eval AUC gap {gap:.4f} (target <= 0.003: {'met' if gap <= 0.003 else 'missed'})")
    with open(args.results, "w") as fh:
        json.dump({"config": os.path.relpath(args.config, REPO), "sort_by": args.sort_by, "runs": results,
                   "gap": gap}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
