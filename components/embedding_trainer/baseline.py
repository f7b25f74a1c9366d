"""The baseline every run fits beside its model: a logistic regression on the same transformed
features (`validation.baseline`), as strong as the simple model a user would fit.

- **Features.** One weight per embedding row (a column of a [total rows, K] variable: tables at
  offsets, so features sharing a table share weights, as they share embeddings) and one per dense
  feature (signed log1p, the model's own dense input: dense_tower.dense_input), and a bias. A
  feature's IDs are a **bag**: their weights summed (times the ID's weight for a weighted feature),
  whatever the feature's combiner, as a one-hot or bag-of-words logistic regression reads them. A
  mean over a row's IDs would shrink each of a long text's words to 1/n of its weight: on long
  multi-hot features that cost up to 0.25 AUC against scikit-learn's fit (bench/README.md).
- **Dense features** standardized: (signed log1p - mean) / std, both measured on the first
  training batches. A logistic regression on unscaled inputs converges slowly under any streamed
  optimizer (chem97's grade, all within [1.9, 2.2] after log1p, needs a weight near 20).
- **Regularization chosen on held-out rows.** K candidates (`validation.baseline.l2`) are fitted
  at once, one column each, candidate k minimizing the mean log loss + l2[k] x |w|^2 / rows, the
  objective of scikit-learn's LogisticRegression with C = 1 / (2 l2). Streamed, an example adds
  l2[k] x w^2 / count for each ID it looks up (count: the ID's train count from its vocabulary's
  counts file), which sums to l2[k] x |w|^2 over a pass, and l2[k] x |w_dense|^2 / rows. Rows
  without a count (OOV buckets, identity and hashed tables) take their table's mean occurrences per
  row. The candidate with the best AUC on the train split's held-out slice (selection.py's slice,
  by the same key; its rows are never trained on) is the baseline; every candidate's AUC is recorded.
- **Length.** `epochs` passes over the train split less the slice, when set; else `max_rows` rows
  (at most `max_epochs` passes, at least `min_steps` steps): a small split gets many passes, which
  cost little; a large one a part of a pass, its files in a seeded random order (make_dataset), so
  the rows are drawn across the split. A whole pass at 20M rows cost over 30% of the Trainer's time
  (bench/README.md "A whole epoch at 20M rows"); `max_rows` keeps it under 10%.

Written by hand: TF 2.16 has no linear Keras model over SparseTensors of IDs (the estimator
LinearClassifier is gone from Keras 2.16's tf.compat paths the Trainer uses), and this one costs one
gather and a few segment sums per step. Its eval AUC is what `validation.baseline_margin` compares
the model with (the exporter's gate).
"""
from __future__ import annotations

import math
import os
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from components.config.schema import PipelineConfig
from components.contracts.manifest import VocabularyManifest, weights_key
from components.contracts.plan import EmbeddingPlan
from components.planning.derivation import optimizer_spec
from components.embedding_model.input import make_dataset, read_holdout, records_dataset
from components.embedding_model.dense_tower import dense_input
from components.embedding_model.optimizers import keras_optimizer
from components.embedding_model.tf_objects import learning_rate
from components.embedding_trainer.evaluation import evaluation_batch
from components.embedding_trainer.warm_start import TOKEN_KINDS, read_lines
from components.rules.metrics import auc_undefined_reason, log_loss, log_loss_undefined_reason, roc_auc, with_reasons

MODEL_NAME = "logistic_regression"
CHUNK = 200  # training steps per tf.function call
EVAL_BATCH = 4096
STANDARDIZE_BATCHES = 16  # training batches whose dense inputs give the standardization's mean and std


class LinearBaseline(tf.Module):
    """logits[:, k] = bias[k] + sum over features of sum(w[table][ids, k] x weights) + z . w_dense[:, k],
    z the standardized dense input.

    Every table's weights are one [total rows, K] variable (tables at offsets), and every
    feature's IDs of a batch are pooled at once: one gather and one segment sum per step instead
    of one `safe_embedding_lookup_sparse` (about 25 ops) per feature; `reference_logits` is that
    per-feature form (combiner `sum`), and the tests hold the two equal.

    Args:
      plan: the embedding plan (tables and their rows).
      manifest: preprocessing's manifest (categorical, weighted and dense features).
      l2: the candidates' L2 strengths, one column each.
      inverse_counts: float32 [total rows]: 1 / each row's train count (`row_inverse_counts`);
        None: 1 for every row.
      rows: the rows trained on (the dense weights' penalty is l2 / rows per example).
    """

    def __init__(self, plan: EmbeddingPlan, manifest: VocabularyManifest, l2=(0.0,),
                 inverse_counts: Optional[np.ndarray] = None, rows: int = 1):
        super().__init__(name="baseline")
        self.features = list(manifest.categorical_names)
        self.dense_names = list(manifest.dense_names)
        self.weighted = set(manifest.weighted_names)
        self.table_of = {f: plan.features[f].table for f in self.features}
        self.offsets: Dict[str, int] = {}
        total = 0
        for t in sorted(set(self.table_of.values())):
            self.offsets[t] = total
            total += plan.tables[t].rows
        self.table_rows = {t: plan.tables[t].rows for t in self.offsets}
        self.l2 = tf.constant(list(l2), tf.float32)
        self.inverse_counts = tf.constant(
            np.ones(max(total, 1), np.float32) if inverse_counts is None else inverse_counts, tf.float32)
        self.rows = float(max(1, rows))
        k = len(l2)
        n_dense = max(len(self.dense_names), 1)
        self.dense_mean = tf.Variable(tf.zeros([n_dense]), trainable=False, name="dense_mean")
        self.dense_scale = tf.Variable(tf.ones([n_dense]), trainable=False, name="dense_scale")
        self.weights = tf.Variable(tf.zeros([max(total, 1), k]), name="w_rows")
        self.w_dense = tf.Variable(tf.zeros([max(len(self.dense_names), 1), k]), name="w_dense")
        self.bias = tf.Variable(tf.zeros([k]), name="bias")

    def _rows(self, features: Dict[str, Any]) -> tf.Tensor:
        first = features[self.features[0]] if self.features else features[self.dense_names[0]]
        return tf.shape(first, out_type=tf.int64)[0]

    def logits_and_penalty(self, features: Dict[str, Any]) -> Tuple[tf.Tensor, tf.Tensor]:
        """The candidates' logits and their L2 penalties.

        Args:
          features: a batch as make_dataset yields it: SparseTensors of IDs (and weights), dense features.

        Returns:
          (float32 logits [batch, K], float32 [K]: each candidate's penalty summed over the batch's
          examples: l2[k] x (the squared weight / count of every ID looked up + |w_dense|^2 / rows)).
        """
        n = self._rows(features)
        out = tf.zeros(tf.stack([n, tf.constant(1, tf.int64)])) + self.bias
        squares = tf.zeros_like(self.bias)
        if self.features:
            ids, rows, wts, keeps = [], [], [], []
            for f in self.features:
                sp = features[f]
                w = features[weights_key(f)].values if f in self.weighted else tf.ones_like(sp.values, tf.float32)
                # safe_embedding_lookup_sparse's pruning: IDs < 0 and weights <= 0 take no part.
                keeps.append(tf.logical_and(sp.values >= 0, w > 0))
                rows.append(sp.indices[:, 0])
                ids.append(sp.values + self.offsets[self.table_of[f]])
                wts.append(w)
            # Pruned once over every feature's IDs, in the same order as feature by feature: a 1-D
            # boolean_mask is 27 graph ops, and three per feature were most of the baseline's traces.
            kept = tf.where(tf.concat(keeps, 0))[:, 0]
            ids, rows, w = (tf.gather(tf.concat(x, 0), kept) for x in (ids, rows, wts))
            looked_up = tf.gather(self.weights, ids)  # [IDs, K]
            out += tf.math.unsorted_segment_sum(looked_up * w[:, None], rows, n)
            squares += tf.reduce_sum(tf.square(looked_up) * tf.gather(self.inverse_counts, ids)[:, None], 0)
        if self.dense_names:
            out += tf.matmul(self.standardized(features), self.w_dense)
            squares += tf.cast(n, tf.float32) / self.rows * tf.reduce_sum(tf.square(self.w_dense), 0)
        return out, self.l2 * squares

    def standardized(self, features: Dict[str, Any]) -> tf.Tensor:
        """The dense input (signed log1p) less `dense_mean`, over `dense_scale`: float32 [batch, dense]."""
        return (dense_input(features, self.dense_names) - self.dense_mean) / self.dense_scale

    def logits(self, features: Dict[str, Any]) -> tf.Tensor:
        """The candidates' logits, float32 [batch, K] (`logits_and_penalty`)."""
        return self.logits_and_penalty(features)[0]

    @tf.function(autograph=False)  # no tensor-dependent Python control flow in the logits
    def probabilities(self, features: Dict[str, Any]) -> tf.Tensor:
        """The candidates' probabilities, float32 [batch, K]: sigmoid(`logits`), one trace per input spec."""
        return tf.sigmoid(self.logits(features))

    def reference_logits(self, features: Dict[str, Any]) -> tf.Tensor:
        """The same logits, one TF embedding lookup (combiner `sum`) per feature and candidate (the
        tests' reference).

        Args:
          features: a batch as for `logits`.

        Returns:
          float32 logits of shape [batch, K].
        """
        out = tf.zeros(tf.stack([self._rows(features), tf.constant(1, tf.int64)])) + self.bias
        for f in self.features:
            t = self.table_of[f]
            table = self.weights[self.offsets[t]:self.offsets[t] + self.table_rows[t]]
            w = features[weights_key(f)] if f in self.weighted else None
            out += tf.nn.safe_embedding_lookup_sparse(table, features[f], sparse_weights=w, combiner="sum")
        if self.dense_names:
            z = (dense_input(features, self.dense_names) - self.dense_mean) / self.dense_scale
            out += tf.matmul(z, self.w_dense)
        return out


def row_inverse_counts(plan: EmbeddingPlan, manifest: VocabularyManifest, offsets: Dict[str, int],
                       total: int, rows_trained: int) -> np.ndarray:
    """1 / the train count of every row of the baseline's tables, at their offsets.

    A row's count is its line of the vocabulary's counts file (`<count> <token>`, row i = line i);
    rows without one (OOV buckets; identity and hashed tables, which have no counts file) take
    their table's mean: the IDs its features looked up in the train split (statistics' mean IDs per
    example x `rows_trained`) over its rows.

    Args:
      plan: the embedding plan (tables' rows; features' mean IDs per example).
      manifest: the manifest naming the vocabulary files.
      offsets: {table: its first row in the baseline's weights}.
      total: the baseline's rows over all tables.
      rows_trained: the train split's rows (the mean's scale).

    Returns:
      float32 [max(total, 1)].
    """
    out = np.ones(max(total, 1), np.float32)
    for table, start in offsets.items():
        rows = plan.tables[table].rows
        looked_up = sum((plan.features[f].ids_per_example or {}).get("mean") or 1.0 for f in plan.tables[table].features)
        counts = np.full(rows, max(1.0, looked_up * rows_trained / max(1, rows)), np.float64)
        entry = manifest.vocabulary(table)
        path = os.path.join(manifest.vocabulary_dir, entry.counts_file) if entry.counts_file else ""
        if entry.kind in TOKEN_KINDS and path and tf.io.gfile.exists(path):
            known = [float(line.partition(b" ")[0]) for line in read_lines(path)[:rows]]
            counts[:len(known)] = np.maximum(known, 1.0)
        out[start:start + rows] = 1.0 / counts
    return out


def baseline_holdout_fraction(cfg: PipelineConfig, train_rows: Optional[int]) -> float:
    """The share of the train split the baseline holds out to choose its regularization: the
    model's held-out slice (`training.holdout_fraction`), or with early stopping off the slice it
    would have had (`early_stopping.holdout_fraction`, capped at `max_holdout_rows` rows).

    Args:
      cfg: the pipeline config.
      train_rows: the train split's row count, None when unknown.

    Returns:
      A fraction in (0, 1).
    """
    es = cfg.training.early_stopping
    if not train_rows:
        return es.holdout_fraction
    return min(es.holdout_fraction, es.max_holdout_rows / train_rows)


def baseline_length(cfg: PipelineConfig, train_rows: Optional[int], model_steps: int) -> Dict[str, Any]:
    """How long the baseline trains.

    Args:
      cfg: the pipeline config (`validation.baseline`).
      train_rows: the train split's row count, None when unknown.
      model_steps: the model's steps (the length when the split's size is unknown).

    Returns:
      {steps, batch_size, epochs (None when the split's size is unknown), rows_per_epoch, source}:
      `rows_per_epoch` is the train split less the held-out slice, `source` how the steps follow.
    """
    b = cfg.validation.baseline
    batch = int(b.batch_size)
    if b.train_steps:
        return {"steps": int(b.train_steps), "batch_size": batch, "epochs": None, "rows_per_epoch": None,
                "source": "validation.baseline.train_steps"}
    if not train_rows:
        steps = int(math.ceil(model_steps * cfg.training.batch_size / batch))
        return {"steps": steps, "batch_size": batch, "epochs": None, "rows_per_epoch": None,
                "source": f"the model's rows ({model_steps} steps x batch {cfg.training.batch_size}; the split's size is unknown)"}
    # as TrainingConfig.trained_rows counts an epoch, with the baseline's slice
    rows = max(1, int(train_rows) - round(int(train_rows) * baseline_holdout_fraction(cfg, train_rows)))
    if b.epochs:
        epochs, why = float(b.epochs), "validation.baseline.epochs"
    else:
        epochs = min(float(b.max_epochs), b.max_rows / rows)
        why = f"max_rows {b.max_rows:,} / rows, at most max_epochs {b.max_epochs:g}"
        if epochs * rows < b.min_steps * batch:
            epochs, why = b.min_steps * batch / rows, f"min_steps {b.min_steps:,} x batch {batch} / rows"
    steps = max(1, int(math.ceil(epochs * rows / batch - 1e-9)))
    return {"steps": steps, "batch_size": batch, "epochs": round(epochs, 4), "rows_per_epoch": rows,
            "source": f"{epochs:.4g} epochs ({why}) x {rows:,} rows / batch {batch}"}


def train_baseline(cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest, train_files,
                   eval_files, model_steps: int, train_rows: Optional[int] = None) -> Dict[str, Any]:
    """Fits the baseline's candidates, keeps the best on the held-out slice and scores it on the
    eval split: the `baseline` entry of eval_metrics.json.

    Args:
      cfg: the pipeline config.
      plan: the embedding plan.
      manifest: preprocessing's manifest.
      train_files: the train split's file patterns (its held-out slice is left out of training).
      eval_files: the eval split's file patterns.
      model_steps: the model's training steps (the length when the split's size is unknown).
      train_rows: the train split's row count, None when unknown.

    Returns:
      {model, auc, log_loss, examples, l2, candidates, selected_by, train_steps, batch_size, epochs,
      length_source, train_loss_last_chunk, optimizer, weights, seconds}; an AUC or log loss
      undefined on the eval split (one label only; no rows) is None, with its reason under
      `undefined` (rules/metrics.py `with_reasons`).
    """
    b = cfg.validation.baseline
    length = baseline_length(cfg, train_rows, model_steps)
    fraction = baseline_holdout_fraction(cfg, train_rows)
    start = time.time()
    tf.keras.utils.set_random_seed(cfg.training.seed)
    spec = optimizer_spec(b.optimizer)
    l2 = [float(x) for x in b.l2]
    rows_trained = length["rows_per_epoch"] or int(model_steps * cfg.training.batch_size)
    with tf.device("/cpu:0"):
        model = LinearBaseline(plan, manifest, l2, rows=rows_trained)
        model.inverse_counts = tf.constant(row_inverse_counts(plan, manifest, model.offsets,
                                                              int(model.weights.shape[0]), rows_trained))
        # The embedding optimizers' factory: lazy Adam touches only the rows a batch looks up;
        # Keras' Adam decays every row's moments every step, which at 20M rows (3.4M weights x K)
        # made the baseline cost as much per row as the model.
        opt = keras_optimizer(spec, learning_rate(spec))
        variables = [v for v in model.trainable_variables if v is not model.w_dense or model.dense_names]
        losses = _fit_baseline(cfg, model, opt, variables, manifest, train_files, length, fraction)
        held = read_holdout(train_files, manifest, fraction, cfg.training.early_stopping.max_holdout_rows)
        p_held, y_held = _score(model, records_dataset(held.records, manifest, evaluation_batch(manifest, EVAL_BATCH)))
        candidates = [{"l2": x, "holdout_auc": roc_auc(p_held[:, k], y_held) if _ranked(y_held) else None}
                      for k, x in enumerate(l2)]
        best, selected_by = _choose(candidates, held.rows)
        p, y = _score(model, make_dataset(eval_files, manifest, EVAL_BATCH, training=False))
        p = p[:, best] if len(p) else np.zeros(0, np.float32)
    tail = losses[-1:]
    return with_reasons({
        "model": MODEL_NAME,
        "auc": roc_auc(p, y),
        "log_loss": log_loss(p, y),
        "examples": int(len(y)),
        "pooling": "bag of IDs (sum)",
        "l2": l2[best],
        "candidates": candidates,
        "selected_by": selected_by,
        "holdout_rows": int(held.rows),
        "train_steps": length["steps"],
        "batch_size": length["batch_size"],
        "epochs": length["epochs"],
        "length_source": length["source"],
        "train_loss_last_chunk": tail[0] if tail else None,
        "optimizer": spec,
        "weights": int(sum(int(np.prod(v.shape)) for v in variables)) // max(1, len(l2)),
        "seconds": round(time.time() - start, 2),
    }, {"auc": auc_undefined_reason(y, "eval split"), "log_loss": log_loss_undefined_reason(y, "eval split")})


def _ranked(y: np.ndarray) -> bool:
    return len(y) > 0 and 0 < float(np.sum(y)) < len(y)


def _choose(candidates: List[Dict[str, Any]], holdout_rows: int) -> Tuple[int, str]:
    """The index of the candidate kept and why: the best held-out AUC (the smaller L2 on a tie);
    without a rankable slice the middle candidate."""
    scored = [(c["holdout_auc"], -k) for k, c in enumerate(candidates) if c["holdout_auc"] is not None]
    if not scored:
        k = (len(candidates) - 1) // 2
        return k, (f"the middle candidate: the held-out slice ({holdout_rows:,} rows) cannot rank "
                   "(no rows or one label only)")
    k = -max(scored)[1]
    return k, f"the best AUC on the held-out slice of the train split ({holdout_rows:,} rows)"


def _fit_baseline(cfg: PipelineConfig, model: LinearBaseline, opt, variables, manifest: VocabularyManifest,
                  train_files, length: Dict[str, Any], fraction: float) -> List[float]:
    """Trains the candidates for `length["steps"]` steps on the train split less its held-out
    slice; returns each chunk's mean loss (summed over the candidates)."""

    def step(features, label):
        with tf.GradientTape() as tape:
            logits, penalty = model.logits_and_penalty(features)
            n = tf.cast(tf.shape(logits)[0], tf.float32)
            labels = tf.broadcast_to(label, tf.shape(logits))
            loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)) / n
            loss += tf.reduce_sum(penalty) / n
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

    train = make_dataset(train_files, manifest, length["batch_size"], training=True, seed=cfg.training.seed,
                         shuffle_rows=max(cfg.training.shuffle_buffer_rows, 16 * length["batch_size"]),
                         part="train", holdout_fraction=fraction)
    iterator = iter(train)
    _start_from_batches(model, iterator, min(STANDARDIZE_BATCHES, length["steps"]))
    # The optimizer's slots and step created here, not in the first chunk: a tf.function that
    # creates variables is traced again for its later calls (two traces of the step, not one).
    # Private, as RankingModel.create_optimizer_slots: legacy Keras optimizers have no public way.
    opt._create_all_weights(variables)  # pylint: disable=protected-access
    losses, done = [], 0
    while done < length["steps"]:
        k = min(CHUNK, length["steps"] - done)
        losses.append(float(run(iterator, tf.constant(k))))
        done += k
    return losses


def _start_from_batches(model: LinearBaseline, iterator, batches: int) -> None:
    """Sets the dense standardization (mean and std of the dense input) and the bias (the label's
    log-odds) from the next `batches` training batches, which are read for this only."""
    dense, labels = [], []
    for _ in range(batches):
        features, label = next(iterator)
        if model.dense_names:
            dense.append(dense_input(features, model.dense_names).numpy())
        labels.append(label.numpy().ravel())
    if dense:
        z = np.concatenate(dense)
        std = z.std(0)
        model.dense_mean.assign(z.mean(0).astype(np.float32))
        model.dense_scale.assign(np.where(std > 1e-6, std, 1.0).astype(np.float32))
    if labels:
        rate = float(np.clip(np.concatenate(labels).mean(), 1e-4, 1 - 1e-4))
        model.bias.assign(np.full(model.bias.shape, math.log(rate / (1 - rate)), np.float32))


def _score(model: LinearBaseline, dataset) -> Tuple[np.ndarray, np.ndarray]:
    """(probabilities [examples, K], labels [examples]) of a dataset of (features, label).

    Traced once for the dataset's element spec (its batch dimension unknown), which the held-out
    slice's and the eval split's datasets share: one trace of the logits per run, whatever the
    batches' sizes (on small data the traces are most of the baseline's time)."""
    scores, labels = [], []
    score = model.probabilities.get_concrete_function(dataset.element_spec[0])
    for f, y in dataset:
        scores.append(score(f).numpy())
        labels.append(y.numpy())
    if not scores:  # an empty split: its metrics are undefined (train_baseline says so)
        return np.zeros((0, int(model.bias.shape[0])), np.float32), np.zeros(0, np.float32)
    return np.concatenate(scores), np.concatenate(labels).ravel()
