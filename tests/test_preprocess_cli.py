"""The standalone preprocessing CLI on CSV with bad rows: counted by reason, nothing silently lost."""
import csv
import json
import os
from collections import Counter

import pyarrow as pa
import pytest
import yaml

from components.embedding_preprocess import vocabulary
from components.embedding_preprocess.__main__ import main
from components.example_gen.synthetic_data import GeneratorSpec, write_csv

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEAM = ["--direct_running_mode=in_memory"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    path = root / "rows.csv"
    write_csv(GeneratorSpec(rows=600, seed=5), str(path))
    good = path.read_bytes()
    header = good.split(b"\n", 1)[0].split(b",")
    width = len(header)

    def row(**cells):
        values = [b"1"] + [b"3"] * 13 + [b"tok"] * 26
        for k, v in cells.items():
            values[header.index(k.encode())] = v
        return b",".join(values)

    bad = [
        b"1,2,3",  # wrong number of fields
        row(I1=b"abc"),  # non-numeric dense
        row(I2=b"nan"),  # NaN dense
        row(label=b""),  # no label: dropped
        row(C1=b"caf\xe9"),  # not UTF-8
        row(C3=b"a|b|c|d|e|f|g|h"),  # multi-hot longer than max_length 5
    ]
    (root / "bad.csv").write_bytes(good + b"\n".join(bad) + b"\n")
    with open(os.path.join(REPO, "configs", "demo.yaml")) as fh:
        cfg = yaml.safe_load(fh)
    cfg["input"]["path"] = str(root / "bad.csv")
    (root / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert width == 40
    return root


@pytest.fixture(scope="module")
def full_run(data):
    """The CLI's whole run on bad.csv into data/out, once for the module (both tests below read it,
    in either order): (exit status, what it printed)."""
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = main(["--config", str(data / "cfg.yaml"), "--input", str(data / "bad.csv"), "--output", str(data / "out"), *BEAM])
    return rc, printed.getvalue()


def test_cli_counts_bad_rows_and_matches_independent_vocabulary(data, full_run):
    out = data / "out"
    rc, printed = full_run
    assert rc == 0
    assert not (data / "out.partial").exists()
    stats = json.loads((out / "statistics" / "statistics.json").read_text())
    assert stats["input"] == {"malformed_rows": 1, "not_numeric": {"I1": 1}}
    train = stats["splits"]["train"]
    assert train["examples_read"] == 605 and train["examples_dropped"] == {"missing_label": 1, "invalid_label": 0}
    assert stats["dense_features"]["I2"]["train"]["invalid_values"] == {"nan": 1}
    assert stats["features"]["C1"]["splits"]["train"]["invalid_values"] == {"not_utf8": 1}
    assert stats["features"]["C3"]["splits"]["train"]["truncated_ids"] >= 3
    assert (out / "statistics" / "statistics.html").exists()

    # independent count with the csv module over the labelled, well-formed rows
    counts = Counter()
    with open(data / "bad.csv", newline="", encoding="latin-1") as fh:
        for r in csv.DictReader(fh):
            if r.get("label") in ("", None) or None in r or r.get("C26") is None:
                continue
            for col, max_len in (("C3", 5), ("C4", None)):
                toks = [t.encode("latin-1") for t in r[col].split("|") if t] if col == "C3" else (
                    [r[col].encode("latin-1")] if r[col] else [])
                counts.update(toks[:max_len] if max_len else toks)
    expected = [t for t, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if c >= 3]
    assert vocabulary.read_vocabulary(str(out / "vocabulary"), "shared_c3_c4") == expected
    assert "rows/s" in printed


def test_cli_refuses_bad_input_before_beam(data, tmp_path, capsys):
    cfg = str(data / "cfg.yaml")
    assert main(["--config", cfg, "--input", str(tmp_path / "none*.csv"), "--output", str(tmp_path / "o")]) == 2
    assert "matches no file" in capsys.readouterr().err
    (tmp_path / "empty.csv").write_bytes(b"")
    assert main(["--config", cfg, "--input", str(tmp_path / "empty.csv"), "--output", str(tmp_path / "o")]) == 2
    assert "no header" in capsys.readouterr().err
    (tmp_path / "cols.csv").write_bytes(b"label,I1\n1,2\n")
    assert main(["--config", cfg, "--input", str(tmp_path / "cols.csv"), "--output", str(tmp_path / "o")]) == 2
    assert "not in the CSV header" in capsys.readouterr().err
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "keep.txt").write_text("x")
    assert main(["--config", cfg, "--input", str(data / "bad.csv"), "--output", str(tmp_path / "o")]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert main(["--config", str(tmp_path / "nope.yaml"), "--input", "x", "--output", "y"]) == 2
    # Raw Parquet (input.format: parquet) is typed by EmbeddingExampleGen, not read as an ExampleGen split.
    import yaml

    raw = yaml.safe_load((data / "cfg.yaml").read_text())
    raw["input"]["format"] = "parquet"
    (tmp_path / "pq.yaml").write_text(yaml.safe_dump(raw))
    assert main(["--config", str(tmp_path / "pq.yaml"), "--input", str(data / "bad.csv"), "--output", str(tmp_path / "p")]) == 2
    assert "input.format: parquet is typed by EmbeddingExampleGen" in capsys.readouterr().err
    assert not (tmp_path / "o.partial").exists()


def test_cli_analyze_only_gives_the_same_vocabularies(data, full_run):
    full, only = data / "out", data / "analyze"
    assert full_run[0] == 0
    rc = main(["--config", str(data / "cfg.yaml"), "--input", str(data / "bad.csv"), "--output", str(only),
               "--analyze-only", *BEAM])
    assert rc == 0 and not (only / "transformed").exists()
    for vocab in ("shared_c3_c4", "C1", "C26"):
        assert (only / "vocabulary" / f"{vocab}.counts.txt").read_bytes() == (
            full / "vocabulary" / f"{vocab}.counts.txt").read_bytes()
    stats = json.loads((only / "statistics" / "statistics.json").read_text())
    assert stats["splits"]["train"]["examples_read"] == 605
    assert stats["splits"]["train"]["examples_dropped"] == {"missing_label": 1, "invalid_label": 0}


# ---- the CLI reads CSV as ExampleGen does (components.example_gen.csv_records) ------------------

READER_CONFIG = {
    "input": {"path": "unused.csv"},
    "label": "label",
    "dense_features": [{"name": "I1", "column": "I,1"}],
    "categorical_features": [{"name": "C1", "dim": 4}],
}
# A byte-order mark and a quoted header name holding the separator; a quoted separator and a quoted
# line break in the rows, CRLF; a text label (invalid) and an empty one (missing), as
# tests/test_example_gen.py's MESSY_CSV has them.
MESSY = b'\xef\xbb\xbflabel,"I,1",C1\r\n1,0.5,"a,b"\r\n0,,"multi\nline"\r\nyes,2,c\r\n,3,d\r\n'
RULE_CONFIG = {**READER_CONFIG, "label": "clicked", "label_rule": {"column": "rating", "op": ">=", "value": 4},
               "dense_features": []}


def test_cli_checks_headers_by_example_gen_rules(tmp_path):
    from components.config.loading import parse_config
    from components.embedding_preprocess.csv_input import check_csv_input, read_header
    from components.reporting.errors import InputError

    (tmp_path / "messy.csv").write_bytes(MESSY)
    check_csv_input(parse_config(READER_CONFIG), str(tmp_path / "messy.csv"))
    assert read_header(str(tmp_path / "messy.csv")) == ["label", "I,1", "C1"]
    # With label_rule the header holds the rule's column, not the derived label.
    (tmp_path / "rated.csv").write_bytes(b"rating,C1\n5,a\n")
    check_csv_input(parse_config(RULE_CONFIG), str(tmp_path / "rated.csv"))
    (tmp_path / "clash.csv").write_bytes(b"rating,C1,clicked\n5,a,1\n")
    with pytest.raises(InputError, match="rename `label`"):
        check_csv_input(parse_config(RULE_CONFIG), str(tmp_path / "clash.csv"))


def _read_csv_rows(path, columns, cfg, label_name):
    """(label as text, *the other columns) of every row the CLI's CSV reader gives for `path`, its
    ranges read one by one as the PTransform's workers do (`csv_input._ParseCsvRange`)."""
    from components.embedding_preprocess import csv_input
    from components.example_gen import ranges

    rs = csv_input.csv_ranges(path)
    before = ranges.before_each_range([ranges.count_quotes(r) for r in rs])
    fn = csv_input._ParseCsvRange(columns, cfg.to_json(), 2)
    fn.setup()
    rows = []
    for r in rs:
        for rb in fn.process(r, before):
            if isinstance(rb, pa.RecordBatch):
                values = [rb.column(rb.schema.get_field_index(c)).to_pylist() for c in [label_name, *columns[1:]]]
                rows += [(str(label), *rest) for label, *rest in zip(*values)]
    return len(rs), rows


def test_cli_reads_quoted_line_breaks_compressed_files_and_label_rules_as_example_gen(tmp_path, monkeypatch):
    import gzip

    from components.config.loading import parse_config
    from components.embedding_preprocess import csv_input

    monkeypatch.setattr(csv_input, "RANGE_BYTES", 7)  # ranges that cut the quoted line break
    (tmp_path / "messy.csv").write_bytes(MESSY)
    (tmp_path / "messy.csv.gz").write_bytes(gzip.compress(MESSY))  # one range, streamed
    (tmp_path / "rated.csv").write_bytes(b"rating,C1\n5,a\n3,b\n,c\nhigh,d\n")
    # The label as preprocessing's L1 reads it: 0/1, None when missing, NaN (here "nan") when invalid.
    messy = [("1.0", 0.5, b"a,b"), ("0.0", None, b"multi\nline"), ("nan", 2.0, b"c"), ("None", 3.0, b"d")]
    cfg = parse_config(READER_CONFIG)
    assert _read_csv_rows(str(tmp_path / "messy.csv"), ["label", "I,1", "C1"], cfg, "label") == (len(MESSY) // 7 + 1, messy)
    assert _read_csv_rows(str(tmp_path / "messy.csv.gz"), ["label", "I,1", "C1"], cfg, "label") == (1, messy)
    rated = [("1.0", b"a"), ("0.0", b"b"), ("None", b"c"), ("nan", b"d")]
    assert _read_csv_rows(str(tmp_path / "rated.csv"), ["rating", "C1"], parse_config(RULE_CONFIG), "clicked")[1] == rated
