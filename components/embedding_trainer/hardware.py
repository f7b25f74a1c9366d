"""Where the Trainer trains: the strategy and its replicas, the embedding API and chips the TPU
reports, the checkpoint layout they give, and the plan checked and sized for them before training.

A TPU reports its embedding engine as `strategy.extended.tpu_hardware_feature.embedding_feature`:
V2 (SparseCore: TPUEmbeddingV2), V1 (TPUEmbedding) or UNSUPPORTED (no engine, e.g. v5e: TFRS
would build TPUEmbeddingV0 and replicate every table on every chip), and its replicas as
`strategy.num_replicas_in_sync`: TPUEmbeddingV2 pads and shards every stack over num_replicas_in_sync
x SparseCores per chip (tpu_embedding_v3.py ~319, ~354). The plan was sized for the API of
`training.embedding.topology.chip`, or for SparseCore when no chip was named, and for
`topology.num_chips` chips, or 8 when not set (rules.chips). `plan_for_hardware`, called by the
trainer once the strategy exists and before anything is built:
- refuses TPU-embedding tables on a chip without an engine (way out: size_threshold: null, or a
  chip with an engine);
- refuses a plan sized for a named chip whose API (or SparseCores per chip) the TPU contradicts;
- refuses a configured num_chips the TPU's replicas contradict (planning.fitting.hardware_num_chips:
  a SparseCore chip is one replica, a v2/v3 chip two), naming both;
- otherwise re-sizes the plan for the API, SparseCores per chip and chips the TPU has and checks it
  against the HBM budget, so the plan recorded with the model says what TensorFlow allocated
  (planning.fitting.with_run does the same sizing from the run's checkpoint layout).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

import components  # noqa: F401
import tensorflow as tf

from components.config.schema import PipelineConfig
from components.embedding_trainer.precision_choice import choose_precision
from components.contracts.plan import CheckpointLayout, EmbeddingPlan, PlanError
from components.planning.fitting import check_embedding_api, check_fits, hardware_num_chips, sized_for
from components.rules import chips


def reported_embedding(strategy: tf.distribute.Strategy) -> Tuple[str, str, int]:
    """The embedding API the TPU under `strategy` reports.

    Args:
      strategy: a TPUStrategy.

    Returns:
      (API (chips.EMBEDDING_APIS), TF's EmbeddingFeature name, SparseCores per chip): SparseCores
      per chip is what the hardware says, else 4 as TPUEmbeddingV2 assumes (tpu_embedding_v3.py).

    Raises:
      PlanError: the TPU reports an embedding feature this trainer does not know.
    """
    hw = strategy.extended.tpu_hardware_feature
    feature = getattr(hw.embedding_feature, "name", str(hw.embedding_feature))
    if feature not in chips.EMBEDDING_FEATURE_APIS:
        raise PlanError(f"the TPU reports embedding feature {feature!r}, which this trainer does not know "
                        f"({', '.join(chips.EMBEDDING_FEATURE_APIS)})")
    per_chip = int(getattr(hw, "num_embedding_devices_per_chip", 0) or chips.DEFAULT_SPARSE_CORES_PER_CHIP)
    return chips.EMBEDDING_FEATURE_APIS[feature], feature, per_chip


def plan_for_hardware(plan: EmbeddingPlan, strategy: tf.distribute.Strategy, on_tpu: bool) -> EmbeddingPlan:
    """`plan` checked against and sized for the TPU under `strategy` (module docstring).

    Args:
      plan: the embedding plan.
      strategy: the training strategy.
      on_tpu: whether training runs on a TPU.

    Returns:
      The plan sized for the TPU's embedding API, SparseCores per chip and chips
      (`strategy.num_replicas_in_sync`); off TPU, `plan` unchanged.

    Raises:
      PlanError: the TPU cannot train the plan, or contradicts the chip or the number of chips it
        was sized for (one line).
    """
    if not on_tpu:
        return plan
    api, feature, per_chip = reported_embedding(strategy)
    topo = plan.topology
    reported = f"EmbeddingFeature.{feature} ({chips.API_NAMES[api]}" + (
        f", {per_chip} SparseCores per chip)" if api == chips.SPARSE_CORE else ")")
    if topo.chip and (api != topo.embedding_api or (api == chips.SPARSE_CORE and per_chip != topo.sparse_cores_per_chip)):
        planned = chips.API_NAMES.get(topo.embedding_api, str(topo.embedding_api)) + (
            f", {topo.sparse_cores_per_chip} SparseCores per chip" if topo.embedding_api == chips.SPARSE_CORE else "")
        raise PlanError(
            f"training.embedding.topology.chip {topo.chip} sized the embedding plan for {planned}, but the TPU "
            f"reports {reported}; set topology.chip to the chip trained on, or remove it to size the plan for "
            "what the TPU reports")
    num_chips = hardware_num_chips(topo, api, int(strategy.num_replicas_in_sync))
    sized = sized_for(plan, api, per_chip if api == chips.SPARSE_CORE else None, num_chips)
    check_embedding_api(sized, f"the TPU (EmbeddingFeature.{feature})")
    check_fits(sized)
    return sized


def distribution_strategy(cfg: PipelineConfig) -> tf.distribute.Strategy:
    """The strategy to train under; connects to and initialises a configured TPU.

    Args:
      cfg: the pipeline config (`training.tpu`).

    Returns:
      TPUStrategy when a TPU is configured, MirroredStrategy on several GPUs, else the default strategy.
    """
    if cfg.training.tpu:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=cfg.training.tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    if len(tf.config.list_logical_devices("GPU")) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


def checkpoint_layout(strategy: tf.distribute.Strategy, per_replica: int) -> CheckpointLayout:
    """How this run's checkpoint will hold the TPU-embedding tables.

    Recorded in the plan, so the exporter can recompute a SparseCore layout that TensorFlow 2.16
    does not save.

    Args:
      strategy: the training strategy.
      per_replica: each replica's batch size.

    Returns:
      Layout A (one variable per table) off TPU and on TPUs without SparseCore, B (SparseCore
      stacks) on SparseCore, with the replicas, SparseCores per chip and per-replica batch.

    Raises:
      PlanError: the TPU reports an embedding feature this trainer does not know.
    """
    if not is_tpu_strategy(strategy):
        return CheckpointLayout(kind="A", embedding_api="TPUEmbeddingForServing (CPU/GPU variables)")
    api, feature, sparse_cores = reported_embedding(strategy)
    v2 = api == chips.SPARSE_CORE
    names = {chips.SPARSE_CORE: "TPUEmbeddingV2 (SparseCore)", chips.TPU_EMBEDDING_V1: "TPUEmbedding",
             # no engine: only TensorCore tables train (hardware.plan_for_hardware), one variable each
             chips.NO_EMBEDDING_API: f"none (EmbeddingFeature.{feature}: TensorCore tables only, replicated)"}
    return CheckpointLayout(
        kind="B" if v2 else "A",
        embedding_api=names[api],
        num_replicas=strategy.num_replicas_in_sync,
        # TPUEmbeddingV2 falls back to 4 when the hardware does not say (tpu_embedding_v3.py).
        sparse_cores_per_chip=sparse_cores,
        per_replica_batch_size=per_replica,
        hardware_api=api,
    )


def is_tpu_strategy(strategy: tf.distribute.Strategy) -> bool:
    """Whether training takes the TPU branch.

    The one predicate that decides it, so that tests can walk the TPU branch on CPU with a
    recording strategy by replacing it (tests/test_tpu_conformance.py).

    Args:
      strategy: the training strategy.

    Returns:
      True for a TPUStrategy.
    """
    return isinstance(strategy, tf.distribute.TPUStrategy)


@dataclasses.dataclass
class Hardware:
    """Where the run trains: the strategy, its replicas, each replica's batch, the checkpoint layout."""

    strategy: tf.distribute.Strategy
    on_tpu: bool
    replicas: int
    per_replica: int
    layout: CheckpointLayout
    ids_per_chip: Optional[Dict[str, Any]] = None  # SparseCore: sparsecore_limits.check_ids_per_chip's report
    precision: str = "float32"  # the dense network's, resolved (precision_choice.choose_precision)
    precision_reason: str = ""
    precision_setting: str = "float32"  # training.precision

    def precision_record(self) -> Dict[str, str]:
        """{"setting", "used", "reason"}: the dense network's precision, as training_run.json records it."""
        return {"setting": self.precision_setting, "used": self.precision, "reason": self.precision_reason}


def place_training(cfg: PipelineConfig) -> Hardware:
    """Where the run trains: the strategy, its replicas, each replica's batch and the checkpoint
    layout they give.

    Raises:
      ValueError: training.batch_size is not a multiple of the replicas.
    """
    t = cfg.training
    strategy = distribution_strategy(cfg)
    on_tpu = is_tpu_strategy(strategy)
    replicas = strategy.num_replicas_in_sync
    if t.batch_size % replicas:
        raise ValueError(f"training.batch_size {t.batch_size} must be a multiple of the {replicas} replicas")
    per_replica = t.batch_size // replicas
    platform = "tpu" if on_tpu else "gpu" if tf.config.list_logical_devices("GPU") else "cpu"
    precision, why = choose_precision(t.precision, platform)
    return Hardware(strategy, on_tpu, replicas, per_replica, checkpoint_layout(strategy, per_replica),
                    precision=precision, precision_reason=why, precision_setting=str(t.precision))
