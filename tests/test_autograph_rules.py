"""AutoGraph leaves tf_keras' code and the project's own unconverted once components.embedding_model
is imported (components/embedding_model/autograph_rules.py), TF 2.16's own rules alone do not (the
reason the rules are added), and code outside those packages is converted as before."""
import pytest

import components.embedding_model  # noqa: F401
import tensorflow as tf
from tensorflow.python.autograph.core import config as autograph_config
from tensorflow.python.autograph.impl import api, conversion
from tf_keras.src.engine import base_layer, training

from components.embedding_model import input as input_lib
from components.embedding_model.autograph_rules import PACKAGES, skip_conversion
from components.embedding_trainer import evaluation

KERAS_INTERNALS = (base_layer.Layer.__call__, training.Model.train_step, training.Model.make_train_function)
PROJECT = (input_lib.parse_batch, input_lib.model_inputs, evaluation.compiled_scorer)


def test_tf_keras_internals_and_project_code_are_not_converted_and_the_stock_rules_would_convert_them():
    assert all(conversion.is_allowlisted(f) for f in KERAS_INTERNALS + PROJECT)
    ours = autograph_config.CONVERSION_RULES
    try:
        autograph_config.CONVERSION_RULES = tuple(r for r in ours if getattr(r, "_prefix", None) not in PACKAGES)
        assert not any(conversion.is_allowlisted(f) for f in KERAS_INTERNALS + PROJECT)  # TF 2.16's list alone
    finally:
        autograph_config.CONVERSION_RULES = ours


def test_the_rules_are_added_once_and_other_code_is_still_converted():
    skip_conversion()
    skip_conversion()
    prefixes = [getattr(r, "_prefix", None) for r in autograph_config.CONVERSION_RULES]
    assert all(prefixes.count(p) == 1 for p in PACKAGES)

    def branch(x):  # tensor-dependent Python control flow: needs AutoGraph
        if x > 0:
            return x
        return -x

    assert not conversion.is_allowlisted(branch)
    assert float(tf.function(branch)(tf.constant(-2.0))) == 2.0


def test_a_project_function_is_traced_unconverted_and_tensor_control_flow_in_it_fails_loudly(monkeypatch):
    """A function of the project's modules, mapped over a dataset as the input pipelines map theirs,
    is traced as written (AutoGraph's transpiler never sees it): a tensor used as a Python bool
    there is refused at trace time, not rewritten."""
    seen = []
    transform = api._TRANSPILER.transform
    monkeypatch.setattr(api._TRANSPILER, "transform", lambda f, ctx: seen.append(f) or transform(f, ctx))

    def branch(x):
        if x > 0:
            return x
        return -x

    monkeypatch.setattr(branch, "__module__", "components.embedding_model.input")
    with pytest.raises(TypeError, match="bool"):
        tf.data.Dataset.from_tensors(-2.0).map(branch)
    assert branch not in seen

    def outside(x):  # the same function outside the project: converted, as before
        if x > 0:
            return x
        return -x

    assert list(tf.data.Dataset.from_tensors(-2.0).map(outside).as_numpy_iterator()) == [2.0]
    assert outside in seen
