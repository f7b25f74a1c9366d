"""The baseline every run fits beside its model: a logistic regression on the same transformed
features (`validation.baseline`).

One weight per embedding row (a [rows, 1] table per embedding table, so features sharing a table
share weights, as they share embeddings), pooled per feature with the feature's combiner and
weights exactly as its embedding is (`safe_embedding_lookup_sparse`: empty rows give 0; a sequence
feature is a bag of its IDs, mean-pooled), one weight per dense feature (signed log1p, the model's
own dense input: model.dense_input) and a bias. Trained with its own optimizer (FTRL by default)
on the training batches the model reads (`validation.baseline.epochs` over the train split, between
the model's steps and `max_steps_ratio` times them: baseline_steps), then scored exactly on the
whole eval split. Written by hand: TF 2.16 has no linear Keras model over SparseTensors of IDs (the
estimator LinearClassifier is gone from Keras 2.16's tf.compat paths the Trainer uses), and this
one costs one gather and a few segment sums per step: a small share of the model's step.

Its eval AUC is what `validation.baseline_margin` compares the model with (the exporter's gate).
"""
from __future__ import annotations

import math
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from components.config.schema import PipelineConfig
from components.contracts.manifest import VocabularyManifest, weights_key
from components.contracts.plan import EmbeddingPlan, optimizer_spec
from components.embedding_model.input import make_dataset
from components.embedding_model.dense_tower import dense_input
from components.embedding_model.tf_objects import keras_optimizer
from components.rules.metrics import auc_undefined_reason, log_loss, log_loss_undefined_reason, roc_auc, with_reasons

MODEL_NAME = "logistic_regression"
CHUNK = 200  # training steps per tf.function call
EVAL_BATCH = 4096


COMBINER_CODE = {"mean": 0, "sqrtn": 1, "sum": 2}


class LinearBaseline(tf.Module):
    """logit = bias + sum over features of pool(w[table][ids]) + dense_input . w_dense.

    Every table's weights are one [total rows, 1] variable (tables at offsets), and every
    feature's IDs of a batch are pooled at once: one gather and one segment sum per step instead
    of one `safe_embedding_lookup_sparse` (about 25 ops) per feature; `reference_logits` is that
    per-feature form, and the tests hold the two equal.

    Args:
      plan: the embedding plan (tables, rows, combiners).
      manifest: preprocessing's manifest (categorical, weighted and dense features).
    """

    def __init__(self, plan: EmbeddingPlan, manifest: VocabularyManifest):
        super().__init__(name="baseline")
        self.features = list(manifest.categorical_names)
        self.dense_names = list(manifest.dense_names)
        self.weighted = set(manifest.weighted_names)
        self.table_of = {f: plan.features[f].table for f in self.features}
        self.combiner = {
            f: ("mean" if plan.features[f].max_sequence_length else plan.tables[self.table_of[f]].combiner)
            for f in self.features
        }
        self.offsets: Dict[str, int] = {}
        total = 0
        for t in sorted(set(self.table_of.values())):
            self.offsets[t] = total
            total += plan.tables[t].rows
        self.table_rows = {t: plan.tables[t].rows for t in self.offsets}
        self.weights = tf.Variable(tf.zeros([max(total, 1), 1]), name="w_rows")
        self.w_dense = tf.Variable(tf.zeros([max(len(self.dense_names), 1), 1]), name="w_dense")
        self.bias = tf.Variable(tf.zeros([1]), name="bias")

    def _rows(self, features: Dict[str, Any]) -> tf.Tensor:
        first = features[self.features[0]] if self.features else features[self.dense_names[0]]
        return tf.shape(first, out_type=tf.int64)[0]

    def logits(self, features: Dict[str, Any]) -> tf.Tensor:
        """The baseline's logits.

        Args:
          features: a batch as make_dataset yields it: SparseTensors of IDs (and weights), dense features.

        Returns:
          float32 logits of shape [batch, 1].
        """
        n = self._rows(features)
        out = tf.zeros(tf.stack([n, tf.constant(1, tf.int64)])) + self.bias
        if self.features:
            nf = len(self.features)
            ids, rows, segs, wts, codes = [], [], [], [], []
            for i, f in enumerate(self.features):
                sp = features[f]
                w = features[weights_key(f)].values if f in self.weighted else tf.ones_like(sp.values, tf.float32)
                # safe_embedding_lookup_sparse's pruning: IDs < 0 and weights <= 0 take no part.
                keep = tf.logical_and(sp.values >= 0, w > 0)
                r = tf.boolean_mask(sp.indices[:, 0], keep)
                ids.append(tf.boolean_mask(sp.values, keep) + self.offsets[self.table_of[f]])
                rows.append(r)
                segs.append(r * nf + i)
                wts.append(tf.boolean_mask(w, keep))
                codes.append(tf.fill(tf.shape(r), COMBINER_CODE[self.combiner[f]]))
            ids, rows, segs, w, code = (tf.concat(x, 0) for x in (ids, rows, segs, wts, codes))
            nseg = n * nf
            sum_w = tf.gather(tf.math.unsorted_segment_sum(w, segs, nseg), segs)
            sum_w2 = tf.gather(tf.math.unsorted_segment_sum(w * w, segs, nseg), segs)
            scale = tf.where(code == 0, w / sum_w, tf.where(code == 1, w * tf.math.rsqrt(sum_w2), w))
            pooled = tf.gather(self.weights, ids)[:, 0] * scale
            out += tf.reshape(tf.math.unsorted_segment_sum(pooled, rows, n), [-1, 1])
        if self.dense_names:
            out += tf.matmul(dense_input(features, self.dense_names), self.w_dense)
        return out

    def reference_logits(self, features: Dict[str, Any]) -> tf.Tensor:
        """The same logits, one TF embedding lookup per feature (the tests' reference).

        Args:
          features: a batch as for `logits`.

        Returns:
          float32 logits of shape [batch, 1].
        """
        out = tf.zeros(tf.stack([self._rows(features), tf.constant(1, tf.int64)])) + self.bias
        for f in self.features:
            t = self.table_of[f]
            table = self.weights[self.offsets[t]:self.offsets[t] + self.table_rows[t]]
            w = features[weights_key(f)] if f in self.weighted else None
            out += tf.nn.safe_embedding_lookup_sparse(table, features[f], sparse_weights=w, combiner=self.combiner[f])
        if self.dense_names:
            out += tf.matmul(dense_input(features, self.dense_names), self.w_dense)
        return out


def baseline_steps(cfg: PipelineConfig, model_steps: int, train_rows: Optional[int]) -> int:
    """validation.baseline.train_steps when set; else validation.baseline.epochs over the train
    split (when its row count is known), at most max_steps_ratio x the model's steps and at least
    the model's.

    Args:
      cfg: the pipeline config (`validation.baseline`, the batch size).
      model_steps: the model's training steps.
      train_rows: the train split's row count, None when unknown.

    Returns:
      The baseline's training steps.
    """
    b = cfg.validation.baseline
    if b.train_steps:
        return int(b.train_steps)
    if not train_rows:
        return int(model_steps)
    wanted = math.ceil(b.epochs * train_rows / cfg.training.batch_size)
    return int(max(model_steps, min(wanted, b.max_steps_ratio * model_steps)))


def train_baseline(cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest, train_files,
                   eval_files, model_steps: int, train_rows: Optional[int] = None) -> Dict[str, Any]:
    """Fits the baseline and scores it on the eval split: the `baseline` entry of eval_metrics.json.

    Args:
      cfg: the pipeline config.
      plan: the embedding plan.
      manifest: preprocessing's manifest.
      train_files: the train split's file patterns (its held-out slice is left out).
      eval_files: the eval split's file patterns.
      model_steps: the model's training steps.
      train_rows: the train split's row count, None when unknown.

    Returns:
      {model, auc, log_loss, examples, train_steps, train_loss_last_chunk, optimizer, weights, seconds};
      an AUC or log loss undefined on the eval split (one label only; no rows) is None, with its
      reason under `undefined` (rules/metrics.py `with_reasons`).
    """
    b = cfg.validation.baseline
    steps = baseline_steps(cfg, model_steps, train_rows)
    start = time.time()
    tf.keras.utils.set_random_seed(cfg.training.seed)
    spec = optimizer_spec(b.optimizer)
    with tf.device("/cpu:0"):
        model = LinearBaseline(plan, manifest)
        opt = keras_optimizer(spec)
        variables = [v for v in model.trainable_variables if v is not model.w_dense or model.dense_names]
        losses = _fit_baseline(cfg, model, opt, variables, manifest, train_files, steps, train_rows)
        p, y = _score_baseline(model, manifest, eval_files)
    tail = losses[-1:]
    return with_reasons({
        "model": MODEL_NAME,
        "auc": roc_auc(p, y),
        "log_loss": log_loss(p, y),
        "examples": int(len(y)),
        "train_steps": steps,
        "train_loss_last_chunk": tail[0] if tail else None,
        "optimizer": spec,
        "weights": int(sum(int(np.prod(v.shape)) for v in variables)),
        "seconds": round(time.time() - start, 2),
    }, {"auc": auc_undefined_reason(y, "eval split"), "log_loss": log_loss_undefined_reason(y, "eval split")})


def _fit_baseline(cfg: PipelineConfig, model: LinearBaseline, opt, variables, manifest: VocabularyManifest,
                  train_files, steps: int, train_rows: Optional[int]) -> List[float]:
    """Trains the baseline for `steps` steps on the model's training rows; returns each chunk's mean loss."""

    def step(features, label):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(
                tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=model.logits(features)))
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    # The steps run inside one tf.function per chunk, pulling batches from the iterator there:
    # stepping from Python converts every batch's SparseTensors, which costs more than the step.
    @tf.function
    def run(iterator, k):
        total = tf.constant(0.0)
        for _ in tf.range(k):
            total += step(*next(iterator))
        return total / tf.cast(k, tf.float32)

    # the rows the model trains on: its held-out slice (selection.py) is left out here too
    train = make_dataset(train_files, manifest, cfg.training.batch_size, training=True, seed=cfg.training.seed,
                         shuffle_rows=cfg.training.shuffle_buffer_rows, part="train",
                         holdout_fraction=cfg.training.holdout_fraction(train_rows))
    iterator = iter(train)
    losses, done = [], 0
    while done < steps:
        k = min(CHUNK, steps - done)
        losses.append(float(run(iterator, tf.constant(k))))
        done += k
    return losses


def _score_baseline(model: LinearBaseline, manifest: VocabularyManifest, eval_files) -> Tuple[np.ndarray, np.ndarray]:
    """(probabilities, labels) of the whole eval split, float32 arrays of shape [examples]."""
    scores, labels = [], []
    score = tf.function(lambda f: tf.sigmoid(model.logits(f)), reduce_retracing=True)
    for f, y in make_dataset(eval_files, manifest, EVAL_BATCH, training=False):
        scores.append(score(f).numpy())
        labels.append(y.numpy())
    if not scores:  # an empty eval split: its metrics are undefined (train_baseline says so)
        return np.zeros(0, np.float32), np.zeros(0, np.float32)
    return np.concatenate(scores).ravel(), np.concatenate(labels).ravel()
