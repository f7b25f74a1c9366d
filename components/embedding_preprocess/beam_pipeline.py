"""The preprocessing Beam pipeline: vocabularies, transformed examples and statistics.

Two passes over the data, on Arrow RecordBatches (tf.Examples decoded by tfx_bsl's C++ decoder,
or CSV byte ranges parsed by pyarrow, see csv_input.py), as a chain of named PTransforms:
1. Vocabularies, on the train split:
   `CountValues` (record batches -> each feature's value counts: counted per bundle with Arrow's
   hash counting before anything is shuffled, then added up by `CombinePerKey(MergeCountsFn)`,
   lifted by Beam before the shuffle, with hot-key fan-out when `beam.hot_key_fanout` > 1)
   -> `SumPerTable` (features of a shared table added up into the table's counts)
   -> `WriteVocabularies` (each vocabulary ordered with an Arrow sort, pruned and written, one file
   per vocabulary as tf.Transform's vocabulary analyzer also does).
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

import json
import os
import uuid
from typing import Any, Dict, Iterable, Iterator, List, NamedTuple, Optional, Tuple

import apache_beam as beam
from apache_beam.io import filebasedsink
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from components import tfrecords
from components.config import PipelineConfig
from components.contracts.manifest import FORMAT_BLOCKS, TAIL_PREFIX, TRANSFORMED_PREFIX
from components.embedding_preprocess import statistics as S
from components.embedding_preprocess import vocabulary as V
from components.embedding_preprocess.counting import (
    FeatureValueCounter, ValueCounts, ValueCountsAccumulator, shared_table_features,
)
from components.embedding_preprocess.csv_input import ReadCsvRecordBatches, read_header

# Beam-free names that used to live here (bench/export_bench.py and older callers import them from here).
from components.embedding_preprocess.transform import (  # noqa: F401  (re-exported)
    load_lookups, make_lookups, read_batch_rows, to_blocks, transform_record_batch,
)

STATS_FILE_PREFIX = "_partial_statistics"

# Elements: a feature's or a table's value counts, keyed by its name.
KeyedCounts = Tuple[str, ValueCounts]
StatisticsPartial = Dict[str, Any]


# ---- sink ----------------------------------------------------------------------------------------


class FramedTFRecordSink(filebasedsink.FileBasedSink):
    """A TFRecord sink whose elements are blocks of already framed records (see `tfrecords.frame`).

    Beam's FileBasedSink does the sharding, temporary files and the final rename, exactly as for
    `WriteToTFRecord`; the compression follows the suffix (`.gz`: gzip)."""

    def __init__(self, file_path_prefix: str, file_name_suffix: str = ""):
        from apache_beam import coders

        super().__init__(
            file_path_prefix=file_path_prefix,
            coder=coders.BytesCoder(),
            file_name_suffix=file_name_suffix,
            mime_type="application/octet-stream",
        )

    def write_encoded_record(self, file_handle, value: bytes) -> None:
        file_handle.write(value)


# ---- CombineFns --------------------------------------------------------------------------------


class MergeCountsFn(beam.CombineFn):
    """Adds the `ValueCounts` partials of one feature or table; lifted before the shuffle by Beam."""

    def create_accumulator(self) -> ValueCountsAccumulator:
        return ValueCountsAccumulator()

    def add_input(self, acc: ValueCountsAccumulator, part: ValueCounts) -> ValueCountsAccumulator:
        return acc.add(part)

    def merge_accumulators(self, accumulators: Iterable[ValueCountsAccumulator]) -> ValueCountsAccumulator:
        accumulators = iter(accumulators)
        first = next(accumulators, None)
        return (first if first is not None else self.create_accumulator()).merge(accumulators)

    def extract_output(self, acc: ValueCountsAccumulator) -> Optional[ValueCounts]:
        return acc.total


class MergeStatsFn(beam.CombineFn):
    """Merges statistics partials (see `statistics.StatisticsAccumulator` for the rules)."""

    def create_accumulator(self) -> S.StatisticsAccumulator:
        return S.StatisticsAccumulator()

    def add_input(self, acc: S.StatisticsAccumulator, partial: StatisticsPartial) -> S.StatisticsAccumulator:
        return acc.add(partial)

    def merge_accumulators(self, accumulators: Iterable[S.StatisticsAccumulator]) -> S.StatisticsAccumulator:
        accumulators = iter(accumulators)
        first = next(accumulators, None)
        return (first if first is not None else self.create_accumulator()).merge(accumulators)

    def extract_output(self, acc: S.StatisticsAccumulator) -> StatisticsPartial:
        return acc.values


# ---- DoFns and element functions ----------------------------------------------------------------


class _DecodeExamples(beam.DoFn):
    """Batches of serialized tf.Examples -> Arrow RecordBatches (schema inferred per batch)."""

    def setup(self):
        from tfx_bsl.coders import example_coder

        self._decoder = example_coder.ExamplesToRecordBatchDecoder()

    def process(self, batch: List[bytes]) -> Iterator[pa.RecordBatch]:
        yield self._decoder.DecodeBatch(batch)


class _CountPerBundle(beam.DoFn):
    """Counts each feature's values over a whole bundle before anything is shuffled: one
    (feature, ValueCounts) partial per feature and bundle, so shuffle volume is bounded by distinct
    values per bundle (see `counting.FeatureValueCounter`)."""

    def __init__(self, config_json: str, count_rows: bool = False):
        self._config_json = config_json
        self._count_rows = count_rows  # analysis only: no transform pass counts the rows

    def setup(self):
        from components.config import config_from_json

        self._cfg = config_from_json(self._config_json)

    def start_bundle(self):
        self._counter = FeatureValueCounter(self._cfg)

    def process(self, rb: pa.RecordBatch) -> None:
        self._counter.add(rb)

    def finish_bundle(self):
        from apache_beam.transforms.window import GlobalWindow
        from apache_beam.utils.timestamp import MIN_TIMESTAMP
        from apache_beam.utils.windowed_value import WindowedValue

        for feature, counts in self._counter.result().items():
            yield WindowedValue((feature, counts), MIN_TIMESTAMP, [GlobalWindow()])
        if self._count_rows:
            rows = self._counter.rows.as_statistics("train")
            yield beam.pvalue.TaggedOutput("rows", WindowedValue(rows, MIN_TIMESTAMP, [GlobalWindow()]))


def _top(tokens: pa.Array, counts: pa.Array, top_values: int) -> List[Tuple[bytes, Any]]:
    return list(zip(tokens.slice(0, top_values).to_pylist(), counts.slice(0, top_values).to_pylist()))


def _write_vocabulary(item: KeyedCounts, out_dir: str, options_json: str, top_values: int):
    from components.config import VocabularyOptions

    name, counted = item
    options = VocabularyOptions(**json.loads(options_json)[name])
    tokens, counts = V.order_arrays(counted.values, counted.counts)  # every value, for coverage and skew
    covered = None
    if options.kind in V.GIVEN_KINDS:  # list / file (written before the pipeline): its lines, with the counts seen
        given_tokens = pa.array(V.read_vocabulary(out_dir, name), pa.binary())
        where = pc.index_in(given_tokens, value_set=tokens)
        seen = pc.fill_null(pc.take(counts, where), 0)
        V.write_vocabulary_arrays(out_dir, name, given_tokens, pc.cast(seen, counts.type))
        kept = len(given_tokens)
        covered = pc.sum(seen).as_py() or 0
    elif options.kind in ("hashed", "identity"):  # no vocabulary (V3, V4): empty files
        V.write_vocabulary_arrays(out_dir, name, tokens.slice(0, 0), counts.slice(0, 0))
        kept = 0
        if options.kind == "identity":  # occurrences that are IDs of the table
            lookup = V.IdentityLookup(options.num_buckets, None)
            covered = pc.sum(counts.filter(pa.array(lookup.id_filter(tokens)[0]))).as_py() or 0
        else:
            covered = pc.sum(counts).as_py() or 0  # every token has a row
    else:
        kept = V.prune(counts, options)
        V.write_vocabulary_arrays(out_dir, name, tokens.slice(0, kept), counts.slice(0, kept))
    yield name, kept  # the transform pass reads the files; this only says they are written
    yield beam.pvalue.TaggedOutput(
        "stats", S.vocabulary_stats(name, counts.to_numpy(), kept, _top(tokens, counts, top_values), covered)
    )


def _feature_value_stats(item: KeyedCounts, top_values: int) -> Iterator[StatisticsPartial]:
    """Coverage, hottest values and skew of one feature of a shared table, on its own values."""
    name, counted = item
    tokens, counts = V.order_arrays(counted.values, counted.counts)
    yield S.feature_value_stats(name, counts.to_numpy(), _top(tokens, counts, top_values))


def _rename(item: KeyedCounts, new_name: Dict[str, str]) -> KeyedCounts:
    return new_name[item[0]], item[1]


class _TransformBatch(beam.DoFn):
    """One RecordBatch -> its transformed tf.Examples as one block of framed TFRecords, plus a
    statistics partial (tagged output)."""

    def __init__(self, config_json: str, split: str, vocabulary_dir: str, run_id: str):
        self._config_json = config_json
        self._split = split
        self._vocabulary_dir = vocabulary_dir
        self._run_id = run_id

    def setup(self):
        from tfx_bsl.coders import example_coder

        from components.config import config_from_json

        self._cfg = config_from_json(self._config_json)
        self._encoder = example_coder.RecordBatchToExamplesEncoder()
        self._lookups: Optional[Dict[str, V.VocabularyLookup]] = None

    def process(self, rb: pa.RecordBatch, vocabulary_sizes: Dict[str, int]):
        if self._lookups is None:
            self._lookups = load_lookups(self._cfg, self._vocabulary_dir, vocabulary_sizes, self._run_id)
        if self._split == "train":
            rb = shuffled_rows(rb, self._cfg.training.seed)
        out, _, stats = transform_record_batch(self._cfg, self._lookups, rb, self._split)
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
        yield beam.pvalue.TaggedOutput("stats", stats)


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
            | "Decode" >> beam.ParDo(_DecodeExamples())
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

    counts: beam.PCollection  # (feature, ValueCounts), one per feature with any value
    rows: beam.PCollection  # statistics partials of the rows read (only with count_rows)


class CountValues(beam.PTransform):
    """RecordBatches -> `CountedValues`: each categorical feature's value counts over all the
    labelled rows, as (feature name, ValueCounts), one element per feature that has a value.

    Counted per bundle, then added up per feature (`MergeCountsFn`, lifted; with `hot_key_fanout`
    > 1 spread over that many intermediate keys first, so a runner with many bundles does not merge
    all of a large feature's partials on one worker). With `count_rows`, `rows` also carries the
    rows read and dropped (analysis only, where no transform pass counts them); else it is empty."""

    def __init__(self, cfg: PipelineConfig, count_rows: bool = False):
        super().__init__()
        self._config_json = cfg.to_json()
        self._count_rows = count_rows
        self._fanout = cfg.beam.hot_key_fanout

    def expand(self, batches) -> CountedValues:
        counted = batches | "CountPerBundle" >> beam.ParDo(
            _CountPerBundle(self._config_json, self._count_rows)
        ).with_outputs("rows", main="counts")
        combine = beam.CombinePerKey(MergeCountsFn())
        if self._fanout > 1:
            combine = combine.with_hot_key_fanout(self._fanout)
        return CountedValues(counts=counted.counts | "SumPerFeature" >> combine, rows=counted.rows)


class SumPerTable(beam.PTransform):
    """(feature, ValueCounts) per feature -> (table, ValueCounts) per table.

    A table's vocabulary is the sum of its features' counts: a feature with a table of its own is
    renamed to it; the features of a shared table are added up (`MergeCountsFn`)."""

    def __init__(self, cfg: PipelineConfig):
        super().__init__()
        self._table_of = {f.name: cfg.feature_table(f).name for f in cfg.categorical_features}
        self._shared = shared_table_features(cfg)

    def expand(self, feature_counts):
        own = (
            feature_counts
            | "OwnTables" >> beam.Filter(lambda kv, shared: kv[0] not in shared, self._shared)
            | "OwnTableName" >> beam.Map(_rename, self._table_of)
        )
        shared = (
            feature_counts
            | "SharedTableFeatures" >> beam.Filter(lambda kv, shared: kv[0] in shared, self._shared)
            | "SharedTableName" >> beam.Map(_rename, self._table_of)
            | "SumPerSharedTable" >> beam.CombinePerKey(MergeCountsFn())
        )
        return (own, shared) | "TableCounts" >> beam.Flatten()


class FeatureValueStatistics(beam.PTransform):
    """(feature, ValueCounts) per feature -> statistics partials (`partials.feature_values_info(feature)`) of
    the own values of each feature of a shared table (a feature with a table of its own is described
    by its vocabulary's statistics)."""

    def __init__(self, cfg: PipelineConfig):
        super().__init__()
        self._shared = shared_table_features(cfg)
        self._top_values = cfg.statistics.top_values

    def expand(self, feature_counts):
        return (
            feature_counts
            | "SharedTableFeatures" >> beam.Filter(lambda kv, shared: kv[0] in shared, self._shared)
            | "Describe" >> beam.FlatMap(_feature_value_stats, self._top_values)
        )


class WrittenVocabularies(NamedTuple):
    """`WriteVocabularies`' outputs."""

    sizes: beam.PCollection  # (table, tokens written), one per vocabulary written
    stats: beam.PCollection  # statistics partials `partials.vocabulary_info(table)`


class WriteVocabularies(beam.PTransform):
    """(table, ValueCounts) per table -> `WrittenVocabularies`: each table's vocabulary ordered
    (count descending, then bytes), pruned by its `vocabulary` options and written to
    `vocabulary_dir` (`<table>.txt`, `<table>.counts.txt`); its size and its statistics (distinct
    values, coverage, hottest values, skew; on every value, before pruning) come out."""

    def __init__(self, cfg: PipelineConfig, vocabulary_dir: str):
        super().__init__()
        self._vocabulary_dir = vocabulary_dir
        self._options_json = json.dumps({t.name: t.vocabulary.__dict__ for t in cfg.tables})
        self._top_values = cfg.statistics.top_values

    def expand(self, table_counts) -> WrittenVocabularies:
        written = table_counts | "Write" >> beam.FlatMap(
            _write_vocabulary, self._vocabulary_dir, self._options_json, self._top_values
        ).with_outputs("stats", main="sizes")
        return WrittenVocabularies(sizes=written.sizes, stats=written.stats)


class TransformedSplit(NamedTuple):
    """`TransformSplit`'s outputs."""

    examples: beam.PCollection  # bytes: blocks of framed TFRecords of transformed tf.Examples
    stats: beam.PCollection  # statistics partials of the split, one per record batch
    tail: beam.PCollection  # bytes: framed shorter last blocks of rows (blocks format only)


class TransformSplit(beam.PTransform):
    """RecordBatches of one split -> `TransformedSplit`: the labelled rows as tf.Examples of int64
    embedding IDs and float32 dense values (`transform.transform_record_batch`), one block of framed
    TFRecords per batch, plus each batch's statistics partial (rows read and dropped, presence, OOV,
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
    """Blocks of framed TFRecords -> `<directory>/<prefix>-*` files (`.gz` with gzip)."""

    def __init__(self, directory: str, compression: str, prefix: str = TRANSFORMED_PREFIX):
        super().__init__()
        self._prefix = os.path.join(directory, prefix)
        self._suffix = ".gz" if compression == "gzip" else ""

    def expand(self, blocks):
        return blocks | "Write" >> beam.io.Write(
            FramedTFRecordSink(self._prefix, file_name_suffix=self._suffix)
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
            | "ToJson" >> beam.Map(lambda s: json.dumps(S.jsonable(s), sort_keys=True))
            | "Write" >> beam.io.WriteToText(self._path, shard_name_template="")
        )


def read_source(
    pipeline: beam.Pipeline, cfg: PipelineConfig, label: str, pattern: str, input_format: str
) -> Tuple[beam.PCollection, Optional[beam.PCollection]]:
    """RecordBatches of one input, plus statistics partials of the input itself (CSV only)."""
    if input_format == "tfrecord":
        return pipeline | label >> ReadRecordBatches(pattern, cfg.training.batch_size), None
    if input_format == "parquet":
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
) -> None:
    """Adds the preprocessing transforms to `pipeline`. The vocabulary is computed on 'train'.

    `input_format` is `parquet` (as this project's ExampleGen writes), `tfrecord` (tf.Examples, as
    TFX's own ExampleGens write) or `csv` (the CLI).
    `transformed_dirs=None` analyses only: vocabularies and their statistics, no transform pass."""
    # The train split is read twice (to count, then to transform) rather than shared: a shared
    # PCollection with a side-input consumer is held whole in the local runner's memory.
    analyze_only = transformed_dirs is None
    train, train_input_stats = read_source(pipeline, cfg, "ReadForVocabulary", split_patterns["train"], input_format)
    input_stats = [train_input_stats] if analyze_only and train_input_stats is not None else []
    counted = train | "CountValues" >> CountValues(cfg, count_rows=analyze_only)
    vocabularies = (
        counted.counts
        | "SumPerTable" >> SumPerTable(cfg)
        | "WriteVocabularies" >> WriteVocabularies(cfg, vocabulary_dir)
    )
    feature_value_stats = counted.counts | "SharedFeatureValueStats" >> FeatureValueStatistics(cfg)
    run_id = uuid.uuid4().hex
    partial_stats = [vocabularies.stats, counted.rows, feature_value_stats]
    for split, pattern in split_patterns.items() if not analyze_only else []:
        rbs, stats = read_source(pipeline, cfg, f"ReadForTransform[{split}]", pattern, input_format)
        if stats is not None:
            input_stats.append(stats)
        transformed = rbs | f"Transform[{split}]" >> TransformSplit(
            cfg, split, vocabulary_dir, vocabularies.sizes, run_id
        )
        _ = transformed.examples | f"Write[{split}]" >> WriteTransformedExamples(
            transformed_dirs[split], cfg.transformed_examples.compression
        )
        if cfg.transformed_examples.format == FORMAT_BLOCKS:
            _ = transformed.tail | f"WriteTail[{split}]" >> WriteTransformedExamples(
                transformed_dirs[split], cfg.transformed_examples.compression, TAIL_PREFIX
            )
        partial_stats.append(transformed.stats)
    partial_stats += input_stats
    _ = (
        partial_stats
        | "FlattenStats" >> beam.Flatten()
        | "MergeStatistics" >> MergeStatistics()
        | "WriteStatistics" >> WriteStatistics(stats_dir)
    )
