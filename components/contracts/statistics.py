"""The embedding-ID statistics: what preprocessing measured, for the plan and for people.

Written by preprocessing as `statistics.json` (EmbeddingStatistics artifact, rendered as
`statistics.html`) and as `embedding_statistics.json` beside the transformed examples. The
top level is typed; the per-split, per-feature and per-table sections keep the nested form the
report renders (documented in configs/README.md), and the parts another stage reads have typed
accessors here (`suggested_sparsecore_limits`, `ids_per_example`, `ledger`), so no consumer walks
string keys of its own.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from components.contracts._json import check_version, dumps, pick, plain

# 3: per-feature value distribution (features.<f>.values); 4: ledger, feature_health
STATISTICS_VERSION = 4
# A dense feature's train-split quantiles (dense_features.<f>.train.quantiles): the 0th, 1st, ...,
# 100th percentiles of its filled values, from a quantiles sketch (preprocessing's statistics.py).
DENSE_QUANTILE_POINTS = 100


@dataclass(frozen=True)
class EmbeddingStatistics:
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
        """No statistics (examples written before they were copied beside them): every accessor
        answers 'unknown'."""
        return cls(0, (), {}, {}, {}, {}, 0, {})

    def suggested_sparsecore_limits(self, table: str, num_sparse_cores: int) -> Optional[Mapping[str, Any]]:
        """The statistics' SparseCore limits for `table` sharded over `num_sparse_cores` (None when
        that shard count was not measured)."""
        shard = self.tables.get(table, {}).get("shards", {}).get(str(num_sparse_cores))
        return shard["suggested_sparsecore_limits"] if shard else None

    def dense_quantiles(self, feature: str) -> Optional[Tuple[float, ...]]:
        """The train split's DENSE_QUANTILE_POINTS + 1 quantiles of a dense feature's filled values
        (minimum, ..., maximum); None when unknown (statistics from before they were measured)."""
        q = (self.dense_features.get(feature, {}).get("train", {}) or {}).get("quantiles")
        return tuple(float(v) for v in q) if q else None

    def ids_per_example(self, feature: str, split: str) -> Dict[str, Any]:
        """{mean, p50, p90, p99, max, ...} IDs per example of `feature` on `split` ({} when unknown)."""
        return dict(self.features.get(feature, {}).get("splits", {}).get(split, {}).get("ids_per_example", {}) or {})

    def to_dict(self) -> Dict[str, Any]:
        return plain(self)

    def to_json(self) -> str:
        return dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: Dict[str, Any], source: str = "embedding statistics") -> "EmbeddingStatistics":
        check_version(data, STATISTICS_VERSION, source, "rerun preprocessing with this version of the pipeline")
        return pick(cls, data, source, shard_counts=tuple(data.get("shard_counts", ())))

    @classmethod
    def from_json(cls, text: str, source: str = "embedding statistics") -> "EmbeddingStatistics":
        return cls.from_dict(json.loads(text), source)
