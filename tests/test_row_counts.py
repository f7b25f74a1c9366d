"""The independent CSV line count (`row_counts.scan_csv`) against the line-by-line scan it replaced:
the same counts and end state on random CSV-like bytes, read in blocks of any size and started
from any state (a byte range of a file starts inside quotes or inside a line)."""
import io

import numpy as np
import pytest

from components.rows import row_counts


def _line_by_line(data: bytes, in_quote: bool, line_has_content: bool, strip_bom: bool, block: int):
    """The former scan_csv: parts between quotes, then lines, one Python object each."""
    records = blank = 0
    for i in range(0, len(data), block):
        chunk = data[i:i + block]
        if i == 0 and strip_bom and chunk.startswith(b"\xef\xbb\xbf"):
            chunk = chunk[3:]
        for k, part in enumerate(chunk.split(b'"')):
            if k > 0:
                in_quote = not in_quote
                line_has_content = True
            if in_quote or not part:
                if part:
                    line_has_content = True
                continue
            for j, line in enumerate(part.split(b"\n")):
                content = bool(line.strip(b"\r"))
                if j == 0:
                    line_has_content = line_has_content or content
                else:
                    if line_has_content:
                        records += 1
                    else:
                        blank += 1
                    line_has_content = content
    return row_counts.CsvScanState(records, blank, in_quote, line_has_content)


ALPHABET = [b"a", b",", b'"', b"\n", b"\r", b"\r\n", b"\n\n", b'""', b"x,y", b"\xef\xbb\xbf"]


@pytest.mark.parametrize("seed", range(12))
def test_vectorised_scan_counts_as_the_line_by_line_scan(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    for _ in range(150):
        data = b"".join(ALPHABET[k] for k in rng.integers(0, len(ALPHABET), int(rng.integers(0, 60))))
        if rng.random() < 0.3:
            data = b"\xef\xbb\xbf" + data
        in_quote, has_content, bom = (bool(b) for b in rng.integers(0, 2, 3))
        block = int(rng.integers(1, 12))
        monkeypatch.setattr(row_counts, "BLOCK", block)
        want = _line_by_line(data, in_quote, has_content, bom, block)
        got = row_counts.scan_csv(io.BytesIO(data), in_quote, has_content, strip_bom=bom)
        assert got == want, (data, in_quote, has_content, bom, block)


def test_scan_of_a_file_counts_records_blank_lines_and_an_open_quote():
    data = b'h1,h2\r\n1,"a\nb"\n\r\n\n2,3\n"open\n'
    c = row_counts.count_csv_records(io.BytesIO(data))
    assert (c.data_records, c.blank_lines, c.has_header, c.unterminated_quote) == (3, 2, True, True)
