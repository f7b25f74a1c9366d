"""The preprocessing PTransforms and CombineFns, each on its own, on small hand-built inputs.

Each named PTransform of beam_pipeline.py (and csv_input.py's reader) runs in a `TestPipeline` and is
checked with `assert_that`; the CombineFns are also driven by hand through create/add/merge/extract.
Expected values are counted by hand from `ROWS` (the module docstring of beam_pipeline.py says how
the transforms chain; tests/test_preprocess.py runs the whole chain)."""
import ast
import io
import json
import os
import struct
import subprocess
import sys

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to
from tfx_bsl.coders import example_coder

from components.data_io import tfrecords
from components.rows import row_counts
from components.config.loading import parse_config
from components.embedding_preprocess import beam_pipeline
from components.embedding_preprocess import statistics
from components.embedding_preprocess import vocabulary
from components.embedding_preprocess import spill
from components.embedding_preprocess.counting import (CountSummary, FeatureValueCounter, ValueCounts,
                                                      shared_table_features)
from components.embedding_preprocess.csv_input import ReadCsvRecordBatches
from components.data_io.blocks import from_blocks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIG = {
    "input": {"path": "unused.csv"},
    "label": "label",
    "dense_features": [{"name": "I1", "fill_value": -1.0}],
    "tables": [{"name": "shared", "dim": 4, "vocabulary": {"num_oov_buckets": 1}}],
    "categorical_features": [
        {"name": "C1", "table": "shared"},
        {"name": "C2", "column": "C2raw", "table": "shared"},
        {"name": "C3", "separator": "|", "dim": 4, "vocabulary": {"min_frequency": 2, "num_oov_buckets": 1}},
    ],
    "training": {"batch_size": 2},
    "statistics": {"shard_counts": [2], "top_values": 2},
}
COLUMNS = [("label", pa.int64()), ("I1", pa.float32()), ("C1", pa.binary()), ("C2raw", pa.binary()), ("C3", pa.binary())]
# (label, I1, C1, C2raw, C3); None: the feature is absent from the example
ROWS = [
    (1, 0.5, b"a", b"b", b"x|y"),
    (0, None, b"a", b"a", b"x"),
    (None, 2.0, b"a", b"c", b"z"),  # no label: dropped, feeds no vocabulary
    (1, 1.0, b"b", None, b"x|y|y"),
]
# Counted by hand over the labelled rows (0, 1, 3)
FEATURE_COUNTS = {"C1": {b"a": 2, b"b": 1}, "C2": {b"b": 1, b"a": 1}, "C3": {b"x": 3, b"y": 3}}
TABLE_COUNTS = {"shared": {b"a": 3, b"b": 2}, "C3": {b"x": 3, b"y": 3}}


@pytest.fixture(scope="module")
def cfg():
    return parse_config(json.loads(json.dumps(CONFIG)))


def record_batch(rows) -> pa.RecordBatch:
    """Rows shaped as tfx_bsl's tf.Example decoder gives them: one list column per feature."""
    arrays = [pa.array([None if r[i] is None else [r[i]] for r in rows], pa.list_(t)) for i, (_, t) in enumerate(COLUMNS)]
    return pa.RecordBatch.from_arrays(arrays, [name for name, _ in COLUMNS])


def counts(tokens, weights=None) -> ValueCounts:
    return ValueCounts.of(pa.array(tokens, pa.binary()), None if weights is None else pa.array(weights))


def summary(tokens, options=None, top_values=2) -> CountSummary:
    return CountSummary.of(counts(tokens), top_values, options)


def described(pcoll, label="Described"):
    """(key, CountSummary) -> (key, distinct values, occurrences, hottest values, candidates as a dict or None)."""
    def describe(key, s):
        cands = None if s.candidates is None else s.candidates.as_dict()
        return key, s.histogram.distinct, s.histogram.occurrences(), s.top_pairs(), cands
    return pcoll | label >> beam.MapTuple(describe)


def unframe(block: bytes):
    """The records of a block of framed TFRecords (tfrecords.frame's inverse; CRCs not checked)."""
    out, pos = [], 0
    while pos < len(block):
        (n,) = struct.unpack("<Q", block[pos : pos + 8])
        out.append(block[pos + 12 : pos + 12 + n])
        pos += 12 + n + 4
    return out


# ---- CombineFns, by hand ------------------------------------------------------------------------


def test_merge_summaries_fn_create_add_merge_extract():
    from components.config.schema import VocabularyOptions

    fn = beam_pipeline.MergeSummariesFn()
    options = VocabularyOptions(min_frequency=2)
    assert fn.extract_output(fn.create_accumulator()) is None  # nothing counted
    # disjoint values, as spill buckets are
    a = fn.add_input(fn.create_accumulator(), summary([b"a", b"b", b"a"], options))
    a = fn.add_input(a, summary([b"c", b"c", b"c"], options))
    b = fn.add_input(fn.create_accumulator(), summary([b"d", b"e", b"d", b"d"], options))
    merged = fn.extract_output(fn.merge_accumulators([fn.create_accumulator(), a, b]))
    assert merged.histogram.distinct == 5 and merged.histogram.occurrences() == 10
    assert merged.top_pairs() == [(b"c", 3), (b"d", 3)]  # ties by bytes
    assert merged.candidates.as_dict() == {b"a": 2, b"c": 3, b"d": 3}  # min_frequency 2
    many = fn.create_accumulator()
    for i in range(20):  # past the accumulator's compaction point
        many = fn.add_input(many, summary([bytes([65 + i])] * (i + 1), options))
    out = fn.extract_output(many)
    assert out.histogram.distinct == 20 and out.top_pairs() == [(b"T", 20), (b"S", 19)]
    assert len(out.candidates.values) == 19


def test_count_summary_top_k_candidates_and_weights():
    from components.config.schema import VocabularyOptions

    options = VocabularyOptions(top_k=2)
    parts = [summary([b"a", b"a", b"b"], options), summary([b"c", b"c", b"c", b"d"], options), summary([b"e", b"e"], options)]
    merged = CountSummary.merge(parts)
    assert merged.candidates.as_dict() == {b"c": 3, b"a": 2}  # the top 2 of the union; a before e (bytes)
    weighted = CountSummary.of(counts([b"a", b"b", b"a"], [0.5, 2.0, 1.0]), 1)
    assert weighted.top_pairs() == [(b"b", 2.0)] and weighted.histogram.occurrences() == 3.5


def test_merge_stats_fn_create_add_merge_extract():
    fn = beam_pipeline.MergeStatsFn()
    p1 = {"n": 1, "max/m": 3, "vec/v": np.array([1, 2]), "info/x": {"k": 1}}
    p2 = {"n": 2, "max/m": 5, "vec/v": np.array([1, 1, 1]), "info/x": {"k": 2}}
    p3 = {"n": 4, "only": 7.5}
    a = fn.add_input(fn.add_input(fn.create_accumulator(), p1), p2)
    b = fn.add_input(fn.create_accumulator(), p3)
    out = fn.extract_output(fn.merge_accumulators([a, b, fn.create_accumulator()]))
    assert statistics.jsonable(out) == {"n": 7, "max/m": 5, "vec/v": [2, 3, 1], "info/x": {"k": 1}, "only": 7.5}
    assert p1["vec/v"].tolist() == [1, 2] and p2["vec/v"].tolist() == [1, 1, 1]  # partials untouched
    assert fn.extract_output(fn.create_accumulator()) == {}


def test_feature_value_counter_drops_unlabelled_rows_and_flushes_the_same(cfg):
    results = []
    for flush in (FeatureValueCounter.flush_tokens, 1):  # 1: reduce after every batch
        counter = FeatureValueCounter(cfg, flush_tokens=flush)
        counter.add(record_batch(ROWS[:2]))
        counter.add(record_batch(ROWS[2:]))
        results.append({k: v.as_dict() for k, v in counter.result().items()})
        assert (counter.rows.read, counter.rows.missing_label, counter.rows.invalid_label) == (4, 1, 0)
    assert results[0] == results[1] == FEATURE_COUNTS
    assert shared_table_features(cfg) == ["C1", "C2"]


# ---- CombineFns and PTransforms in a TestPipeline -----------------------------------------------


# The default (no fan-out, 16 buckets) is test_count_values_spills_within_a_bundle_the_same_counts'
# config, and the whole preprocessing runs of tests/test_preprocess_cli.py count with it too.
@pytest.mark.parametrize("fanout, buckets, count_rows", [(3, 1, True), (0, 3, False)])
def test_count_values(fanout, buckets, count_rows, tmp_path):
    config = json.loads(json.dumps(CONFIG))
    config["beam"] = {"hot_key_fanout": fanout, "value_count_buckets": buckets}
    with BeamTestPipeline() as p:
        counted = (
            p | beam.Create([record_batch(ROWS[:2]), record_batch(ROWS[2:])])
            | beam_pipeline.CountValues(parse_config(config), str(tmp_path / "spill"), str(tmp_path), count_rows=count_rows)
        )
        # shared: a 3, b 2 (C1 + C2); C3: x 3, y 3, min_frequency 2; top_values 2
        assert_that(described(counted.tables), equal_to([
            ("shared", 2, 5, [(b"a", 3), (b"b", 2)], {b"a": 3, b"b": 2}),
            ("C3", 2, 6, [(b"x", 3), (b"y", 3)], {b"x": 3, b"y": 3}),
        ]), label="Tables")
        # the features of the shared table, each on its own values
        assert_that(described(counted.features, "DescribedFeatures"), equal_to([
            ("C1", 2, 3, [(b"a", 2), (b"b", 1)], None),
            ("C2", 2, 2, [(b"a", 1), (b"b", 1)], None),
        ]), label="Features")
        if count_rows:
            rows = counted.rows | beam.CombineGlobally(beam_pipeline.MergeStatsFn())
            expected_rows = {"train/examples_read": 4, "train/dropped/missing_label": 1, "train/dropped/invalid_label": 0}
            assert_that(rows, equal_to([expected_rows]), label="Rows")
        else:  # rows are counted only when asked (analysis only: no transform pass counts them)
            assert_that(counted.rows, equal_to([]), label="NoRows")
    spilled = os.listdir(tmp_path / "spill")  # the caller (run.py) deletes them
    assert spilled and all(f.endswith(spill.SUFFIX) for f in spilled)


def test_spill_files_round_trip_and_refuse_a_wrong_reference(tmp_path):
    parts = [("f", counts([b"a", b"b", b"a"])), ("g", counts([b"z"], [0.25]))]
    ref = spill.write(spill.spill_path(str(tmp_path), 3), parts)
    assert os.path.basename(ref[0]).startswith("b0003-") and ref[1] == ("f", "g")
    back = list(spill.read(ref))
    assert [(n, c.as_dict()) for n, c in back] == [("f", {b"a": 2, b"b": 1}), ("g", {b"z": 0.25})]
    assert back[0][1].counts.type == pa.int64() and back[1][1].counts.type == pa.float64()
    with pytest.raises(ValueError, match="2 record batches, its reference names 3"):
        list(spill.read((ref[0], ("f", "g", "h"))))
    spill.delete(str(tmp_path))
    assert not os.path.exists(tmp_path)
    spill.delete(str(tmp_path))  # absent: nothing to do


def test_feature_value_statistics_describe_each_feature():
    feature_summaries = [("C1", summary([b"a", b"a", b"b"])), ("C2", summary([b"b", b"a"]))]
    with BeamTestPipeline() as p:
        stats = p | beam.Create(feature_summaries) | beam_pipeline.FeatureValueStatistics()
        out = stats | beam.FlatMap(
            lambda s: [(k, v["distinct_values"], v["occurrences"], v["hottest_values"][0]["value"]) for k, v in s.items()]
        )
        assert_that(out, equal_to([("info/feature_values/C1", 2, 3, "a"), ("info/feature_values/C2", 2, 2, "a")]))


def test_write_vocabularies(cfg, tmp_path):
    table_counts = [
        ("shared", summary([b"a", b"q", b"b", b"a", b"b", b"a"], cfg.table("shared").vocabulary)),
        ("C3", summary([b"y", b"x", b"z", b"x", b"y"], cfg.table("C3").vocabulary)),  # min_frequency 2: z is pruned
    ]
    with BeamTestPipeline() as p:
        written = p | beam.Create(table_counts) | beam_pipeline.WriteVocabularies(cfg, str(tmp_path))
        assert_that(written.sizes, equal_to([("shared", 3), ("C3", 2)]), label="Sizes")
        figures = written.stats | beam.FlatMap(
            lambda s: [(k, v["distinct_values"], v["vocabulary_size"], v["occurrences"]) for k, v in s.items()]
        )
        assert_that(figures, equal_to([("info/vocab/shared", 3, 3, 6), ("info/vocab/C3", 3, 2, 5)]), label="Stats")
    assert vocabulary.read_vocabulary(str(tmp_path), "shared") == [b"a", b"b", b"q"]
    assert vocabulary.read_vocabulary(str(tmp_path), "C3") == [b"x", b"y"]
    assert (tmp_path / "C3.counts.txt").read_bytes() == b"2 x\n2 y\n"


def test_transform_split(cfg, tmp_path):
    from tfx_bsl.coders import example_coder

    vocabulary.write_vocabulary(str(tmp_path), "shared", [(b"a", 3)])  # b is out of vocabulary: ID 1 (one OOV bucket)
    vocabulary.write_vocabulary(str(tmp_path), "C3", [(b"x", 3), (b"y", 3)])

    def check_examples(blocks):
        # Blocks of rows (the default format), the train split's rows shuffled within their batch:
        # cut back into rows and compared as a set of rows.
        records = [r for block in blocks for r in unframe(block)]
        got = from_blocks(cfg, example_coder.ExamplesToRecordBatchDecoder().DecodeBatch(records)).to_pydict()
        rows = sorted(zip(*(map(str, got[c]) for c in ("label", "I1", "C1", "C2", "C3"))))
        assert rows == sorted([  # label, I1 (absent: the fill value), C1, C2, C3
            ("[1.0]", "[0.5]", "[0]", "[1]", "[0, 1]"),
            ("[0.0]", "[-1.0]", "[0]", "[0]", "[0]"),
            ("[1.0]", "[1.0]", "[1]", "[]", "[0, 1, 1]"),
        ])

    expected_stats = {
        "train/examples_read": 4,
        "train/dropped/missing_label": 1,
        "train/positives": 2.0,
        "train/dense/I1/missing": 1,
        "train/feature/C1/ids": 3,
        "train/feature/C1/oov": 1,
        "train/feature/C2/present": 2,
        "train/feature/C2/oov": 1,
        "train/feature/C3/ids": 6,
        "train/partial_batches": 1,  # 3 kept rows in batches of 2
        "train/table/shared/batches": 1,
        "max/train/table/shared/batch_unique_ids": 2,  # first batch: a (x3) and b
    }
    with BeamTestPipeline() as p:
        sizes = p | "Sizes" >> beam.Create([("shared", 1), ("C3", 2)])
        transformed = (
            p | "Batches" >> beam.Create([record_batch(ROWS)]) | beam_pipeline.TransformSplit(cfg, "train", str(tmp_path), sizes)
        )
        assert_that((transformed.examples, transformed.tail) | beam.Flatten(), check_examples, label="Examples")
        merged = transformed.stats | beam_pipeline.MergeStatistics() | beam.Map(lambda s: {k: s[k] for k in expected_stats})
        assert_that(merged, equal_to([expected_stats]), label="Stats")


def test_transform_split_refuses_vocabulary_files_of_another_size(cfg, tmp_path):
    vocabulary.write_vocabulary(str(tmp_path), "shared", [(b"a", 3)])
    with pytest.raises(Exception, match="another run is writing"):
        with BeamTestPipeline() as p:
            sizes = p | "Sizes" >> beam.Create([("shared", 2)])  # the writer said 2
            _ = p | "Batches" >> beam.Create([record_batch(ROWS)]) | beam_pipeline.TransformSplit(cfg, "eval", str(tmp_path), sizes)


def test_merge_statistics_and_of_nothing_is_empty():
    # Both in one pipeline (a TestPipeline's start-up is most of either's time).
    partials = [{"n": 1, "vec/h": np.array([1, 0, 2])}, {"n": 2, "max/m": 4}, {"max/m": 9, "vec/h": np.array([1])}]
    with BeamTestPipeline() as p:
        merged = (p | "Partials" >> beam.Create(partials) | "Merge" >> beam_pipeline.MergeStatistics()
                  | beam.Map(statistics.jsonable))
        assert_that(merged, equal_to([{"n": 3, "max/m": 9, "vec/h": [2, 0, 2]}]), label="Merged")
        nothing = p | "Nothing" >> beam.Create([], reshuffle=False) | "MergeNothing" >> beam_pipeline.MergeStatistics()
        assert_that(nothing, equal_to([{}]), label="Empty")


def test_write_statistics(tmp_path):
    with BeamTestPipeline() as p:
        _ = p | beam.Create([{"n": 2, "vec/h": np.array([3, 1])}]) | beam_pipeline.WriteStatistics(str(tmp_path))
    assert (tmp_path / beam_pipeline.STATS_FILE_PREFIX).read_text() == '{"n": 2, "vec/h": [3, 1]}\n'


def test_read_record_batches_and_write_transformed_examples(cfg, tmp_path):
    from tfx_bsl.coders import example_coder

    examples = example_coder.RecordBatchToExamplesEncoder().encode(record_batch(ROWS))
    with BeamTestPipeline() as p:
        blocks = p | beam.Create([tfrecords.frame(examples[:3]), tfrecords.frame(examples[3:])])
        _ = blocks | beam_pipeline.WriteTransformedExamples(str(tmp_path / "tx"), "gzip")
    files = sorted(os.listdir(tmp_path / "tx"))
    assert files and all(f.startswith(beam_pipeline.TRANSFORMED_PREFIX) and f.endswith(".gz") for f in files)

    def check(batches):
        rows = sorted(r for rb in batches for r in zip(rb.to_pydict()["C1"], rb.to_pydict()["C3"]))
        assert rows == sorted(([r[2]], [r[4]]) for r in ROWS)

    with BeamTestPipeline() as p:
        batches = p | beam_pipeline.ReadRecordBatches(str(tmp_path / "tx" / "*"), cfg.training.batch_size)
        assert_that(batches, check)


def _examples(values, column="v"):
    """One serialized tf.Example per value, `{column: [value]}` (tfx_bsl's encoder, as the transform's)."""
    rb = pa.RecordBatch.from_arrays([pa.array([[v] for v in values], pa.list_(pa.int64()))], [column])
    return example_coder.RecordBatchToExamplesEncoder().encode(rb)


def _values_of(framed: bytes) -> list:
    """The values of framed one-column tf.Examples (`_examples`' records), in order."""
    payloads = list(row_counts.tfrecord_payloads(io.BytesIO(framed)))
    return example_coder.ExamplesToRecordBatchDecoder().DecodeBatch(payloads).column(0).flatten().to_pylist()


def _values(path) -> list:
    with open(path, "rb") as fh:
        return _values_of(fh.read())


def test_transformed_files_roll_over_after_their_share_of_read_batches(tmp_path):
    """`elements_per_file` caps a file at that many elements (read batches), in the order they came:
    each file holds one short stretch of the input, the unit the trainer reads in a new order."""
    elements = [tfrecords.frame(_examples([i])) for i in range(7)]
    with BeamTestPipeline() as p:
        _ = p | beam.Create(elements) | beam_pipeline.WriteTransformedExamples(str(tmp_path), "none", elements_per_file=2)
    names = sorted(os.listdir(tmp_path))
    contents = [_values(tmp_path / n) for n in names]
    assert len(names) == 4 and all(n.endswith("-of-00004") for n in names), names
    assert sorted(len(c) for c in contents) == [1, 2, 2, 2]
    assert sorted(v for c in contents for v in c) == list(range(7))


def test_the_block_order_key_does_not_depend_on_the_order_of_an_examples_features():
    """tfx_bsl's encoder writes an Example's feature map in an order that differs between processes:
    one Example written two ways (a map's entries may come in any order) has one key."""
    x, y = _examples([1], "x")[0], _examples([2], "y")[0]
    assert x + y != y + x  # both parse as {x: [1], y: [2]}
    assert beam_pipeline.block_order_key(tfrecords.frame([x + y])) == beam_pipeline.block_order_key(tfrecords.frame([y + x]))
    assert beam_pipeline.block_order_key(tfrecords.frame([x + y])) != beam_pipeline.block_order_key(tfrecords.frame([x]))


def test_transformed_files_are_numbered_by_their_first_block_not_by_the_writers_uid(tmp_path):
    """Beam names each writer's temporary file by a uuid4 and numbers the shards in the sorted order
    of those names: the same files took other numbers in every run. Here the writers' uids sort
    opposite to the first blocks' keys, and the shards still follow the keys."""
    blocks = sorted((tfrecords.frame(_examples([i, i + 10])) for i in range(4)), key=beam_pipeline.block_order_key)
    sink = beam_pipeline.FramedTFRecordSink(str(tmp_path / "out" / "part"))
    init = sink.initialize_write()
    written = []
    for uid, block in zip(["u3", "u2", "u1", "u0"], blocks):
        writer = sink.open_writer(init, uid)
        writer.write(block)
        written.append(writer.close())
    finals = list(sink.finalize_write(init, written, sink.pre_finalize(init, written)))
    assert [os.path.basename(f) for f in finals] == [f"part-0000{i}-of-00004" for i in range(4)], finals
    assert [_values(f) for f in finals] == [_values_of(b) for b in blocks]


@pytest.mark.parametrize("rows_per_file, expected", [(0, None), (1, 1), (16_384, 1), (65_536, 4), (100_000, 6)])
def test_elements_per_file_is_rows_per_file_in_whole_read_batches(cfg, rows_per_file, expected):
    cfg.transformed_examples.rows_per_file = rows_per_file
    cfg.training.batch_size = 256  # read batches of 16,384 rows
    assert beam_pipeline.elements_per_file(cfg) == expected


def test_read_csv_record_batches_counts_bad_rows(cfg, tmp_path):
    path = tmp_path / "in.csv"
    path.write_bytes(b"label,I1,C1,C2raw,C3\n1,0.5,a,b,x|y\n0,abc,a,a,x\n1,2\n,1.0,b,,z\n")
    header = ["label", "I1", "C1", "C2raw", "C3"]

    def check(batches):
        got = {k: [v for rb in batches for v in rb.to_pydict()[k]] for k in ("label", "I1", "C1")}
        assert got == {"label": [1.0, 0.0, None], "I1": [0.5, None, 1.0], "C1": [b"a", b"a", b"b"]}

    with BeamTestPipeline() as p:
        batches, stats = p | ReadCsvRecordBatches(str(path), header, cfg)
        assert_that(batches, check, label="Batches")
        merged = stats | beam_pipeline.MergeStatistics()
        assert_that(merged, equal_to([{"input/malformed_rows": 1, "input/not_numeric/I1": 1}]), label="Stats")


# ---- module structure ---------------------------------------------------------------------------


def _imports(module_file: str):
    tree = ast.parse(open(os.path.join(REPO, "components", "embedding_preprocess", module_file)).read())
    for node in ast.walk(tree):  # function-local imports included
        if isinstance(node, ast.ImportFrom):
            yield node.module or ""
            yield from (f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


@pytest.mark.parametrize("module_file", ["csv_input.py", "transform.py", "counting.py", "statistics.py"])
def test_no_module_below_the_pipeline_imports_it(module_file):
    assert not [m for m in _imports(module_file) if "beam_pipeline" in m]


def test_transform_and_counting_do_not_import_beam():
    # tfrecords: the trainer and the exporter read its compression_type (the Beam sink lives in beam_pipeline)
    code = (
        "import sys; import components.embedding_preprocess.transform, components.embedding_preprocess.counting, "
        "components.data_io.tfrecords; "
        "print([m for m in sys.modules if m.startswith('apache_beam')])"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_count_values_spills_within_a_bundle_the_same_counts(cfg, tmp_path, monkeypatch):
    # every record batch spilled on its own (the limit a worker's counts may reach within a bundle),
    # with the default fan-out and buckets
    monkeypatch.setattr(beam_pipeline._CountPerBundle, "SPILL_VALUES", 0)
    with BeamTestPipeline() as p:
        counted = (
            p | beam.Create([record_batch(ROWS[:1]), record_batch(ROWS[1:2]), record_batch(ROWS[2:])])
            | beam_pipeline.CountValues(cfg, str(tmp_path / "spill"), str(tmp_path), count_rows=True)
        )
        assert_that(described(counted.tables), equal_to([
            ("shared", 2, 5, [(b"a", 3), (b"b", 2)], {b"a": 3, b"b": 2}),
            ("C3", 2, 6, [(b"x", 3), (b"y", 3)], {b"x": 3, b"y": 3}),
        ]), label="Tables")
        assert_that(described(counted.features, "DescribedFeatures"), equal_to([
            ("C1", 2, 3, [(b"a", 2), (b"b", 1)], None),
            ("C2", 2, 2, [(b"a", 1), (b"b", 1)], None),
        ]), label="Features")
        rows = counted.rows | beam.CombineGlobally(beam_pipeline.MergeStatsFn())
        assert_that(rows, equal_to([{"train/examples_read": 4, "train/dropped/missing_label": 1,
                                     "train/dropped/invalid_label": 0}]), label="Rows")
    spilled = os.listdir(tmp_path / "spill")  # the caller (run.py) deletes them
    assert spilled and all(f.endswith(spill.SUFFIX) for f in spilled)


def test_running_counts_sum_the_same_whatever_the_flush():
    from components.embedding_preprocess.counting import RunningCounts

    parts = [counts([bytes([97 + (i * j) % 7]) for j in range(i + 1)]) for i in range(12)]
    expected = ValueCounts.sum(parts).as_dict()
    for flush in (1, 3, 10**6):  # 1: the total (7 values) is always past the flush point
        running = RunningCounts(flush_values=flush)
        assert running.result() is None
        for p in [counts([]), *parts]:
            running.add(p)
        assert running.result().as_dict() == expected
