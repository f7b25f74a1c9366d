"""The dense network's precision as a Keras dtype policy (`training.precision`, resolved).

`mixed_bfloat16` is Keras' mixed-precision policy: each dense layer keeps its variables in float32
(AutoCastVariables: checkpoints hold float32, so a float32 and a bfloat16 run are
checkpoint-compatible) and computes in bfloat16. bfloat16 has float32's exponent range, so no loss
scaling is needed. The tables and their optimizers stay float32 (TF 2.16's TPU embedding holds
them so); the pooled vectors are cast where they meet the dense network (dense_tower.py), the
last layer (the logit), the wide part, the loss and every metric stay float32.
"""
from __future__ import annotations

from typing import Optional

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf

from components.config.choices import Precision


def dense_policy(precision: str) -> Optional[tf.keras.mixed_precision.Policy]:
    """The dense layers' Keras policy: None for float32 (the global default), Keras' mixed_bfloat16.

    Args:
      precision: `float32` or `mixed_bfloat16` (resolved: not `auto`).

    Raises:
      ValueError: any other value (an unresolved `auto` among them).
    """
    if precision == Precision.FLOAT32:
        return None
    if precision == Precision.MIXED_BFLOAT16:
        return tf.keras.mixed_precision.Policy("mixed_bfloat16")
    raise ValueError(f"precision {precision!r} is not a resolved precision ({Precision.FLOAT32}, "
                     f"{Precision.MIXED_BFLOAT16}); resolve `auto` first (embedding_trainer/precision_choice.py)")
