"""Copying a training checkpoint into a directory of its own.

A leaf of the trainer: the Model artifact's final checkpoint (trainer_module) and the best
checkpoint kept by the held-out selection (selection) are both copied with `copy_checkpoint`.
"""
from __future__ import annotations

import os

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf


def copy_checkpoint(checkpoint_path: str, directory: str) -> str:
    """Copies one checkpoint (its index and data files) into `directory`, with a `checkpoint` state file.

    The state file makes `tf.train.latest_checkpoint(directory)` find the copy.

    Args:
      checkpoint_path: the checkpoint's prefix (`.../ckpt-<step>`), on any filesystem tf.io.gfile reads.
      directory: where the copy goes; created if missing; files of the same name are overwritten.

    Returns:
      The copy's prefix: `directory` joined with the checkpoint's base name.
    """
    tf.io.gfile.makedirs(directory)
    base = os.path.basename(checkpoint_path)
    for src in tf.io.gfile.glob(checkpoint_path + ".*"):
        tf.io.gfile.copy(src, os.path.join(directory, os.path.basename(src)), overwrite=True)
    # Relative to the directory (as CheckpointManager writes it), so the artifact can be copied or moved.
    tf.compat.v1.train.update_checkpoint_state(directory, base, all_model_checkpoint_paths=[base])
    return os.path.join(directory, base)
