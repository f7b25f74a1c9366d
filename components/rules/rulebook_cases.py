"""The rulebook's table of cases (`components.rules.rulebook`): raw values in, the tokens, IDs,
values, buckets and counted reasons its rules give out. `tests/test_rulebook.py` runs every case
through the rulebook's plain-Python statement and through both vectorised implementations
(preprocessing's pyarrow code, the serving graph's signatures); `tests/test_serving_transform.py`
puts the token cases in one batch. No TensorFlow and no Beam here, as in the rulebook.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Tuple

from components.rules.rulebook import (
    DROP_INVALID_LABEL, DROP_MISSING_LABEL, INT64_MAX, INVALID_FLOAT_IN_CATEGORICAL, INVALID_INFINITE,
    INVALID_LINE_BREAK, INVALID_MULTI_VALUED, INVALID_NAN, INVALID_NEGATIVE_INT, INVALID_NOT_AN_ID,
    INVALID_NOT_INTEGER, INVALID_NOT_NUMERIC, INVALID_NOT_UTF8, INVALID_OUT_OF_RANGE, KIND_BYTES, KIND_FLOAT,
    KIND_INT, KIND_NONE, as_float32,
)

VOCABULARY = (b"a", b"x", b"y", b"7", b"0")  # IDs 0-4; with 5 OOV buckets, unseen tokens get 5-9


@dataclass(frozen=True)
class TokenCase:
    """Raw values of one categorical column -> tokens and IDs per row, reasons counted."""

    name: str
    kind: str
    rows: Tuple[Optional[tuple], ...]  # per row: None (feature absent) or the row's raw values
    tokens: Tuple[Tuple[bytes, ...], ...]
    ids: Tuple[Tuple[int, ...], ...]
    invalid: Mapping[str, int] = field(default_factory=dict)
    truncated: int = 0
    separator: Optional[str] = None
    max_length: Optional[int] = None
    vocabulary: Tuple[bytes, ...] = VOCABULARY
    num_oov_buckets: int = 5

    def json_rows(self) -> Optional[Tuple[bytes, ...]]:
        """Gives the rows as a JSON client sends them to `serve_features`; they give the same tokens (J1-J3).

        Returns:
          One string per row (values joined by the separator, b'' = missing), or None where the
          rows have no such form (several values without a separator).
        """
        out = []
        for values in self.rows:
            values = values or ()
            if len(values) > 1 and self.separator is None:
                return None
            texts = [v if isinstance(v, bytes) else str(v).encode() for v in values]
            out.append((self.separator or "").encode().join(texts))
        return tuple(out)


TOKEN_CASES: Tuple[TokenCase, ...] = (
    TokenCase(
        "bytes_looked_up_as_typed", KIND_BYTES,
        rows=((b"a",), (b"zz",), None, (), (b"",), (b" a ",)),
        tokens=((b"a",), (b"zz",), (), (), (), (b" a ",)),
        ids=((0,), (5 + 2,), (), (), (), (5 + 4,)),
    ),
    TokenCase(
        "separator_and_empty_tokens", KIND_BYTES, separator="|",
        rows=((b"x|y",), (b"x||y",), (b"|y|",), (b"a", b"x|y")),
        tokens=((b"x", b"y"), (b"x", b"y"), (b"y",), (b"a", b"x", b"y")),
        ids=((1, 2), (1, 2), (2,), (0, 1, 2)),
    ),
    TokenCase(
        "max_length", KIND_BYTES, separator="|", max_length=2,
        rows=((b"x|y|z",), (b"|z|x|y",), (b"a",)),
        tokens=((b"x", b"y"), (b"z", b"x"), (b"a",)),
        ids=((1, 2), (5 + 2, 1), (0,)),
        truncated=2,
    ),
    TokenCase(
        "not_utf8", KIND_BYTES,
        rows=((b"bad\xff",), (b"\xc3\xa9t\xc3\xa9",), (b"\xc3",)),
        tokens=((), (b"\xc3\xa9t\xc3\xa9",), ()),
        ids=((), (5 + 4,), ()),
        invalid={INVALID_NOT_UTF8: 2},
    ),
    TokenCase(
        "line_break", KIND_BYTES, separator="|",
        rows=((b"line\nbreak",), (b"cr\rx|y",), (b"bad\xff\n|a",)),
        tokens=((), (b"y",), (b"a",)),
        ids=((), (2,), (0,)),
        invalid={INVALID_LINE_BREAK: 2, INVALID_NOT_UTF8: 1},
    ),
    TokenCase(
        "invalid_tokens_take_no_place", KIND_BYTES, separator="|", max_length=1,
        rows=((b"\xff|b|a",),),
        tokens=((b"b",),),
        ids=((5 + 2,),),
        invalid={INVALID_NOT_UTF8: 1},
        truncated=1,
    ),
    TokenCase(
        "int64_decimal_text", KIND_INT,
        rows=((7,), (0,), (-1,), (INT64_MAX,), None, ()),
        tokens=((b"7",), (b"0",), (), (b"9223372036854775807",), (), ()),
        ids=((3,), (4,), (), (5 + 4,), (), ()),
        invalid={INVALID_NEGATIVE_INT: 1},
    ),
    TokenCase(
        "int64_several_values", KIND_INT, separator="|", max_length=2,
        rows=((-7, 99, 8, 7),),
        tokens=((b"99", b"8"),),
        ids=((5 + 2, 5 + 2),),
        invalid={INVALID_NEGATIVE_INT: 1},
        truncated=1,
    ),
    TokenCase(
        "int64_extremes", KIND_INT,  # an int-valued ID column as a stock ExampleGen stores it
        rows=((-(2**63),), (2**62,), (123456789012,), (7,)),
        tokens=((), (b"4611686018427387904",), (b"123456789012",), (b"7",)),
        ids=((), (5 + 3,), (5 + 2,), (3,)),
        invalid={INVALID_NEGATIVE_INT: 1},
    ),
    TokenCase(
        "float_in_categorical", KIND_FLOAT,
        rows=((2.5,), None, (1.0,)),
        tokens=((), (), ()),
        ids=((), (), ()),
        invalid={INVALID_FLOAT_IN_CATEGORICAL: 2},
    ),
    TokenCase("absent_column", KIND_NONE, rows=(None, None), tokens=((), ()), ids=((), ())),
    TokenCase(
        "one_oov_bucket", KIND_BYTES, vocabulary=(b"a",), num_oov_buckets=1,
        rows=((b"a",), (b"b",), (b"c",)),
        tokens=((b"a",), (b"b",), (b"c",)),
        ids=((0,), (1,), (1,)),
    ),
    TokenCase(
        "many_oov_buckets", KIND_BYTES, num_oov_buckets=1000,
        rows=((b"unseen1",), (b"unseen2",), (b"x" * 300,), (b"x",)),
        tokens=((b"unseen1",), (b"unseen2",), (b"x" * 300,), (b"x",)),
        ids=((5 + 199,), (5 + 925,), (5 + 245,), (1,)),
    ),
)


@dataclass(frozen=True)
class IntTextCase:
    """J2: a JSON string sent for an int64 column (no separator) -> its token, or why none."""

    text: bytes
    token: Optional[bytes]  # the decimal text of the int64 value it stands for
    reason: Optional[str] = None


INT_TEXT_CASES: Tuple[IntTextCase, ...] = (
    IntTextCase(b"7", b"7"),
    IntTextCase(b"07", b"7"),
    IntTextCase(b" 7", b"7"),
    IntTextCase(b"7 \t\r\n", b"7"),
    IntTextCase(b"+7", b"7"),
    IntTextCase(b"+007", b"7"),
    IntTextCase(b"00", b"0"),
    IntTextCase(b"-0", b"0"),
    IntTextCase(b"99", b"99"),
    IntTextCase(b"9223372036854775807", b"9223372036854775807"),
    IntTextCase(b"0009223372036854775807", b"9223372036854775807"),
    IntTextCase(b"-1", None, INVALID_NEGATIVE_INT),
    IntTextCase(b"-3", None, INVALID_NEGATIVE_INT),
    IntTextCase(b" -07", None, INVALID_NEGATIVE_INT),
    IntTextCase(b"-99999999999999999999", None, INVALID_NEGATIVE_INT),
    IntTextCase(b"9223372036854775808", None, INVALID_NOT_INTEGER),
    IntTextCase(b"9323372036854775807", None, INVALID_NOT_INTEGER),
    IntTextCase(b"99999999999999999999", None, INVALID_NOT_INTEGER),
    IntTextCase(b"abc", None, INVALID_NOT_INTEGER),
    IntTextCase(b"7.5", None, INVALID_NOT_INTEGER),
    IntTextCase(b"7.0", None, INVALID_NOT_INTEGER),
    IntTextCase(b"1e3", None, INVALID_NOT_INTEGER),
    IntTextCase(b"0x1f", None, INVALID_NOT_INTEGER),
    IntTextCase(b"7 8", None, INVALID_NOT_INTEGER),
    IntTextCase(b"+", None, INVALID_NOT_INTEGER),
    IntTextCase(b"1_000", None, INVALID_NOT_INTEGER),
    IntTextCase("\u0663".encode(), None, INVALID_NOT_INTEGER),  # an Arabic-Indic digit: not ASCII
    IntTextCase(b" ", None),  # only whitespace: no value
)


# W1: (the weight column's kind, a row's weight values, the row's weight; None: its tokens are dropped)
WEIGHT_CASES: Tuple[Tuple[str, Optional[Tuple], Optional[float]], ...] = (
    (KIND_FLOAT, (0.5,), 0.5),
    (KIND_FLOAT, (2.0, 9.0), 2.0),  # D1: the first value
    (KIND_FLOAT, (0.0,), 0.0),
    (KIND_INT, (3,), 3.0),
    (KIND_INT, (2**60 + 2**36 + 1,), 2.0**60 + 2.0**37),  # D4: rounded once
    (KIND_FLOAT, (-1.0,), None),
    (KIND_FLOAT, (float("nan"),), None),
    (KIND_FLOAT, (float("inf"),), None),
    (KIND_FLOAT, (1e39,), None),  # beyond float32: inf
    (KIND_FLOAT, None, None),  # missing
    (KIND_FLOAT, (), None),
    (KIND_BYTES, (b"0.5",), None),  # text: not numeric (ExampleGen parses configured numeric text)
)


@dataclass(frozen=True)
class DenseCase:
    """Raw values of one dense column -> one float32 per row, missing and reasons counted."""

    name: str
    kind: str
    rows: Tuple[Optional[tuple], ...]
    fill_value: float
    values: Tuple[float, ...]
    missing: int
    invalid: Mapping[str, int] = field(default_factory=dict)

    def json_rows(self) -> Optional[Tuple[float, ...]]:
        """Gives the rows as a JSON client sends them.

        Returns:
          One float per row (the first value as float32, NaN = missing), or None for a text
          column (JSON dense columns are numbers).
        """
        if self.kind == KIND_BYTES:
            return None
        # an int64 value as the float32 it is (D4): a JSON number is read as float32 itself
        return tuple(float(as_float32(self.kind, v[0])) if v else float("nan") for v in self.rows)


NAN, INF = float("nan"), float("inf")

DENSE_CASES: Tuple[DenseCase, ...] = (
    DenseCase(
        "non_finite_filled", KIND_FLOAT, fill_value=-1.0,
        rows=((2.5,), (NAN,), (INF,), (-INF,), (3.4e38,), None),
        values=(2.5, -1.0, -1.0, -1.0, 3.4e38, -1.0),  # the largest float32 magnitude is a value
        missing=4, invalid={INVALID_NAN: 1, INVALID_INFINITE: 2},
    ),
    DenseCase(
        "beyond_float32", KIND_FLOAT, fill_value=0.0,
        rows=((1e39,), (-1e39,), ()),
        values=(0.0, 0.0, 0.0),
        missing=3, invalid={INVALID_INFINITE: 2},
    ),
    DenseCase(
        "first_value_only", KIND_FLOAT, fill_value=0.0,
        rows=((1.0, 2.0), (NAN, 1.0), (3.0,)),
        values=(1.0, 0.0, 3.0),
        missing=1, invalid={INVALID_MULTI_VALUED: 2, INVALID_NAN: 1},
    ),
    DenseCase(
        "int64_as_float32", KIND_INT, fill_value=0.5,
        rows=((3,), (-5,), None, (16777217,)),
        values=(3.0, -5.0, 0.5, 16777216.0),
        missing=1,
    ),
    DenseCase(
        "text_not_numeric", KIND_BYTES, fill_value=1.0,
        rows=((b"2.5",), None, (b"x", b"y")),
        values=(1.0, 1.0, 1.0),
        missing=3, invalid={INVALID_NOT_NUMERIC: 3},
    ),
    DenseCase(
        "int64_rounded_once", KIND_INT, fill_value=0.0,  # D4: an int-valued CSV column (CsvExampleGen)
        rows=((2**60 + 2**36 + 1,), (-(2**60 + 2**36 + 1),), (INT64_MAX,), (-(2**63),), (7, 8), ()),
        values=(2.0**60 + 2.0**37, -(2.0**60 + 2.0**37), 2.0**63, -(2.0**63), 7.0, 0.0),
        missing=1, invalid={INVALID_MULTI_VALUED: 1},
    ),
)


@dataclass(frozen=True)
class BucketCase:
    """Dense values of one column (raw, then D1-D4) -> each row's bucket among `boundaries` (B1)."""

    name: str
    case: DenseCase  # the raw rows and their float32 values
    boundaries: Tuple[float, ...]
    buckets: Tuple[int, ...]


BUCKET_CASES: Tuple[BucketCase, ...] = (
    BucketCase("edges_and_filled", DENSE_CASES[0], boundaries=(-1.0, 2.5, 1e30),
               buckets=(2, 1, 1, 1, 3, 1)),  # -1.0 (filled) equals the first boundary: bucket 1
    BucketCase("below_every_boundary", DENSE_CASES[2], boundaries=(1.5, 2.0),
               buckets=(0, 0, 2)),
    BucketCase("int64_rounded_to_float32_first", DENSE_CASES[3], boundaries=(-5.0, 0.5, 16777216.0),
               buckets=(2, 1, 2, 3)),  # 16777217 is 16777216.0: equal to the last boundary
    BucketCase("one_boundary", DENSE_CASES[4], boundaries=(1.0,), buckets=(1, 1, 1)),
    BucketCase("repeated_boundaries", DENSE_CASES[3], boundaries=(0.5, 0.5, 3.0, 3.0, 3.0),
               buckets=(5, 0, 2, 5)),  # 3.0 passes all three 3.0 boundaries; 0.5 both 0.5 ones
)


@dataclass(frozen=True)
class LabelCase:
    """One row's raw label -> its 0/1 label, or the reason the row is dropped."""

    kind: str
    values: Optional[tuple]
    label: Optional[float]
    reason: Optional[str] = None


LABEL_CASES: Tuple[LabelCase, ...] = (
    LabelCase(KIND_FLOAT, (1.0,), 1.0),
    LabelCase(KIND_FLOAT, (0.0,), 0.0),
    LabelCase(KIND_FLOAT, (2.0,), None, DROP_INVALID_LABEL),
    LabelCase(KIND_FLOAT, (-1.0,), None, DROP_INVALID_LABEL),
    LabelCase(KIND_FLOAT, (0.5,), None, DROP_INVALID_LABEL),
    LabelCase(KIND_FLOAT, (0.0, 1.0), None, DROP_INVALID_LABEL),
    LabelCase(KIND_FLOAT, (NAN,), None, DROP_INVALID_LABEL),
    LabelCase(KIND_FLOAT, (INF,), None, DROP_INVALID_LABEL),
    LabelCase(KIND_FLOAT, None, None, DROP_MISSING_LABEL),
    LabelCase(KIND_FLOAT, (), None, DROP_MISSING_LABEL),
    LabelCase(KIND_INT, (1,), 1.0),
    LabelCase(KIND_INT, (3,), None, DROP_INVALID_LABEL),
    LabelCase(KIND_INT, (0,), 0.0),
    LabelCase(KIND_INT, (1, 1), None, DROP_INVALID_LABEL),
    LabelCase(KIND_BYTES, (b"yes",), None, DROP_INVALID_LABEL),
)


@dataclass(frozen=True)
class OovCase:
    """V2: an out-of-vocabulary token's bucket."""

    token: bytes
    num_oov_buckets: int
    bucket: int


OOV_CASES: Tuple[OovCase, ...] = tuple(
    OovCase(token, n, bucket)
    for token, buckets in (
        (b"unseen1", (0, 4, 199)),
        (b"unseen2", (0, 0, 925)),
        (b"\xc3\xa9t\xc3\xa9", (0, 4, 534)),
        (b"x" * 300, (0, 0, 245)),
    )
    for n, bucket in zip((1, 5, 1000), buckets)
)


@dataclass(frozen=True)
class IdentityCase:
    """V4: a token of an identity column with `num_buckets` rows (and a default row or none)."""

    token: bytes
    num_buckets: int
    default_value: Optional[int]
    row: Optional[int]
    reason: Optional[str] = None


IDENTITY_CASES: Tuple[IdentityCase, ...] = tuple(
    IdentityCase(token, 10, default, row if row is not None else default, None if row is not None or default is not None else reason)
    for token, row, reason in (
        (b"0", 0, None),
        (b"7", 7, None),
        (b"9", 9, None),
        (b"10", None, INVALID_OUT_OF_RANGE),
        (b"99999999999999999999999", None, INVALID_OUT_OF_RANGE),  # beyond int64: still an integer text
        (b"07", None, INVALID_NOT_AN_ID),
        (b"+7", None, INVALID_NOT_AN_ID),
        (b"-1", None, INVALID_NOT_AN_ID),  # a bytes column's text; an int64 -1 is negative_int first (T2)
        (b" 7", None, INVALID_NOT_AN_ID),
        (b"7.0", None, INVALID_NOT_AN_ID),
        (b"abc", None, INVALID_NOT_AN_ID),
        (b"\xd9\xa3", None, INVALID_NOT_AN_ID),  # Arabic-Indic digit three: not an ASCII digit
    )
    for default in (None, 3)
)
