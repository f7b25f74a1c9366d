"""TFRecord files as this project writes them: plain, or gzipped with a `.gz` suffix."""
from __future__ import annotations

from typing import Sequence


def compression_type(files: Sequence[str]) -> str:
    """`"GZIP"` when every file ends in `.gz`, `""` when none does (tf.data's compression_type)."""
    gz = {str(f).endswith(".gz") for f in files}
    if len(gz) > 1:
        raise ValueError(f"mixed gzipped and plain TFRecord files, e.g. {sorted(files)[:2]}; keep one kind per split")
    return "GZIP" if gz == {True} else ""
