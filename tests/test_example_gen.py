"""EmbeddingExampleGen's executor called directly (TFX executor-test style) on hand-made messy input:
every bad-input case with exact counts, column types from the config, label rules, the ledger."""
import gzip
import json
import os
import struct

import pytest

import components  # noqa: F401
import tensorflow as tf

from components.rows import ledger
from components.config.loading import parse_config
from components.reporting.errors import InputError, LedgerError
from components.rows.row_counts import count_csv_records, count_tfrecords

from tests.stages import BASE, example_gen_config as _cfg, run_example_gen, split_rows  # noqa: F401


def _rows(records):
    return sorted(records, key=lambda r: json.dumps(r, default=str, sort_keys=True))


MESSY_CSV = (
    b"\xef\xbb\xbflabel,I1,I2,C1,C2,extra\r\n"  # byte-order mark, CRLF
    b'1,0.5,3,a,"x|y",keep\r\n'
    b'0,,7,"b,with comma","multi\nline",\r\n'  # quoted separator, quoted line break, empty cells
    b"1,2\r\n"  # too few fields
    b"\r\n"  # a blank line: not a row
    b"1,1,2,c,d,e,f\r\n"  # too many fields
    b"2,1,1,c,d,\r\n"  # label 2: invalid
    b"-1,1,1,c,d,\r\n"  # label -1: invalid
    b"0.5,1,1,c,d,\r\n"  # label 0.5: invalid
    b"yes,1,1,c,d,\r\n"  # label not a number: invalid
    b",1,1,c,d,\r\n"  # no label: missing
    b"0,1e400,abc,c,d,\r\n"  # 1e400: inf (counted later, by preprocessing); abc: not numeric
    b"1,inf,-inf,c,d,\r\n"
    b"0,nan,1e39,c,d,"  # no final newline; 1e39 overflows float32
)


def test_csv_every_case_counted_and_typed(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / "data.csv").write_bytes(MESSY_CSV)
    led, records, err = run_example_gen(_cfg(), d, tmp_path / "out")
    assert err is None
    stage = led["stages"][0]
    assert stage["stage"] == "EmbeddingExampleGen" and stage["balanced"] and led["balanced"]
    assert stage["rows_in"] == 12  # counted on the bytes: 13 records after the header, the blank line apart
    assert stage["input"]["blank_lines"] == 1
    assert stage["malformed"] == {"too_few_fields": 1, "too_many_fields": 1}
    assert stage["rows_parsed"] == 10
    assert stage["dropped"] == {"invalid_label": 4, "missing_label": 1}
    assert sum(stage["rows_out"].values()) == 5 == len(records)
    assert stage["cells"]["not_numeric"] == {"I2": 1, "label": 1}  # "yes" (its row is dropped too)
    assert stage["cells"]["missing"]["I1"] == 1 and stage["cells"]["missing"]["C2"] == 0
    assert any("data.csv:5 (2 fields" in e for e in stage["examples"]["malformed/too_few_fields"])  # its line
    rows = {(r["C1"][0] if r.get("C1") else None, r["I1"][0] if r.get("I1") else None): r for r in _rows(records)}
    # types from the config: label int64 0/1, dense float32 (numbers as text parsed), categorical bytes
    first = rows[(b"a", 0.5)]
    assert first["label"] == [1] and first["I2"] == [3.0] and first["C2"] == [b"x|y"] and first["extra"] == [b"keep"]
    second = rows[(b"b,with comma", None)]
    assert second["C2"] == [b"multi\nline"] and second["I1"] == [] and second["extra"] == []
    inf_row = [r for r in rows.values() if r["label"] == [0] and r.get("I2") == []]
    assert len(inf_row) == 1 and inf_row[0]["I1"] == [float("inf")]  # 1e400 kept as inf; abc removed
    overflow = [r for r in rows.values() if r.get("I2") and r["I2"][0] == float("inf")]
    assert len(overflow) == 1  # 1e39 overflows float32


def test_label_rule(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / "r.csv").write_text("rating,I1,I2,C1,C2\n5,1,1,a,b\n4,1,1,a,b\n3.5,1,1,a,b\n,1,1,a,b\nfive,1,1,a,b\n")
    cfg = _cfg(label="liked", label_rule={"column": "rating", "op": ">=", "value": 4})
    led, records, err = run_example_gen(cfg, d, tmp_path / "out")
    assert err is None
    stage = led["stages"][0]
    assert stage["dropped"] == {"invalid_label": 1, "missing_label": 1}
    assert sorted(r["liked"][0] for r in _rows(records)) == [0, 1, 1]
    assert all(len(r["rating"]) == 1 for r in _rows(records))  # the source column is kept


def test_empty_and_header_only_files_and_a_split_without_rows_gets_an_empty_file(tmp_path):
    # One ExampleGen run for both: the files hold one row in all, so one split stays empty.
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.csv").write_bytes(b"")
    (d / "b.csv").write_text("label,I1,I2,C1,C2\n")
    (d / "c.csv").write_text("label,I1,I2,C1,C2\n1,1,1,a,b\n")
    led, records, err = run_example_gen(_cfg(), d, tmp_path / "out")
    assert err is None and len(records) == 1 and led["balanced"]
    stage = led["stages"][0]
    assert stage["rows_in"] == 1 and stage["input"]["files"] == 3 and stage["input"]["files_without_header"] == 1
    rows_out = stage["rows_out"]
    empty = [s for s, n in rows_out.items() if n == 0]
    assert len(empty) == 1
    import pyarrow.parquet as pq

    files = os.listdir(tmp_path / "out" / f"Split-{empty[0]}")
    assert files == ["data_parquet-empty.parquet"]
    table = pq.read_table(tmp_path / "out" / f"Split-{empty[0]}" / files[0])
    assert table.num_rows == 0 and "label" in table.schema.names  # the other split's columns


@pytest.mark.parametrize("first", [",,,,\n", '"","","","",""\r\n', "   \n"])
def test_a_header_after_a_line_of_empty_cells_is_refused(tmp_path, first):
    # The byte-range reader and the header reader share one rule: the first line with content is the
    # header. A line of empty cells above the real header is refused by name, not read as a row.
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.csv").write_text(first + "label,I1,I2,C1,C2\n1,1,1,a,b\n")
    with pytest.raises(InputError, match="a.csv: the first line with content .* names no column; .*remove the lines above"):
        run_example_gen(_cfg(), d, tmp_path / "out")


def test_missing_column_refused_before_beam(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.csv").write_text("label,I1,C1,C2\n1,1,a,b\n")
    with pytest.raises(InputError, match=r"a.csv: column\(s\) \['I2'\]"):
        run_example_gen(_cfg(), d, tmp_path / "out")
    assert not os.path.exists(tmp_path / "out" / ledger.LEDGER_FILE)


def test_derived_label_name_clash_refused(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.csv").write_text("label,rating,I1,I2,C1,C2\n1,4,1,1,a,b\n")
    cfg = _cfg(label_rule={"column": "rating", "op": ">=", "value": 4})
    with pytest.raises(InputError, match="rename `label`"):
        run_example_gen(cfg, d, tmp_path / "out")


def _framed(payload: bytes, corrupt_crc: bool = False) -> bytes:
    from components.example_gen.beam_io import _masked_crc

    length = struct.pack("<Q", len(payload))
    crc = _masked_crc(payload) ^ (1 if corrupt_crc else 0)
    return length + struct.pack("<I", _masked_crc(length)) + payload + struct.pack("<I", crc)


def _tf_example(**cols) -> bytes:
    feats = {}
    for k, v in cols.items():
        if isinstance(v[0], bytes):
            feats[k] = tf.train.Feature(bytes_list=tf.train.BytesList(value=v))
        elif isinstance(v[0], float):
            feats[k] = tf.train.Feature(float_list=tf.train.FloatList(value=v))
        else:
            feats[k] = tf.train.Feature(int64_list=tf.train.Int64List(value=v))
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


def test_tfrecord_corrupt_records_and_missing_features(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    good = _tf_example(label=[1], I1=[3], I2=[b"2.5"], C1=[7], C2=[b"a|b"])
    no_c1 = _tf_example(label=[0], I1=[1.5], I2=[1.0], C2=[b"x"])
    no_label = _tf_example(I1=[1.0], I2=[1.0], C1=[1], C2=[b"x"])
    data = _framed(good) + _framed(no_c1) + _framed(good, corrupt_crc=True) + _framed(b"\x0a\xff\xff") + _framed(no_label)
    with gzip.open(d / "part.tfrecord.gz", "wb") as fh:
        fh.write(data)
    cfg = _cfg(input={"path": "unused", "format": "tfrecord"})
    led, records, err = run_example_gen(cfg, d, tmp_path / "out")
    assert err is None
    stage = led["stages"][0]
    assert stage["rows_in"] == 5 and stage["rows_in_counted_by"] == "TFRecord framing"
    assert stage["malformed"] == {"corrupt_record": 1, "not_a_tf_example": 1}
    assert stage["dropped"] == {"invalid_label": 0, "missing_label": 1}
    assert stage["cells"]["missing"]["C1"] == 1
    rows = _rows(records)
    assert len(rows) == 2
    typed = [r for r in rows if r.get("C1")][0]
    assert typed["I1"] == [3.0] and typed["I2"] == [2.5] and typed["C1"] == [7]  # dense typed as float; IDs kept


def test_csv_record_counter_cases():
    import io

    assert count_csv_records(io.BytesIO(b"")).data_records == 0
    assert count_csv_records(io.BytesIO(b"h\n")).data_records == 0
    c = count_csv_records(io.BytesIO(b'h1,h2\n"a\n\nb",1\n\n2,"x""y"\r\n3,4'))
    assert (c.data_records, c.blank_lines, c.unterminated_quote) == (3, 1, False)
    assert count_csv_records(io.BytesIO(b'h\n"open\n1\n')).unterminated_quote


def test_ledger_names_the_missing_rows():
    counts = {"input/data_rows": 100, "rows/parsed": 90, "rows/malformed/too_few_fields": 10,
              "rows/dropped/missing_label": 5, "rows/written": 85}
    stage = ledger.example_gen_stage(counts, {"train": 60, "eval": 20})
    assert not stage["balanced"]
    with pytest.raises(LedgerError, match="EmbeddingExampleGen.*written rows.*85 != found in the output files 80 \\(5 rows missing\\)"):
        ledger.check_stage(stage)
    pre = ledger.preprocess_stage({"train": 58, "eval": 20}, {"train": {"missing_label": 0}}, {"train": 58, "eval": 20}, {"train": 60, "eval": 20})
    assert pre["problems"] == ["train rows in: EmbeddingExampleGen wrote 60 != preprocessing read 58 (2 rows missing)"]


def _split_members(tmp_path, tag, **beam_and_input):
    d = tmp_path / "in"
    out = tmp_path / f"out-{tag}"
    raw = json.loads(json.dumps(BASE))
    raw["input"].update(beam_and_input.pop("input", {}))
    raw["beam"] = beam_and_input.pop("beam")
    led, _, err = run_example_gen(parse_config(raw), d, out)
    assert err is None and led["balanced"]
    from tfx.types import artifact_utils  # noqa: F401

    return {s: sorted(json.dumps(r, sort_keys=True, default=str) for r in split_rows(str(out / f"Split-{s}"))) for s in ("train", "eval")}, led


@pytest.mark.slow(reason="ExampleGen in one and in two Beam worker processes")
def test_split_membership_same_with_one_or_two_workers_and_any_range_size(tmp_path):
    """The split is a hash of each row's content: the same rows land in train and eval whether one
    process reads the file as one range or two worker processes read it in many small ranges."""
    d = tmp_path / "in"
    d.mkdir()
    lines = ["label,I1,I2,C1,C2"] + [f'{i % 2},{i},{i * 0.5},"a{i}\nx",b{i % 7}|c{i % 3}' for i in range(3000)]
    (d / "in.csv").write_text("\n".join(lines) + "\n")
    one, led_one = _split_members(tmp_path, "one", beam={"direct_running_mode": "in_memory"})
    two, led_two = _split_members(tmp_path, "two", beam={"direct_running_mode": "multi_processing", "direct_num_workers": 2},
                                  input={"range_mb": 4096 / (1 << 20)})
    assert led_one["stages"][0]["byte_ranges"] == 1 and led_two["stages"][0]["byte_ranges"] > 20
    assert one == two
    assert len(one["train"]) + len(one["eval"]) == 3000 and 450 < len(one["eval"]) < 750
