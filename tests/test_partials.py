"""partials.py: the exact key strings, the merge rule each key family gets, the raw-kind parser."""
import numpy as np
import pytest

from components.embedding_preprocess import partials as P
from components.embedding_preprocess import statistics as S


def test_keys_are_the_documented_strings():
    assert P.examples_read("train") == "train/examples_read"
    assert P.dropped("eval", "missing_label") == "eval/dropped/missing_label"
    assert P.positives("train") == "train/positives"
    assert P.partial_batches() == "train/partial_batches"
    assert P.raw_kind("user_id", "bytes") == "kind/user_id/bytes"
    assert P.dense_missing("train", "age") == "train/dense/age/missing"
    assert P.dense_invalid("train", "age", "nan") == "train/dense/age/invalid/nan"
    assert P.dense_invalid("train", "age", "nan").startswith(P.dense_invalid_prefix("train", "age"))
    for what in P.FEATURE_COUNTS:
        assert P.feature("eval", "item", what) == f"eval/feature/item/{what}"
    assert P.feature_invalid("train", "item", "empty") == "train/feature/item/invalid/empty"
    assert P.feature_invalid("train", "item", "empty").startswith(P.feature_invalid_prefix("train", "item"))
    assert P.ids_per_example_histogram("train", "item") == "vec/train/feature/item/ids_per_example_histogram"
    for what in P.TABLE_BATCH_COUNTS:
        assert P.table_batch("train", "t", what) == f"train/table/t/{what}"
    for what in P.TABLE_BATCH_MAXIMA:
        assert P.table_batch_max("train", "t", what) == f"max/train/table/t/{what}"
    assert P.shard_load("train", "t", "mod", 4) == "vec/train/table/t/mod/4/load"
    for what in P.SHARD_MAXIMA:
        assert P.shard_max("train", "t", "div", 2, what) == f"max/train/table/t/div/2/{what}"
    assert P.vocabulary_info("t") == "info/vocab/t"
    assert P.feature_values_info("item") == "info/feature_values/item"
    assert P.MALFORMED_ROWS == "input/malformed_rows"
    assert P.not_numeric("age") == "input/not_numeric/age"
    with pytest.raises(ValueError):
        P.feature("train", "item", "unknown")
    with pytest.raises(ValueError):
        P.table_batch_max("train", "t", "batches")  # summed only, no maximum


def test_merge_stats_applies_each_key_family_its_rule():
    keys = {
        "sum": [P.examples_read("train"), P.feature("train", "f", "ids"), P.table_batch("train", "t", "batch_ids"),
                P.not_numeric("c"), P.raw_kind("c", "float")],
        "max": [P.table_batch_max("train", "t", "batch_ids"), P.shard_max("train", "t", "mod", 2, "max_ids_per_shard")],
        "vec": [P.ids_per_example_histogram("train", "f"), P.shard_load("train", "t", "div", 2)],
        "info": [P.vocabulary_info("t"), P.feature_values_info("f")],
    }
    for rule, ks in keys.items():
        assert all(P.merge_rule(k) == rule for k in ks), rule
    a = {**{k: 3 for k in keys["sum"] + keys["max"]}, **{k: np.array([1, 2]) for k in keys["vec"]},
         **{k: {"distinct_values": 5} for k in keys["info"]}}
    b = {**{k: 4 for k in keys["sum"] + keys["max"]}, **{k: np.array([10, 20, 30]) for k in keys["vec"]},
         **{k: {"distinct_values": 7} for k in keys["info"]}}
    m = S.merge_stats([a, b])
    assert all(m[k] == 7 for k in keys["sum"])
    assert all(m[k] == 4 for k in keys["max"])
    assert all(m[k].tolist() == [11, 22, 30] for k in keys["vec"])
    assert all(m[k] == {"distinct_values": 5} for k in keys["info"])  # the first, whole


def test_parse_raw_kind_inverts_raw_kind():
    for column, kind in (("user_id", "bytes"), ("a/b", "float"), ("x", "none")):
        assert P.parse_raw_kind(P.raw_kind(column, kind)) == (column, kind)
    assert P.parse_raw_kind(P.examples_read("train")) is None
