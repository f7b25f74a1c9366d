"""Scoring a model on a dataset: exact AUC and log loss over every example.

A leaf of the trainer: the Trainer's final evaluation (trainer_module) and the held-out selection
of checkpoints (selection) both score through `evaluate`.
"""
from __future__ import annotations

from typing import Any, Dict

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import numpy as np
import tensorflow as tf

from components.rules.metrics import log_loss, roc_auc


def evaluate(model: Any, dataset: tf.data.Dataset) -> Dict[str, float]:
    """Scores `model` on every batch of `dataset`, exactly (no streaming approximation).

    Args:
      model: a callable taking a batch's features and returning click probabilities of shape
        [batch, 1] or [batch] (a RankingModel).
      dataset: batched (features, label) pairs, labels float32 of shape [batch] or [batch, 1].

    Returns:
      {"auc", "log_loss", "examples", "positive_rate"}: ROC AUC and mean log loss over all
      examples, their count, and the share of positive labels.
    """
    probs, labels = [], []
    for features, label in dataset:
        probs.append(model(features).numpy())
        labels.append(label.numpy())
    p, y = np.concatenate(probs).ravel(), np.concatenate(labels).ravel()
    return {"auc": roc_auc(p, y), "log_loss": log_loss(p, y), "examples": int(len(y)), "positive_rate": float(y.mean())}
