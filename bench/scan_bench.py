"""ExampleGen's first pass over a CSV: the quote count and the block hashes (the input's identity)
in one read per range, against the two passes they were (bench/README.md "Reading a CSV once").

    .venv/bin/python bench/scan_bench.py [--rows 300000] [--mb-per-s 0 200]

Writes ROWS generated rows (the demo's columns) to a temporary CSV, cuts it into ExampleGen's
64 MiB ranges and runs, on every range, the two passes (`ranges.count_quotes`, then
`ranges.range_blocks`: the baseline) and the one (`ranges.scan_range`: what runs), the faster of 3
runs each, their results checked equal. With MB_PER_S above 0, every read is delayed by its size
over that rate, as a remote store's throughput bounds a worker's reads (the page cache makes a
local second pass nearly free; a bucket's does not). Prints one RESULT line (JSON) per rate and
writes bench/results/scan.json.
"""
import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from apache_beam.io.filesystems import FileSystems  # noqa: E402

from components.example_gen import ranges  # noqa: E402
from components.example_gen.synthetic_data import GeneratorSpec, write_csv  # noqa: E402

RANGE_BYTES = 64 << 20  # input.range_mb's default


class _Throttled:
    """A binary file whose reads take len(bytes) / rate seconds more."""

    def __init__(self, fh, rate: float):
        self._fh, self._rate = fh, rate

    def read(self, n=-1):
        data = self._fh.read(n)
        time.sleep(len(data) / self._rate)
        return data

    def seek(self, *a):
        return self._fh.seek(*a)

    def tell(self):
        return self._fh.tell()

    def close(self):
        self._fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._fh.close()


def _best(fn, rs):
    times, out = [], None
    for _ in range(3):
        start = time.perf_counter()
        out = [fn(r) for r in rs]
        times.append(time.perf_counter() - start)
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--mb-per-s", type=float, nargs="+", default=[0.0, 200.0])
    args = parser.parse_args()
    path = os.path.join(tempfile.mkdtemp(prefix="scan_bench_"), "data.csv")
    write_csv(GeneratorSpec(rows=args.rows, seed=7), path)
    size = os.path.getsize(path)
    rs = ranges.plan_ranges([(path, size)], RANGE_BYTES)
    local = FileSystems.open  # what ExampleGen's ranges read through (Beam's, for any filesystem)
    results = []
    for rate in args.mb_per_s:
        if rate:
            FileSystems.open = staticmethod(lambda *a, rate=rate, **k: _Throttled(local(*a, **k), rate * 1e6))
        try:
            two, expected = _best(lambda r: (ranges.count_quotes(r), ranges.range_blocks(r)), rs)
            one, got = _best(ranges.scan_range, rs)
        finally:
            FileSystems.open = staticmethod(local)
        assert got == expected, "scan_range differs from count_quotes + range_blocks"
        result = {"rows": args.rows, "mb": round(size / 1e6, 1), "ranges": len(rs), "store_mb_per_s": rate or None,
                  "two_passes_s": round(two, 3), "one_pass_s": round(one, 3), "ratio": round(two / one, 2)}
        print("RESULT " + json.dumps(result), flush=True)
        results.append(result)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "scan.json")
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
