"""The embedding plan: the TPU embedding configuration derived from the config and the statistics.

`derive_plan(cfg, manifest, statistics)` is a plain function returning a JSON-able dict (written
as `embedding_plan.json` beside the model), and `table_configs(plan)` / `feature_configs(plan)`
render it into `tf.tpu.experimental.embedding.TableConfig` / `FeatureConfig` objects. Nothing in
the plan is guessed by the user: rows come from the vocabulary manifest (vocabulary + OOV
buckets), SparseCore limits and sequence lengths from the embedding-ID statistics, memory from
rows x dim x 4 bytes x (1 + optimizer slots).

Rules (documented in configs/README.md):
- dim: the configured dim; with `training.embedding.dim_rule: fourth_root`, tables without an
  explicit dim get 8 * ceil(6 * rows^0.25 / 8) (the 6 x fourth-root rule of thumb, rounded up to
  a multiple of 8 for TPU lanes), capped at 256.
- initializer: truncated normal, stddev 1/sqrt(dim).
- placement: rows > `size_threshold` -> `tpu_embedding` (sharded over all chips), otherwise
  `tensor_core` (a Keras embedding replicated on every chip), as PartialTPUEmbedding decides.
- SparseCore limits: the statistics' suggestion for num_chips x sparse_cores_per_chip shards
  (busiest SparseCore in any full batch, with headroom); `SparseCoreEmbeddingConfig` exists from
  TensorFlow 2.17, so on 2.16 they are reported in the plan and not passed.
- memory: TPU-embedding tables are sharded over the chips (per chip = total / chips, each shard
  rounded up to whole rows); TensorCore tables are replicated on every chip. A plan whose per-chip
  total exceeds hbm_gib_per_chip x usable_hbm_fraction is refused with the tables that take most.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf

from components.config import OptimizerConfig, PipelineConfig
from components.embedding_preprocess.statistics import OPTIMIZER_SLOTS

PLAN_VERSION = 1
PLAN_FILE = "embedding_plan.json"
# Each optimizer's hyperparameters beyond the learning rate and clipping; the Keras (legacy) and the
# TPU embedding optimizers take them under the same names.
HYPERPARAMETERS = {
    "sgd": (),
    "adagrad": ("initial_accumulator_value",),
    "adam": ("beta_1", "beta_2", "epsilon"),
    "ftrl": ("initial_accumulator_value", "l1_regularization_strength", "l2_regularization_strength"),
}
MAX_RULE_DIM = 256


class PlanError(ValueError):
    """The embedding plan cannot be built (does not fit, inconsistent inputs); says what to change."""


def fourth_root_dim(rows: int) -> int:
    return int(min(MAX_RULE_DIM, 8 * math.ceil(6 * max(rows, 1) ** 0.25 / 8)))


def optimizer_spec(o: OptimizerConfig) -> Dict[str, Any]:
    spec: Dict[str, Any] = {"name": o.name, "learning_rate": o.learning_rate, "schedule": dict(vars(o.schedule))}
    if o.clipvalue is not None:
        spec["clipvalue"] = o.clipvalue
    if o.clipnorm is not None:
        spec["clipnorm"] = o.clipnorm
    spec.update({k: getattr(o, k) for k in HYPERPARAMETERS[o.name]})
    if o.name == "adam":
        spec["lazy_adam"] = o.lazy_adam  # the embedding optimizer's rule (optimizers.py); dense Adam ignores it
    return spec


def build_optimizer(classes: Dict[str, Any], spec: Dict[str, Any], kw: Dict[str, Any]):
    name = spec["name"]
    if name not in classes:
        raise PlanError(f"optimizer {name!r} is not one of {', '.join(classes)}")
    return classes[name](**kw, **{k: spec[k] for k in HYPERPARAMETERS[name]})


def _sparsecore_available() -> bool:
    return hasattr(tf.tpu.experimental.embedding, "SparseCoreEmbeddingConfig")


def _dense_width(max_length: Optional[int], observed_max: Optional[float]) -> Optional[int]:
    """Static width of a TensorCore-table feature's padded dense IDs (the TPU step's input form):
    the configured `max_length` (preprocessing keeps no more), else the most IDs any train example
    had (statistics), else unknown (the trainer then asks for `max_length`)."""
    if observed_max is not None:
        observed = max(1, int(observed_max))
        return min(observed, max_length) if max_length else observed
    return max_length or None


def derive_plan(
    cfg: PipelineConfig, manifest: Dict[str, Any], statistics: Optional[Dict[str, Any]] = None
) -> Dict[str, Any]:
    """The plan for `cfg`'s tables, sized by the vocabulary `manifest` and (optionally) the statistics."""
    emb = cfg.training.embedding
    topo = emb.topology
    statistics = statistics or {}
    num_sc = topo.num_chips * topo.sparse_cores_per_chip
    slots = OPTIMIZER_SLOTS[cfg.training.embedding_optimizer.name]
    opt = optimizer_spec(cfg.training.embedding_optimizer)
    tables: Dict[str, Any] = {}
    for t in cfg.tables:
        v = manifest["vocabularies"].get(t.name)
        if v is None:
            raise PlanError(f"table {t.name!r} has no vocabulary in the manifest; rerun preprocessing with this config")
        rows = int(v["rows"])
        if emb.dim_rule == "fourth_root" and not cfg.resolved.table(t.name).dim_explicit:
            dim, dim_source = fourth_root_dim(rows), "fourth_root rule"
        else:
            dim, dim_source = int(t.dim), "config"
        placement = "tpu_embedding" if emb.size_threshold is not None and rows > emb.size_threshold else "tensor_core"
        weight_bytes = rows * dim * 4
        total = weight_bytes * (1 + slots)
        if placement == "tpu_embedding":
            per_chip = math.ceil(rows / topo.num_chips) * dim * 4 * (1 + slots)
        else:
            per_chip = total  # replicated
        stats_table = statistics.get("tables", {}).get(t.name, {})
        shard_stats = stats_table.get("shards", {}).get(str(num_sc))
        limits: Dict[str, Any]
        if shard_stats:
            s = shard_stats["suggested_sparsecore_limits"]
            limits = {
                "max_ids_per_table": s["max_ids_per_table"],
                "max_unique_ids_per_table": s["max_unique_ids_per_table"],
                "source": f"statistics: {s['basis']}, {num_sc} SparseCores, headroom {s['headroom']}",
            }
        else:
            limits = {
                "max_ids_per_table": None,
                "max_unique_ids_per_table": None,
                "source": (
                    f"no statistics for {num_sc} shards (num_chips x sparse_cores_per_chip); add {num_sc} to "
                    "statistics.shard_counts and rerun preprocessing"
                ),
            }
        tables[t.name] = {
            "rows": rows,
            "vocabulary_size": int(v["size"]),
            "num_oov_buckets": int(v["num_oov_buckets"]),
            "dim": dim,
            "dim_source": dim_source,
            "combiner": t.combiner,
            "initializer": {"name": "truncated_normal", "mean": 0.0, "stddev": 1.0 / math.sqrt(dim)},
            "optimizer": opt,
            "placement": placement,
            "features": list(cfg.resolved.table(t.name).features),
            "sparsecore_limits": limits,
            "memory": {
                "weight_bytes": weight_bytes,
                "slots_per_row": slots,
                "total_bytes": total,
                "per_chip_bytes": per_chip,
            },
        }
    features: Dict[str, Any] = {}
    for f in cfg.categorical_features:
        table = cfg.feature_table(f).name
        fstats = statistics.get("features", {}).get(f.name, {}).get("splits", {}).get("train", {})
        pooling = fstats.get("ids_per_example", {})
        features[f.name] = {
            "table": table,
            # Features are pooled by their table's combiner; a sequence feature (max_sequence_length
            # > 0) would keep one vector per position. None of this product's models use sequences.
            "max_sequence_length": 0,
            "ids_per_example": {k: pooling.get(k) for k in ("mean", "p99", "max")} if pooling else None,
            "dense_width": _dense_width(f.max_length, pooling.get("max"))
            if tables[table]["placement"] == "tensor_core" else None,
        }
    budget = int(topo.hbm_gib_per_chip * (1 << 30) * topo.usable_hbm_fraction)
    per_chip_total = sum(t["memory"]["per_chip_bytes"] for t in tables.values())
    plan = {
        "version": PLAN_VERSION,
        "global_batch_size": cfg.training.batch_size,
        "size_threshold": emb.size_threshold,
        "topology": {
            "num_chips": topo.num_chips,
            "hbm_gib_per_chip": topo.hbm_gib_per_chip,
            "sparse_cores_per_chip": topo.sparse_cores_per_chip,
            "num_sparse_cores": num_sc,
            "usable_hbm_fraction": topo.usable_hbm_fraction,
        },
        "tables": tables,
        "features": features,
        "memory": {
            "total_bytes": sum(t["memory"]["total_bytes"] for t in tables.values()),
            "per_chip_bytes": per_chip_total,
            "budget_per_chip_bytes": budget,
            "fits": per_chip_total <= budget,
        },
        "sparse_core_config": {
            "available_in_tensorflow": _sparsecore_available(),
            "note": (
                "passed to SparseCoreEmbeddingConfig"
                if _sparsecore_available()
                else "tf.tpu.experimental.embedding.SparseCoreEmbeddingConfig needs TensorFlow 2.17+; the "
                "limits above are reported, not passed (TensorFlow 2.16 sizes SparseCore buffers itself)"
            ),
        },
    }
    if per_chip_total > budget:
        biggest = sorted(tables.items(), key=lambda kv: -kv[1]["memory"]["per_chip_bytes"])[:3]
        names = ", ".join(f"{n} ({t['memory']['per_chip_bytes'] / 2**30:.2f} GiB/chip, {t['placement']})" for n, t in biggest)
        raise PlanError(
            f"embedding tables need {per_chip_total / 2**30:.2f} GiB per chip but "
            f"training.embedding.topology allows {budget / 2**30:.2f} GiB ({topo.hbm_gib_per_chip} GiB x "
            f"{topo.usable_hbm_fraction} on each of {topo.num_chips} chips); largest: {names}. Use more chips, "
            "smaller dims, a vocabulary top_k/min_frequency, or a lower size_threshold so large tables are sharded"
        )
    return plan


# ---- rendering into TensorFlow objects ---------------------------------------------------------


class WarmupDecay(tf.keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to `learning_rate`, then constant / exponential / cosine decay (ScheduleConfig)."""

    def __init__(self, learning_rate: float, schedule: Dict[str, Any]):
        self.learning_rate = learning_rate
        self.schedule = dict(schedule)

    def __call__(self, step):
        sc = self.schedule
        step = tf.cast(step, tf.float32)
        lr = tf.constant(self.learning_rate, tf.float32)
        if sc["warmup_steps"]:
            lr = lr * tf.minimum(1.0, (step + 1.0) / float(sc["warmup_steps"]))
        t = tf.maximum(0.0, step - float(sc["warmup_steps"]))
        if sc["name"] == "exponential":
            lr = lr * tf.pow(float(sc["decay_rate"]), t / float(sc["decay_steps"]))
        elif sc["name"] == "cosine":
            frac = tf.minimum(1.0, t / float(sc["decay_steps"]))
            lr = lr * ((1.0 - sc["alpha"]) * 0.5 * (1.0 + tf.cos(math.pi * frac)) + sc["alpha"])
        return lr

    def get_config(self):
        return {"learning_rate": self.learning_rate, "schedule": self.schedule}


def learning_rate(spec: Dict[str, Any]):
    """A float, or a `WarmupDecay` schedule, for an optimizer spec's learning rate and schedule."""
    sc = spec["schedule"]
    if sc["name"] == "constant" and not sc["warmup_steps"]:
        return float(spec["learning_rate"])
    return WarmupDecay(spec["learning_rate"], sc)


def keras_optimizer(spec: Dict[str, Any]):
    """The Keras (legacy) optimizer for a spec: the dense optimizer on every platform (the embedding
    optimizers, CPU and TPU, come from optimizers.py)."""
    kw: Dict[str, Any] = {"learning_rate": learning_rate(spec)}
    for k in ("clipnorm", "clipvalue"):
        if spec.get(k) is not None:
            kw[k] = spec[k]
    legacy = tf.keras.optimizers.legacy
    classes = {"sgd": legacy.SGD, "adagrad": legacy.Adagrad, "adam": legacy.Adam, "ftrl": legacy.Ftrl}
    return build_optimizer(classes, spec, kw)


def table_configs(plan: Dict[str, Any]) -> Dict[str, Any]:
    """name -> TableConfig for every table in the plan (the optimizer is set on the layer)."""
    out = {}
    for name, t in plan["tables"].items():
        init = t["initializer"]
        out[name] = tf.tpu.experimental.embedding.TableConfig(
            vocabulary_size=t["rows"],
            dim=t["dim"],
            combiner=t["combiner"],
            initializer=tf.initializers.TruncatedNormal(mean=init["mean"], stddev=init["stddev"]),
            name=name,
        )
    return out


def feature_configs(
    plan: Dict[str, Any], tables: Optional[Dict[str, Any]] = None, output_batch: Optional[int] = None
) -> Dict[str, Any]:
    """feature -> FeatureConfig (shared tables are the same TableConfig object). `output_batch`:
    the static per-replica batch a TPU step sees (FeatureConfig.output_shape)."""
    tables = tables or table_configs(plan)
    return {
        name: tf.tpu.experimental.embedding.FeatureConfig(
            table=tables[f["table"]], max_sequence_length=f["max_sequence_length"], name=name,
            output_shape=[output_batch] if output_batch else None,
        )
        for name, f in plan["features"].items()
    }


def dense_id_widths(plan: Dict[str, Any]) -> Dict[str, int]:
    """{feature: width} of the features fed as padded dense IDs (those of TensorCore tables)."""
    out: Dict[str, int] = {}
    for name, f in plan["features"].items():
        if plan["tables"][f["table"]]["placement"] != "tensor_core":
            continue
        if not f.get("dense_width"):
            raise ValueError(
                f"categorical_features: {name!r} uses TensorCore table {f['table']!r}, whose TPU step input "
                "needs a static number of IDs per example; set max_length for it (or train from "
                "preprocessing output that carries embedding_statistics.json)"
            )
        out[name] = int(f["dense_width"])
    return out
