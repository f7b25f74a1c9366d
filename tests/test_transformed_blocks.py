"""Transformed examples in blocks of rows (`transformed_examples.format: blocks`, the default).

The same data preprocessed into blocks and into one tf.Example per row must reach the model as the
same rows: through `make_dataset` (whole blocks parsed together, shorter last blocks re-cut), the
row ledger (rows counted inside the blocks) and `examples_io.transformed_rows` (blocks cut back into
rows for the Trainer's signature). configs/features.yaml covers every feature kind: weighted,
sequence, multi-hot, identity, hashed, list and file vocabularies.
"""
import gzip
import os
import struct

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf
import yaml

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from components.rows import row_counts
from components.config.loading import parse_config
from components.contracts.manifest import TAIL_PREFIX, TRANSFORMED_PREFIX, row_lengths_key, weights_key
from components.embedding_model.input import make_dataset
from components.embedding_preprocess.run import run_preprocessing
from components.data_io.blocks import from_blocks, to_blocks
from components.embedding_trainer import resolved_input
from tests.stages import examples_uri
from components.data_io.examples_io import transformed_rows
from components.example_gen.synthetic_data import GeneratorSpec, write_csv

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = 1200


def _raw_config(csv_path, fmt, block_rows=8, batch_size=32):
    with open(os.path.join(REPO, "configs", "features.yaml")) as fh:
        raw = yaml.safe_load(fh)
    raw["input"]["path"] = str(csv_path)
    for f in raw["categorical_features"]:
        v = f.get("vocabulary") or {}
        if v.get("kind") == "file":
            v["file"] = os.path.join(REPO, "configs", v["file"])
    raw["training"]["batch_size"] = batch_size
    raw["transformed_examples"] = {"format": fmt, "block_rows": block_rows}
    return parse_config(raw)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same CSV preprocessed as rows and as blocks of 8 rows: {format: (cfg, tx root)}. The
    train split only: an eval split takes the same transform and write (less the train split's
    shuffle within a batch), so it would only cost a second transform pass in each run."""
    root = tmp_path_factory.mktemp("blocks")
    small = [min(c, 500) for c in GeneratorSpec().cardinalities]
    csv = root / "data.csv"
    write_csv(GeneratorSpec(rows=ROWS, seed=5, cardinalities=small, extra_columns=True), str(csv))
    out = {}
    for fmt in ("examples", "blocks"):
        cfg = _raw_config(csv, fmt)
        w = root / fmt
        run_preprocessing(
            beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=in_memory"])),
            cfg, {"train": str(csv)}, str(w / "vocab"), {"train": str(w / "tx" / "Split-train")}, str(w / "stats"),
            input_format="csv",
        )
        out[fmt] = (cfg, w / "tx")
    return out


def _pattern(tx, split):
    return str(tx / f"Split-{split}" / "*")


def _rows(features, label):
    """One hashable row per example of a batch: label, every dense value, every feature's IDs."""
    cols = {"label": label.numpy().ravel().tolist()}
    for k, t in sorted(features.items()):
        if isinstance(t, tf.SparseTensor):  # rows of IDs in index order, read in numpy (no eager op per feature)
            rows = [[] for _ in range(int(t.dense_shape[0]))]
            for i, v in zip(t.indices.numpy()[:, 0].tolist(), t.values.numpy().tolist()):
                rows[i].append(v)
            cols[k] = [tuple(r) for r in rows]
        else:
            cols[k] = [tuple(np.ravel(r).tolist()) for r in t.numpy()]
    return list(zip(*(cols[k] for k in sorted(cols))))


def _all_rows(ds):
    return sorted(r for f, y in ds for r in _rows(f, y))


def test_blocks_reach_the_model_as_the_same_rows(runs):
    split = "train"
    (_, tx_rows), (_, tx_blocks) = runs["examples"], runs["blocks"]
    m_rows, m_blocks = (resolved_input.read_manifest(examples_uri([_pattern(tx, split)])) for tx in (tx_rows, tx_blocks))
    assert (m_rows.transformed_format, m_blocks.transformed_format, m_blocks.block_rows) == ("examples", "blocks", 8)
    names = sorted(os.listdir(tx_blocks / f"Split-{split}"))
    assert any(n.startswith(TRANSFORMED_PREFIX) for n in names) and any(n.startswith(TAIL_PREFIX) for n in names)
    # Sequence lengths and padded dense IDs are computed from either format the same way.
    kw = dict(sequence_lengths={"history": 4}, dense_id_widths={"C12": 3, "C2": 2, "C14": 1})
    got = _all_rows(make_dataset([_pattern(tx_blocks, split)], m_blocks, 32, training=False, **kw))
    want = _all_rows(make_dataset([_pattern(tx_rows, split)], m_rows, 32, training=False, **kw))
    assert len(got) == len(want) > 1000 and got == want
    # and the Trainer's signature gets the same rows from either
    a = transformed_rows(_pattern(tx_blocks, split), m_blocks, 1 << 30)
    b = transformed_rows(_pattern(tx_rows, split), m_rows, 1 << 30)
    assert len(a) == len(b) and sorted(map(_example_dict, a)) == sorted(map(_example_dict, b))


def _example_dict(serialized):
    """A tf.Example as sorted (feature, values) pairs (a map's serialized order is not fixed)."""
    ex = tf.train.Example.FromString(serialized)
    return sorted((k, str(getattr(f, f.WhichOneof("kind")).value[:] if f.WhichOneof("kind") else []))
                  for k, f in ex.features.feature.items())


def test_training_batches_are_static_whole_and_mix_blocks(runs):
    cfg, tx = runs["blocks"]
    manifest = resolved_input.read_manifest(examples_uri([_pattern(tx, "train")]))
    batches = list(make_dataset([_pattern(tx, "train")], manifest, 32, training=True, seed=1).take(60))
    for features, label in batches:
        assert label.shape == (32, 1)
        assert all(t.shape[0] == 32 for t in features.values())
    seen = _all_rows([(f, y) for f, y in batches])
    assert len(set(seen)) > 0.5 * len(seen)
    # the same seed gives the same stream (a resumed run skips to where it stopped)
    again = list(make_dataset([_pattern(tx, "train")], manifest, 32, training=True, seed=1, skip_batches=3).take(2))
    for (f1, y1), (f2, y2) in zip(batches[3:5], again):
        np.testing.assert_array_equal(y1.numpy(), y2.numpy())


def test_a_batch_that_is_no_multiple_of_the_block_takes_every_row(runs):
    _, tx = runs["blocks"]
    manifest = resolved_input.read_manifest(examples_uri([_pattern(tx, "train")]))
    got = _all_rows(make_dataset([_pattern(tx, "train")], manifest, 20, training=False))  # 20 % 8 != 0
    want = _all_rows(make_dataset([_pattern(tx, "train")], manifest, 32, training=False))
    assert got == want
    batch = next(iter(make_dataset([_pattern(tx, "train")], manifest, 20, training=True, seed=2)))
    assert batch[1].shape == (20, 1)


def test_ledger_counts_the_rows_inside_the_blocks(runs, tmp_path):
    cfg, tx = runs["blocks"]
    stats = (tx / "embedding_statistics.json").read_text()
    import json

    written = json.loads(stats)["splits"]["train"]["examples_written"]
    files = row_counts.files_in(str(tx / "Split-train"))
    assert sum(row_counts.count_written_file(f, "test", cfg.label) for f in files) == written
    assert sum(row_counts.count_written_file(f, "test") for f in files) < written  # records are blocks
    # The whole-block files counted by their framing (blocks x block_rows) say the same.
    rows = cfg.transformed_examples.block_rows
    by_framing = sum(row_counts.count_written_file(f, "test", cfg.label, rows if "/" + TRANSFORMED_PREFIX in f else None)
                     for f in files)
    assert by_framing == written
    # A block file cut inside a record is reported, not counted short.
    whole = next(p for p in (tx / "Split-train").iterdir() if p.name.startswith(TRANSFORMED_PREFIX))
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / whole.name).write_bytes(whole.read_bytes()[:-7])
    with pytest.raises(Exception, match="ends inside a record"):
        row_counts.count_written_file(str(cut / whole.name), "EmbeddingPreprocess", cfg.label)


def test_to_blocks_and_back_keeps_every_row(runs):
    cfg, _ = runs["blocks"]
    weighted = next(f for f in cfg.categorical_features if f.weight_column)
    single = next(f for f in cfg.categorical_features if not f.weight_column)
    lengths = np.array([0, 2, 1, 0, 3, 1, 2, 0, 0, 4, 1], np.int64)  # rows without IDs too; 11 % 4 != 0
    n, ids = len(lengths), np.arange(lengths.sum(), dtype=np.int64)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    one = pa.array(np.arange(n + 1, dtype=np.int32))
    rb = pa.RecordBatch.from_arrays(
        [pa.ListArray.from_arrays(one, pa.array(np.arange(n) % 2, pa.float32())),
         pa.ListArray.from_arrays(offsets, pa.array(ids)),
         pa.ListArray.from_arrays(offsets, pa.array(ids.astype(np.float32) / 10)),
         pa.ListArray.from_arrays(one, pa.array(np.arange(n), pa.int64()))],
        [cfg.label, weighted.name, weights_key(weighted.name), single.name],
    )
    blocks = to_blocks(cfg, rb, 4)
    assert blocks.num_rows == 3
    assert blocks.column(blocks.schema.get_field_index(row_lengths_key(weighted.name))).to_pylist() == [
        [0, 2, 1, 0], [3, 1, 2, 0], [0, 4, 1]]
    assert from_blocks(cfg, blocks).equals(rb)


def test_full_block_count_walks_the_framing_and_checks_the_first_block(tmp_path):
    from components.data_io import tfrecords
    from tfx_bsl.coders import example_coder

    def blocks_file(name, rows_per_block, gzip_it=False):
        rb = pa.RecordBatch.from_arrays(
            [pa.array([[1.0] * n for n in rows_per_block], pa.list_(pa.float32()))], ["y"])
        data = tfrecords.frame(example_coder.RecordBatchToExamplesEncoder().encode(rb))
        path = tmp_path / name
        path.write_bytes(gzip.compress(data) if gzip_it else data)
        return str(path), data

    path, data = blocks_file("whole", [4, 4, 4])
    assert row_counts.count_written_file(path, "test", "y", 4) == 12
    gz, _ = blocks_file("whole.gz", [4] * 5, gzip_it=True)
    assert row_counts.count_written_file(gz, "test", "y", 4) == 20
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert row_counts.count_written_file(str(empty), "test", "y", 4) == 0
    # a whole-block file whose blocks hold another number of rows is refused, naming the file
    from components.reporting.errors import LedgerError

    wrong, _ = blocks_file("wrong", [3, 3])
    with pytest.raises(LedgerError, match=r"wrong should hold blocks of 4 rows each, but its first block holds 3"):
        row_counts.count_written_file(wrong, "EmbeddingPreprocess", "y", 4)
    # a cut after the first block, and one inside it, are both reported
    for cut_at in (len(data) - 3, 10):
        (tmp_path / "cut").write_bytes(data[:cut_at])
        with pytest.raises(LedgerError, match="ends inside a record"):
            row_counts.count_written_file(str(tmp_path / "cut"), "EmbeddingPreprocess", "y", 4)


def test_full_block_count_across_buffer_refills(tmp_path, monkeypatch):
    """The first block's walk and the framing walk share one buffer: with a buffer of a few bytes
    every record crosses a refill, and the counts stay the same."""
    from components.data_io import tfrecords
    from tfx_bsl.coders import example_coder

    rb = pa.RecordBatch.from_arrays([pa.array([[1.0] * 4] * 7, pa.list_(pa.float32()))], ["y"])
    (tmp_path / "f").write_bytes(tfrecords.frame(example_coder.RecordBatchToExamplesEncoder().encode(rb)))
    for block in (5, 13, 64, 1 << 20):
        monkeypatch.setattr(row_counts, "BLOCK", block)
        assert row_counts.count_written_file(str(tmp_path / "f"), "test", "y", 4) == 28, block
        assert row_counts.count_written_file(str(tmp_path / "f"), "test", "y") == 28, block


def test_block_row_counter_reads_framed_blocks(tmp_path):
    from components.data_io import tfrecords
    from tfx_bsl.coders import example_coder

    rb = pa.RecordBatch.from_arrays([pa.array([[1.0, 0.0, 1.0], [0.0]], pa.list_(pa.float32()))], ["y"])
    data = tfrecords.frame(example_coder.RecordBatchToExamplesEncoder().encode(rb))
    (tmp_path / "f").write_bytes(data)
    with open(tmp_path / "f", "rb") as fh:
        c = row_counts.count_block_rows(fh, "y")
    assert (c.rows, c.blocks, c.truncated) == (4, 2, False)
    assert struct.unpack("<Q", data[:8])[0] > 0


def test_tfrecord_framing_walk_counts_reads_and_reports_a_cut(tmp_path):
    import io

    from components.data_io import tfrecords

    records = [b"", b"a" * 5, b"b" * 70000]  # an empty record among others
    data = tfrecords.frame(records)
    assert list(row_counts.tfrecord_payloads(io.BytesIO(data))) == records
    assert row_counts.count_tfrecords(io.BytesIO(data)) == row_counts.TFRecordCount(3, False)
    first = len(tfrecords.frame(records[:1]))
    for cut, complete in ((5, 0), (first + 3, 1), (len(data) - 1, 2)):  # in a header, a length CRC, a payload
        assert row_counts.count_tfrecords(io.BytesIO(data[:cut])) == row_counts.TFRecordCount(complete, True)
        with pytest.raises(ValueError, match="ends inside a record"):
            list(row_counts.tfrecord_payloads(io.BytesIO(data[:cut])))


@pytest.mark.parametrize("fmt", ["examples", "blocks"])
def test_a_wide_shuffle_buffer_draws_from_the_whole_split(runs, fmt):
    """Transformed rows keep the input's order: the training shuffle buffer (in rows,
    `training.shuffle_buffer_rows`) decides how far apart the rows of one batch may lie. Its first
    batches come from the first rows with the smallest buffer (16 batches), from the whole split
    with a buffer as large as the split."""
    cfg, tx = runs[fmt]
    manifest = resolved_input.read_manifest(examples_uri([_pattern(tx, "train")]))
    order = {}
    for f, y in make_dataset([_pattern(tx, "train")], manifest, 32, training=False):
        for row in _rows(f, y):
            order.setdefault(row, len(order))

    def reach(shuffle_rows):
        ds = make_dataset([_pattern(tx, "train")], manifest, 32, training=True, seed=3, shuffle_rows=shuffle_rows)
        return max(order[r] for f, y in ds.take(4) for r in _rows(f, y) if r in order)

    narrow, wide = reach(1), reach(ROWS)  # 1: at least 16 batches (512 rows)
    assert narrow < 0.6 * len(order) < wide, (narrow, wide, len(order))


def _rewritten_in_stretches(tx, split, out_dir, files):
    """The split's records, in the order a reader of its sorted files meets them (the input's order:
    a time-ordered split), rewritten into `files` files of consecutive records, as preprocessing
    writes them with `transformed_examples.rows_per_file`."""
    names = sorted(tf.io.gfile.glob(_pattern(tx, split)), key=lambda f: (os.path.basename(f).startswith(TAIL_PREFIX), f))
    records = list(tf.data.TFRecordDataset(names).as_numpy_iterator())
    per_file = -(-len(records) // files)
    os.makedirs(out_dir)
    for i in range(files):
        with tf.io.TFRecordWriter(os.path.join(out_dir, f"{TRANSFORMED_PREFIX}-{i:05d}-of-{files:05d}")) as w:
            for r in records[i * per_file:(i + 1) * per_file]:
                w.write(r)
    return str(out_dir / "*")


@pytest.mark.slow(reason="reads a 1,200-row split three times through make_dataset, row by row in Python")
def test_a_time_sorted_split_in_many_files_is_drawn_from_its_whole_range(runs, tmp_path):
    """A split whose rows are sorted (by time, as logs are) and written as many files of
    consecutive rows: the trainer reads the files in a seeded order, 16 at a time, so its first
    two batches already hold rows from both ends of the range with the smallest shuffle buffer,
    where the same rows in one file give only rows from its first part."""
    cfg, tx = runs["blocks"]
    manifest = resolved_input.read_manifest(examples_uri([_pattern(tx, "train")]))
    one_file = _rewritten_in_stretches(tx, "train", tmp_path / "one", 1)
    many = _rewritten_in_stretches(tx, "train", tmp_path / "many", 30)
    position = {}  # a row's place in the sorted split (its "time")
    for f, y in make_dataset([one_file], manifest, 32, training=False):
        for row in _rows(f, y):
            position.setdefault(row, len(position) / ROWS)

    def first_rows(pattern):
        ds = make_dataset([pattern], manifest, 32, training=True, seed=3, shuffle_rows=1)
        return [position[r] for f, y in ds.take(2) for r in _rows(f, y) if r in position]

    narrow, spread = first_rows(one_file), first_rows(many)
    assert max(narrow) < 0.5, max(narrow)
    assert min(spread) < 0.2 and max(spread) > 0.8, (min(spread), max(spread))
