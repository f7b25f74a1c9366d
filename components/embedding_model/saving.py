"""Saving a serving module as a SavedModel: the Trainer's (transformed examples) and the exporter's
(raw feature values) are saved the same way."""
from __future__ import annotations

import contextlib

import components  # noqa: F401
import tensorflow as tf


def save_serving_model(module: tf.Module, path: str) -> None:
    """tf.saved_model.save without Keras' per-layer call traces (`save_traces=False`, what
    `model.save(save_traces=False)` does): the serving signatures are the module's own functions,
    and tracing every Keras layer again took most of the export time (52 s of 110 s on the demo).
    The scope is tf-keras' own (private) switch; without it the save is only slower."""
    try:
        from tf_keras.src.saving.legacy.saved_model.utils import keras_option_scope

        scope = keras_option_scope(save_traces=False, in_tf_saved_model_scope=True)
    except ImportError:  # another tf-keras layout: same result, slower
        scope = contextlib.nullcontext()
    with scope:
        tf.saved_model.save(module, path, signatures=module.signatures())
