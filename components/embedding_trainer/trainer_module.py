"""`run_fn` for TFX's standard Trainer (referenced as `components.embedding_trainer.trainer_module.run_fn`).

What it leaves in the Model artifact (the exporter needs nothing else):
- `Format-Serving/`: the trained model as a SavedModel whose `serving_default` takes serialized
  *transformed* tf.Examples (embedding IDs) and returns the click probability;
- `checkpoints/`: the final training checkpoint (model weights and optimizer slots);
- `embedding_manifest.json`: the preprocessing manifest (tables, vocabulary location);
- `eval_metrics.json`: exact AUC and log loss on the whole eval split.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict

import components  # noqa: F401
import numpy as np
import tensorflow as tf
from absl import logging

from components.config import PipelineConfig, config_from_json
from components.embedding_preprocess.run import EMBEDDING_MANIFEST_FILE, read_json
from components.embedding_trainer.input import make_dataset, parse_batch
from components.embedding_trainer.model import RankingModel, keras_optimizer
from components.metrics import log_loss, roc_auc

CONFIG_KEY = "config_json"
CHECKPOINT_DIR = "checkpoints"
EVAL_METRICS_FILE = "eval_metrics.json"


def read_manifest_for(train_files) -> Dict[str, Any]:
    """The manifest preprocessing wrote beside the transformed examples (<uri>/Split-train/*)."""
    root = os.path.dirname(os.path.dirname(train_files[0]))
    return read_json(os.path.join(root, EMBEDDING_MANIFEST_FILE))


def distribution_strategy(cfg: PipelineConfig) -> tf.distribute.Strategy:
    if cfg.training.tpu:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=cfg.training.tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    if len(tf.config.list_logical_devices("GPU")) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


def build_model(manifest: Dict[str, Any], cfg: PipelineConfig, for_training: bool) -> RankingModel:
    t = cfg.training
    if for_training:
        return RankingModel(manifest, t, keras_optimizer(t.embedding_optimizer), keras_optimizer(t.dense_optimizer))
    return RankingModel(manifest, t)


def transformed_serving_function(model: RankingModel, manifest: Dict[str, Any]):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve(examples):
        features, _ = parse_batch(examples, manifest)
        return {"probabilities": model(features)}

    return serve


def evaluate(model: RankingModel, dataset: tf.data.Dataset) -> Dict[str, float]:
    probs, labels = [], []
    for features, label in dataset:
        probs.append(model(features).numpy())
        labels.append(label.numpy())
    p, y = np.concatenate(probs).ravel(), np.concatenate(labels).ravel()
    return {"auc": roc_auc(p, y), "log_loss": log_loss(p, y), "examples": int(len(y)), "positive_rate": float(y.mean())}


def run_fn(fn_args) -> None:
    cfg = config_from_json(fn_args.custom_config[CONFIG_KEY])
    manifest = read_manifest_for(fn_args.train_files)
    tf.keras.utils.set_random_seed(cfg.training.seed)
    model_root = os.path.dirname(fn_args.serving_model_dir.rstrip("/"))
    strategy = distribution_strategy(cfg)
    batch = cfg.training.batch_size
    train_ds = make_dataset(fn_args.train_files, manifest, batch, training=True, seed=cfg.training.seed)
    eval_ds = make_dataset(fn_args.eval_files, manifest, batch, training=False)
    if isinstance(strategy, tf.distribute.TPUStrategy):
        # Sparse features must stay on the host for the TPU embedding enqueue.
        options = tf.distribute.InputOptions(experimental_fetch_to_device=False)
        train_ds = strategy.experimental_distribute_dataset(train_ds, options)
    with strategy.scope():
        model = build_model(manifest, cfg, for_training=True)
        model.compile(optimizer=model.dense_optimizer, loss=tf.keras.losses.BinaryCrossentropy())
    steps = fn_args.train_steps or cfg.training.train_steps
    model.fit(
        train_ds,
        epochs=1,
        steps_per_epoch=steps,
        callbacks=[tf.keras.callbacks.TensorBoard(log_dir=fn_args.model_run_dir)],
        verbose=2,
    )
    ckpt = tf.train.Checkpoint(model=model, step=tf.Variable(steps, dtype=tf.int64))
    manager = tf.train.CheckpointManager(ckpt, os.path.join(model_root, CHECKPOINT_DIR), max_to_keep=1)
    manager.save(checkpoint_number=steps)
    metrics = evaluate(model, eval_ds)
    logging.info("eval metrics: %s", metrics)
    tf.saved_model.save(
        model,
        fn_args.serving_model_dir,
        signatures={"serving_default": transformed_serving_function(model, manifest)},
    )
    for name, obj in ((EMBEDDING_MANIFEST_FILE, manifest), (EVAL_METRICS_FILE, metrics)):
        with tf.io.gfile.GFile(os.path.join(model_root, name), "w") as fh:
            fh.write(json.dumps(obj, indent=2, sort_keys=True))
