"""CPU per row of the data path's parts, in one process, without Beam: where the scale benchmark's
seconds go.

    .venv/bin/python bench/data_path_profile.py [--rows 1000000] [--profile example_gen|count|transform]

Reads what `bench/scale_bench.py --rows N` left under data/scale/ (run it first): the CSV, and
the pipeline output's ExampleGen Parquet files and vocabularies. Times, each over the same rows:
- ExampleGen: two byte ranges of 64 MB through `ReadAndWriteRange` (CSV parsing, typing, the split
  hash, Parquet writing), then the independent line count of the same ranges (`count_range_lines`);
- preprocessing's counting pass (`FeatureValueCounter.add`) over two train Parquet files;
- the transform (the seeded row shuffle, `transform_batch` and `batch_statistics`, the block encoding) over the same.
Prints microseconds per row for each, the faster of two runs. `--profile PART` adds cProfile's top functions for one part.
"""
from __future__ import annotations

import argparse
import cProfile
import glob
import os
import pstats
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--profile", choices=["example_gen", "count", "transform"])
    args = ap.parse_args()

    import pyarrow as pa
    import pyarrow.parquet as pq
    from tfx_bsl.coders import example_coder

    from components.config.loading import load_config
    from components.config.serialization import config_to_json
    from components.data_io.blocks import to_blocks
    from components.embedding_preprocess import transform as transform_lib
    from components.contracts import artifacts
    from components.embedding_preprocess import vocabulary
    from components.embedding_preprocess.batch_statistics import batch_statistics
    from components.embedding_preprocess.beam_pipeline import shuffled_rows
    from components.embedding_preprocess.counting import FeatureValueCounter
    from components.example_gen import beam_io, ranges, split_hash

    scale = os.path.join(REPO, "data", "scale")
    csv_path = os.path.join(scale, f"criteo_like_{args.rows}.csv")
    cfg = load_config(os.path.join(scale, f"scale_{args.rows}.yaml"))
    root = os.path.join(scale, f"out_{args.rows}", "pipeline_root")
    if not os.path.exists(csv_path) or not os.path.isdir(root):
        raise SystemExit(f"run `bench/scale_bench.py --rows {args.rows} --data-only` first ({csv_path}, {root})")

    # ExampleGen: two ranges of the CSV, read, typed, hashed and written
    rs = ranges.plan_ranges([(csv_path, os.path.getsize(csv_path))], 64 << 20)[:2]
    before = ranges.before_each_range([ranges.count_quotes(r) for r in rs])
    work = tempfile.mkdtemp(prefix="data-path-")
    dirs = {s: os.path.join(work, s) for s in ("train", "eval", "tmp")}
    for d in dirs.values():
        os.makedirs(d)
    fn = beam_io.ReadAndWriteRange(config_to_json(cfg), {"train": dirs["train"], "eval": dirs["eval"]},
                                   split_hash.bucket_bounds([4, 1]), dirs["tmp"], len(rs))
    fn.setup()
    csv_rows = [0]

    def example_gen():
        csv_rows[0] = sum(out["rows/parsed"] for r in rs for out in fn.process(r, before))

    def line_count():
        for r in rs:
            ranges.count_range_lines(r, before[r.key()][0])

    # Preprocessing: two Parquet files of the train split, with the run's vocabularies
    examples = sorted(glob.glob(os.path.join(root, "EmbeddingExampleGen", "examples", "*", "Split-train", "*.parquet")))[:2]
    table = pa.concat_tables([pq.read_table(f) for f in examples]).combine_chunks()
    batches = table.to_batches(max_chunksize=transform_lib.read_batch_rows(cfg.training.batch_size))
    vocabulary_dir = sorted(glob.glob(os.path.join(root, "EmbeddingPreprocess", "vocabulary", "*")))[-1]
    sizes = {t.name: len(vocabulary.read_vocabulary_tokens(vocabulary_dir, t.name)) for t in cfg.tables
             if os.path.exists(artifacts.vocabulary_file(vocabulary_dir, t.name))}
    lookups = transform_lib.load_lookups(cfg, vocabulary_dir, sizes)
    encoder = example_coder.RecordBatchToExamplesEncoder()

    def count():
        counter = FeatureValueCounter(cfg)
        for b in batches:
            counter.add(b)

    def transform():
        for b in batches:
            rb = shuffled_rows(b, cfg.training.seed)
            transformed = transform_lib.transform_batch(cfg, lookups, rb)
            batch_statistics(cfg, lookups, rb, transformed, "train")
            encoder.encode(to_blocks(cfg, transformed.batch, cfg.transformed_examples.block_rows))

    parts = {"example_gen": example_gen, "line_count": line_count, "count": count, "transform": transform}
    for name, f in parts.items():
        seconds = float("inf")
        for _ in range(2):  # the faster of two: the first also pays imports and first-use set-up
            start = time.perf_counter()
            f()
            seconds = min(seconds, time.perf_counter() - start)
        rows = csv_rows[0] if name in ("example_gen", "line_count") else table.num_rows
        print(f"{name:12s} {rows:9,d} rows {seconds:6.2f} s {seconds / rows * 1e6:6.2f} us/row", flush=True)
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        parts[args.profile]()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
