"""AutoGraph leaves tf_keras' code and this project's own code unconverted.

AutoGraph rewrites a Python function from its source before tracing it, unless the function's
module matches a `DoNotConvert` rule (`tensorflow/python/autograph/core/config.py`,
CONVERSION_RULES). TF 2.16's list has `keras` but not `tf_keras`, the legacy-Keras package this
project runs on (TF_USE_LEGACY_KERAS=1): so every process re-parses and rewrites Keras' internal
functions (`Layer.__call__`'s helpers, `Model.train_function`, the input-spec checks) the first
time it traces a model, about 2.6 s of a fresh Trainer process on the 2-core machine. tf_keras is
Keras 2.15's code under a new name, written to run unconverted under the `keras` rule, and later
TensorFlow releases add `DoNotConvert("tf_keras")` to the same list.

The project's own functions that tf.data maps and that traced code calls (the input pipelines'
parsing and batching, the serving transforms, the dense tower's input) hold no tensor-dependent
Python control flow: they are written for graph tracing as they stand, as `RankingModel.call` and
`train_step` always were (`do_not_convert`). Converting them re-parsed and rewrote about 170
functions in every process that trains or exports: a fresh 3,000-row pipeline run made 177
conversions in about 3.5 s of its CPU, and makes 9 under this rule (the functions handed to
`tf.function` by name, which AutoGraph converts whatever the rules say), with the same figures to
every digit. Unconverted, Python control flow on a tensor fails at trace time (TensorFlow refuses a
symbolic tensor used as a Python bool) instead of being rewritten, and the suite traces every such
function. Code outside these packages (a user's, the tests') is converted as before.

`skip_conversion()` adds a rule for each of PACKAGES where none is there. input.py and
optimizers.py import this module, and every model (the ranking model's dense tower reads input.py;
the baseline, optimizers.py) imports one of them, so the rules hold before any model or input
pipeline is traced.
"""
from tensorflow.python.autograph.core import config as autograph_config

PACKAGES = ("tf_keras", "components")


def skip_conversion() -> None:
    """Adds AutoGraph's DoNotConvert rule for each of PACKAGES unless a rule for it is there already."""
    rules = tuple(autograph_config.CONVERSION_RULES)
    have = {getattr(r, "_prefix", None) for r in rules}
    autograph_config.CONVERSION_RULES = rules + tuple(autograph_config.DoNotConvert(p) for p in PACKAGES if p not in have)


skip_conversion()
