"""The pre-run input checks on many files of a slow store (bench/README.md "Input checks").

    .venv/bin/python bench/input_check_bench.py [--files 500] [--latency-ms 50]

Writes FILES small CSV files, then runs `input_checks.check_files` on them twice in one process:
reading one file's first bytes at a time (the baseline) and `PEEK_THREADS` at a time (what runs).
Each read is delayed by LATENCY_MS, as a remote store's first byte is (GCS answers a small read in
tens of milliseconds; a local disk in microseconds, where both take about the same time). Prints
one RESULT line (JSON): the seconds of each and their ratio.
"""
import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from components.config.loading import parse_config  # noqa: E402
from components.example_gen import input_checks  # noqa: E402
from tests.stages import demo_raw_config  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    args = parser.parse_args()
    d = tempfile.mkdtemp(prefix="input_check_bench_")
    files = []
    for i in range(args.files):
        path = os.path.join(d, f"part-{i:05d}.csv")
        with open(path, "wb") as fh:
            fh.write(b"label,C1\n1,a\n")
        files.append((path, os.path.getsize(path)))
    raw = demo_raw_config()
    raw["input"]["path"] = d
    cfg = parse_config(raw, "bench.yaml")
    read = input_checks._head  # pylint: disable=protected-access

    def slow_read(path, n):
        time.sleep(args.latency_ms / 1000)
        return read(path, n)

    input_checks._head = slow_read  # pylint: disable=protected-access
    seconds = {}
    for name, threads in (("one_at_a_time", 1), ("threads", input_checks.PEEK_THREADS)):
        input_checks.PEEK_THREADS = threads
        start = time.perf_counter()
        input_checks.check_files(cfg, files)
        seconds[name] = round(time.perf_counter() - start, 2)
    print("RESULT " + json.dumps({"files": args.files, "latency_ms": args.latency_ms, "seconds": seconds,
                                  "ratio": round(seconds["one_at_a_time"] / seconds["threads"], 1)}))


if __name__ == "__main__":
    main()
