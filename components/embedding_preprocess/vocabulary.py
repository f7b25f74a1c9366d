"""Vocabularies: ordering, pruning, files on disk, and token -> embedding-ID lookup.

File formats (read by standard tools):
- `<name>.txt`: one token per line, most frequent first (row i of the table is line i). Loadable
  by `tf.lookup.TextFileInitializer(..., key_index=TextFileIndex.WHOLE_LINE,
  value_index=TextFileIndex.LINE_NUMBER)`, which is what the serving graph does.
- `<name>.counts.txt`: `<count> <token>` per line in the same order, tf.Transform's
  `store_frequency=True` convention.
IDs: the rulebook's V1-V2 (`components.rulebook`): token at line i -> i; any other valid token ->
size + `rulebook.oov_bucket(token)`, i.e. Fingerprint64(token) % num_oov_buckets, the same bucket
`tf.lookup.StaticVocabularyTable` (FastHashSpec, farmhash Fingerprint64) assigns in the serving graph.
"""
from __future__ import annotations

import os
from typing import Iterable, List, Sequence, Tuple

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from components.config import VocabularyOptions
from components.rulebook import oov_bucket  # V2; importable from here as before


def order_vocabulary(counts: Iterable[Tuple[bytes, int]], options: VocabularyOptions) -> List[Tuple[bytes, int]]:
    """Count descending, ties by token bytes ascending; then min_frequency, then top_k.

    The plain-Python statement of the order; the pipeline uses `order_arrays` + `prune`, which the
    tests hold against this."""
    ordered = sorted(counts, key=lambda tc: (-tc[1], tc[0]))
    kept = [tc for tc in ordered if tc[1] >= options.min_frequency]
    if options.top_k is not None:
        kept = kept[: options.top_k]
    return kept


def order_arrays(tokens: pa.Array, counts: pa.Array) -> Tuple[pa.Array, pa.Array]:
    """`order_vocabulary`'s order (count descending, then bytes ascending), vectorised in Arrow."""
    table = pa.table({"t": tokens, "c": counts})
    order = pc.sort_indices(table, sort_keys=[("c", "descending"), ("t", "ascending")])
    table = table.take(order)
    return table.column("t").combine_chunks(), table.column("c").combine_chunks()


def prune(counts: pa.Array, options: VocabularyOptions) -> int:
    """How many of the ordered entries the options keep (min_frequency, then top_k)."""
    kept = int(pc.sum(pc.greater_equal(counts, options.min_frequency)).as_py() or 0)
    return min(kept, options.top_k) if options.top_k is not None else kept


def vocabulary_file(directory: str, name: str) -> str:
    return os.path.join(directory, f"{name}.txt")


def counts_file(directory: str, name: str) -> str:
    return os.path.join(directory, f"{name}.counts.txt")


def write_vocabulary(directory: str, name: str, entries: Sequence[Tuple[bytes, int]]) -> None:
    """Writes both files through Beam's filesystems (local, GCS, ...), byte-identical per input."""
    write_vocabulary_arrays(
        directory,
        name,
        pa.array([t for t, _ in entries], pa.binary()),
        pa.array([c for _, c in entries], pa.float64() if any(isinstance(c, float) for _, c in entries) else pa.int64()),
    )


def _lines(values: pa.Array) -> bytes:
    """`b"".join(v + b"\n" for v in values)`, done by Arrow: a million-line vocabulary takes
    milliseconds instead of seconds of Python string work."""
    if len(values) == 0:
        return b""
    joined = pc.binary_join_element_wise(pc.cast(values, pa.binary()), pa.scalar(b"", pa.binary()), b"\n")
    offsets = np.frombuffer(joined.buffers()[1], np.int32, len(joined) + 1, joined.offset * 4)
    return joined.buffers()[2].to_pybytes()[offsets[0] : offsets[-1]]


def write_vocabulary_arrays(directory: str, name: str, tokens: pa.Array, counts: pa.Array) -> None:
    """`write_vocabulary` for ordered Arrow arrays: tokens (binary) and their counts."""
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.create(vocabulary_file(directory, name)) as fh:
        fh.write(_lines(tokens))
    if pa.types.is_integer(counts.type):
        count_text = pc.cast(counts, pa.string())  # Arrow's decimal text equals Python's str(int)
    else:  # weighted counts (weight_column): Python's repr, exact and shortest
        count_text = pa.array([repr(float(c)) for c in counts.to_pylist()], pa.string())
    with FileSystems.create(counts_file(directory, name)) as fh:
        # tf.Transform's store_frequency convention: "<count> <token>"
        fh.write(_lines(pc.binary_join_element_wise(pc.cast(count_text, pa.binary()), tokens, b" ")))


def read_vocabulary(directory: str, name: str) -> List[bytes]:
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.open(vocabulary_file(directory, name)) as fh:
        data = fh.read()
    return data.split(b"\n")[:-1] if data else []


class VocabularyLookup:
    """Maps tokens to embedding IDs, vectorised (a pandas hash index built once per vocabulary)."""

    def __init__(self, tokens: Sequence[bytes], num_oov_buckets: int):
        self.size = len(tokens)
        self.num_oov_buckets = num_oov_buckets
        self._index = pd.Index(list(tokens), dtype=object)

    @property
    def rows(self) -> int:
        return self.size + self.num_oov_buckets

    def lookup(self, tokens) -> Tuple[np.ndarray, int]:
        """IDs of `tokens` (a pyarrow binary array or a sequence of bytes) and how many were OOV."""
        if len(tokens) == 0:
            return np.zeros(0, dtype=np.int64), 0
        if isinstance(tokens, pa.Array):
            tokens = tokens.to_numpy(zero_copy_only=False)  # object array of bytes
        else:
            tokens = np.asarray(list(tokens), dtype=object)
        ids = self._index.get_indexer(tokens).astype(np.int64)
        missing = np.flatnonzero(ids < 0)
        if len(missing):
            if self.num_oov_buckets == 1:  # every bucket is 0: skip the hashing
                ids[missing] = self.size
            else:
                ids[missing] = [self.size + oov_bucket(tokens[i], self.num_oov_buckets) for i in missing]
        return ids, int(len(missing))
