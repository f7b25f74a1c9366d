"""partials.py: the exact key strings, the merge rule each key family gets, the raw-kind parser."""
import numpy as np
import pytest

from components.embedding_preprocess import partials
from components.embedding_preprocess import statistics


def test_keys_are_the_documented_strings():
    assert partials.examples_read("train") == "train/examples_read"
    assert partials.dropped("eval", "missing_label") == "eval/dropped/missing_label"
    assert partials.positives("train") == "train/positives"
    assert partials.partial_batches() == "train/partial_batches"
    assert partials.raw_kind("user_id", "bytes") == "kind/user_id/bytes"
    assert partials.dense_missing("train", "age") == "train/dense/age/missing"
    assert partials.dense_invalid("train", "age", "nan") == "train/dense/age/invalid/nan"
    assert partials.dense_invalid("train", "age", "nan").startswith(partials.dense_invalid_prefix("train", "age"))
    for what in partials.FEATURE_COUNTS:
        assert partials.feature("eval", "item", what) == f"eval/feature/item/{what}"
    assert partials.feature_invalid("train", "item", "empty") == "train/feature/item/invalid/empty"
    assert partials.feature_invalid("train", "item", "empty").startswith(partials.feature_invalid_prefix("train", "item"))
    assert partials.ids_per_example_histogram("train", "item") == "vec/train/feature/item/ids_per_example_histogram"
    for what in partials.TABLE_BATCH_COUNTS:
        assert partials.table_batch("train", "t", what) == f"train/table/t/{what}"
    for what in partials.TABLE_BATCH_MAXIMA:
        assert partials.table_batch_max("train", "t", what) == f"max/train/table/t/{what}"
    assert partials.shard_load("train", "t", "mod", 4) == "vec/train/table/t/mod/4/load"
    for what in partials.SHARD_MAXIMA:
        assert partials.shard_max("train", "t", "div", 2, what) == f"max/train/table/t/div/2/{what}"
    assert partials.vocabulary_info("t") == "info/vocab/t"
    assert partials.feature_values_info("item") == "info/feature_values/item"
    assert partials.MALFORMED_ROWS == "input/malformed_rows"
    assert partials.not_numeric("age") == "input/not_numeric/age"
    with pytest.raises(ValueError):
        partials.feature("train", "item", "unknown")
    with pytest.raises(ValueError):
        partials.table_batch_max("train", "t", "batches")  # summed only, no maximum


def test_merge_stats_applies_each_key_family_its_rule():
    keys = {
        "sum": [partials.examples_read("train"), partials.feature("train", "f", "ids"), partials.table_batch("train", "t", "batch_ids"),
                partials.not_numeric("c"), partials.raw_kind("c", "float")],
        "max": [partials.table_batch_max("train", "t", "batch_ids"), partials.shard_max("train", "t", "mod", 2, "max_ids_per_shard")],
        "vec": [partials.ids_per_example_histogram("train", "f"), partials.shard_load("train", "t", "div", 2)],
        "info": [partials.vocabulary_info("t"), partials.feature_values_info("f")],
    }
    for rule, ks in keys.items():
        assert all(partials.merge_rule(k) == rule for k in ks), rule
    a = {**{k: 3 for k in keys["sum"] + keys["max"]}, **{k: np.array([1, 2]) for k in keys["vec"]},
         **{k: {"distinct_values": 5} for k in keys["info"]}}
    b = {**{k: 4 for k in keys["sum"] + keys["max"]}, **{k: np.array([10, 20, 30]) for k in keys["vec"]},
         **{k: {"distinct_values": 7} for k in keys["info"]}}
    m = statistics.merge_stats([a, b])
    assert all(m[k] == 7 for k in keys["sum"])
    assert all(m[k] == 4 for k in keys["max"])
    assert all(m[k].tolist() == [11, 22, 30] for k in keys["vec"])
    assert all(m[k] == {"distinct_values": 5} for k in keys["info"])  # the first, whole


def test_parse_raw_kind_inverts_raw_kind():
    for column, kind in (("user_id", "bytes"), ("a/b", "float"), ("x", "none")):
        assert partials.parse_raw_kind(partials.raw_kind(column, kind)) == (column, kind)
    assert partials.parse_raw_kind(partials.examples_read("train")) is None


# ---- transform_batch and batch_statistics ------------------------------------------------------

SPLIT_CONFIG = {
    "input": {"path": "unused.csv"},
    "label": "label",
    "dense_features": [{"name": "I1", "fill_value": -1.0}],
    "tables": [{"name": "shared", "dim": 4, "vocabulary": {"num_oov_buckets": 1}}],
    "categorical_features": [
        {"name": "C1", "table": "shared", "weight_column": "w"},
        {"name": "C3", "separator": "|", "dim": 4, "max_length": 2, "vocabulary": {"num_oov_buckets": 1}},
    ],
    "training": {"batch_size": 2},
    "statistics": {"shard_counts": [2]},
}


def _three_rows():
    """Row 0: label 1, all present; row 1: label 0, I1 missing, C1 out of vocabulary, a non-UTF-8
    token; row 2: no label (dropped)."""
    import pyarrow as pa

    from components.config.loading import parse_config
    from components.embedding_preprocess.transform import make_lookups

    cfg = parse_config(SPLIT_CONFIG)
    lookups = make_lookups(cfg, {"shared": [b"a", b"b"], "C3": [b"x", b"y"]})
    rb = pa.RecordBatch.from_pydict({
        "label": pa.array([[1], [0], None], pa.list_(pa.int64())),
        "I1": pa.array([[0.5], None, [float("nan")]], pa.list_(pa.float32())),
        "w": pa.array([[2.0], [1.0], [1.0]], pa.list_(pa.float32())),
        "C1": pa.array([[b"a"], [b"zz"], [b"b"]], pa.list_(pa.binary())),
        "C3": pa.array([[b"x|y|y"], [b"caf\xe9|x"], None], pa.list_(pa.binary())),
    })
    return cfg, lookups, rb


def test_transform_batch_and_batch_statistics_give_the_combined_partial():
    from components.embedding_preprocess.batch_statistics import batch_statistics
    from components.embedding_preprocess.transform import transform_batch

    cfg, lookups, rb = _three_rows()
    transformed = transform_batch(cfg, lookups, rb)
    assert transformed.keep.tolist() == [True, True, False]
    assert transformed.batch.to_pydict() == {
        "label": [[1.0], [0.0]], "I1": [[0.5], [-1.0]], "C1": [[0], [2]], "C1__weights": [[2.0], [1.0]],
        "C3": [[0, 1], [0]]}
    # Counted by hand (and equal to what the combined transform-and-statistics function returned).
    common = {
        "kind/C1/bytes": 1, "kind/C3/bytes": 1, "kind/I1/float": 1, "kind/label/int64": 1, "kind/w/float": 1,
        "{s}/dense/I1/input_sum_1": float(np.log1p(0.5) - np.log1p(1.0)),
        "{s}/dense/I1/input_sum_2": float(np.log1p(0.5) ** 2 + np.log1p(1.0) ** 2), "{s}/dense/I1/missing": 1,
        "{s}/dropped/invalid_label": 0, "{s}/dropped/missing_label": 1, "{s}/examples_read": 3,
        "{s}/feature/C1/ids": 2, "{s}/feature/C1/oov": 1, "{s}/feature/C1/present": 2, "{s}/feature/C1/truncated": 0,
        "{s}/feature/C3/ids": 3, "{s}/feature/C3/invalid/not_utf8": 1, "{s}/feature/C3/oov": 0,
        "{s}/feature/C3/present": 2, "{s}/feature/C3/truncated": 1, "{s}/positives": 1.0,
        "vec/{s}/feature/C1/ids_per_example_histogram": [0, 2], "vec/{s}/feature/C3/ids_per_example_histogram": [0, 1, 1],
    }
    train_only = {
        "max/train/table/C3/batch_ids": 3, "max/train/table/C3/batch_unique_ids": 2,
        "max/train/table/C3/div/2/max_ids_per_shard": 3, "max/train/table/C3/div/2/max_unique_ids_per_shard": 2,
        "max/train/table/C3/mod/2/max_ids_per_shard": 2, "max/train/table/C3/mod/2/max_unique_ids_per_shard": 1,
        "max/train/table/shared/batch_ids": 2, "max/train/table/shared/batch_unique_ids": 2,
        "max/train/table/shared/div/2/max_ids_per_shard": 1, "max/train/table/shared/div/2/max_unique_ids_per_shard": 1,
        "max/train/table/shared/mod/2/max_ids_per_shard": 2, "max/train/table/shared/mod/2/max_unique_ids_per_shard": 2,
        "sketch/train/dense/I1/quantiles": [-1.0] * 50 + [0.5] * 51, "train/dense/I1/quantile_values": 2,
        "train/partial_batches": 0, "train/table/C3/batch_ids": 3, "train/table/C3/batch_unique_ids": 2,
        "train/table/C3/batches": 1, "train/table/shared/batch_ids": 2, "train/table/shared/batch_unique_ids": 2,
        "train/table/shared/batches": 1, "vec/train/table/C3/div/2/load": [3, 0], "vec/train/table/C3/mod/2/load": [2, 1],
        "vec/train/table/shared/div/2/load": [1, 1], "vec/train/table/shared/mod/2/load": [2, 0],
    }
    for split, extra in (("train", train_only), ("eval", {})):
        got = statistics.jsonable(batch_statistics(cfg, lookups, rb, transformed, split))
        expected = {k.format(s=split): v for k, v in {**common, **extra}.items()}
        assert got.keys() == expected.keys(), split
        for k, v in expected.items():
            assert got[k] == pytest.approx(v, rel=1e-6), (split, k)


def test_transform_batch_computes_no_statistics(monkeypatch):
    from components.embedding_preprocess.transform import transform_batch

    def refuse(*args, **kwargs):
        raise AssertionError("transform_batch computed a statistic")

    for name in ("quantile_sample", "quantiles_sketch", "batch_table_stats"):
        monkeypatch.setattr(statistics, name, refuse)
    cfg, lookups, rb = _three_rows()
    transformed = transform_batch(cfg, lookups, rb)
    assert transformed.batch.num_rows == 2 and transformed.num_kept == 2
