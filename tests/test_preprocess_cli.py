"""The standalone preprocessing CLI on CSV with bad rows: counted by reason, nothing silently lost."""
import csv
import json
import os
from collections import Counter

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
