"""`python -m pipelines score`'s throughput: scoring a file against reading the same file alone.

    .venv/bin/python bench/score_bench.py [--model output/demo/serving/<version>] [--input data/demo/criteo_like.csv]
        [--rows 200000] [--repeats 2] [--beam]

The demo's pushed serving model (the newest version under output/demo/serving when --model is not
given: run `make demo` first) and the first `--rows` rows of the demo's CSV (written once to a
temporary file). Side by side in one process, alternating, `--repeats` times: the scorer
(components/embedding_exporter/batch_scoring.py `score_file`, to Parquet) and the same reader alone
(the batches it scores, read and converted to the model's inputs, nothing scored or written; the
scorer's figure includes loading the model, as the command does).
Prints rows/s of each and the ratio; results go to bench/results/score.json.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import components  # noqa: E402,F401

from components.embedding_exporter import batch_scoring  # noqa: E402


def read_only(inputs, path: str) -> int:
    """Rows of `path` read and converted to the model's inputs as `score_file` does, none scored."""
    columns = sorted({i.column for i in inputs})
    report = batch_scoring.ScoreReport()
    rows = 0
    for batch, numbers in batch_scoring._csv_batches(path, columns, report):  # noqa: SLF001 - the scorer's reader
        batch_scoring.score_inputs(batch, inputs)
        rows += len(numbers)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--input", default=os.path.join(REPO, "data", "demo", "criteo_like.csv"))
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--beam", action="store_true",
                    help="also the same rows as Parquet (row groups of 65,536): the local scorer against `score --beam` "
                         "on Beam's local runner, one process per core")
    args = ap.parse_args()
    model = args.model or max(glob.glob(os.path.join(REPO, "output", "demo", "serving", "[0-9]*")), default=None)
    if not model:
        raise SystemExit("no --model and no pushed version under output/demo/serving: run `make demo` first")
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "rows.csv")
        with open(args.input, encoding="utf-8") as src, open(path, "w", encoding="utf-8") as dst:
            for i, line in enumerate(src):
                if i > args.rows:
                    break
                dst.write(line)
        _, inputs = batch_scoring.load_scorer(model)  # the read alone is timed without the model's load
        rates = {"score": [], "read_only": []}
        if args.beam:
            import pyarrow.csv as pcsv  # lazy: only with --beam
            import pyarrow.parquet as pq  # lazy: only with --beam

            from components.embedding_exporter.batch_scoring_beam import LOCAL_BEAM_SCORING, score_file_beam

            pq.write_table(pcsv.read_csv(path), os.path.join(work, "rows.parquet"), row_group_size=65_536)
            rates.update(score_parquet=[], beam_parquet=[])
        for r in range(args.repeats):
            start = time.perf_counter()
            report = batch_scoring.score_file(model, path, os.path.join(work, "scores.parquet"))
            rates["score"].append(report.rows_scored / (time.perf_counter() - start))
            start = time.perf_counter()
            rows = read_only(inputs, path)
            rates["read_only"].append(rows / (time.perf_counter() - start))
            if args.beam:
                parquet = os.path.join(work, "rows.parquet")
                start = time.perf_counter()
                n = batch_scoring.score_file(model, parquet, os.path.join(work, "p.parquet")).rows_scored
                rates["score_parquet"].append(n / (time.perf_counter() - start))
                start = time.perf_counter()
                n = score_file_beam(model, parquet, os.path.join(work, "b.parquet"), beam_args=LOCAL_BEAM_SCORING).rows_scored
                rates["beam_parquet"].append(n / (time.perf_counter() - start))
            print(f"repeat {r + 1}: score {rates['score'][-1]:,.0f} rows/s, read alone {rates['read_only'][-1]:,.0f} rows/s",
                  flush=True)
    best = {k: max(v) for k, v in rates.items()}
    out = {"model": model, "rows": args.rows, "cpus": os.cpu_count(), "rows_per_second": rates, "best": best,
           "score_vs_read_only": best["score"] / best["read_only"]}
    os.makedirs(os.path.join(REPO, "bench", "results"), exist_ok=True)
    with open(os.path.join(REPO, "bench", "results", "score.json"), "w") as fh:
        json.dump(out, fh, indent=2)
    print(f"| contender | rows/s, best of {args.repeats} |\n|---|---|")
    print(f"| read and convert alone | {best['read_only']:,.0f} |")
    print(f"| score (read, score, write Parquet) | {best['score']:,.0f} ({out['score_vs_read_only']:.2f}x the read) |")
    if args.beam:
        print(f"| score the Parquet copy, local scorer | {best['score_parquet']:,.0f} |")
        print(f"| score the Parquet copy, --beam (local runner, {os.cpu_count()} processes, model loads included) | "
              f"{best['beam_parquet']:,.0f} ({best['beam_parquet'] / best['score_parquet']:.2f}x the local scorer) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
