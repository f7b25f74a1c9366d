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
