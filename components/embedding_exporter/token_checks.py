"""The rulebook's token checks (`components.rules.rulebook`) as TensorFlow ops of the serving graph:
valid tokens (T5-T6, with a plain-ASCII shortcut and the full checks in a branch only a batch
with other tokens runs), JSON integer texts (J2), identity IDs (V4), and whether a vocabulary file
can be keyed by int64 value (T2's decimal texts).
"""
from __future__ import annotations

import functools
from typing import Optional

import components  # noqa: F401
import tensorflow as tf

from components.rules import rulebook
from components.embedding_exporter.ragged_rows import keep_values


def valid_tokens(flat: tf.Tensor) -> tf.Tensor:
    """Rulebook T5-T6: non-empty, valid UTF-8, no line break (one bool per token)."""
    nonempty = tf.strings.length(flat) > 0
    utf8 = tf.equal(tf.strings.unicode_transcode(flat, "UTF-8", "UTF-8", errors="ignore"), flat)
    no_break = tf.logical_not(tf.strings.regex_full_match(flat, "(?s).*[\r\n].*"))
    return nonempty & utf8 & no_break


# Rulebook T5-T6 for the commonest valid token: ASCII without line breaks (every such string is
# valid UTF-8). RE2's own UTF-8 handling is not a validity check: it accepts encoded surrogates
# and code points above U+10FFFF (tests/test_serving_transform.py has the cases).
_PLAIN_ASCII = r"[\x00-\x09\x0b\x0c\x0e-\x7f]+"


def plain_tokens(flat: tf.Tensor) -> tf.Tensor:
    """Tokens valid by T5-T6 for sure: plain ASCII without line breaks (others may be valid too)."""
    return tf.strings.regex_full_match(flat, _PLAIN_ASCII)


def valid_tokens_fast(flat: tf.Tensor, plain: Optional[tf.Tensor] = None) -> tf.Tensor:
    """`valid_tokens` with one regex for plain ASCII tokens (`plain`, when already known); the
    full checks (UTF-8 transcoding the most costly) run on the others only."""
    plain = plain_tokens(flat) if plain is None else plain
    other = tf.where(tf.logical_not(plain))
    return tf.tensor_scatter_nd_update(plain, other, valid_tokens(tf.gather(flat, other[:, 0])))


def _fits_int64(digits: tf.Tensor) -> tf.Tensor:
    """Whether decimal digits without leading zeros are at most INT64_MAX, without converting a
    longer number (tf.strings.to_number fails on overflow): the first 18 digits and the 19th."""
    n = tf.strings.length(digits)
    head = tf.strings.to_number(tf.strings.substr(digits, 0, 18), tf.int64)  # never overflows
    nineteenth = tf.strings.to_number(tf.strings.substr(tf.strings.join([digits, "0" * 19]), 18, 1), tf.int64)
    top, last = divmod(rulebook.INT64_MAX, 10)
    return (n < 19) | ((n == 19) & ((head < top) | ((head == top) & (nineteenth <= last))))


def int_texts(values: tf.RaggedTensor) -> tf.RaggedTensor:
    """Rulebook J2: JSON strings of an int64 column -> the decimal text preprocessing makes of the
    int64 value each stands for (`rulebook.int_text_value`); no value, `negative_int` and
    `not_integer` strings are dropped."""
    values = values.with_flat_values(tf.strings.strip(values.flat_values))
    values = keep_values(values, tf.strings.regex_full_match(values.flat_values, rulebook.INTEGER_TEXT.decode()))
    negative = tf.strings.regex_full_match(values.flat_values, "-0*[1-9][0-9]*")
    digits = tf.strings.regex_replace(values.flat_values, "^[+-]?0*([0-9])", r"\1")  # sign and leading zeros off
    return keep_values(values.with_flat_values(digits), tf.logical_not(negative) & _fits_int64(digits))


def identity_ids(flat: tf.Tensor, num_buckets: int) -> tf.Tensor:
    """Looks tokens up in an identity table (rulebook V4).

    Args:
      flat: tokens, int64 values or text, shape [n].
      num_buckets: the table's rows.

    Returns:
      int64 [n]: each token's row when it is an ID 0 <= i < num_buckets (text:
      `rulebook.IDENTITY_TEXT`, no sign or leading zero), else -1 (what a vocabulary miss is;
      the serving transform then gives it the default row or drops it).
    """
    if flat.dtype == tf.int64:
        return tf.where((flat >= 0) & (flat < num_buckets), flat, -1)
    text = tf.strings.regex_full_match(flat, rulebook.IDENTITY_TEXT.decode())
    short = text & (tf.strings.length(flat) <= 18)  # at most 18 digits always fit int64
    values = tf.strings.to_number(tf.where(short, flat, "0"), tf.int64)
    return tf.where(short & (values < num_buckets), values, -1)


def decimal_int64_lines(path: str) -> bool:
    """Whether every line of a vocabulary file is a text T2 makes of an int64 value (decimal
    digits, no sign, no leading zero, at most INT64_MAX): then a table keyed by the int64 values
    maps each value to the line number the string table maps its text to."""
    with tf.io.gfile.GFile(path, "rb") as fh:  # line by line: a vocabulary can be gigabytes
        for line in fh:
            line = line.rstrip(b"\n")
            if not (line.isdigit() and (line == b"0" or line[:1] != b"0") and (len(line) < 19 or int(line) <= rulebook.INT64_MAX)):
                return False
    return True


def _drop_invalid(flat: tf.Tensor, splits: tf.Tensor, miss: tf.Tensor, valid: tf.Tensor, finish):
    """T5-T6, in the rare batch that has invalid tokens: the stacked IDs without the invalid
    misses (`valid`: one bool per miss), through `finish`."""
    keep = tf.tensor_scatter_nd_update(tf.ones(tf.shape(flat), tf.bool), miss, valid)
    out = keep_values(tf.RaggedTensor.from_row_splits(flat, splits, validate=False), keep)
    return finish(out.flat_values, out.row_splits)


def _checked(fast, flat: tf.Tensor, splits: tf.Tensor, miss: tf.Tensor, missed: tf.Tensor, plain: tf.Tensor,
             kept: Optional[tf.Tensor], finish):
    """The full T5-T6 checks on the missed tokens (V4's drops with them): `fast` when all pass,
    else the IDs with the invalid ones dropped."""
    valid = valid_tokens_fast(missed, plain)
    if kept is not None:
        valid &= kept
    return tf.cond(tf.reduce_all(valid), lambda: fast,
                   functools.partial(_drop_invalid, flat, splits, miss, valid, finish))


def unless_valid(fast, flat: tf.Tensor, splits: tf.Tensor, miss: tf.Tensor, missed: tf.Tensor, plain: tf.Tensor,
                 kept: Optional[tf.Tensor], finish):
    """`fast` (the IDs as they are, through `finish`) when every missed token is surely valid:
    plain ASCII (`plain`) and not dropped by its table (`kept`, None: no table drops); else the
    full checks (`_checked`) in a branch that only such a batch runs."""
    sure = plain if kept is None else plain & kept
    return tf.cond(tf.reduce_all(sure), lambda: fast,
                   functools.partial(_checked, fast, flat, splits, miss, missed, plain, kept, finish))
