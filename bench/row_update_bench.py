"""Sparse embedding updates on CPU: Keras' own fused kernels (what the CPU/GPU Trainer runs) against
the row rules of components/embedding_model/xla_updates.py (what an XLA computation runs), both in
an uncompiled tf.function, side by side in one process: why the CPU/GPU Trainer keeps Keras' path.
(Compiled with XLA's CPU backend, every contender runs at about 1/50 of its speed here, the
scatter into a 200k-row variable copying it: that measures XLA's CPU backend, not a TPU, so it is
not a contender.)

    .venv/bin/python bench/row_update_bench.py [--rows 200000] [--dim 16] [--ids 6656] [--steps 200] [--repeats 5]

One table of `rows` x `dim`, `ids` looked-up rows a step drawn Zipf-like (repeats, as a batch of
256 examples x 26 features gives), each optimizer's `apply_gradients` in a tf.function,
contenders alternated `--repeats` times; reports the best repeat's steps/s and the ratio row rule /
Keras fused per optimizer. The row rule is forced outside XLA (`xla_updates.in_xla_context`
patched), as it would run if the Trainer used it everywhere. Prints a markdown table and writes
bench/results/row_updates.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from components.embedding_model import optimizers, xla_updates  # noqa: E402

legacy = tf.keras.optimizers.legacy
_IN_XLA = xla_updates.in_xla_context
CONTENDERS = {
    "adagrad": (lambda: legacy.Adagrad(0.1), lambda: xla_updates.Adagrad(0.1)),
    "ftrl": (lambda: legacy.Ftrl(0.1, l2_regularization_strength=0.01), lambda: xla_updates.Ftrl(0.1, l2_regularization_strength=0.01)),
    "adam (not lazy)": (lambda: legacy.Adam(0.01), lambda: xla_updates.Adam(0.01)),
    "sgd": (lambda: legacy.SGD(0.1), lambda: legacy.SGD(0.1)),
}


def steps_per_second(make, rows, dim, ids, steps, jit, seed=0, force_rows=False):
    xla_updates.in_xla_context = (lambda: True) if force_rows else _IN_XLA
    rng = np.random.default_rng(seed)
    var = tf.Variable(rng.normal(size=(rows, dim)).astype(np.float32))
    opt = make()
    idx = tf.constant(np.minimum(rng.zipf(1.2, size=(steps, ids)) - 1, rows - 1).astype(np.int64))
    vals = tf.constant(rng.normal(size=(ids, dim)).astype(np.float32))

    @tf.function(jit_compile=jit)
    def step(i):
        opt.apply_gradients([(tf.IndexedSlices(vals, idx[i], tf.constant([rows, dim], tf.int64)), var)])

    for i in range(5):  # trace and warm up
        step(tf.constant(i))
    start = time.perf_counter()
    for i in range(steps):
        step(tf.constant(i))
    return steps / (time.perf_counter() - start)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--ids", type=int, default=256 * 26)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    out = {"args": vars(a), "results": {}}
    print("| optimizer | Keras fused, steps/s | row rule, steps/s | ratio |\n|---|---|---|---|")
    for name, (keras, ours) in CONTENDERS.items():
        k, o = [], []
        for _ in range(a.repeats):
            k.append(steps_per_second(keras, a.rows, a.dim, a.ids, a.steps, jit=False))
            o.append(steps_per_second(ours, a.rows, a.dim, a.ids, a.steps, jit=False, force_rows=True))
        out["results"][name] = {"keras": k, "ours": o, "ratio_best": max(o) / max(k)}
        print(f"| {name} | {max(k):,.0f} | {max(o):,.0f} | {max(o) / max(k):.2f} |")
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    with open(os.path.join(os.path.dirname(__file__), "results", "row_updates.json"), "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
