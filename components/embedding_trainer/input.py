"""tf.data input over the transformed examples written by preprocessing.

Categorical features arrive as int64 SparseTensors of embedding IDs (no string work in the step),
dense features as float32 [batch, 1], the label as float32 [batch, 1]. Training batches have a
static size (`drop_remainder=True`), as TPUs require.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import components  # noqa: F401
import tensorflow as tf


def feature_spec(manifest: Dict[str, Any]) -> Dict[str, Any]:
    spec: Dict[str, Any] = {manifest["label"]: tf.io.FixedLenFeature([1], tf.float32)}
    for d in manifest["dense_features"]:
        spec[d["name"]] = tf.io.FixedLenFeature([1], tf.float32)
    for f in manifest["categorical_features"]:
        spec[f["name"]] = tf.io.VarLenFeature(tf.int64)
    return spec


def parse_batch(serialized: tf.Tensor, manifest: Dict[str, Any]) -> Tuple[Dict[str, Any], tf.Tensor]:
    parsed = tf.io.parse_example(serialized, feature_spec(manifest))
    label = parsed.pop(manifest["label"])
    return parsed, label


def make_dataset(
    file_patterns: List[str],
    manifest: Dict[str, Any],
    batch_size: int,
    training: bool,
    seed: int = 0,
) -> tf.data.Dataset:
    from components.tfrecords import compression_type

    compression = compression_type([f for p in file_patterns for f in tf.io.gfile.glob(p)])
    files = tf.data.Dataset.list_files(file_patterns, shuffle=training, seed=seed)
    ds = tf.data.TFRecordDataset(files, compression_type=compression, num_parallel_reads=tf.data.AUTOTUNE)
    if training:
        ds = ds.shuffle(16 * batch_size, seed=seed, reshuffle_each_iteration=True).repeat()
    ds = ds.batch(batch_size, drop_remainder=training)
    ds = ds.map(lambda s: parse_batch(s, manifest), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)
