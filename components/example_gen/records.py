"""Rows typed by the configuration, with every dropped row and every unusable cell counted.

Pure Arrow (no Beam, no TensorFlow): `type_rows` takes a RecordBatch as read from the input (CSV:
every column binary text, one value per row; TFRecord: list columns as tfx_bsl decodes tf.Examples)
and returns the RecordBatch ExampleGen writes, plus counts:
- numeric columns (`PipelineConfig.numeric_columns`: dense features, vocabulary weights, the label's
  source) become float32 lists; a text cell that is not a number is removed and counted as
  `cells/not_numeric/<column>` (the value is then missing, as preprocessing fills it). Non-finite
  values (`inf`, `nan`, and numbers beyond float32 such as `1e400`) are kept as float32 inf/NaN:
  preprocessing and the serving graph both count and fill them, so the export parity covers them.
- categorical columns stay text (CSV) or as stored (TFRecord: bytes or int64); an empty text cell
  is missing.
- the label: one number per row; with `label_rule` derived from the rule's column. A row whose label
  is missing is dropped as `missing_label`; one whose label is not exactly 0 or 1 (e.g. 2, -1, 0.5,
  "yes", several values) as `invalid_label` (the rulebook's L1, `components.rules.rulebook.binary_label`).
  The label is written as int64 0/1.
- missing configured columns are counted per column (`cells/missing/<column>`); other columns pass
  through unchanged (CSV: as text), but for those with an empty or repeated name, which are not
  written (`unnamed_or_repeated`).
"""
from __future__ import annotations

import operator
from collections import Counter
from typing import Collection, Dict, Sequence, Set, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from components.config.schema import PipelineConfig

_OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt, "==": operator.eq, "!=": operator.ne}

# The rulebook's label rule L1 (`components.rules.rulebook.binary_label`), which preprocessing's
# `features.extract_label` applies again to what ExampleGen wrote; this one also reads labels
# written as text and applies `label_rule`.
from components.rules.rulebook import DROP_INVALID_LABEL, DROP_MISSING_LABEL, binary_label  # noqa: E402


def _is_list(arr: pa.Array) -> bool:
    return pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)


def as_list_column(arr: pa.Array) -> pa.Array:
    """A flat column (one value per row) as a list column: null and empty text become a null list."""
    if _is_list(arr):
        return arr
    present = pc.is_valid(arr)
    if pa.types.is_binary(arr.type) or pa.types.is_string(arr.type):
        present = pc.and_(present, pc.greater(pc.binary_length(arr), 0))
    present_np = np.asarray(present.to_numpy(zero_copy_only=False), dtype=bool)
    if present_np.all():  # every cell holds a value: one per row, no copy of the values
        return pa.ListArray.from_arrays(pa.array(np.arange(len(arr) + 1, dtype=np.int32)), arr)
    lengths = present_np.astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = arr.filter(pa.array(present_np))
    mask = pa.array(~present_np)
    return pa.ListArray.from_arrays(pa.array(offsets), values, mask=mask)


def _rebuild(arr: pa.Array, values: pa.Array, keep: np.ndarray) -> pa.Array:
    """`arr` (a list column) with its flat values replaced by `values` filtered by `keep`."""
    parents = np.asarray(pc.list_parent_indices(arr)) if len(values) else np.zeros(0, np.int64)
    lengths = np.bincount(parents[keep], minlength=len(arr)).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    present = np.asarray(pc.is_valid(arr).to_numpy(zero_copy_only=False), dtype=bool) & (lengths > 0)
    return pa.ListArray.from_arrays(pa.array(offsets), values.filter(pa.array(keep)), mask=pa.array(~present))


def to_float_list(arr: pa.Array) -> Tuple[pa.Array, int]:
    """A list column of numbers or numeric text -> list<float32>, and how many values were not numbers."""
    values = arr.flatten()
    if pa.types.is_floating(values.type) or pa.types.is_integer(values.type):
        floats = pc.cast(values, pa.float64())
        keep = np.ones(len(values), bool)
    else:
        floats, keep = parse_numbers(values)
    rebuilt = _rebuild(arr, pc.cast(floats, pa.float32(), safe=False), keep)
    return rebuilt, int(len(values) - np.count_nonzero(keep))


def parse_numbers(text: pa.Array) -> Tuple[pa.Array, np.ndarray]:
    """Text -> float64 (Arrow's parser: decimal, exponent, inf, nan), and which values parsed."""
    as_str = pc.cast(text, pa.string(), safe=False) if not pa.types.is_string(text.type) else text
    try:
        return pc.cast(as_str, pa.float64()), np.ones(len(text), bool)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    out = np.zeros(len(text), np.float64)
    ok = np.zeros(len(text), bool)
    for i, v in enumerate(text.to_pylist()):  # rare: some cells are not numbers; find them one by one
        try:
            out[i] = float(v.strip()) if isinstance(v, (bytes, str)) else float(v)
            ok[i] = True
        except (ValueError, TypeError, UnicodeDecodeError):
            pass
    return pa.array(out), ok


def _single_numbers(arr: pa.Array, num_rows: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(value, missing, invalid) per row of a label-like list column: one number per row."""
    lengths = np.asarray(pc.fill_null(pc.list_value_length(arr), 0), dtype=np.int64)
    floats, not_numeric = to_float_list(arr)
    flen = np.asarray(pc.fill_null(pc.list_value_length(floats), 0), dtype=np.int64)
    first = np.full(num_rows, np.nan)
    one = flen == 1
    if one.any():
        first[one] = np.asarray(pc.list_element(floats.filter(pa.array(one)), 0), dtype=np.float64)
    missing = lengths == 0
    invalid = ~missing & ((lengths != 1) | (flen != 1))  # several values, or text that is no number
    return first, missing, invalid


def derive_label(cfg: PipelineConfig, column: pa.Array, num_rows: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(label 0/1 as int64, missing, invalid) per row: the label column, or the rule on its column."""
    value, missing, invalid = _single_numbers(column, num_rows)
    if cfg.label_rule is not None:
        rule = cfg.label_rule
        nan = np.isnan(value)
        missing = missing | (nan & ~invalid)  # a NaN in the rule's column says nothing
        ok = ~missing & ~invalid
        label = np.where(ok, _OPS[rule.op](np.nan_to_num(value), rule.value), False).astype(np.int64)
        return label, missing, invalid
    # `value` is NaN unless the row holds exactly one number, so rulebook L1 sees several values and
    # text alike as no 0/1 label.
    lengths = np.asarray(pc.fill_null(pc.list_value_length(column), 0), dtype=np.int64)
    label, missing, invalid = binary_label(value, lengths)
    return label.astype(np.int64), missing, invalid


def unnamed_or_repeated(names: Sequence[str], configured: Collection[str]) -> Set[str]:
    """The columns of a file that are not read: those the config does not read whose name is empty
    (pandas' unnamed index column) or that share their name with another column. A tf.Example, and
    so ExampleGen's output, holds one feature per name; a configured column named twice is refused
    before anything runs (`header.check_header`).

    Args:
      names: the file's column names, in order (a CSV header, a Parquet schema's names).
      configured: the columns the config reads.

    Returns:
      The names of the columns left out.
    """
    counts = Counter(names)
    return {n for n, k in counts.items() if (n == "" or k > 1) and n not in configured}


def type_rows(cfg: PipelineConfig, rb: pa.RecordBatch) -> Tuple[pa.RecordBatch, Dict[str, int]]:
    """The typed, labelled rows of `rb` and the counts (see the module docstring)."""
    counts: Counter = Counter()
    n = rb.num_rows
    numeric = set(cfg.numeric_columns())
    configured = numeric | set(cfg.categorical_columns())
    columns: Dict[str, pa.Array] = {}
    source = cfg.label_source()
    label_col = None  # the label's source as read: text that is no number is an invalid label, not a missing one
    for name in configured:
        if rb.schema.get_field_index(name) < 0:
            counts[f"cells/missing/{name}"] += n
    left_out = unnamed_or_repeated(rb.schema.names, configured)
    for i, name in enumerate(rb.schema.names):
        if name in left_out:
            continue
        col = as_list_column(rb.column(i))
        if name == source:
            label_col = col
        if name in configured:
            counts[f"cells/missing/{name}"] += int(n - np.count_nonzero(np.asarray(pc.fill_null(pc.list_value_length(col), 0))))
        if name in numeric:
            col, bad = to_float_list(col)
            if bad:
                counts[f"cells/not_numeric/{name}"] += bad
        columns[name] = col
    if label_col is None:
        label_col = pa.array([None] * n, pa.list_(pa.float32()))
    label, missing, invalid = derive_label(cfg, label_col, n)
    counts[f"rows/dropped/{DROP_MISSING_LABEL}"] += int(missing.sum())
    counts[f"rows/dropped/{DROP_INVALID_LABEL}"] += int(invalid.sum())
    keep = ~missing & ~invalid
    columns[cfg.label] = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), pa.array(label))
    out = pa.RecordBatch.from_arrays(list(columns.values()), list(columns.keys()))
    if not keep.all():
        out = out.filter(pa.array(keep))
    counts["rows/written"] += out.num_rows
    return out, dict(counts)
