"""AutoGraph leaves tf_keras' code unconverted once components.embedding_model is imported
(components/embedding_model/keras_autograph.py), and TF 2.16's own rules alone do not: the reason
the rule is added."""
import components.embedding_model  # noqa: F401
import tensorflow as tf
from tensorflow.python.autograph.core import config as autograph_config
from tensorflow.python.autograph.impl import conversion
from tf_keras.src.engine import base_layer, training

from components.embedding_model.keras_autograph import PACKAGE, skip_tf_keras

KERAS_INTERNALS = (base_layer.Layer.__call__, training.Model.train_step, training.Model.make_train_function)


def test_tf_keras_internals_are_not_converted_and_the_stock_rules_would_convert_them():
    assert all(conversion.is_allowlisted(f) for f in KERAS_INTERNALS)
    ours = autograph_config.CONVERSION_RULES
    try:
        autograph_config.CONVERSION_RULES = tuple(r for r in ours if getattr(r, "_prefix", None) != PACKAGE)
        assert not any(conversion.is_allowlisted(f) for f in KERAS_INTERNALS)  # TF 2.16's list alone
    finally:
        autograph_config.CONVERSION_RULES = ours


def test_the_rule_is_added_once_and_project_code_is_still_converted():
    skip_tf_keras()
    skip_tf_keras()
    assert sum(getattr(r, "_prefix", None) == PACKAGE for r in autograph_config.CONVERSION_RULES) == 1

    def branch(x):  # tensor-dependent Python control flow: needs AutoGraph
        if x > 0:
            return x
        return -x

    assert not conversion.is_allowlisted(branch)
    assert float(tf.function(branch)(tf.constant(-2.0))) == 2.0
