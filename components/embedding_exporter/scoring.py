"""Scoring serialized tf.Examples with a serving signature: the export's checks and the gate's.

A leaf module: `export.py` (parity, AUC of each variant) and `gate.py` (the last blessed model's
AUC) both score through it.
"""
from __future__ import annotations

from typing import Callable, List

import numpy as np
import tensorflow as tf

SCORE_BATCH = 1024


def score(fn: Callable[..., dict], serialized: List[bytes], batch: int = SCORE_BATCH) -> np.ndarray:
    """Click probabilities of serialized tf.Examples, scored `batch` at a time.

    Args:
      fn: a `serving_default`-style signature: takes `examples` (a string tensor of shape [n]) and
        returns {"probabilities": float32 [n, 1]}.
      serialized: the tf.Examples, one per row.
      batch: how many examples go into one call of `fn`.

    Returns:
      float32 probabilities of shape [len(serialized)], in the order of `serialized`.
    """
    out = [fn(examples=tf.constant(serialized[i: i + batch]))["probabilities"].numpy().ravel()
           for i in range(0, len(serialized), batch)]
    return np.concatenate(out) if out else np.zeros([0], np.float32)
