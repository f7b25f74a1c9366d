"""ExampleGen's byte ranges and split hash, without Beam: every record read exactly once whatever the
range size (quoted line breaks across range boundaries included), the independent count equal to
the whole-file count, and the split hash independent of batches and of the process."""
import gzip
import io
import os
import random
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from components.rows import row_counts
from components.example_gen import ranges as ranges_lib
from components.example_gen import split_hash


def _messy_csv(rng: random.Random, rows: int) -> bytes:
    out = [b"\xef\xbb\xbfa,b,c\r\n"] if rng.random() < 0.5 else [b"\n\na,b,c\n"]
    for i in range(rows):
        kind = rng.random()
        if kind < 0.15:
            out.append(b'"quoted\nline ' + str(i).encode() + b'\n",x,"y ""z"""\n')
        elif kind < 0.2:
            out.append(b"\n")
        elif kind < 0.25:
            out.append(b"\r\n")
        elif kind < 0.3:
            out.append(b'1,"a,b\r\nc",' + b"q" * rng.randint(0, 300) + b"\r\n")
        else:
            out.append(f"{i},{rng.random():.6f},tok{i % 7}\n".encode())
    if rng.random() < 0.5:
        out.append(b"9,9,last-without-newline")
    return b"".join(out)


def _read_all(path, range_bytes):
    size = os.path.getsize(path)
    ranges = ranges_lib.plan_ranges([(path, size)], range_bytes)
    before = ranges_lib.before_each_range(ranges_lib.count_quotes(r) for r in ranges)
    blocks, lines = [], {}
    for r in ranges:
        q, n = before[r.key()]
        owned = ranges_lib.read_owned_records(r, q, n)
        blocks.append(owned)
        for k, v in ranges_lib.count_range_lines(r, q).items():
            lines[k] = lines.get(k, 0) + v
    return ranges, blocks, lines


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("range_bytes", [7, 64, 1000])
def test_every_record_once_at_any_range_size(tmp_path, seed, range_bytes):
    data = _messy_csv(random.Random(seed), 60)
    path = str(tmp_path / "x.csv")
    open(path, "wb").write(data)
    ranges, blocks, lines = _read_all(path, range_bytes)
    assert len(ranges) > 1
    whole = b"".join(b.data for b in blocks)
    one = ranges_lib.read_owned_records(ranges_lib.plan_ranges([(path, len(data))], len(data) + 1)[0], 0, 0)
    assert whole == one.data  # the blocks partition the file's records
    assert data.endswith(whole)  # ... which run from the first data record to the end
    full = row_counts.count_csv_records(io.BytesIO(data))
    assert lines["input/lines"] - 1 == full.data_records  # header apart
    assert lines["input/blank_lines"] == full.blank_lines
    # pyarrow parses the blocks to the same rows as the whole file
    import pyarrow.csv as csv

    opts = dict(
        read_options=csv.ReadOptions(column_names=["a", "b", "c"], use_threads=False),
        parse_options=csv.ParseOptions(newlines_in_values=True, invalid_row_handler=lambda row: "skip"),
        convert_options=csv.ConvertOptions(column_types={c: pa.binary() for c in "abc"}),
    )
    # open_csv: pyarrow 10's read_csv scans the whole heap on Python 3.10 (gc.get_referrers), which
    # took this test from 2 s to 12 s a case with TensorFlow's objects in the heap
    parts = [csv.open_csv(io.BytesIO(b.data), **opts).read_all() for b in blocks if b.data.strip()]
    assert pa.concat_tables(parts).equals(csv.open_csv(io.BytesIO(one.data), **opts).read_all())


@pytest.mark.parametrize("range_bytes,block", [(97, 64), (64, 64), (500, 7), (3, 1000), (1000, 64)])
def test_one_scan_counts_quotes_and_hashes_blocks_as_the_two_passes_do(tmp_path, range_bytes, block):
    """ExampleGen's one read per range (`scan_range`) gives what `count_quotes` and `range_blocks`
    give apart, at range sizes below, at and above the block size, the file's last short block and
    a file that ends on a block boundary included."""
    for n, rows in enumerate((40, 13)):
        path = str(tmp_path / f"{n}.csv")
        with open(path, "wb") as fh:
            fh.write(_messy_csv(random.Random(n), rows))
        if n:  # the second file: cut to end exactly on a block boundary
            size = os.path.getsize(path) // block * block
            os.truncate(path, size)
        rs = ranges_lib.plan_ranges([(path, os.path.getsize(path))], range_bytes)
        for r in rs:
            assert ranges_lib.scan_range(r, block) == (ranges_lib.count_quotes(r), ranges_lib.range_blocks(r, block)), r
        hashed = [k for r in rs for _, k, _ in ranges_lib.scan_range(r, block)[1]]
        assert hashed == list(range(-(-os.path.getsize(path) // block)))  # every block once
    # a compressed file: one range, not cut; its raw (compressed) bytes hashed, no quotes counted
    gz = str(tmp_path / "0.csv.gz")
    with open(str(tmp_path / "0.csv"), "rb") as src, gzip.open(gz, "wb") as dst:
        dst.write(src.read())
    (r,) = ranges_lib.plan_ranges([(gz, os.path.getsize(gz))], range_bytes)
    assert r.whole_file and ranges_lib.scan_range(r, block) == (ranges_lib.count_quotes(r), ranges_lib.range_blocks(r, block))
    assert len(ranges_lib.scan_range(r, block)[1]) == -(-os.path.getsize(gz) // block)


@pytest.mark.parametrize("range_bytes", [100_000, 333_333, 1 << 20])
def test_records_longer_than_the_boundary_search_window(tmp_path, range_bytes):
    """A range's first record end and the one past its end are searched in windows that start at
    64 KB and grow: quoted fields of up to 600 KB (line breaks and escaped quotes inside) put both
    far from where the search starts."""
    rng = random.Random(3)
    rows = [b"h1,h2,h3\n"]
    for i in range(40):
        piece = b"".join(rng.choice([b"x", b"\n", b'""', b",", b"\r\n"]) for _ in range(997))
        body = (piece * 700)[: rng.choice([10, 70_000, 600_000])]
        body = body[:-1] if (len(body) - len(body.rstrip(b'"'))) % 2 else body  # no pair of quotes cut
        rows.append(b'%d,"%s",%d\n' % (i, body, i))
    data = b"".join(rows)
    path = str(tmp_path / "long.csv")
    open(path, "wb").write(data)
    ranges, blocks, lines = _read_all(path, range_bytes)
    assert len(ranges) > 5
    assert b"".join(b.data for b in blocks) == data[len(rows[0]):]
    assert lines["input/lines"] == 41


def test_boundary_inside_a_quoted_field(tmp_path):
    data = b'h1,h2\n1,"a\nb\nc\nd"\n2,x\n'
    path = str(tmp_path / "q.csv")
    open(path, "wb").write(data)
    cut = data.index(b"b\nc")  # a range starts inside the quoted field, on a line that looks like a record
    for range_bytes in (cut, cut + 2, 3):
        ranges, blocks, lines = _read_all(path, range_bytes)
        assert b"".join(b.data for b in blocks) == b'1,"a\nb\nc\nd"\n2,x\n'
        assert lines["input/lines"] == 3


@pytest.mark.parametrize("range_bytes", [1, 2, 3, 5])
def test_blank_lines_before_the_header_longer_than_a_range(tmp_path, range_bytes):
    data = b'\n\n\r\n\n"h1",h2\n1,"x\ny"\n2,z\n'
    path = str(tmp_path / "b.csv")
    open(path, "wb").write(data)
    _, blocks, lines = _read_all(path, range_bytes)
    assert b"".join(b.data for b in blocks) == b'1,"x\ny"\n2,z\n'  # the header is never a row
    assert lines["input/lines"] - 1 == 2 and lines["input/blank_lines"] == 4
    full = row_counts.count_csv_records(io.BytesIO(data))
    assert (full.data_records, full.blank_lines) == (2, 4)


def test_record_lines_for_messages(tmp_path):
    data = b'h\n1\n\n"x\ny"\n4\n5\n'
    path = str(tmp_path / "l.csv")
    open(path, "wb").write(data)
    _, blocks, _ = _read_all(path, 1000)
    # pyarrow numbers non-blank records: 1 -> line 2, 2 -> line 4 (after a blank line), 3 -> line 6
    assert blocks[0].record_lines([1, 2, 3, 4]) == {1: 2, 2: 4, 3: 6, 4: 7}


def test_compressed_and_tfrecord_files_are_one_range():
    rs = ranges_lib.plan_ranges([("a.csv.gz", 10_000), ("b.csv", 250)], 100)
    assert [(r.start, r.end) for r in rs if r.path == "a.csv.gz"] == [(0, ranges_lib.TO_END)]
    assert [(r.start, r.end, r.last) for r in rs if r.path == "b.csv"] == [(0, 100, False), (100, 200, False), (200, 250, True)]
    assert [r.whole_file for r in ranges_lib.plan_ranges([("c.tfrecord", 10_000)], 100, splittable=False)] == [True]
    assert [r.index for r in rs] == list(range(len(rs)))


# ---- split hash ---------------------------------------------------------------------------------


def _batch(rows):
    cols = {
        "C1": pa.array([r[0] for r in rows], pa.list_(pa.binary())),
        "I1": pa.array([r[1] for r in rows], pa.list_(pa.float32())),
        "label": pa.array([[r[2]] for r in rows], pa.list_(pa.int64())),
    }
    return pa.RecordBatch.from_pydict(cols)


ROWS = [
    ([b"a"], [1.0], 0), ([b"a", b"b"], [], 1), ([b"b", b"a"], [], 1), ([], [float("nan")], 0),
    (None, None, 1), ([b""], [0.0], 0), ([b"ab"], [1.0], 0), ([b"a", b"b"], [], 0), ([b"\xff\x00"], [-0.0], 1),
]


def test_row_hash_depends_on_the_row_only():
    whole = split_hash.row_hashes(_batch(ROWS), ["C1", "I1", "label"])
    for k in range(len(ROWS)):  # alone, and as a slice of a bigger batch
        assert split_hash.row_hashes(_batch([ROWS[k]]), ["C1", "I1", "label"])[0] == whole[k]
        assert split_hash.row_hashes(_batch(ROWS).slice(k, 1), ["label", "C1", "I1"])[0] == whole[k]
    assert len(set(whole.tolist())) == len(ROWS)  # order within a list, label and text all count
    # a missing list and an empty one are the same content; a column the batch lacks is missing
    assert split_hash.row_hashes(_batch([([], [], 1)]), ["C1", "I1", "label"])[0] == split_hash.row_hashes(_batch([(None, None, 1)]), ["C1", "I1", "label"])[0]
    without = pa.RecordBatch.from_pydict({"label": pa.array([[1]], pa.list_(pa.int64()))})
    assert split_hash.row_hashes(without, ["C1", "I1", "label"])[0] == whole[4]


def test_row_hashes_are_pinned():
    """The split of a row must not move between versions (a retrain, warm start or published figure
    would see other eval rows): these values were computed by the general path (positions and
    prefix sums) before single-valued columns got their shortcut, and must stay."""
    assert split_hash.row_hashes(_batch(ROWS), ["C1", "I1", "label"]).tolist() == [
        17737953801848408229, 571362927998670653, 281943852904555469, 8927786230175040706, 17980909140598484883,
        1600742332220979087, 4124757868016427121, 10045947622424549919, 844842334825527521]
    flat = pa.RecordBatch.from_pydict({"C1": pa.array([b"a", None, b"", b"xyz"], pa.binary()),
                                       "I1": pa.array([1.0, None, 2.0, float("nan")], pa.float32())})
    assert split_hash.row_hashes(flat, ["C1", "I1"]).tolist() == [
        336868911720392631, 5154262750204775544, 7886391471720318402, 7496316572088151956]


def test_long_buffers_hash_in_pieces_alike(monkeypatch):
    """binary_value_hashes cuts a long buffer (a whole vocabulary) into pieces of _CHUNK_BYTES to
    bound its temporaries; every piece size gives the same hashes, slices and a value longer than
    a piece included."""
    # 2,000 short values (38 KB) and one of 100 KB: pieces of 1 and 7 bytes cut the buffer at
    # nearly every value (about 1,900 pieces; a piece is a few numpy passes, the cost of this test),
    # 1,000 and 5,000 bytes hold up to 60 and 270 values a piece, and the long value outgrows each.
    rng = np.random.default_rng(1)
    values = pa.array([bytes(rng.integers(0, 256, rng.integers(0, 40)).astype(np.uint8)) for _ in range(2_000)]
                      + [b"x" * 100_000, b"", b"ab"], pa.binary())
    slices = (("all", values), ("mid", values.slice(5, 1_500)), ("end", values.slice(1_990)))
    monkeypatch.setattr(split_hash, "_CHUNK_BYTES", 1 << 40)
    whole = {k: split_hash.binary_value_hashes(v) for k, v in slices}
    for piece in (1, 7, 1000, 5_000):
        monkeypatch.setattr(split_hash, "_CHUNK_BYTES", piece)
        for k, v in slices:
            assert np.array_equal(split_hash.binary_value_hashes(v), whole[k]), (piece, k)


def test_split_proportions_and_buckets():
    n = 200_000
    rb = pa.RecordBatch.from_pydict({"C1": pa.array([[f"t{i}".encode()] for i in range(n)], pa.list_(pa.binary()))})
    split = split_hash.assign_splits(split_hash.row_hashes(rb, ["C1"]), split_hash.bucket_bounds([4, 1]))
    assert abs((split == 1).mean() - 0.2) < 0.005
    with pytest.raises(ValueError, match="at least one hash bucket"):
        split_hash.bucket_bounds([4, 0])


def test_row_hash_is_the_same_in_another_process():
    batch = _batch(ROWS)
    here = split_hash.row_hashes(batch, ["C1", "I1", "label"]).tolist()
    sink = pa.BufferOutputStream()  # the same batch handed over in Arrow's IPC format
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    code = (  # pyarrow and split_hash only: this test module would import Beam (1.5 s)
        "import json, sys, pyarrow as pa\n"
        "from components.example_gen import split_hash\n"
        "batch = pa.ipc.open_stream(sys.stdin.buffer.read()).read_next_batch()\n"
        "print(json.dumps(split_hash.row_hashes(batch, ['C1', 'I1', 'label']).tolist()))\n"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], input=sink.getvalue().to_pybytes(), capture_output=True,
                         check=True, env=env, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import json

    assert json.loads(out.stdout.decode().strip().splitlines()[-1]) == here
