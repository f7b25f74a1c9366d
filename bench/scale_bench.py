"""Scale benchmark: the whole pipeline on 1M, 5M and 20M generated rows, stage by stage, beside a
single-process pyarrow floor on the same CSV.

    .venv/bin/python bench/scale_bench.py [--rows 1000000 5000000 20000000] [--steps 100] [--workers 0] [--data-only]
        [--train-epochs 1]

For each row count:
- the data: `components.example_gen.synthetic_data` (Criteo-like, about 350 bytes a row), generated once into
  data/scale/ and reused (20M rows is about 7 GB);
- the pipeline: `python -m pipelines run` on configs/demo.yaml with the input pointed at that CSV
  and `--steps` training steps (a short training: the data path is what is measured), as its own
  process tree. The component start and end lines it prints are stamped as they arrive; the RSS of
  the whole tree (runner, Beam workers) is sampled every 0.25 s, and each stage gets the seconds
  between its lines, its rows/s (input rows / seconds) and the largest tree RSS while it ran;
- the floor: one process reads the same CSV with pyarrow's streaming CSV reader (every column as
  binary, one thread) and counts the rows: what reading the bytes costs at the least;
- the counting floor (`--counting-floor`): `bench/preprocess_bench.py`'s pyarrow floor, one process
  (pyarrow's own threads) that reads the 26 categorical columns as strings and counts each one's
  distinct values (`pc.value_counts`): the least a vocabulary count costs, the floor of 370k rows/s
  at 1M that the data path's 8x target was set against. It holds the columns in memory (about
  7 GB at 20M rows).
With `--train-epochs E` the Trainer trains E passes over the train split (the demo config's model,
the Trainer's default checkpoint interval and held-out evaluations; no `--steps`), and the run
reports the Trainer's examples/s (its training steps' own seconds, from `training_run.json`), the
rate of the same training input alone (`training_data.training_input` consumed inside TensorFlow,
in a fresh process after the run; target at least 4x the step), the seconds of the held-out slice's
read, the held-out evaluations with the selection, and the final evaluation (target under 10% of
the Trainer's time together), the peak process-tree memory of the Trainer and the Exporter (target
under 8 GB), the Exporter's seconds and the eval AUC.
With `--data-only` each run is stopped once preprocessing finished (the ledger then comes from
preprocessing's statistics). The row ledger must balance and the run must succeed, or the bench fails. Results go to
bench/results/scale.json (and are printed as a markdown table); `bench/README.md` keeps them with
the command.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Tuple

import psutil
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from components.example_gen.synthetic_data import GeneratorSpec, ensure_dataset  # noqa: E402

# The data stages, timed between their "running" and "finished" progress lines
# (components/reporting/progress.py: each stage's own start and end); the whole run's wall time is
# reported for the rest.
STAGES = ("EmbeddingExampleGen", "EmbeddingPreprocess")


def tree_rss(proc: psutil.Process) -> Dict[int, int]:
    """{pid: RSS} of `proc` and every process below it ({} once the run ended)."""
    try:
        tree = [proc, *proc.children(recursive=True)]
    except psutil.Error:  # the run ended (or was stopped) between samples
        return {}
    rss = {}
    for p in tree:
        try:
            rss[p.pid] = p.memory_info().rss
        except psutil.Error:
            pass
    return rss


def run_pipeline(config: str, out: str, data_only: bool = False) -> Tuple[Dict[str, Dict[str, float]], float, str]:
    """({stage: {start, end, peak_rss}}, wall seconds, output) of one `pipelines run`; with
    `data_only`, the run is stopped (its process tree killed) once EmbeddingPreprocess finished."""
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    start = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "pipelines", "run", "--config", config, "--output-dir", out],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=REPO, text=True)
    root = psutil.Process(proc.pid)
    samples: List[Tuple[float, Dict[int, int]]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((time.time(), tree_rss(root)))
            time.sleep(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stamps: Dict[str, Dict[str, float]] = {}
    lines = []
    for line in proc.stdout:
        lines.append(line)
        m = re.search(r"\] (\S+) (running|finished)", line)
        if m:
            stamps.setdefault(m.group(1), {})["start" if m.group(2) == "running" else "end"] = time.time()
            if data_only and m.group(1) == STAGES[-1] and m.group(2) == "finished":
                for p in [*root.children(recursive=True), root]:
                    try:
                        p.kill()
                    except psutil.Error:
                        pass
                break
    proc.wait()
    done.set()
    sampler.join()
    output = "".join(lines)
    # 3: the run finished but the gate kept its model back (expected after a short training)
    if data_only and "end" in stamps.get(STAGES[-1], {}):
        pass
    elif proc.returncode not in (0, 3) or not os.path.exists(os.path.join(out, "summary.json")):
        raise RuntimeError(f"pipeline run failed ({proc.returncode}):\n{output[-4000:]}")
    with open(out.rstrip("/") + ".timeline.json", "w") as fh:  # for reading the phases: [[t, {pid: rss}], ...]
        json.dump({"root": proc.pid, "stamps": stamps, "samples": samples}, fh)
    for s in stamps.values():
        during = [(sum(r.values()), r) for t, r in samples if s.get("start", 0) <= t <= s.get("end", time.time())]
        total, at_peak = max(during, key=lambda x: x[0], default=(0, {}))
        s["peak_rss"] = total
        # who held it: the runner (the `pipelines run` process) and its largest other process
        s["peak_runner_rss"] = at_peak.get(proc.pid, 0)
        s["peak_largest_worker_rss"] = max((r for pid, r in at_peak.items() if pid != proc.pid), default=0)
    return stamps, time.time() - start, output


def pyarrow_floor(data: str) -> Tuple[float, int]:
    """(seconds, rows): one process, pyarrow's streaming CSV reader, every column binary."""
    code = (
        "import sys, time, pyarrow as pa\n"
        "from pyarrow import csv\n"
        "t = time.time()\n"
        "header = open(sys.argv[1], 'rb').readline().decode().strip().split(',')\n"
        "r = csv.open_csv(sys.argv[1], read_options=csv.ReadOptions(use_threads=False, block_size=16 << 20),\n"
        "                 parse_options=csv.ParseOptions(newlines_in_values=True),\n"
        "                 convert_options=csv.ConvertOptions(column_types={c: pa.binary() for c in header}))\n"
        "n = sum(b.num_rows for b in r)\n"
        "print(time.time() - t, n)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, data], capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), int(out[1])


def counting_floor(data: str) -> float:
    """Seconds of `bench/preprocess_bench.py`'s pyarrow floor on `data`, in a fresh process."""
    code = ("import sys; sys.path.insert(0, sys.argv[2])\n"
            "from bench.preprocess_bench import pyarrow_floor\n"
            "print(pyarrow_floor(sys.argv[1])[0])\n")
    out = subprocess.run([sys.executable, "-c", code, data, REPO], capture_output=True, text=True, check=True).stdout
    return float(out.split()[-1])


def bench_config(path: str, data: str, steps: int, workers: int, top_k: Optional[int] = None,
                 epochs: Optional[float] = None, rows: int = 0) -> None:
    """Writes the benchmark's config: configs/demo.yaml on `data`, `steps` training steps, or with
    `epochs` that many passes over the train split at the Trainer's default checkpoint interval and
    held-out evaluations (the cosine decay over the run's estimated steps: `rows` x the train share
    of ExampleGen's hash split / the batch size)."""
    with open(os.path.join(REPO, "configs", "demo.yaml")) as fh:
        cfg = yaml.safe_load(fh)
    if top_k:  # every vocabulary capped: the same vocabulary sizes at every row count
        for vocabulary in [cfg["categorical_defaults"]["vocabulary"], *(t["vocabulary"] for t in cfg["tables"])]:
            vocabulary["top_k"] = top_k
    cfg["name"] = "scale-bench"
    cfg["input"]["path"] = data
    training = cfg["training"]
    if epochs:
        training.pop("train_steps", None)
        training.pop("checkpoint_every_steps", None)
        training["epochs"] = epochs
        share = cfg["input"]["train_buckets"] / (cfg["input"]["train_buckets"] + cfg["input"]["eval_buckets"])
        steps = max(1, int(epochs * rows * share / training["batch_size"]))
    else:
        training["train_steps"] = steps
        training["checkpoint_every_steps"] = steps
    training["dense_optimizer"].get("schedule", {})["decay_steps"] = steps
    cfg["beam"]["direct_num_workers"] = workers
    with open(path, "w") as fh:
        yaml.safe_dump(cfg, fh)


def one_size(rows: int, args) -> Dict:
    data = os.path.join(args.work_dir, f"criteo_like_{rows}.csv")
    t = time.time()
    meta = ensure_dataset(data, GeneratorSpec(rows=rows))
    print(f"data: {data} ({meta['rows']} rows, {os.path.getsize(data) / 1e9:.2f} GB; ready in {time.time() - t:.0f}s)", flush=True)
    # twice, the faster kept: the first read may come from disk, the pipeline's from the page cache
    (floor_s, floor_rows), (again_s, _) = pyarrow_floor(data), pyarrow_floor(data)
    floor_s = min(floor_s, again_s)
    print(f"  pyarrow floor: {floor_s:.1f}s ({floor_rows / floor_s:,.0f} rows/s)", flush=True)
    count_s = None
    if args.counting_floor:
        count_s = min(counting_floor(data), counting_floor(data))
        print(f"  counting floor: {count_s:.1f}s ({rows / count_s:,.0f} rows/s)", flush=True)
    cfg = os.path.join(args.work_dir, f"scale_{rows}.yaml")
    bench_config(cfg, data, args.steps, args.workers, args.top_k, args.train_epochs, rows)
    out = os.path.join(args.work_dir, f"out_{rows}")
    subprocess.run(["rm", "-rf", out], check=True)
    stamps, wall, _ = run_pipeline(cfg, out, args.data_only)
    if args.data_only:  # the ledger as preprocessing wrote it beside its output (ExampleGen's stages included)
        stats = glob.glob(os.path.join(out, "pipeline_root", "EmbeddingPreprocess", "transformed_examples", "*",
                                       "embedding_statistics.json"))
        summary = {"ledger": json.load(open(stats[0])).get("ledger")} if stats else {}
    else:
        summary = json.load(open(os.path.join(out, "summary.json")))
    ledger = summary.get("ledger") or {}
    stages = {}
    for name in STAGES:
        s = stamps.get(name)
        if not s or "end" not in s:
            continue
        secs = s["end"] - s["start"]
        stages[name] = {"seconds": round(secs, 1), "rows_per_s": round(rows / secs), "peak_rss_gb": round(s["peak_rss"] / 1e9, 2),
                        "peak_runner_gb": round(s["peak_runner_rss"] / 1e9, 2),
                        "peak_largest_worker_gb": round(s["peak_largest_worker_rss"] / 1e9, 2)}
        print(f"  {name}: {secs:.1f}s, {rows / secs:,.0f} rows/s, peak {s['peak_rss'] / 1e9:.2f} GB "
              f"(runner {s['peak_runner_rss'] / 1e9:.2f} GB, largest worker {s['peak_largest_worker_rss'] / 1e9:.2f} GB)", flush=True)
    eg, pre = stages.get("EmbeddingExampleGen"), stages.get("EmbeddingPreprocess")
    ingest = None
    if eg and pre:
        secs = eg["seconds"] + pre["seconds"]
        ingest = {"seconds": round(secs, 1), "rows_per_s": round(rows / secs),
                  "peak_rss_gb": max(eg["peak_rss_gb"], pre["peak_rss_gb"]),
                  "x_floor_time": round(secs / floor_s, 2),
                  "x_counting_floor_time": round(secs / count_s, 2) if count_s else None}
        print(f"  ExampleGen + Preprocess: {secs:.1f}s, {rows / secs:,.0f} rows/s, {secs / floor_s:.1f}x the floor's time"
              + (f", {secs / count_s:.1f}x the counting floor's" if count_s else ""), flush=True)
    if not ledger or not all(st["balanced"] for st in ledger.get("stages", [])):
        raise RuntimeError(f"{rows} rows: the row ledger does not balance: {ledger}")
    training = None
    if args.train_epochs and not args.data_only:
        training = training_figures(out, stamps, cfg)
    return {"rows": rows, "training": training, "csv_gb": round(os.path.getsize(data) / 1e9, 2), "floor": {"seconds": round(floor_s, 1), "rows_per_s": round(floor_rows / floor_s)},
            "counting_floor": {"seconds": round(count_s, 1), "rows_per_s": round(rows / count_s)} if count_s else None,
            "stages": stages, "ingest": ingest, "wall_seconds": None if args.data_only else round(wall, 1),
            "eval_auc": summary.get("eval_auc")}


def stage_figures(stamps: Dict[str, Dict[str, float]], name: str) -> Optional[Dict[str, float]]:
    """{seconds, peak_rss_gb} of one component from its progress lines, or None."""
    s = stamps.get(name)
    if not s or "end" not in s or "start" not in s:
        return None
    return {"seconds": round(s["end"] - s["start"], 1), "peak_rss_gb": round(s["peak_rss"] / 1e9, 2)}


def input_rate(out: str, config: str, batches: int = 2000) -> float:
    """Examples/s of the Trainer's own training input (`training_data.training_input`: the same
    files, plan, held-out slice and batch) alone, consumed inside TensorFlow, in a fresh process."""
    code = """
import glob, json, os, sys, time
sys.path.insert(0, sys.argv[1])
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import components
import tensorflow as tf
from components.config.loading import load_config
from components.embedding_trainer import resolved_input, training_data, training_loop
from tests.stages import examples_uri  # noqa: E402
out, config, batches = sys.argv[2], sys.argv[3], int(sys.argv[4])
cfg = load_config(config)
root = os.path.join(out, "pipeline_root")
train = glob.glob(os.path.join(root, "EmbeddingPreprocess", "transformed_examples", "*", "Split-train"))[0]
model = sorted(glob.glob(os.path.join(root, "Trainer", "model", "*")))[-1]
files = [os.path.join(train, "*")]
manifest = resolved_input.read_manifest(examples_uri(files))
plan = resolved_input.read_plan(model)
t = cfg.training
rows = (json.load(open(os.path.join(out, "summary.json"))).get("rows_read") or {}).get("train")
fraction = t.holdout_fraction(rows) if rows else 0.0
ds = training_data.training_input(files, manifest, plan, t, t.batch_size, 0, 1, fraction)(None)
ds.take(50).reduce(0, lambda n, b: n + 1)
start = time.time()
n = ds.take(batches).reduce(tf.constant(0, tf.int64), lambda n, b: n + tf.shape(b[1], out_type=tf.int64)[0])
print(int(n) / (time.time() - start))
"""
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", code, REPO, out, config, str(batches)], capture_output=True,
                          text=True, env=env)
    if proc.returncode:
        raise RuntimeError(f"input rate measurement failed:\n{proc.stderr[-3000:]}")
    return float(proc.stdout.split()[-1])


def training_figures(out: str, stamps: Dict[str, Dict[str, float]], config: str) -> Dict:
    """The epoch run's Trainer and Exporter: examples/s, the input's rate beside the step's, the
    time held-out evaluation, selection and the final evaluation took, peak memory, eval AUC."""
    model = sorted(glob.glob(os.path.join(out, "pipeline_root", "Trainer", "model", "*")))[-1]
    with open(os.path.join(model, "training_run.json")) as fh:
        run = json.load(fh)
    trainer, exporter = stage_figures(stamps, "Trainer"), stage_figures(stamps, "EmbeddingExporter")
    seconds = run.get("seconds") or {}  # training_loop._seconds: training, holdout_read, holdout_evaluations, final_evaluation
    steps = run["final_step"] - (run.get("resumed_from_step") or 0)
    batch = run["per_replica_batch_size"] * run["replicas"]
    train_s = seconds.get("training")
    step_rate = steps * batch / train_s if steps and train_s else None
    feed = input_rate(out, config)
    figures = {"trainer": trainer, "exporter": exporter, "steps": steps, "seconds": seconds,
               "examples_per_s": round(step_rate) if step_rate else None, "input_examples_per_s": round(feed),
               "input_x_step": round(feed / step_rate, 2) if step_rate else None,
               "model_step": run.get("model_step"), "selection": run.get("selection")}
    evaluating = sum(seconds.get(k) or 0 for k in ("holdout_read", "holdout_evaluations", "final_evaluation"))
    if trainer and evaluating:
        figures["evaluation_share_of_trainer"] = round(evaluating / trainer["seconds"], 3)
    print(f"  Trainer: {json.dumps(figures, default=str)}", flush=True)
    return figures


def markdown(results: List[Dict]) -> str:
    lines = ["| rows | CSV GB | floor rows/s | counting floor rows/s | ExampleGen s / rows/s / peak GB | Preprocess s / rows/s / peak GB | both: rows/s, x floor time, x counting floor time, peak GB | whole run s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        st = r["stages"]

        def cell(name: str) -> str:
            s = st.get(name)
            return f"{s['seconds']} / {s['rows_per_s']:,} / {s['peak_rss_gb']}" if s else "-"

        ing = r["ingest"] or {}
        wall = "-" if r["wall_seconds"] is None else f"{r['wall_seconds']:.0f}"
        counting = f"{r['counting_floor']['rows_per_s']:,}" if r.get("counting_floor") else "-"
        lines.append(f"| {r['rows']:,} | {r['csv_gb']} | {r['floor']['rows_per_s']:,} | {counting} | "
                     f"{cell('EmbeddingExampleGen')} | {cell('EmbeddingPreprocess')} | {ing.get('rows_per_s', 0):,}, "
                     f"{ing.get('x_floor_time')}x, {ing.get('x_counting_floor_time') or '-'}x, {ing.get('peak_rss_gb')} | {wall} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 5_000_000, 20_000_000])
    p.add_argument("--steps", type=int, default=100, help="training steps (a short training)")
    p.add_argument("--workers", type=int, default=0, help="Beam workers (0: one per core)")
    p.add_argument("--top-k", type=int, default=None,
                   help="cap every vocabulary at this many tokens (memory at a fixed vocabulary size)")
    p.add_argument("--work-dir", default=os.path.join(REPO, "data", "scale"))
    p.add_argument("--data-only", action="store_true",
                   help="stop each run once preprocessing finished (ExampleGen and preprocessing measured; no training)")
    p.add_argument("--counting-floor", action="store_true",
                   help="also time bench/preprocess_bench.py's floor (the categorical columns read and their values counted) on each CSV")
    p.add_argument("--train-epochs", type=float, default=None,
                   help="train this many passes over the train split at the defaults (instead of --steps) and report "
                        "the Trainer's examples/s, its input's rate, evaluation time, peak memory and the Exporter's")
    p.add_argument("--results", default=os.path.join(REPO, "bench", "results", "scale.json"))
    args = p.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    results = [one_size(n, args) for n in args.rows]
    os.makedirs(os.path.dirname(args.results), exist_ok=True)
    with open(args.results, "w") as fh:
        json.dump({"machine": f"{os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB", "results": results}, fh, indent=2)
    print(markdown(results))
    trained = [r for r in results if r.get("training")]
    if trained:
        print(training_markdown(trained))
    return 0


def training_markdown(results: List[Dict]) -> str:
    """The epoch runs' Trainer and Exporter figures as a markdown table."""
    lines = ["| rows | steps | examples/s | input examples/s (x step) | held-out read / evaluations + selection / final evaluation s "
             "(share of Trainer) | Trainer s / peak GB | Exporter s / peak GB | eval AUC |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        t = r["training"]
        sec = t["seconds"]
        tr, ex = t["trainer"] or {}, t["exporter"] or {}
        lines.append(f"| {r['rows']:,} | {t['steps']:,} | {t['examples_per_s']:,} | {t['input_examples_per_s']:,} "
                     f"({t['input_x_step']}x) | {sec.get('holdout_read')} / {sec.get('holdout_evaluations')} / "
                     f"{sec.get('final_evaluation')} ({t.get('evaluation_share_of_trainer')}) | {tr.get('seconds')} / "
                     f"{tr.get('peak_rss_gb')} | {ex.get('seconds')} / {ex.get('peak_rss_gb')} | {r.get('eval_auc')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
