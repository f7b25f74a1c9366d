"""The embedding-ID statistics: what preprocessing measured, for the plan and for people.

Written by preprocessing as `statistics.json` (EmbeddingStatistics artifact, rendered as
`statistics.html`) and as `embedding_statistics.json` beside the transformed examples. The
top level is typed; the per-split, per-feature and per-table sections keep the nested form the
report renders (documented in configs/README.md), and the parts another stage reads have typed
accessors here (`suggested_sparsecore_limits`, `ids_per_example`, `ledger`), so no consumer walks
string keys of its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from components.contracts._json import StoredContract, pick

# 3: per-feature value distribution (features.<f>.values); 4: ledger, feature_health
STATISTICS_VERSION = 4


@dataclass(frozen=True)
class EmbeddingStatistics(StoredContract):
    """What preprocessing measured: rows per split, per-feature IDs, per-table batches and shards, input problems.

    The nested sections keep the form the report renders (configs/README.md); the parts another stage
    reads have typed accessors.
    """

    CONTRACT = "embedding statistics"
    VERSION = STATISTICS_VERSION
    REWRITE = "rerun preprocessing with this version of the pipeline"

    global_batch_size: int
    shard_counts: Tuple[int, ...]
    splits: Mapping[str, Any]  # split -> rows read / dropped by reason / written, positive rate
    features: Mapping[str, Any]  # categorical feature -> table, value distribution, per-split IDs
    dense_features: Mapping[str, Any]  # dense feature -> split -> missing, invalid by reason
    tables: Mapping[str, Any]  # table -> vocabulary, batches, shards (div/mod, SparseCore limits), memory
    train_partial_batches: int
    input: Mapping[str, Any]  # malformed rows, non-numeric cells by column
    ledger: Optional[Mapping[str, Any]] = None  # components.rows.ledger: rows in/out of every stage
    feature_health: Optional[Mapping[str, Any]] = None  # components.embedding_preprocess.health
    version: int = STATISTICS_VERSION

    @classmethod
    def empty(cls) -> "EmbeddingStatistics":
        """No statistics: every accessor answers "unknown".

        Returns:
          Statistics with every section empty.
        """
        return cls(0, (), {}, {}, {}, {}, 0, {})

    def suggested_sparsecore_limits(self, table: str, num_sparse_cores: int) -> Optional[Mapping[str, Any]]:
        """The statistics' SparseCore limits for a table sharded over some SparseCores.

        Args:
          table: the table's name.
          num_sparse_cores: the shard count (chips x SparseCores per chip).

        Returns:
          {max_ids_per_table, max_unique_ids_per_table, basis, headroom}, or None when that shard count
          was not measured.
        """
        shard = self.tables.get(table, {}).get("shards", {}).get(str(num_sparse_cores))
        return shard["suggested_sparsecore_limits"] if shard else None

    def dense_quantiles(self, feature: str) -> Optional[Tuple[float, ...]]:
        """A dense feature's train-split quantiles of its filled values.

        Args:
          feature: the dense feature's name.

        Returns:
          DENSE_QUANTILE_POINTS + 1 floats (minimum, ..., maximum), or None when unknown.
        """
        q = (self.dense_features.get(feature, {}).get("train", {}) or {}).get("quantiles")
        return tuple(float(v) for v in q) if q else None

    def ids_per_example(self, feature: str, split: str) -> Dict[str, Any]:
        """IDs per example of a categorical feature on a split.

        Args:
          feature: the categorical feature's name.
          split: "train" or "eval".

        Returns:
          {mean, p50, p90, p99, max, ...}; {} when unknown.
        """
        return dict(self.features.get(feature, {}).get("splits", {}).get(split, {}).get("ids_per_example", {}) or {})

    @classmethod
    def _from_fields(cls, data: Dict[str, Any], source: str) -> "EmbeddingStatistics":
        """The statistics of their stored fields."""
        return pick(cls, data, source, shard_counts=tuple(data.get("shard_counts", ())))

