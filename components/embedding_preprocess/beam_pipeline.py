"""The preprocessing Beam pipeline: vocabularies, transformed examples and statistics.

Two passes over the data, on Arrow RecordBatches (tf.Examples decoded by tfx_bsl's C++ decoder,
or CSV byte ranges parsed by pyarrow, see csv_input.py), as a chain of named PTransforms:
1. Vocabularies, on the train split:
   `CountValues` (record batches -> each table's `CountSummary`: values counted per bundle with
   Arrow's hash counting, the bundle's counts spilled to files in `beam.value_count_buckets` hash
   buckets of values (spill.py), each bucket added up by one worker, features of a shared table
   summed there, and each bucket summarised: a histogram of its counts, its hottest values and
   the vocabulary's candidates; the bucket summaries are merged per table by
   `CombinePerKey(MergeSummariesFn)`, with hot-key fan-out when `beam.hot_key_fanout` > 1)
   -> `WriteVocabularies` (each vocabulary's candidates ordered with an Arrow sort, pruned and
   written, one file per vocabulary as tf.Transform's vocabulary analyzer also does).
   `FeatureValueStatistics` describes the own values of each feature of a shared table.
2. Transform (unless analysing only): `TransformSplit` maps every split, read again, through the
   vocabularies (read from the written files once per worker process; the side input only carries
   their sizes) into int64 IDs and filled float32 dense values, counted into the statistics on
   the way, and encodes them as tf.Examples: one per block of rows (`transformed_examples.format:
   blocks`, the default; the train split's rows shuffled within their batch first; see
   contracts.manifest) or one per row (`examples`); `WriteTransformedExamples` writes them as
   TFRecords (gzipped when `transformed_examples.compression: gzip`), whole blocks and the shorter
   last blocks in separate files.
Every statistics partial then goes through `MergeStatistics` and `WriteStatistics`.
The per-batch work is plain Arrow/numpy code without Beam (counting.py, transform.py).
Nothing here is runner-specific: `beam_pipeline_args` alone pick DirectRunner, Dataflow, Flink...
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import uuid
from typing import Any, Dict, Iterable, Iterator, List, NamedTuple, Optional, Tuple

import apache_beam as beam
from apache_beam import coders
from apache_beam.io import filebasedsink
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tfx_bsl.coders import example_coder

from components.reporting import progress
from components.rows import row_counts
from components.data_io import tfrecords
from components.config.loading import config_from_json
from components.config.schema import PipelineConfig, VocabularyOptions
from components.config.choices import FORMAT_BLOCKS
from components.contracts.manifest import TAIL_PREFIX, TRANSFORMED_PREFIX
from components.embedding_preprocess import partials as partials_lib
from components.embedding_preprocess import spill
from components.embedding_preprocess import statistics
from components.embedding_preprocess import vocabulary
from components.embedding_preprocess.counting import (
    CountSummary, FeatureValueCounter, RunningCounts, ValueCounts, shared_table_features, value_buckets,
)
from components.embedding_preprocess.csv_input import ReadCsvRecordBatches, read_header

from components.embedding_preprocess.batch_statistics import batch_statistics
from components.data_io.blocks import to_blocks
from components.embedding_preprocess.transform import load_lookups, read_batch_rows, transform_batch
from components.config.choices import Compression, InputFormat, VocabularyKind

STATS_FILE_PREFIX = "_partial_statistics"
COUNTING = "counting values"  # live progress: the vocabulary pass's rows (components/reporting/progress.py)


def transforming(split: str) -> str:
    """Live progress: the transform pass's rows of `split`."""
    return f"transforming {split}"

# Elements: a feature's or a table's summarised value counts, keyed by its name.
KeyedSummary = Tuple[str, CountSummary]
StatisticsPartial = Dict[str, Any]


# ---- sink ----------------------------------------------------------------------------------------


class FramedTFRecordSink(filebasedsink.FileBasedSink):
    """A TFRecord sink whose elements are blocks of already framed records (see `tfrecords.frame`).

    Beam's FileBasedSink does the sharding, temporary files and the final rename, as for
    `WriteToTFRecord`, but each temporary file is named by its first block (`FirstBlockNamedWriter`),
    so that the final shard numbers follow the data; the compression follows the suffix (`.gz`: gzip)."""

    def __init__(self, file_path_prefix: str, file_name_suffix: str = "", max_elements_per_file: Optional[int] = None):
        super().__init__(
            file_path_prefix=file_path_prefix,
            coder=coders.BytesCoder(),
            file_name_suffix=file_name_suffix,
            mime_type="application/octet-stream",
            # Beam's own roll-over: a bundle's writer closes its file after this many elements and
            # opens the next; finalize_write renames them all (shards of one -NNNNN-of-NNNNN set).
            max_records_per_shard=max_elements_per_file,
        )

    def write_encoded_record(self, file_handle, value: bytes) -> None:
        file_handle.write(value)

    def open_writer(self, init_result: str, uid: str) -> "FirstBlockNamedWriter":
        # Beam's own writer names its file by `uid` (a uuid4) and finalize_write numbers the shards
        # in the sorted order of those names: the same rows landed in other shard numbers in every
        # run, and the trainer reads the files in name order. Here a file is named by its first
        # block, and the run's shard numbers follow the data. The suffix is Beam's open_writer's.
        suffix = "." + os.path.basename(self.file_path_prefix.get()) + self.file_name_suffix.get()
        return FirstBlockNamedWriter(self, init_result, uid, suffix)


def block_order_key(block: bytes) -> str:
    """A digest of the first record of a block of framed tf.Examples that does not depend on how
    its encoder ordered the features: tfx_bsl's encoder writes an Example's feature map in an order
    that differs between processes, so the record's bytes do; tfx_bsl's decoder gives the same
    columns in the same order whatever the order of the map's entries.

    Args:
      block: framed TFRecords (`tfrecords.frame`), at least one.

    Returns:
      40 hex digits (SHA-1 of the first record's decoded columns in Arrow's IPC format)."""
    rb = example_coder.ExamplesToRecordBatchDecoder().DecodeBatch([next(row_counts.tfrecord_payloads(io.BytesIO(block)))])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rb.schema) as stream:
        stream.write_batch(rb)
    return hashlib.sha1(sink.getvalue().to_pybytes()).hexdigest()


class FirstBlockNamedWriter(filebasedsink.FileBasedSinkWriter):
    """`FileBasedSinkWriter` whose temporary file, opened at its first block, is named
    `<block_order_key>-<uid>`: finalize_write's sorted names, hence the final shard numbers, follow
    each file's first block, as reproducible as the blocks each bundle holds (the local runner's are,
    with one worker or several processes; a runner that splits bundles dynamically, as Dataflow
    does, may cut them elsewhere in another run). Two files whose first blocks are equal keep the
    uids' order."""

    def __init__(self, sink: FramedTFRecordSink, directory: str, uid: str, suffix: str):  # pylint: disable=super-init-not-called
        # Beam's __init__ opens the file: it runs at the first block (`_open`), which names it
        self.sink, self.temp_handle, self.num_records_written = sink, None, 0
        self._directory, self._uid, self._suffix = directory, uid, suffix

    def _open(self, name: str) -> None:
        super().__init__(self.sink, FileSystems.join(self._directory, name) + self._suffix)

    def write(self, value: bytes) -> None:
        if self.temp_handle is None:
            self._open(f"{block_order_key(value)}-{self._uid}")
        super().write(value)

    def close(self) -> str:
        if self.temp_handle is None:  # nothing written: an empty file, as Beam's writer leaves
            self._open(self._uid)
        return super().close()


# ---- CombineFns --------------------------------------------------------------------------------


class MergeSummariesFn(beam.CombineFn):
    """Merges the `CountSummary`s of one table's (or feature's) spill buckets; lifted by Beam.

    The accumulator is the list of summaries so far, merged into one whenever it holds more than
    eight (each merge re-orders the candidates, a vocabulary's size)."""

    def create_accumulator(self) -> List[CountSummary]:
        return []

    def add_input(self, acc: List[CountSummary], summary: CountSummary) -> List[CountSummary]:
        acc.append(summary)
        return [CountSummary.merge(acc)] if len(acc) > 8 else acc

    def merge_accumulators(self, accumulators: Iterable[List[CountSummary]]) -> List[CountSummary]:
        merged = [s for acc in accumulators for s in acc]
        return [CountSummary.merge(merged)] if len(merged) > 1 else merged

    def extract_output(self, acc: List[CountSummary]) -> Optional[CountSummary]:
        return CountSummary.merge(acc) if acc else None


class MergeStatsFn(beam.CombineFn):
    """Merges statistics partials (see `statistics.StatisticsAccumulator` for the rules)."""

    def create_accumulator(self) -> statistics.StatisticsAccumulator:
        return statistics.StatisticsAccumulator()

    def add_input(self, acc: statistics.StatisticsAccumulator, partial: StatisticsPartial) -> statistics.StatisticsAccumulator:
        return acc.add(partial)

    def merge_accumulators(self, accumulators: Iterable[statistics.StatisticsAccumulator]) -> statistics.StatisticsAccumulator:
        accumulators = iter(accumulators)
        first = next(accumulators, None)
        return (first if first is not None else self.create_accumulator()).merge(accumulators)

    def compact(self, acc: statistics.StatisticsAccumulator) -> statistics.StatisticsAccumulator:
        """What a worker sends on (Beam calls it on a lifted combine's accumulators): its sketches
        compacted to a bounded size (statistics.compact_sketches)."""
        return statistics.StatisticsAccumulator(statistics.compact_sketches(acc.values))

    def extract_output(self, acc: statistics.StatisticsAccumulator) -> StatisticsPartial:
        return acc.values


# ---- DoFns and element functions ----------------------------------------------------------------


class _DecodeExamples(beam.DoFn):
    """Batches of serialized tf.Examples -> Arrow RecordBatches (schema inferred per batch)."""

    def __init__(self, file_pattern: str = ""):
        super().__init__()
        self._file_pattern = file_pattern

    def setup(self):
        self._decoder = example_coder.ExamplesToRecordBatchDecoder()

    def process(self, batch: List[bytes]) -> Iterator[pa.RecordBatch]:
        try:
            rb = self._decoder.DecodeBatch(batch)
        except RuntimeError as e:  # tfx_bsl's: a feature of two types among the batch's examples
            raise ValueError(
                f"tf.Examples at {self._file_pattern}: {str(e).replace('INVALID_ARGUMENT: ', '')}; a column "
                "must hold one type (bytes, int64 or float) in every example"
            ) from None
        yield rb


class _CountPerBundle(beam.DoFn):
    """Counts each feature's values over a bundle, then spills them: one file per hash bucket of
    values holding every feature's counts in that bucket (spill.py), and one (bucket, SpillRef)
    element per file. Only those references cross the shuffle. A bundle whose counts grow past
    `SPILL_VALUES` distinct values (plus buffered tokens) spills them there and goes on counting
    from nothing: the local runner gives each worker one bundle per split, so without this a
    worker would hold half of the split's distinct values."""

    SPILL_VALUES = 2_000_000

    def __init__(self, config_json: str, spill_dir: str, count_rows: bool = False):
        self._config_json = config_json
        self._spill_dir = spill_dir
        self._count_rows = count_rows  # analysis only: no transform pass counts the rows

    def setup(self):
        self._cfg = config_from_json(self._config_json)

    def start_bundle(self):
        self._counter = FeatureValueCounter(self._cfg)
        self._refs: List[Tuple[int, spill.SpillRef]] = []

    def process(self, rb: pa.RecordBatch) -> None:
        self._counter.add(rb)
        progress.count(progress.PREPROCESS, COUNTING, rb.num_rows)
        if self._counter.held() > self.SPILL_VALUES:
            self._spill()

    def _spill(self) -> None:
        buckets = self._cfg.beam.value_count_buckets
        parts: Dict[int, List[Tuple[str, ValueCounts]]] = {}
        for feature, counts in sorted(self._counter.take().items()):
            bucket = value_buckets(counts.values, buckets)
            order = np.argsort(bucket, kind="stable")
            values, cnts = counts.values.take(pa.array(order)), counts.counts.take(pa.array(order))
            bounds = np.searchsorted(bucket[order], np.arange(buckets + 1))
            for b in range(buckets):
                lo, hi = int(bounds[b]), int(bounds[b + 1])
                if hi > lo:
                    parts.setdefault(b, []).append((feature, ValueCounts(values.slice(lo, hi - lo), cnts.slice(lo, hi - lo))))
        for b, bucket_parts in sorted(parts.items()):
            self._refs.append((b, spill.write(spill.spill_path(self._spill_dir, b), bucket_parts)))

    def finish_bundle(self):
        self._spill()
        for ref in self._refs:
            yield WindowedValue(ref, MIN_TIMESTAMP, [GlobalWindow()])
        if self._count_rows:
            rows = self._counter.rows.as_statistics("train")
            yield beam.pvalue.TaggedOutput("rows", WindowedValue(rows, MIN_TIMESTAMP, [GlobalWindow()]))


class _SummarizeBucket(beam.DoFn):
    """(bucket, its spill references) -> (table, CountSummary) of the bucket's values of each
    table (its features' counts added up), and, tagged `features`, (feature, CountSummary) of each
    feature of a shared table. Memory: the bucket's distinct values (`RunningCounts`)."""

    def __init__(self, config_json: str, vocabulary_dir: str):
        self._config_json = config_json
        self._vocabulary_dir = vocabulary_dir

    def setup(self):
        cfg = config_from_json(self._config_json)
        self._top_values = cfg.statistics.top_values
        self._tables = {t.name: t.vocabulary for t in cfg.tables}
        self._features_of: Dict[str, List[str]] = {}
        for f in cfg.categorical_features:
            self._features_of.setdefault(cfg.feature_table(f).name, []).append(f.name)
        self._shared = set(shared_table_features(cfg))
        self._given = {  # written into the vocabulary directory before the pipeline (run.py)
            name: vocabulary.read_vocabulary_tokens(self._vocabulary_dir, name)
            for name, options in self._tables.items() if options.kind in vocabulary.GIVEN_KINDS
        }

    def process(self, item: Tuple[int, Iterable[spill.SpillRef]]):
        _, refs = item
        running: Dict[str, RunningCounts] = {}
        for ref in sorted(refs):  # by file name, not by arrival (summed weights may differ in the last bit between runs)
            for feature, counts in spill.read(ref):
                running.setdefault(feature, RunningCounts()).add(counts)
        counted = {f: r.result() for f, r in running.items()}
        for table, features in sorted(self._features_of.items()):
            parts = [counted[f] for f in features if counted.get(f) is not None]
            if not parts:
                continue
            yield table, CountSummary.of(ValueCounts.sum(parts), self._top_values, self._tables[table],
                                         self._given.get(table))
            for f in features:
                if f in self._shared and counted.get(f) is not None:
                    yield beam.pvalue.TaggedOutput("features", (f, CountSummary.of(counted[f], self._top_values)))


def _write_vocabulary(item: KeyedSummary, out_dir: str, options_json: str):
    name, summary = item
    options = VocabularyOptions(**json.loads(options_json)[name])
    covered = None
    if options.kind in vocabulary.GIVEN_KINDS:  # list / file (written before the pipeline): its lines, with the counts seen
        given_tokens = vocabulary.read_vocabulary_tokens(out_dir, name)
        occurring = summary.candidates  # the given tokens that occur, with their counts
        where = pc.index_in(given_tokens, value_set=occurring.values)
        seen = pc.fill_null(pc.take(occurring.counts, where), 0)
        vocabulary.write_vocabulary_arrays(out_dir, name, given_tokens, pc.cast(seen, occurring.counts.type))
        kept = len(given_tokens)
        covered = pc.sum(seen).as_py() or 0
    elif options.kind in (VocabularyKind.HASHED, VocabularyKind.IDENTITY):  # no vocabulary (V3, V4): empty files
        vocabulary.write_vocabulary_arrays(out_dir, name, summary.top.values.slice(0, 0), summary.top.counts.slice(0, 0))
        kept = 0
        # identity: the occurrences that are IDs of the table; hashed: every token has a row
        covered = summary.covered if options.kind == VocabularyKind.IDENTITY else summary.histogram.occurrences()
    else:
        tokens, counts = vocabulary.order_arrays(summary.candidates.values, summary.candidates.counts)
        kept = vocabulary.prune(counts, options)
        vocabulary.write_vocabulary_arrays(out_dir, name, tokens.slice(0, kept), counts.slice(0, kept))
    yield name, kept  # the transform pass reads the files; this only says they are written
    yield beam.pvalue.TaggedOutput(
        "stats", statistics.vocabulary_stats(name, summary.histogram, kept, summary.top_pairs(), covered)
    )


def _feature_value_stats(item: KeyedSummary) -> Iterator[StatisticsPartial]:
    """Coverage, hottest values and skew of one feature of a shared table, on its own values."""
    name, summary = item
    yield statistics.feature_value_stats(name, summary.histogram, summary.top_pairs())


class _TransformBatch(beam.DoFn):
    """One RecordBatch -> its transformed tf.Examples as one block of framed TFRecords; the batches'
    statistics partials are merged over the bundle and come out once per bundle (tagged `stats`):
    one partial per batch (about 100 KB with per-shard loads) crossed the local runner's data plane
    and stayed in its memory, about 0.3 GB at 20M rows."""

    def __init__(self, config_json: str, split: str, vocabulary_dir: str, run_id: str):
        self._config_json = config_json
        self._split = split
        self._vocabulary_dir = vocabulary_dir
        self._run_id = run_id

    def setup(self):
        self._cfg = config_from_json(self._config_json)
        self._encoder = example_coder.RecordBatchToExamplesEncoder()
        self._lookups: Optional[Dict[str, vocabulary.VocabularyLookup]] = None

    def start_bundle(self):
        self._stats = statistics.StatisticsAccumulator()

    def finish_bundle(self):
        if self._stats.values:  # a bundle with batches (each partial counts its rows read)
            yield beam.pvalue.TaggedOutput("stats", WindowedValue(self._stats.values, MIN_TIMESTAMP, [GlobalWindow()]))

    def process(self, rb: pa.RecordBatch, vocabulary_sizes: Dict[str, int]):
        if self._lookups is None:
            self._lookups = load_lookups(self._cfg, self._vocabulary_dir, vocabulary_sizes, self._run_id)
        if self._split == "train":
            rb = shuffled_rows(rb, self._cfg.training.seed)
        transformed = transform_batch(self._cfg, self._lookups, rb)
        stats = batch_statistics(self._cfg, self._lookups, rb, transformed, self._split)
        out = transformed.batch
        progress.count(progress.PREPROCESS, transforming(self._split), rb.num_rows)
        if out is not None:
            t = self._cfg.transformed_examples
            if t.format != FORMAT_BLOCKS:
                yield tfrecords.frame(self._encoder.encode(out))  # one element per batch, see tfrecords.py
            else:
                records = self._encoder.encode(to_blocks(self._cfg, out, t.block_rows))
                full = out.num_rows // t.block_rows
                if full:
                    yield tfrecords.frame(records[:full])
                if len(records) > full:  # the shorter last block (see contracts.manifest)
                    yield beam.pvalue.TaggedOutput("tail", tfrecords.frame(records[full:]))
        self._stats.add(stats)


def shuffled_rows(rb: pa.RecordBatch, seed: int) -> pa.RecordBatch:
    """`rb`'s rows in an order drawn from `seed` and the row count alone (the same in every run and
    on every worker). The input keeps its files' row order (often by time or by user) and the
    trainer shuffles blocks of rows, not rows: mixing each batch's rows here makes every block a
    sample of its batch instead of a run of neighbouring rows. The batch and shard statistics are
    computed on this order, the one training reads."""
    order = np.random.default_rng([seed, rb.num_rows]).permutation(rb.num_rows)
    return rb.take(pa.array(order))


# ---- PTransforms -------------------------------------------------------------------------------


class ReadRecordBatches(beam.PTransform):
    """PBegin -> RecordBatches of the tf.Examples in TFRecord files `file_pattern`
    (`read_batch_rows(batch_size)` rows each, a whole number of training batches)."""

    def __init__(self, file_pattern: str, batch_size: int):
        super().__init__()
        self._file_pattern = file_pattern
        self._rows = read_batch_rows(batch_size)

    def expand(self, pbegin):
        return (
            pbegin
            | "Read" >> beam.io.ReadFromTFRecord(self._file_pattern)
            | "Batch" >> beam.BatchElements(min_batch_size=self._rows, max_batch_size=self._rows)
            | "Decode" >> beam.ParDo(_DecodeExamples(self._file_pattern))
        )


def _record_batches(table: pa.Table, rows: int) -> Iterator[pa.RecordBatch]:
    for rb in table.combine_chunks().to_batches(max_chunksize=rows):
        if rb.num_rows:
            yield rb


class ReadParquetRecordBatches(ReadRecordBatches):
    """PBegin -> RecordBatches of the Parquet files `file_pattern` (as ExampleGen writes them: list
    columns), `read_batch_rows(batch_size)` rows each at most. Beam's Parquet source splits the files
    by row group, so one big file is read by several workers; no row is decoded from a protobuf."""

    def expand(self, pbegin):
        return (
            pbegin
            | "Read" >> beam.io.ReadFromParquetBatched(self._file_pattern)
            | "Batches" >> beam.FlatMap(_record_batches, self._rows)
        )


class CountedValues(NamedTuple):
    """`CountValues`' outputs."""

    tables: beam.PCollection  # (table, CountSummary), one per table with any value
    features: beam.PCollection  # (feature, CountSummary), one per feature of a shared table with any value
    rows: beam.PCollection  # statistics partials of the rows read (only with count_rows)


class CountValues(beam.PTransform):
    """RecordBatches -> `CountedValues`: each table's value counts over all the labelled rows,
    summarised (`CountSummary`: count histogram, hottest values, the vocabulary's candidates), and
    the same for each feature of a shared table on its own values.

    Counted per bundle and spilled to `spill_dir` in `beam.value_count_buckets` hash buckets of
    values; each bucket is added up by one worker (`_SummarizeBucket`), then the buckets'
    summaries are merged per key (`MergeSummariesFn`, lifted; with `hot_key_fanout` > 1 spread over
    that many intermediate keys first). No worker holds more than one bucket's distinct values, and
    the shuffle carries file references and summaries, not counts. The caller deletes `spill_dir`
    once the pipeline finished (run.py). Given vocabularies (list, file) are read from
    `vocabulary_dir`. With `count_rows`, `rows` also carries the rows read and dropped (analysis
    only, where no transform pass counts them); else it is empty."""

    def __init__(self, cfg: PipelineConfig, spill_dir: str, vocabulary_dir: str, count_rows: bool = False):
        super().__init__()
        self._config_json = cfg.to_json()
        self._spill_dir = spill_dir
        self._vocabulary_dir = vocabulary_dir
        self._count_rows = count_rows
        self._fanout = cfg.beam.hot_key_fanout

    def _merge(self):
        combine = beam.CombinePerKey(MergeSummariesFn())
        return combine.with_hot_key_fanout(self._fanout) if self._fanout > 1 else combine

    def expand(self, batches) -> CountedValues:
        spilled = batches | "CountPerBundle" >> beam.ParDo(
            _CountPerBundle(self._config_json, self._spill_dir, self._count_rows)
        ).with_outputs("rows", main="refs")
        buckets = (
            spilled.refs
            | "GroupBuckets" >> beam.GroupByKey()
            | "SummarizeBuckets" >> beam.ParDo(
                _SummarizeBucket(self._config_json, self._vocabulary_dir)
            ).with_outputs("features", main="tables")
        )
        return CountedValues(
            tables=buckets.tables | "MergePerTable" >> self._merge(),
            features=buckets.features | "MergePerFeature" >> self._merge(),
            rows=spilled.rows,
        )


class FeatureValueStatistics(beam.PTransform):
    """(feature, CountSummary) of the features of shared tables -> statistics partials
    (`partials.feature_values_info(feature)`) of their own values (a feature with a table of its own
    is described by its vocabulary's statistics)."""

    def expand(self, feature_summaries):
        return feature_summaries | "Describe" >> beam.FlatMap(_feature_value_stats)


class WrittenVocabularies(NamedTuple):
    """`WriteVocabularies`' outputs."""

    sizes: beam.PCollection  # (table, tokens written), one per vocabulary written
    stats: beam.PCollection  # statistics partials `partials.vocabulary_info(table)`


class WriteVocabularies(beam.PTransform):
    """(table, CountSummary) per table -> `WrittenVocabularies`: each table's vocabulary ordered
    (count descending, then bytes), pruned by its `vocabulary` options and written to
    `vocabulary_dir` (`<table>.txt`, `<table>.counts.txt`); its size and its statistics (distinct
    values, coverage, hottest values, skew; on every value, before pruning) come out."""

    def __init__(self, cfg: PipelineConfig, vocabulary_dir: str):
        super().__init__()
        self._vocabulary_dir = vocabulary_dir
        self._options_json = json.dumps({t.name: t.vocabulary.__dict__ for t in cfg.tables})

    def expand(self, table_summaries) -> WrittenVocabularies:
        written = table_summaries | "Write" >> beam.FlatMap(
            _write_vocabulary, self._vocabulary_dir, self._options_json
        ).with_outputs("stats", main="sizes")
        return WrittenVocabularies(sizes=written.sizes, stats=written.stats)


class TransformedSplit(NamedTuple):
    """`TransformSplit`'s outputs."""

    examples: beam.PCollection  # bytes: blocks of framed TFRecords of transformed tf.Examples
    stats: beam.PCollection  # statistics partials of the split, one per bundle (its batches merged)
    tail: beam.PCollection  # bytes: framed shorter last blocks of rows (blocks format only)


class TransformSplit(beam.PTransform):
    """RecordBatches of one split -> `TransformedSplit`: the labelled rows as tf.Examples of int64
    embedding IDs and float32 dense values (`transform.transform_batch`), one block of framed
    TFRecords per batch, plus the statistics (merged per bundle: rows read and dropped, presence, OOV,
    invalid values; on the train split also per-batch and per-shard ID counts).

    `vocabulary_sizes` is the (table, size) output of `WriteVocabularies`: the vocabularies are read
    from `vocabulary_dir` once per worker process (keyed by `run_id`) and checked against these sizes."""

    def __init__(
        self, cfg: PipelineConfig, split: str, vocabulary_dir: str, vocabulary_sizes, run_id: Optional[str] = None
    ):
        super().__init__()
        self._config_json = cfg.to_json()
        self._split = split
        self._vocabulary_dir = vocabulary_dir
        self._vocabulary_sizes = vocabulary_sizes
        self._run_id = run_id or uuid.uuid4().hex

    def expand(self, batches) -> TransformedSplit:
        result = batches | "Transform" >> beam.ParDo(
            _TransformBatch(self._config_json, self._split, self._vocabulary_dir, self._run_id),
            beam.pvalue.AsDict(self._vocabulary_sizes),
        ).with_outputs("stats", "tail", main="examples")
        return TransformedSplit(examples=result.examples, stats=result.stats, tail=result.tail)


class WriteTransformedExamples(beam.PTransform):
    """Blocks of framed TFRecords -> `<directory>/<prefix>-*` files (`.gz` with gzip), at most
    `elements_per_file` elements (read batches) a file when set: the train split's files are the
    units the trainer reads in a new order each epoch, so a file must hold a short stretch of a
    time-ordered input, not a worker's whole share of it."""

    def __init__(self, directory: str, compression: str, prefix: str = TRANSFORMED_PREFIX,
                 elements_per_file: Optional[int] = None):
        super().__init__()
        self._prefix = os.path.join(directory, prefix)
        self._suffix = ".gz" if compression == Compression.GZIP else ""
        self._elements_per_file = elements_per_file

    def expand(self, blocks):
        return blocks | "Write" >> beam.io.Write(
            FramedTFRecordSink(self._prefix, file_name_suffix=self._suffix,
                               max_elements_per_file=self._elements_per_file)
        )


def elements_per_file(cfg: PipelineConfig) -> Optional[int]:
    """The read batches (one element of the transform's output each) per transformed file:
    `transformed_examples.rows_per_file` in whole read batches, at least one; None when it is 0.

    Args:
      cfg: the pipeline configuration.

    Returns:
      The elements per file, or None (the runner decides: one file per bundle).
    """
    rows = cfg.transformed_examples.rows_per_file
    if not rows:
        return None
    return max(1, rows // read_batch_rows(cfg.training.batch_size))


def count_written_rows(path: str, split: str, block_label: Optional[str],
                       block_rows: Optional[int] = None) -> StatisticsPartial:
    """One written file of transformed examples read back: its rows (with `block_label`, the rows of
    its blocks; with `block_rows` too, its blocks times `block_rows`) as a statistics partial for
    the ledger (`row_counts.count_written_file`). Raises, naming the file, when it ends inside a
    record."""
    return {partials_lib.written_rows(split): row_counts.count_written_file(path, progress.PREPROCESS, block_label, block_rows),
            partials_lib.written_files(split): 1}


class CountWrittenRows(beam.PTransform):
    """Final file names of a split's writes -> one statistics partial per file: the rows read back
    from it (`count_written_rows`), spread over the workers. The writes' final names come out only
    after they finished (Beam's `Write` yields them from its finalize step), so this reads what a
    later stage will read; the launcher then checks that the split's directory holds no other file
    (run.build_ledger). `block_rows`: every block of these files holds that many rows (the
    whole-block files; their framing is walked and the first block decoded)."""

    def __init__(self, split: str, block_label: Optional[str], block_rows: Optional[int] = None):
        super().__init__()
        self._split = split
        self._block_label = block_label
        self._block_rows = block_rows

    def expand(self, file_names):
        return (
            file_names
            | "SpreadFiles" >> beam.Reshuffle()
            | "CountRows" >> beam.Map(count_written_rows, self._split, self._block_label, self._block_rows)
        )


class MergeStatistics(beam.PTransform):
    """Statistics partials -> one merged partial (`MergeStatsFn`; `{}` when there is none)."""

    def expand(self, partials):
        return partials | "Merge" >> beam.CombineGlobally(MergeStatsFn())


class WriteStatistics(beam.PTransform):
    """The merged statistics partial -> `<stats_dir>/_partial_statistics` as sorted-key JSON."""

    def __init__(self, stats_dir: str):
        super().__init__()
        self._path = os.path.join(stats_dir, STATS_FILE_PREFIX)

    def expand(self, merged):
        return (
            merged
            | "ToJson" >> beam.Map(lambda s: json.dumps(statistics.jsonable(s), sort_keys=True))
            | "Write" >> beam.io.WriteToText(self._path, shard_name_template="")
        )


def spill_dir_of(stats_dir: str) -> str:
    """Where the vocabulary pass spills its counts: a temporary folder of the statistics output."""
    return os.path.join(stats_dir, "_value_counts")


def read_source(
    pipeline: beam.Pipeline, cfg: PipelineConfig, label: str, pattern: str, input_format: str
) -> Tuple[beam.PCollection, Optional[beam.PCollection]]:
    """RecordBatches of one input, plus statistics partials of the input itself (CSV only)."""
    if input_format == InputFormat.TFRECORD:
        return pipeline | label >> ReadRecordBatches(pattern, cfg.training.batch_size), None
    if input_format == InputFormat.PARQUET:
        return pipeline | label >> ReadParquetRecordBatches(pattern, cfg.training.batch_size), None
    return pipeline | label >> ReadCsvRecordBatches(pattern, read_header(pattern), cfg)


def build_pipeline(
    pipeline: beam.Pipeline,
    cfg: PipelineConfig,
    split_patterns: Dict[str, str],
    vocabulary_dir: str,
    transformed_dirs: Optional[Dict[str, str]],
    stats_dir: str,
    input_format: str = "tfrecord",
    spill_dir: Optional[str] = None,
) -> None:
    """Adds the preprocessing transforms to `pipeline`. The vocabulary is computed on 'train'.

    `spill_dir` (default `spill_dir_of(stats_dir)`) holds the vocabulary pass's spill files; the
    caller deletes it once the pipeline finished (`spill.delete`).

    `input_format` is `parquet` (as this project's ExampleGen writes), `tfrecord` (tf.Examples, as
    TFX's own ExampleGens write) or `csv` (the CLI).
    `transformed_dirs=None` analyses only: vocabularies and their statistics, no transform pass."""
    # The train split is read twice (to count, then to transform) rather than shared: a shared
    # PCollection with a side-input consumer is held whole in the local runner's memory.
    analyze_only = transformed_dirs is None
    train, train_input_stats = read_source(pipeline, cfg, "ReadForVocabulary", split_patterns["train"], input_format)
    input_stats = [train_input_stats] if analyze_only and train_input_stats is not None else []
    counted = train | "CountValues" >> CountValues(cfg, spill_dir or spill_dir_of(stats_dir), vocabulary_dir,
                                                   count_rows=analyze_only)
    vocabularies = counted.tables | "WriteVocabularies" >> WriteVocabularies(cfg, vocabulary_dir)
    feature_value_stats = counted.features | "SharedFeatureValueStats" >> FeatureValueStatistics()
    run_id = uuid.uuid4().hex
    partial_stats = [vocabularies.stats, counted.rows, feature_value_stats]
    for split, pattern in split_patterns.items() if not analyze_only else []:
        rbs, stats = read_source(pipeline, cfg, f"ReadForTransform[{split}]", pattern, input_format)
        if stats is not None:
            input_stats.append(stats)
        transformed = rbs | f"Transform[{split}]" >> TransformSplit(
            cfg, split, vocabulary_dir, vocabularies.sizes, run_id
        )
        files = transformed.examples | f"Write[{split}]" >> WriteTransformedExamples(
            transformed_dirs[split], cfg.transformed_examples.compression, elements_per_file=elements_per_file(cfg)
        )
        if cfg.transformed_examples.format == FORMAT_BLOCKS:
            # Blocks hold several rows. The whole-block files: their blocks times block_rows (the
            # first block checked); the last blocks of the batches (tail files): their labels, one per row.
            tails = transformed.tail | f"WriteTail[{split}]" >> WriteTransformedExamples(
                transformed_dirs[split], cfg.transformed_examples.compression, TAIL_PREFIX
            )
            written = [
                files | f"CountWritten[{split}]" >> CountWrittenRows(split, cfg.label, cfg.transformed_examples.block_rows),
                tails | f"CountWrittenTail[{split}]" >> CountWrittenRows(split, cfg.label),
            ] | f"WrittenCounts[{split}]" >> beam.Flatten()
        else:
            written = files | f"CountWritten[{split}]" >> CountWrittenRows(split, None)
        partial_stats += [transformed.stats, written]
    partial_stats += input_stats
    _ = (
        partial_stats
        | "FlattenStats" >> beam.Flatten()
        | "MergeStatistics" >> MergeStatistics()
        | "WriteStatistics" >> WriteStatistics(stats_dir)
    )
