"""The vectorised Fingerprint64 (preprocessing's OOV and hashed rows) against pyfarmhash, the rulebook's
V2 (`rulebook.oov_bucket`), on every length the vectorised paths take and past them."""
import numpy as np
import pyarrow as pa
import pytest

from components.rules import rulebook
from components.embedding_preprocess.fingerprint import fingerprint64


def _tokens(seed: int):
    rng = np.random.default_rng(seed)
    alphabet = [c.encode("utf-8") for c in "abcXYZ09|-_ é漢\U0001F600"]
    out = []
    for length in list(range(0, 81)) * 3:
        t = b""
        while len(t) < length:
            t += alphabet[int(rng.integers(0, len(alphabet)))]
        out.append(t)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_fingerprint64_matches_pyfarmhash_at_every_length(seed):
    import farmhash

    tokens = _tokens(seed)
    got = fingerprint64(pa.array(tokens, pa.binary()))
    want = [farmhash.fingerprint64(t.decode("utf-8")) for t in tokens]
    assert got.tolist() == want
    # slices (an Arrow offset), strings, and the buckets of V2
    assert fingerprint64(pa.array(tokens, pa.binary()).slice(7, 50)).tolist() == want[7:57]
    assert fingerprint64(pa.array([t.decode("utf-8") for t in tokens], pa.string())).tolist() == want
    for buckets in (1, 8, 1000, 2**31 - 1):
        assert (got % np.uint64(buckets)).tolist() == [rulebook.oov_bucket(t, buckets) for t in tokens]


def test_fingerprint64_of_nothing_and_of_nulls():
    import farmhash

    assert fingerprint64(pa.array([], pa.binary())).dtype == np.uint64
    assert fingerprint64(pa.array([b"ab", None], pa.binary())).tolist() == [
        farmhash.fingerprint64("ab"), farmhash.fingerprint64("")]
