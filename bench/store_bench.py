"""Row files and their delta at size: rows/s and peak memory against the table's size.

    .venv/bin/python bench/store_bench.py [--rows 4000000] [--dim 16] [--max-file-mib 128]

One generated table (a counted vocabulary of `--rows` tokens and 16 OOV buckets, float32 rows of
`--dim`) in the exporter's `tables/` format, and a second version of it (1% of the rows moved, 1%
of the tokens dropped, as many new). Each step runs in a fresh process whose peak resident memory
(ru_maxrss) is read after it; side by side in the same run:

- `write_row_files` (chunked: the .npy read by seek, rows spilled per shard, one shard sorted at a
  time) against the naive way (the table and vocabulary loaded whole, keyed, sorted and written as
  one Parquet file);
- `write_delta` of the two versions (one shard pair joined at a time).

Prints rows/s, peak MiB and the peak above the imports' of each, the table's own size, and the
ratios; bench/results/store.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def make_tables(root: str, rows: int, dim: int, seed: int, base: str = "") -> None:
    """A tables/ directory of one table `T`, written in blocks (never whole in memory).
    With `base`, a second version of it: 1% of rows moved, 1% of tokens replaced by new ones."""
    import numpy as np

    tables = os.path.join(root, "tables")
    os.makedirs(os.path.join(tables, "vocabularies"))
    oov, block = 16, 1 << 20
    rng = np.random.default_rng(seed)
    values = np.lib.format.open_memmap(os.path.join(tables, "T.npy"), mode="w+", dtype=np.float32, shape=(rows + oov, dim))
    with open(os.path.join(tables, "vocabularies", "T.txt"), "wb") as vocab:
        for start in range(0, rows + oov, block):
            stop = min(start + block, rows + oov)
            base_rng = np.random.default_rng([0, start])  # both versions: the same rows before the moves
            chunk = base_rng.normal(size=(stop - start, dim)).astype(np.float32)
            if base:
                chunk[rng.random(stop - start) < 0.01] += 1.0
            values[start:stop] = chunk
            ids = np.arange(start, min(stop, rows))
            if base:  # 1% of tokens renamed: a tombstone and a new key each
                renamed = rng.random(len(ids)) < 0.01
                text = [f"new-{i}" if r else f"token-{i}" for i, r in zip(ids, renamed)]
            else:
                text = [f"token-{i}" for i in ids]
            vocab.write(("\n".join(text) + "\n").encode() if len(text) else b"")
    values.flush()
    entry = {"table": "T", "rows": rows + oov, "dim": dim, "dtype": "float32", "files": {"values": "T.npy"},
             "vocabulary_file": "vocabularies/T.txt", "vocabulary_size": rows, "num_oov_buckets": oov,
             "combiner": "mean", "features": ["t"], "vocabulary_kind": "counted", "default_value": None, "wide_of": None}
    with open(os.path.join(tables, "tables_manifest.json"), "w") as fh:
        json.dump({"tables": {"T": entry}}, fh)


def naive(tables: str, out: str) -> None:
    """The table and its vocabulary whole in memory, keyed, sorted, one Parquet file."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    values = np.load(os.path.join(tables, "T.npy"))
    tokens = open(os.path.join(tables, "vocabularies", "T.txt"), "rb").read().split(b"\n")[:-1]
    keys = [t.decode() for t in tokens] + [str(b) for b in range(values.shape[0] - len(tokens))]
    oov = np.arange(values.shape[0]) >= len(tokens)
    t = pa.table({"key": keys, "oov": oov,
                  "vector": pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])})
    os.makedirs(out)
    pq.write_table(t.sort_by([("oov", "ascending"), ("key", "ascending")]), os.path.join(out, "T.parquet"))


def step(kind: str, args: list) -> dict:
    """Runs one step in a fresh process; its seconds, peak resident MiB, and that peak above the
    process's once its modules (TensorFlow among them) are imported: what the step itself holds."""
    code = ("import sys, time, resource, json; sys.path.insert(0, %r); import bench.store_bench as b; "
            "from components.data_io import row_files, row_delta; "
            "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024; t = time.perf_counter(); %s; "
            "peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024; "
            "print(json.dumps({'seconds': time.perf_counter() - t, 'peak_mib': peak, 'work_mib': peak - base}))") % (REPO, kind)
    r = subprocess.run([sys.executable, "-c", code] + args, capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--max-file-mib", type=int, default=128)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        v0, v1 = os.path.join(work, "v0"), os.path.join(work, "v1")
        make_tables(v0, args.rows, args.dim, 0)
        make_tables(v1, args.rows, args.dim, 1, base=v0)
        table_mib = os.path.getsize(os.path.join(v0, "tables", "T.npy")) / 2**20
        mfb = args.max_file_mib * 2**20
        baseline = step("b.naive(sys.argv[1], sys.argv[2])", [os.path.join(v0, "tables"), os.path.join(work, "naive")])
        rows0 = step(f"row_files.write_row_files(sys.argv[1], sys.argv[2], {mfb})", [os.path.join(v0, "tables"), os.path.join(v0, "rows")])
        step(f"row_files.write_row_files(sys.argv[1], sys.argv[2], {mfb})", [os.path.join(v1, "tables"), os.path.join(v1, "rows")])
        delta = step("m = row_delta.write_delta(sys.argv[1], sys.argv[2], sys.argv[3]); print(json.dumps(m['tables']['T'] | {'bytes_vs_full': m['bytes_vs_full']}))",
                     [os.path.join(v0, "rows"), os.path.join(v1, "rows"), os.path.join(work, "delta")])
        n = args.rows + 16
        result = {"rows": n, "dim": args.dim, "table_mib": round(table_mib, 1),
                  **{name: {"rows_per_s": round(n / r["seconds"]), "peak_mib": round(r["peak_mib"]),
                            "above_imports_mib": round(r["work_mib"])}
                     for name, r in (("naive", baseline), ("row_files", rows0), ("delta", delta))}}
        result["memory_ratio_row_files_vs_naive"] = round(rows0["work_mib"] / max(baseline["work_mib"], 1), 3)
        result["speed_ratio_row_files_vs_naive"] = round(baseline["seconds"] / rows0["seconds"], 3)
    print(json.dumps(result, indent=2))
    os.makedirs(os.path.join(REPO, "bench", "results"), exist_ok=True)
    with open(os.path.join(REPO, "bench", "results", "store.json"), "w") as fh:
        json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
