"""The contracts the stages hand each other: TensorFlow- and Beam-free, round-trip through their
JSON, refuse other versions and missing fields by name, and the sizing rules every stage uses."""
import subprocess
import sys

import pytest

from components.contracts import sizing
from components.contracts._json import ContractError
from components.contracts.manifest import (
    CategoricalFeatureEntry,
    DenseFeatureEntry,
    VocabularyEntry,
    VocabularyManifest,
)
from components.contracts.plan import EmbeddingPlan
from components.contracts.statistics import EmbeddingStatistics


def _manifest():
    return VocabularyManifest(
        vocabulary_dir="gs://bucket/vocab",
        label="label",
        raw_feature_kinds={"I1": "float", "C1": "bytes", "C2": "int64"},
        dense_features=(DenseFeatureEntry("I1", "I1", -1.0),),
        categorical_features=(
            CategoricalFeatureEntry("C1", "C1", "shared", None, None),
            CategoricalFeatureEntry("C2", "C2raw", "shared", "|", 3),
        ),
        vocabularies={"shared": VocabularyEntry("shared.txt", "shared.counts.txt", 10, 12, 2, 12, 8, "mean", ("C1", "C2"))},
    )


def test_contract_modules_load_without_tensorflow_or_beam():
    code = ("import sys, components.contracts.plan, components.contracts.manifest, components.contracts.statistics, "
            "components.contracts.sizing, components.contracts.artifacts; "
            "print(sorted(m for m in ('tensorflow', 'apache_beam') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_manifest_round_trips_and_answers_the_stages_questions():
    m = _manifest()
    assert VocabularyManifest.from_json(m.to_json()) == m
    assert m.to_dict()["vocabularies"]["shared"]["features"] == ["C1", "C2"]  # the JSON form: lists
    assert m.raw_columns() == ["I1", "C1", "C2raw"] and m.categorical_names == ["C1", "C2"]
    assert m.vocabulary("shared").rows == sizing.table_rows(10, 2)
    with pytest.raises(KeyError, match="'other' has no vocabulary"):
        m.vocabulary("other")


def test_stored_contracts_of_another_version_or_missing_a_field_are_refused_by_name():
    data = _manifest().to_dict()
    data["version"] = 2
    with pytest.raises(ContractError, match=r"vocab/manifest.json: version 2, this code reads version 1; rerun preprocessing"):
        VocabularyManifest.from_dict(data, "vocab/manifest.json")
    data = _manifest().to_dict()
    del data["vocabularies"]["shared"]["num_oov_buckets"]
    with pytest.raises(ContractError, match=r"vocabularies.shared: field 'num_oov_buckets' missing"):
        VocabularyManifest.from_dict(data)
    with pytest.raises(ContractError, match="version None"):
        EmbeddingStatistics.from_dict({"tables": {}})


def test_statistics_round_trip_and_typed_accessors():
    limits = {"max_ids_per_table": 9, "max_unique_ids_per_table": 4, "headroom": 0.2, "basis": "busiest"}
    stats = EmbeddingStatistics(
        global_batch_size=64, shard_counts=(8,), splits={"train": {"examples_read": 3}},
        features={"C1": {"table": "shared", "splits": {"train": {"ids_per_example": {"mean": 1.0, "max": 2}}}}},
        dense_features={}, tables={"shared": {"shards": {"8": {"suggested_sparsecore_limits": limits}}}},
        train_partial_batches=1, input={"malformed_rows": 0},
    )
    assert EmbeddingStatistics.from_json(stats.to_json()) == stats
    assert stats.suggested_sparsecore_limits("shared", 8) == limits
    assert stats.suggested_sparsecore_limits("shared", 16) is None  # not measured for 16 shards
    assert stats.ids_per_example("C1", "train") == {"mean": 1.0, "max": 2}
    assert EmbeddingStatistics.empty().ids_per_example("C1", "train") == {}


def test_sizing_rules():
    m = sizing.table_memory(1001, 16, "adam", "tpu_embedding", num_chips=4, embedding_api="tpu_embedding_v1")
    assert (m.weight_bytes, m.slots_per_row, m.total_bytes) == (1001 * 16 * 4, 2, 1001 * 16 * 4 * 3)
    assert m.per_chip_bytes == 251 * 16 * 4 * 3  # ceil(1001 / 4) whole rows per chip
    # SparseCore (the default API): rows padded to a multiple of 8 x 16 SparseCores, 8 columns for dim 1
    m = sizing.table_memory(1001, 1, "ftrl", "tpu_embedding", num_chips=4, sparse_cores_per_chip=4)
    assert (m.padded_rows, m.padded_dim, m.per_chip_rows) == (1024, 8, 256)
    assert (m.total_bytes, m.per_chip_bytes) == (1024 * 8 * 4 * 3, 256 * 8 * 4 * 3)
    assert sizing.table_memory(1001, 16, "sgd", "tensor_core", num_chips=4).per_chip_bytes == 1001 * 16 * 4  # replicated
    with pytest.raises(ValueError, match="optimizer 'rmsprop' is not one of"):
        sizing.table_memory(10, 4, "rmsprop")
    with pytest.raises(ValueError, match="placement 'gpu' is not one of"):
        sizing.table_memory(10, 4, "sgd", "gpu")


def test_hand_built_plan_is_a_valid_stored_plan():
    plan = EmbeddingPlan.for_tables({"a": (30, 8, "tpu_embedding"), "b": (5, 4, "tensor_core")}, num_chips=2)
    assert EmbeddingPlan.from_json(plan.to_json()) == plan
    assert plan.feature_table("f_a").rows == 30 and set(plan.tables_placed("tensor_core")) == {"b"}
    assert plan.memory.per_chip_bytes == 64 // 2 * 8 * 4 * 2 + 5 * 4 * 4 * 2  # SparseCore: 30 rows padded to 8 x 8
