"""Vocabularies: ordering, pruning, files on disk, and token -> embedding-ID lookup.

File formats (read by standard tools):
- `<name>.txt`: one token per line, most frequent first (row i of the table is line i). Loadable
  by `tf.lookup.TextFileInitializer(..., key_index=TextFileIndex.WHOLE_LINE,
  value_index=TextFileIndex.LINE_NUMBER)`, which is what the serving graph does.
- `<name>.counts.txt`: `<count> <token>` per line in the same order, tf.Transform's
  `store_frequency=True` convention.
IDs: the rulebook's V1-V2 (`components.rules.rulebook`): token at line i -> i; any other valid token ->
size + `rulebook.oov_bucket(token)`, i.e. Fingerprint64(token) % num_oov_buckets, the same bucket
`tf.lookup.StaticVocabularyTable` (FastHashSpec, farmhash Fingerprint64) assigns in the serving graph.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from components.config.schema import ConfigError, VocabularyOptions
from components.config.binding import check_vocabulary_values
from components.embedding_preprocess.fingerprint import fingerprint64
from components.example_gen import split_hash
from components.rules.rulebook import IDENTITY_TEXT, INVALID_NOT_AN_ID, INVALID_OUT_OF_RANGE
from components.rules.rulebook import oov_bucket  # V2; importable from here as before
from components.config.choices import VocabularyKind
from components.contracts.artifacts import counts_file, vocabulary_file


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
    from apache_beam.io.filesystems import FileSystems  # lazy: keeps Beam off the transform's import path (the exporter and the rulebook's tests read it)

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
    """The tokens of `<name>.txt`, one per complete line (a last line without its line break is
    not a token: the writer ends every line with one)."""
    return read_vocabulary_tokens(directory, name).to_pylist()


_MAX_BINARY_BYTES = 2**31 - 1  # an Arrow binary array's 32-bit offsets


def read_vocabulary_tokens(directory: str, name: str) -> pa.Array:
    """`read_vocabulary` as a pyarrow binary array built straight from the file's bytes (numpy
    finds the line breaks; no Python object per token). A 3.4M-token vocabulary set as Python
    bytes objects took 312 MB while it was read, and left memory the allocator does not give back;
    as one Arrow array it is 58 MB (bench/lookup_bench.py --load). Every transform worker loads
    every vocabulary, so this is per worker."""
    from apache_beam.io.filesystems import FileSystems  # lazy: keeps Beam off the transform's import path (the exporter and the rulebook's tests read it)

    path = vocabulary_file(directory, name)
    with FileSystems.open(path) as fh:
        data = fh.read()
    raw = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(raw == ord("\n"))
    body = raw[: ends[-1] + 1 if len(ends) else 0]
    body = body[body != ord("\n")]  # the tokens' bytes, back to back
    if len(body) > _MAX_BINARY_BYTES:
        raise ValueError(f"{path}: {len(body):,} bytes of tokens exceed what one lookup holds (2 GiB); "
                         "cap the table's vocabulary (vocabulary.top_k or vocabulary.min_frequency)")
    offsets = np.zeros(len(ends) + 1, np.int32)
    # token i starts where line i starts, less the i line breaks taken out before it
    offsets[1:] = ends + 1 - np.arange(1, len(ends) + 1)
    return pa.Array.from_buffers(pa.binary(), len(ends), [None, pa.py_buffer(offsets), pa.py_buffer(body)])


class VocabularyLookup:
    """Maps tokens to embedding IDs, vectorised and exact.

    Each token is hashed to 64 bits with numpy over the Arrow data buffer
    (`split_hash.binary_value_hashes`, no Python object per token) and looked up in a pandas index
    of the vocabulary's hashes: an integer hash table, 2.1x faster than an index of Python bytes
    objects on a 100k-token vocabulary and 6.5x on 3M tokens, holding a sixth less memory at 3M
    (bench/lookup_bench.py). Exact:
    a found token is compared with the vocabulary entry it hit (one vectorised Arrow comparison),
    and since no two vocabulary entries share a hash, a token whose hash hits an entry with other
    bytes is not in the vocabulary (OOV). A vocabulary in which two entries do share a hash (about
    one in a million for 5M tokens) falls back to an index of the tokens themselves."""

    def __init__(self, tokens: Sequence[bytes], num_oov_buckets: int):
        self.size = len(tokens)
        self.num_oov_buckets = num_oov_buckets
        self._tokens = tokens if isinstance(tokens, pa.Array) else pa.array(list(tokens), pa.binary())
        hashes = split_hash.binary_value_hashes(self._tokens)
        self._by_hash = len(np.unique(hashes)) == len(hashes)
        if self._by_hash:
            self._index = pd.Index(hashes)
        else:
            self._index = pd.Index(self._tokens.to_numpy(zero_copy_only=False), dtype=object)

    @property
    def rows(self) -> int:
        return self.size + self.num_oov_buckets

    def lookup(self, tokens) -> Tuple[np.ndarray, int]:
        """IDs of `tokens` (a pyarrow binary array or a sequence of bytes) and how many were OOV."""
        if len(tokens) == 0:
            return np.zeros(0, dtype=np.int64), 0
        if not isinstance(tokens, pa.Array):
            tokens = pa.array(list(tokens), pa.binary())
        if not pa.types.is_binary(tokens.type):
            tokens = tokens.cast(pa.binary())
        if self._by_hash:
            ids = self._index.get_indexer(split_hash.binary_value_hashes(tokens)).astype(np.int64)
            hit = np.flatnonzero(ids >= 0)
            if len(hit):
                same = np.asarray(pc.equal(self._tokens.take(pa.array(ids[hit])), tokens.take(pa.array(hit))))
                ids[hit[~same]] = -1  # another token's hash: not in the vocabulary
        else:
            ids = self._index.get_indexer(tokens.to_numpy(zero_copy_only=False)).astype(np.int64)
        missing = np.flatnonzero(ids < 0)
        if len(missing):
            if self.num_oov_buckets == 1:  # every bucket is 0: skip the hashing
                ids[missing] = self.size
            else:
                buckets = fingerprint64(tokens.take(pa.array(missing))) % np.uint64(self.num_oov_buckets)
                ids[missing] = self.size + buckets.astype(np.int64)
        return ids, int(len(missing))


# ---- column kinds other than a counted vocabulary (rulebook V1-V4) -------------------------------


GIVEN_KINDS = ("list", "file")  # vocabularies given by the config, written before the pipeline runs


def given_vocabulary(options: VocabularyOptions) -> Optional[List[bytes]]:
    """The tokens of a vocabulary given in the config (`kind: list`) or as a file (`kind: file`,
    one token per line; a trailing CR of a line and the last line break are not part of the
    token), checked (T5-T6, distinct) with the file and line named; None for other kinds."""
    if options.kind == VocabularyKind.LIST:
        return [t.encode("utf-8") for t in options.values]
    if options.kind != VocabularyKind.FILE:
        return None
    from apache_beam.io.filesystems import FileSystems  # lazy: keeps Beam off the transform's import path (the exporter and the rulebook's tests read it)

    try:
        with FileSystems.open(options.file) as fh:
            data = fh.read()
    except Exception as e:  # noqa: BLE001  (any filesystem's "not found" / permission error)
        raise ConfigError(f"vocabulary.file: {options.file} cannot be read ({type(e).__name__}: {e}); "
                          "give an existing vocabulary file, one value per line") from None
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    tokens = [line[:-1] if line.endswith(b"\r") else line for line in lines]
    if not tokens:
        raise ConfigError(f"vocabulary.file: {options.file} is empty; list one value per line")
    check_vocabulary_values(tokens, f"vocabulary file {options.file}", "line")
    return tokens


class IdentityLookup:
    """V4 over a batch: tokens that are IDs of an identity column with `num_buckets` rows map to
    themselves; the others to `default_value` (counted as oov), or, without one, `id_filter`
    removes them before truncation (T7), counted `out_of_range` / `not_an_id`."""

    def __init__(self, num_buckets: int, default_value: Optional[int]):
        self.size = num_buckets
        self.num_oov_buckets = 0
        self.default_value = default_value

    @property
    def rows(self) -> int:
        return self.size

    def _ids(self, tokens: pa.Array) -> Tuple[np.ndarray, np.ndarray]:
        """(ids with -1 where not an ID, whether each token is an integer text at all)."""
        tokens = tokens if isinstance(tokens, pa.Array) else pa.array(list(tokens), pa.binary())
        integer = np.asarray(pc.fill_null(pc.match_substring_regex(tokens, f"^(?:{IDENTITY_TEXT.decode()})$"), False))
        # at most 18 digits always fit int64; longer integer texts exceed any table
        short = integer & (np.asarray(pc.binary_length(tokens)) <= 18)
        ids = np.full(len(tokens), -1, np.int64)
        if short.any():
            values = pc.cast(pc.cast(tokens.filter(pa.array(short)), pa.string()), pa.int64()).to_numpy()
            ids[short] = np.where(values < self.size, values, -1)
        return ids, integer

    def id_filter(self, tokens: pa.Array) -> Tuple[np.ndarray, Dict[str, int]]:
        """(which tokens are kept, dropped ones by reason): everything is kept with a default row."""
        if self.default_value is not None or len(tokens) == 0:
            return np.ones(len(tokens), bool), {}
        ids, integer = self._ids(tokens)
        keep = ids >= 0
        reasons = {INVALID_OUT_OF_RANGE: int(np.count_nonzero(~keep & integer)),
                   INVALID_NOT_AN_ID: int(np.count_nonzero(~keep & ~integer))}
        return keep, {r: c for r, c in reasons.items() if c}

    def lookup(self, tokens) -> Tuple[np.ndarray, int]:
        """IDs of `tokens` and how many went to the default row."""
        if len(tokens) == 0:
            return np.zeros(0, dtype=np.int64), 0
        ids, _ = self._ids(tokens)
        missing = ids < 0
        if missing.any():
            if self.default_value is None:
                raise ValueError("identity tokens that are no IDs reach the lookup; extract_tokens' id_filter removes them")
            ids[missing] = self.default_value
        return ids, int(np.count_nonzero(missing))
