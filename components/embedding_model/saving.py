"""Saving a serving module as a SavedModel: the Trainer's (transformed examples) and the exporter's
(raw feature values) are saved the same way."""
from __future__ import annotations

import contextlib

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf

try:  # tf-keras' own switch, in a private module: no public API turns off the per-layer traces
    from tf_keras.src.saving.legacy.saved_model.utils import keras_option_scope
except ImportError:  # another tf-keras layout: the save gives the same SavedModel, more slowly
    keras_option_scope = None


def save_serving_model(module: tf.Module, path: str) -> None:
    """Saves a serving module as a SavedModel, its signatures the module's own.

    tf.saved_model.save without Keras' per-layer call traces (`save_traces=False`, what
    `model.save(save_traces=False)` does): the serving signatures are the module's own functions,
    and tracing every Keras layer again would take most of the export time.

    Args:
      module: a tf.Module with a `signatures()` method returning {name: tf.function}.
      path: the SavedModel directory.
    """
    scope = (keras_option_scope(save_traces=False, in_tf_saved_model_scope=True)
             if keras_option_scope is not None else contextlib.nullcontext())
    with scope:
        tf.saved_model.save(module, path, signatures=module.signatures())
