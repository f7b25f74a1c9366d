"""CSV byte ranges: every line read exactly once, whatever the range size."""
import random

import pytest

from components.embedding_preprocess.csv_input import read_range_lines, split_ranges


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000, 1 << 20])
def test_ranges_cover_every_line_once(tmp_path, chunk):
    data = b"h1,h2\n" + b"".join(b"%d,%s\n" % (i, b"x" * random.Random(i).randint(0, 30)) for i in range(3000))
    path = tmp_path / "r.csv"
    path.write_bytes(data)
    got = b"".join(read_range_lines(*r) for r in split_ranges(str(path), chunk))
    assert got == data.split(b"\n", 1)[1]


def test_last_line_without_newline(tmp_path):
    path = tmp_path / "r.csv"
    path.write_bytes(b"h\n1\n2")
    assert b"".join(read_range_lines(*r) for r in split_ranges(str(path), 1)) == b"1\n2"
