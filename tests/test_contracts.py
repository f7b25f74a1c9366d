"""The contracts the stages hand each other: TensorFlow- and Beam-free, round-trip through their
JSON, refuse other versions and missing fields by name, and the sizing rules every stage uses."""
import subprocess
import sys

import pytest

from components.planning import sizing
from components.contracts._json import ContractError
from components.contracts.manifest import (
    CategoricalFeatureEntry,
    DenseFeatureEntry,
    VocabularyEntry,
    VocabularyManifest,
)
from components.contracts.plan import EmbeddingPlan
from components.contracts.statistics import EmbeddingStatistics
from components.planning.derivation import hand_built_plan
from components.rules import chips


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
            "components.contracts.serving_inputs, components.contracts.artifacts, components.planning.derivation, "
            "components.planning.fitting, components.planning.sizing, components.planning.capacity, "
            "components.rules.chips, components.rules.names; "
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
    # TPUEmbedding (V1): parameters, Adam's 2 slots and the gradient accumulators
    m = sizing.table_memory(1001, 16, "adam", "tpu_embedding", num_chips=4, embedding_api="tpu_embedding_v1")
    assert (m.weight_bytes, m.slots_per_row, m.gradient_accumulators) == (1001 * 16 * 4, 2, 1)
    assert m.total_bytes == 1001 * 16 * 4 * 4
    assert m.per_chip_bytes == 251 * 16 * 4 * 4  # ceil(1001 / 4) whole rows per chip
    # SparseCore (the default API): rows padded to a multiple of 8 x 16 SparseCores, 8 columns for dim 1
    m = sizing.table_memory(1001, 1, "ftrl", "tpu_embedding", num_chips=4, sparse_cores_per_chip=4)
    assert (m.padded_rows, m.padded_dim, m.per_chip_rows) == (1024, 8, 256)
    assert (m.total_bytes, m.per_chip_bytes) == (1024 * 8 * 4 * 3, 256 * 8 * 4 * 3)
    assert sizing.table_memory(1001, 16, "sgd", "tensor_core", num_chips=4).per_chip_bytes == 1001 * 16 * 4  # replicated
    with pytest.raises(ValueError, match="optimizer 'rmsprop' is not one of"):
        sizing.table_memory(10, 4, "rmsprop")
    with pytest.raises(ValueError, match="placement 'gpu' is not one of"):
        sizing.table_memory(10, 4, "sgd", "gpu")


def test_v1_counts_the_gradient_accumulators_tf_adds():
    """TPUEmbedding (V1) keeps a gradient_accumulators variable of the table's shape whenever
    gradient accumulation is on (TF's default, which the trainer keeps): per-chip bytes x 2 for SGD,
    x 1.5 for Adagrad, x 4/3 for FTRL and Adam against parameters + slots."""
    for name, slots in (("sgd", 0), ("adagrad", 1), ("ftrl", 2), ("adam", 2)):
        assert sizing.v1_gradient_accumulators(name) == 1 and sizing.v1_gradient_accumulators(name, False) == 0
        on = sizing.table_memory(1000, 8, name, "tpu_embedding", num_chips=2, embedding_api="tpu_embedding_v1")
        off = sizing.table_memory(1000, 8, name, "tpu_embedding", num_chips=2, embedding_api="tpu_embedding_v1",
                                  use_gradient_accumulation=False)
        assert (on.per_chip_bytes, off.per_chip_bytes) == (500 * 8 * 4 * (2 + slots), 500 * 8 * 4 * (1 + slots)), name
        assert on.per_chip_bytes * (1 + slots) == off.per_chip_bytes * (2 + slots)
    # SparseCore and TensorCore tables have no such variable (TF's Python creates them all: tests/test_sparsecore_real.py)
    for api, placement in (("sparse_core", "tpu_embedding"), ("sparse_core", "tensor_core"), ("none", "tpu_embedding")):
        assert sizing.table_memory(1000, 8, "sgd", placement, num_chips=2, embedding_api=api).gradient_accumulators == 0


def test_initialization_transient_counts_the_initializers_temporaries():
    """A stack's whole padded tables F, plus the larger of one chip's shard of them (F / chips) and
    the initializer's extra full-size copies of its largest table ((copies - 1) x f)."""
    assert sizing.INITIALIZER_COPIES == {"truncated_normal": 3, "random_normal": 3, "random_uniform": 3, "zeros": 1}
    with pytest.raises(ValueError, match="initializer 'orthogonal' is not one of"):
        sizing.initializer_copies("orthogonal")
    padded = {"a": 800, "b": 200, "w": 80}
    groups = [("a", "b"), ("w",)]
    assert sizing.sparse_core_init_transient(padded, groups, 4) == (1000 + 250, ("a", "b"))  # zeros: F + F / 4
    copies = {"a": 3, "b": 3, "w": 1}
    assert sizing.sparse_core_init_transient(padded, groups, 4, copies) == (1000 + 2 * 800, ("a", "b"))
    assert sizing.sparse_core_init_transient(padded, groups, 1, copies) == (1000 + 1600, ("a", "b"))  # 2 x 800 > F / 1
    assert sizing.sparse_core_init_transient({"w": 80}, [("w",)], 1, copies) == (160, ("w",))


def test_chips_hbm_in_the_unit_google_lists_and_their_devices():
    gib = 2 ** 30
    assert {n: c.hbm_bytes_per_chip for n, c in chips.CHIPS.items()} == {
        "v2": 16 * gib, "v3": 32 * gib, "v4": 32 * gib, "v5e": 16 * 10 ** 9, "v5p": 95 * gib, "v6e": 32 * 10 ** 9}
    assert chips.CHIPS["v5e"].hbm_gib_per_chip == pytest.approx(14.901, abs=1e-3)
    assert chips.CHIPS["v6e"].hbm_gib_per_chip == pytest.approx(29.802, abs=1e-3)
    assert chips.devices_per_chip("tpu_embedding_v1") == (1, 2)  # v4 (megacore) or v2/v3 (a device a TensorCore)
    assert chips.devices_per_chip("tpu_embedding_v1", "v3") == (2,)
    assert chips.devices_per_chip("sparse_core") == chips.devices_per_chip("none") == (1,)


def test_hand_built_plan_is_a_valid_stored_plan():
    plan = hand_built_plan({"a": (30, 8, "tpu_embedding"), "b": (5, 4, "tensor_core")}, num_chips=2)
    assert EmbeddingPlan.from_json(plan.to_json()) == plan
    assert plan.feature_table("f_a").rows == 30 and set(plan.tables_placed("tensor_core")) == {"b"}
    assert plan.memory.per_chip_bytes == 64 // 2 * 8 * 4 * 2 + 5 * 4 * 4 * 2  # SparseCore: 30 rows padded to 8 x 8
