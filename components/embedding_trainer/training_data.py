"""The Trainer's input: per-replica batches of the transformed train split, seeded, resumable at
any step and distributed over the replicas as the strategy needs them."""
from __future__ import annotations

from typing import Optional

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf

from components.config.schema import PipelineConfig
from components.contracts.manifest import VocabularyManifest
from components.contracts.plan import EmbeddingPlan
from components.embedding_model import tf_objects
from components.embedding_model.input import make_dataset
from components.embedding_trainer.hardware import Hardware


def training_input(train_files, manifest: VocabularyManifest, plan: EmbeddingPlan, t, per_replica: int,
                   start: int, replicas: int, holdout_fraction: float = 0.0):
    """The training input as a dataset function (`ctx`: tf.distribute's InputContext, or None for
    one replica): per-replica batches, seeded. One input pipeline reads one stream in units of
    the global batch, so each step's replicas together get the examples one replica gets as that
    step's global batch (make_dataset's `global_batch`). With P input pipelines (hosts), pipeline
    i reads only its own files (i, i+P, ... of the split's sorted files; make_dataset's
    `input_context`) and feeds its replicas / P replicas, in units of its share of the global
    batch. Every step takes one batch per replica, so a run resumed at step `start` skips
    `start x replicas` batches over all pipelines, `start x replicas / P` of each pipeline's
    stream: each pipeline yields the batches it would have yielded next (the replicas are a
    multiple of the pipelines). Skipping only `start` batches would feed a resumed multi-replica
    run examples it has already seen.

    Args:
      train_files: the train split's file patterns.
      manifest: preprocessing's manifest.
      plan: the embedding plan (padded dense-ID widths, sequence lengths).
      t: the training config (seed, shuffle buffer).
      per_replica: each replica's batch size.
      start: the step the run starts from.
      replicas: the replicas in sync.
      holdout_fraction: the share held out for the selection (selection.py), left out here.

    Returns:
      A function of an optional tf.distribute.InputContext returning the batched dataset.
    """
    widths, lengths = tf_objects.dense_id_widths(plan), tf_objects.sequence_lengths(plan)

    def train_input(ctx: Optional[tf.distribute.InputContext] = None) -> tf.data.Dataset:
        return make_dataset(train_files, manifest, per_replica, training=True, seed=t.seed,
                            skip_batches=start * replicas, dense_id_widths=widths, sequence_lengths=lengths,
                            global_batch=per_replica * replicas, shuffle_rows=t.shuffle_buffer_rows,
                            part="train", holdout_fraction=holdout_fraction, input_context=ctx)

    return train_input


def sample_batch(train_files, manifest: VocabularyManifest, plan: EmbeddingPlan, per_replica: int):
    """One per-replica batch of features in the training step's input form, to build a model's variables.

    Args:
      train_files: the train split's file patterns.
      manifest: preprocessing's manifest.
      plan: the embedding plan.
      per_replica: each replica's batch size.

    Returns:
      The batch's features, {name: tensor} with batch dimension `per_replica`.
    """
    features, _ = next(iter(make_dataset(train_files, manifest, per_replica, training=False,
                                         dense_id_widths=tf_objects.dense_id_widths(plan),
                                         sequence_lengths=tf_objects.sequence_lengths(plan))))
    return features


def training_dataset(cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest, train_files,
                     hardware: Hardware, start: int, holdout: float):
    """The training input from step `start`, distributed over the replicas as the strategy needs it."""
    train_input = training_input(train_files, manifest, plan, cfg.training, hardware.per_replica, start,
                                 hardware.replicas, holdout)
    if hardware.on_tpu:
        # Sparse features stay on the host for the TPU embedding enqueue.
        options = tf.distribute.InputOptions(experimental_fetch_to_device=False)
        return hardware.strategy.distribute_datasets_from_function(train_input, options)
    if hardware.replicas > 1:
        return hardware.strategy.distribute_datasets_from_function(train_input)
    return train_input()
