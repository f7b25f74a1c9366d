"""Preprocessing's vocabulary lookup: the shipped hash index vs an index of Python bytes objects.

    .venv/bin/python bench/lookup_bench.py [--vocabulary 100000 3000000] [--tokens 1000000]

`VocabularyLookup` (components/embedding_preprocess/vocabulary.py) hashes tokens with numpy over
the Arrow data buffer and looks the hashes up in a pandas integer index, then checks each hit's
bytes; the baseline is the lookup it replaced: `pd.Index` of the tokens as Python bytes objects,
`get_indexer` on the batch's tokens converted to Python objects. Both run on the same vocabulary
(hex texts, as the scale benchmark's high-cardinality columns) and the same tokens (30% not in
the vocabulary), in batches of 4,096 as the transform pass calls them, each contender in a fresh
process. Reported: ns per token looked up, build seconds, and the memory the lookup holds (RSS
after the vocabulary's Python list is built, the lookup built and the list dropped, minus RSS
before). The IDs must be identical (checked). Results: bench/results/lookup.json.

    .venv/bin/python bench/lookup_bench.py --load [--vocabulary 3400000]

compares how a transform worker loads a vocabulary file into its lookup: the shipped
`read_vocabulary_tokens` (one Arrow array from the file's bytes) against reading it as a list of
Python bytes objects first (`read_vocabulary`, what the workers did before). Each in a fresh
process; reported: the peak RSS gained while loading, what stays held after the load, and the
seconds. Results: bench/results/lookup_load.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import gc, hashlib, json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np, pandas as pd, psutil, pyarrow as pa
from components.embedding_preprocess.vocabulary import VocabularyLookup

kind, size, n = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])


class ObjectIndexLookup:
    def __init__(self, tokens):
        self.size = len(tokens)
        self._index = pd.Index(list(tokens), dtype=object)

    def lookup(self, tokens):
        ids = self._index.get_indexer(tokens.to_numpy(zero_copy_only=False)).astype(np.int64)
        missing = np.flatnonzero(ids < 0)
        ids[missing] = self.size
        return ids, len(missing)


rng = np.random.default_rng(0)
proc = psutil.Process()
gc.collect()
before = proc.memory_info().rss
vocab = [b"%08x" % i for i in rng.permutation(1 << 28)[:size]]  # what read_vocabulary returns
t = time.perf_counter()
lookup = VocabularyLookup(vocab, 1) if kind == "hash" else ObjectIndexLookup(vocab)
build = time.perf_counter() - t
picks = rng.integers(0, int(size / 0.7), n)
queries = pa.array([vocab[i] if i < size else b"unseen%d" % i for i in picks], pa.binary())
del vocab
gc.collect()
held = proc.memory_info().rss - before - queries.nbytes
ids = []
t = time.perf_counter()
for k in range(0, n, 4096):
    ids.append(lookup.lookup(queries.slice(k, 4096))[0])
seconds = time.perf_counter() - t
digest = hashlib.sha256(np.concatenate(ids).tobytes()).hexdigest()
print(json.dumps({"ns_per_token": seconds / n * 1e9, "build_s": build, "held_mb": held / 1e6, "ids_sha256": digest}))
"""


LOAD_CHILD = r"""
import gc, json, resource, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np, pyarrow as pa
from components.embedding_preprocess import vocabulary

kind, directory = sys.argv[2], sys.argv[3]
from apache_beam.io.filesystems import FileSystems  # noqa: F401  (imported by the readers)
lookup = vocabulary.VocabularyLookup([b"warm"], 1)  # imports and first-call allocations before measuring
lookup.lookup(pa.array([b"warm"], pa.binary()))
gc.collect()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
before, peak_before = rss(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
t = time.perf_counter()
tokens = vocabulary.read_vocabulary_tokens(directory, "v") if kind == "arrow" else vocabulary.read_vocabulary(directory, "v")
lookup = vocabulary.VocabularyLookup(tokens, 1)
ids, _ = lookup.lookup(pa.array([b"%08x" % 5, b"unseen"], pa.binary()))  # builds the hash table
del tokens
gc.collect()
seconds = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"peak_gain_mb": (peak - max(before, peak_before)) / 1e6, "held_mb": (rss() - before) / 1e6,
                  "seconds": seconds, "size": lookup.size, "ids": ids.tolist()}))
"""


def load_main(sizes) -> int:
    import tempfile

    import numpy as np
    import pyarrow as pa

    sys.path.insert(0, REPO)
    from components.embedding_preprocess import vocabulary

    results = []
    print("| vocabulary | load | peak gained MB | held after MB | seconds |")
    print("|---|---|---|---|---|")
    for size in sizes:
        with tempfile.TemporaryDirectory() as d:
            tokens = pa.array([b"%08x" % i for i in np.random.default_rng(0).permutation(size)], pa.binary())
            vocabulary.write_vocabulary_arrays(d, "v", tokens, pa.array(np.ones(size, np.int64)))
            row = {"vocabulary": size}
            for kind in ("arrow", "list"):
                out = subprocess.run([sys.executable, "-c", LOAD_CHILD, REPO, kind, d],
                                     capture_output=True, text=True, check=True).stdout
                row[kind] = json.loads(out.strip().splitlines()[-1])
            if row["arrow"]["ids"] != row["list"]["ids"] or row["arrow"]["size"] != size:
                raise SystemExit(f"vocabulary {size}: the two loads gave different lookups")
        results.append(row)
        for kind, label in (("arrow", "one Arrow array (shipped)"), ("list", "list of bytes objects")):
            r = row[kind]
            print(f"| {size:,} | {label} | {r['peak_gain_mb']:,.0f} | {r['held_mb']:,.0f} | {r['seconds']:.2f} |")
    os.makedirs(os.path.join(REPO, "bench", "results"), exist_ok=True)
    with open(os.path.join(REPO, "bench", "results", "lookup_load.json"), "w") as fh:
        json.dump(results, fh, indent=2)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocabulary", type=int, nargs="+", default=[100_000, 3_000_000])
    ap.add_argument("--tokens", type=int, default=1_000_000)
    ap.add_argument("--load", action="store_true", help="compare how a vocabulary file is loaded instead")
    args = ap.parse_args()
    if args.load:
        return load_main(args.vocabulary)
    results = []
    print("| vocabulary | lookup | ns per token | build s | memory held MB |")
    print("|---|---|---|---|---|")
    for size in args.vocabulary:
        row = {"vocabulary": size, "tokens": args.tokens}
        for kind in ("hash", "object"):
            out = subprocess.run([sys.executable, "-c", CHILD, REPO, kind, str(size), str(args.tokens)],
                                 capture_output=True, text=True, check=True).stdout
            row[kind] = json.loads(out.strip().splitlines()[-1])
        if row["hash"]["ids_sha256"] != row["object"]["ids_sha256"]:
            raise SystemExit(f"vocabulary {size}: the two lookups gave different IDs")
        row["speedup"] = row["object"]["ns_per_token"] / row["hash"]["ns_per_token"]
        results.append(row)
        for kind, label in (("hash", "hash index (shipped)"), ("object", "index of bytes objects")):
            r = row[kind]
            print(f"| {size:,} | {label} | {r['ns_per_token']:,.0f} | {r['build_s']:.2f} | {r['held_mb']:,.0f} |")
        print(f"| {size:,} | speedup | {row['speedup']:.1f}x | | |")
    os.makedirs(os.path.join(REPO, "bench", "results"), exist_ok=True)
    with open(os.path.join(REPO, "bench", "results", "lookup.json"), "w") as fh:
        json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
