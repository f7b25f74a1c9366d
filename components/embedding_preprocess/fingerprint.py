"""FarmHash Fingerprint64 of every value of an Arrow binary array, vectorised with numpy.

The rulebook's V2 (`components.rules.rulebook.oov_bucket`) puts an out-of-vocabulary token, and every
token of a hashed table (V3), in row `Fingerprint64(token) % buckets`: what TensorFlow's
`tf.lookup.StaticVocabularyTable` and `to_hash_bucket_fast` compute in the serving graph. Called
once per token through pyfarmhash it cost about 1.1 us a token in the transform (8% of it on the
demo's data, with one shared table of 8 OOV buckets; every token of a hashed table). Nothing at
the pinned versions hashes an Arrow array with it (pyarrow has no hash kernel, and TensorFlow's
op would need TensorFlow in the Beam workers), so it is written here for the values of up to 32
bytes (farmhashna's HashLen0to16 and HashLen17to32, the same arithmetic on uint64 columns); longer
values, rare among categorical tokens, go through pyfarmhash one by one.
`tests/test_fingerprint.py` checks it against pyfarmhash on every length from 0 to 80 bytes.
"""
from __future__ import annotations

import farmhash
import numpy as np
import pyarrow as pa

from components.example_gen.split_hash import binary_buffers

_K0 = np.uint64(0xC3A5C85C97CB3127)
_K1 = np.uint64(0xB492B66FBE98F273)
_K2 = np.uint64(0x9AE16A3B2F90404F)
_U47 = np.uint64(47)


def _rotate(v: np.ndarray, shift: int) -> np.ndarray:
    return (v >> np.uint64(shift)) | (v << np.uint64(64 - shift))


def _hash_len16(u: np.ndarray, v: np.ndarray, mul: np.ndarray) -> np.ndarray:
    a = (u ^ v) * mul
    a ^= a >> _U47
    b = (v ^ a) * mul
    b ^= b >> _U47
    return b * mul


def _fetch(data: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """The little-endian unsigned `width`-byte words of `data` at offsets `at`, as uint64."""
    idx = at[:, None] + np.arange(width)
    words = np.ascontiguousarray(data[idx]).view(np.uint64 if width == 8 else np.uint32).ravel()
    return words.astype(np.uint64)


def fingerprint64(values: pa.Array) -> np.ndarray:
    """Fingerprint64 of each value of a binary (or string) array, as uint64 (a null hashes as empty)."""
    n = len(values)
    if n == 0:
        return np.zeros(0, np.uint64)
    offsets, data = binary_buffers(values)
    start, length = offsets[:-1], np.diff(offsets)
    if values.null_count:
        length = np.where(np.asarray(values.is_valid()), length, 0)
    out = np.full(n, _K2, np.uint64)  # length 0
    with np.errstate(over="ignore"):
        lens = length.astype(np.uint64)
        mul_all = _K2 + lens * np.uint64(2)
        pick = np.flatnonzero((length > 0) & (length < 4))
        if len(pick):
            s, ln = start[pick], length[pick]
            a, b, c = (data[s].astype(np.uint64), data[s + (ln >> 1)].astype(np.uint64), data[s + ln - 1].astype(np.uint64))
            y = (a + (b << np.uint64(8))) & np.uint64(0xFFFFFFFF)
            z = (lens[pick] + (c << np.uint64(2))) & np.uint64(0xFFFFFFFF)
            mixed = (y * _K2) ^ (z * _K0)
            out[pick] = (mixed ^ (mixed >> _U47)) * _K2
        pick = np.flatnonzero((length >= 4) & (length < 8))
        if len(pick):
            s, ln, mul = start[pick], length[pick], mul_all[pick]
            a = _fetch(data, s, 4)
            out[pick] = _hash_len16(lens[pick] + (a << np.uint64(3)), _fetch(data, s + ln - 4, 4), mul)
        pick = np.flatnonzero((length >= 8) & (length <= 16))
        if len(pick):
            s, ln, mul = start[pick], length[pick], mul_all[pick]
            a = _fetch(data, s, 8) + _K2
            b = _fetch(data, s + ln - 8, 8)
            c = _rotate(b, 37) * mul + a
            d = (_rotate(a, 25) + b) * mul
            out[pick] = _hash_len16(c, d, mul)
        pick = np.flatnonzero((length > 16) & (length <= 32))
        if len(pick):
            s, ln, mul = start[pick], length[pick], mul_all[pick]
            a = _fetch(data, s, 8) * _K1
            b = _fetch(data, s + 8, 8)
            c = _fetch(data, s + ln - 8, 8) * mul
            d = _fetch(data, s + ln - 16, 8) * _K2
            out[pick] = _hash_len16(_rotate(a + b, 43) + _rotate(c, 30) + d, a + _rotate(b + _K2, 18) + c, mul)
    longer = np.flatnonzero(length > 32)
    if len(longer):
        for i in longer:
            s = int(start[i])
            out[i] = farmhash.fingerprint64(bytes(data[s : s + int(length[i])]).decode("utf-8"))
    return out
