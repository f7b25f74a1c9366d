"""Scoring a model on a dataset: exact AUC and log loss over every example.

A leaf of the trainer: the Trainer's final evaluation (trainer_module) and the held-out selection
of checkpoints (selection) both score through `evaluate`.

The model runs as one compiled function per batch (`tf.function`, traced once for the dataset's
element spec), on batches of about EVAL_ROWS rows that the input pipeline reads and parses in
parallel ahead of it; only each batch's scores and labels come back to numpy (8 bytes a row: 32 MB
for 4M rows), and the exact metrics are computed once over all of them at the end. Called eagerly
per batch of the training batch size, the same model scored about 4k rows/s with one core busy
(bench/eval_bench.py keeps that loop as its baseline).
"""
from __future__ import annotations

import time
import weakref
from typing import Any, Callable, Dict

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import numpy as np
import tensorflow as tf

from components.config.choices import FORMAT_BLOCKS
from components.contracts.manifest import VocabularyManifest
from components.rules.metrics import log_loss, roc_auc

# Rows per evaluation batch: large enough that a batch's fixed costs (the function call, handing
# ~40 tensors over from tf.data) vanish against its arithmetic, small enough that a batch's parsed
# features stay a few tens of MB.
EVAL_ROWS = 8192

# Each model's compiled scoring, by the batches' spec: the held-out selection scores the same twin
# (its variables reassigned from each checkpoint) at every evaluation and traces it once. The
# functions hold the model weakly (only while tracing is it called), so an entry goes with its model.
_SCORERS: "weakref.WeakKeyDictionary[Any, Dict[str, Callable]]" = weakref.WeakKeyDictionary()


def evaluation_batch(manifest: VocabularyManifest, rows: int = EVAL_ROWS) -> int:
    """Rows per evaluation batch for data in `manifest`'s layout.

    Args:
      manifest: the transformed data's manifest (its layout and block size).
      rows: the rows wanted per batch.

    Returns:
      `rows`, rounded down to whole blocks (at least one) in the `blocks` layout, so a batch is
      whole blocks parsed by one call (input.py) instead of blocks re-cut row by row.
    """
    if manifest.transformed_format != FORMAT_BLOCKS or not manifest.block_rows:
        return int(rows)
    return max(1, int(rows) // manifest.block_rows) * manifest.block_rows


def compiled_scorer(model: Any, dataset: tf.data.Dataset) -> Callable[[Any, Any], Any]:
    """The model's scoring of one batch of `dataset` as one compiled function.

    Args:
      model: a callable taking a batch's features and returning click probabilities of shape
        [batch, 1] or [batch].
      dataset: batched (features, label) pairs; its element spec is the function's signature
        (batch dimension unknown), so it is traced once whatever the batches' sizes.

    Returns:
      A tf.function of (features, label) returning (probabilities float32 [batch], labels float32
      [batch]); the same one for the same model and spec while the model lives (traced once: the
      selection's twin is scored at every evaluation with its variables reassigned).
    """
    # any batch size: the last batch is shorter, blocks give batches of other sizes
    signature = [tf.nest.map_structure(lambda s: s._unbatch()._batch(None), spec)  # pylint: disable=protected-access
                 for spec in dataset.element_spec]
    key = repr(signature)
    try:
        known, model_ref = _SCORERS.setdefault(model, {}), weakref.ref(model)
    except TypeError:  # a model that cannot be referenced weakly: compiled afresh each time
        known, model_ref = {}, (lambda: model)
    if key not in known:
        known[key] = _scorer(model_ref, signature)
    return known[key]


def _scorer(model_ref, signature) -> Callable[[Any, Any], Any]:
    @tf.function(input_signature=signature)
    def score(features, label):
        probs = tf.cast(tf.reshape(model_ref()(features), [-1]), tf.float32)
        return probs, tf.cast(tf.reshape(label, [-1]), tf.float32)

    return score


def evaluate(model: Any, dataset: tf.data.Dataset) -> Dict[str, float]:
    """Scores `model` on every batch of `dataset`, exactly (no streaming approximation).

    Args:
      model: a callable taking a batch's features and returning click probabilities of shape
        [batch, 1] or [batch] (a RankingModel, or the CPU serving twin).
      dataset: batched (features, label) pairs, labels float32 of shape [batch] or [batch, 1].

    Returns:
      {"auc", "log_loss", "examples", "positive_rate", "seconds"}: ROC AUC and mean log loss over
      all examples, their count, the share of positive labels, and the wall seconds the reading
      and scoring took.

    Raises:
      ValueError: the dataset holds no examples.
    """
    start = time.perf_counter()
    score = compiled_scorer(model, dataset)
    probs, labels = [], []
    for features, label in dataset:
        p, y = score(features, label)
        probs.append(p.numpy())
        labels.append(y.numpy())
    if not labels:
        raise ValueError("evaluation: the dataset holds no examples to score")
    p, y = np.concatenate(probs), np.concatenate(labels)
    seconds = time.perf_counter() - start
    return {"auc": roc_auc(p, y), "log_loss": log_loss(p, y), "examples": int(len(y)),
            "positive_rate": float(y.mean()), "seconds": float(seconds)}
