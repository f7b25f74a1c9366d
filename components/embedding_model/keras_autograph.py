"""AutoGraph leaves tf_keras' own code unconverted, as it leaves `keras`' (TF 2.16 omits tf_keras).

AutoGraph rewrites a Python function from its source before tracing it, unless the function's
module matches a `DoNotConvert` rule (`tensorflow/python/autograph/core/config.py`,
CONVERSION_RULES). TF 2.16's list has `keras` but not `tf_keras`, the legacy-Keras package this
project runs on (TF_USE_LEGACY_KERAS=1): so every process re-parses and rewrites Keras' internal
functions (`Layer.__call__`'s helpers, `Model.train_function`, the input-spec checks) the first
time it traces a model, about 2.6 s of a fresh Trainer process on the 2-core machine. tf_keras is
Keras 2.15's code under a new name, written to run unconverted under the `keras` rule, and later
TensorFlow releases add `DoNotConvert("tf_keras")` to the same list. `skip_tf_keras()` adds that one
rule where it is missing. input.py and optimizers.py import this module, and every model (the
ranking model's dense tower reads input.py; the baseline, optimizers.py) imports one of them, so the
rule holds before any model or input pipeline is traced.
"""
from tensorflow.python.autograph.core import config as autograph_config

PACKAGE = "tf_keras"


def skip_tf_keras() -> None:
    """Adds AutoGraph's DoNotConvert rule for tf_keras unless a rule for it is there already."""
    rules = autograph_config.CONVERSION_RULES
    if any(getattr(r, "_prefix", None) == PACKAGE for r in rules):
        return
    autograph_config.CONVERSION_RULES = tuple(rules) + (autograph_config.DoNotConvert(PACKAGE),)


skip_tf_keras()
