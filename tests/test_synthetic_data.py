"""The Criteo-like generator: deterministic, shaped as documented, with a learnable label."""
import csv
import json

import numpy as np

from components.example_gen import synthetic_data as sd


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_deterministic_and_complete(tmp_path):
    spec = sd.GeneratorSpec(rows=3000, seed=7)
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    meta_a = sd.write_csv(spec, str(a))
    sd.write_csv(spec, str(b))
    assert a.read_bytes() == b.read_bytes()
    assert not (tmp_path / "a.csv.partial").exists()
    assert json.loads((tmp_path / "a.csv.meta.json").read_text())["rows"] == 3000
    rows = _rows(a)
    assert len(rows) == 3000 and list(rows[0]) == sd.column_names()
    assert set(r["label"] for r in rows) == {"0", "1"}
    assert 0.1 < meta_a["positive_rate"] < 0.45
    # a learnable label: the true probability ranks clicks well above chance, below perfection
    assert 0.7 < meta_a["best_achievable_auc"] < 0.95


def test_shapes_cardinality_and_skew():
    spec = sd.GeneratorSpec(rows=20000, seed=3)
    cols, prob = sd.generate_chunk(spec, 0, 20000)
    assert prob.shape == (20000,) and np.all((prob > 0) & (prob < 1))
    for c, card in enumerate(spec.cardinalities):
        values = cols[f"C{c + 1}"]
        missing = np.mean(values == "")
        assert 0.02 < missing < 0.09, c
        tokens = [t for v in values if v for t in v.split(sd.MULTI_HOT_SEPARATOR)]
        assert all(len(t) == 8 for t in tokens)
        distinct = len(set(tokens))
        assert distinct <= card
        if c in spec.multi_hot:
            lengths = [len(v.split("|")) for v in values if v]
            assert max(lengths) == spec.multi_hot[c] and min(lengths) == 1
        if card >= 1000:
            # Zipf-like: the most frequent value is far above the uniform share
            top = max(np.unique(tokens, return_counts=True)[1])
            assert top / len(tokens) > 20.0 / card
    i2 = cols["I2"][cols["I2"] != ""].astype(int)
    assert i2.min() == -1  # Criteo's I2 has -1 values
    for j in range(13):
        vals = cols[f"I{j + 1}"]
        assert 0.05 < np.mean(vals == "") < 0.15


def test_tokens_are_the_hashes_in_eight_lowercase_hex_digits():
    """The demo dataset's tokens as printf's "%08x" of each rank's hash spelled them (the values
    np.char.mod gave, pinned): leading zeros kept, one dtype for any number of ranks."""
    ranks = np.array([0, 1, 2, 4095, 10**9, 4821, 7431])
    assert list(sd.token_of(2, ranks)) == ["1b147dcc", "971e9964", "12925fb8", "915590a6", "edf6b804",
                                          "000bfb3f", "0004f64f"]
    assert sd.token_of(2, ranks[:0]).dtype == sd.token_of(2, ranks).dtype == np.dtype("<U8")


def test_tokens_distinct_per_rank_and_large_cardinalities_cheap():
    ranks = np.arange(200000)
    assert len(set(sd.token_of(2, ranks))) == len(ranks)  # fmix32 is a bijection
    rng = np.random.default_rng(0)
    r = sd.zipf_ranks(rng, 10_000_000, 100000, 1.1)
    assert r.min() >= 0 and r.max() < 10_000_000 and np.mean(r == 0) > 0.05


def test_id_shift_drifts_large_features_only_and_keeps_each_values_effect():
    """A later day (id_shift k): a large feature's value at rank r is the unshifted value of rank
    r + k, so the k most frequent values fade; small features (the label's main signal) stay."""
    base = sd.GeneratorSpec(rows=3000, seed=3)
    day = sd.GeneratorSpec(rows=3000, seed=3, id_shift=7)
    cols0, p0 = sd.generate_chunk(base, 0, 3000)
    cols1, p1 = sd.generate_chunk(day, 0, 3000)
    c1 = 0  # C1: 1460 values >= DRIFT_MIN_CARDINALITY
    ranks = np.arange(base.cardinalities[c1] + 7)
    faded = set(sd.token_of(c1, ranks[:7]))
    assert faded & set(cols0["C1"]) and not faded & set(cols1["C1"])
    assert set(cols1["C1"]) - {""} <= set(sd.token_of(c1, ranks[7:]))
    small = [f"C{c + 1}" for c, n in enumerate(base.cardinalities) if n < sd.DRIFT_MIN_CARDINALITY]
    assert small and all((cols0[c] == cols1[c]).all() for c in small)
    assert not np.allclose(p0, p1)  # C1's values carry no effect, but the multi-hot C24's do
