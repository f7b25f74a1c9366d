"""Serving transform benchmark: raw tf.Examples -> model inputs, for integer ID columns.

    .venv/bin/python bench/transform_bench.py [--features 26] [--vocabulary 20000] [--calls 200]

Issue 17's direction "integer columns looked up as integers": a config whose categorical columns
are int64 IDs (as MovieLens' user and item IDs are), 30% of the values unseen, each column's
vocabulary the decimal texts preprocessing writes. Three transforms of the same manifest, and the
shipped one's JSON entry point, called alternately in one process (one tf.function each, the
transform and a sum over all its outputs, as a model reads them; p50 of `--calls` calls per batch
size):

- fused, int64 tables (shipped): `serving.RawFeatureTransform`, integer tables keyed by value;
- fused, string tables: the same with `integer_tables=False` (every value turned into its decimal
  text, then looked up by string);
- feature by feature: `serving_reference.FeatureByFeatureTransform`, the transform before issue 17;
- the JSON entry point of the shipped transform on the same rows: IDs as int64 numbers (what
  `serve_typed_features` takes) and as decimal texts (what `serve_features` takes).

All of them must give identical model inputs on every batch (checked; the bench fails otherwise).
Results go to bench/results/transform.json and print as a markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
RESULTS = os.path.join(REPO, "bench", "results")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--features", type=int, default=26)
    ap.add_argument("--vocabulary", type=int, default=20000)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()

    import numpy as np

    import components  # noqa: F401
    import tensorflow as tf

    from components.rules import rulebook
    from components.config.loading import parse_config
    from components.embedding_exporter.serving import RawFeatureTransform
    from components.embedding_exporter.serving_reference import FeatureByFeatureTransform
    from components.embedding_preprocess import vocabulary
    from components.embedding_preprocess.run import build_manifest

    rng = random.Random(0)
    work = tempfile.mkdtemp(prefix="transform_bench_")
    names = [f"id{i}" for i in range(args.features)]
    cfg = parse_config({"input": {"path": "unused.csv"}, "label": "label",
                        "dense_features": [{"name": "d0"}],
                        "categorical_features": [{"name": n} for n in names]})
    vocab_dir = os.path.join(work, "vocab")
    seen = {}
    for n in names:
        seen[n] = rng.sample(range(10**9), args.vocabulary)
        vocabulary.write_vocabulary(vocab_dir, n, [(str(v).encode(), 1) for v in seen[n]])
    kinds = {n: rulebook.KIND_INT for n in names}
    kinds["d0"] = rulebook.KIND_FLOAT
    manifest = build_manifest(cfg, {f"kind/{c}/{k}": 1 for c, k in kinds.items()}, vocab_dir)

    def example():
        feats = {"d0": tf.train.Feature(float_list=tf.train.FloatList(value=[rng.random()]))}
        for n in names:
            v = rng.choice(seen[n]) if rng.random() < 0.7 else rng.randrange(10**9, 2 * 10**9)
            feats[n] = tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))
        return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()

    rows = [example() for _ in range(1024)]
    parsed = [tf.train.Example.FromString(r).features.feature for r in rows]
    # The JSON signatures' inputs for the same rows: each ID as a number (serve_typed_features)
    # and as its decimal text (serve_features); the dense value as float32.
    numbers = {n: np.array([f[n].int64_list.value[0] for f in parsed], np.int64) for n in names}
    numbers["d0"] = np.array([f["d0"].float_list.value[0] for f in parsed], np.float32)
    texts = {n: np.array([str(v).encode() for v in numbers[n]], object) for n in names}
    texts["d0"] = numbers["d0"]
    transforms = {
        "fused, int64 tables": RawFeatureTransform(manifest, vocab_dir),
        "fused, string tables": RawFeatureTransform(manifest, vocab_dir, integer_tables=False),
        "feature by feature": FeatureByFeatureTransform(manifest, vocab_dir),
    }
    assert transforms["fused, int64 tables"].integer_tables == set(names)
    spec = [tf.TensorSpec([None], tf.string)]
    fns = {k: tf.function(t.from_examples, input_signature=spec, autograph=False) for k, t in transforms.items()}

    def consumed(transform, entry="from_examples", input_spec=None):
        """The transform and one scalar that reads every output, as a model would: a tf.function
        returning 27 tensors and SparseTensors spends milliseconds packing them in Python."""

        def fn(x):
            total = []
            for v in getattr(transform, entry)(x).values():
                if isinstance(v, tf.SparseTensor):
                    total += [tf.reduce_sum(v.values), tf.reduce_sum(v.indices), tf.reduce_sum(v.dense_shape)]
                else:
                    total.append(tf.cast(tf.reduce_sum(v), tf.int64))
            return tf.add_n(total)

        return tf.function(fn, input_signature=input_spec or spec, autograph=False)

    timed = {k: consumed(t) for k, t in transforms.items()}
    shipped = transforms["fused, int64 tables"]
    json_spec = lambda dtype: [{**{n: tf.TensorSpec([None], dtype) for n in names}, "d0": tf.TensorSpec([None], tf.float32)}]
    timed["JSON numbers (serve_typed_features)"] = consumed(shipped, "from_feature_tensors", json_spec(tf.int64))
    timed["JSON texts (serve_features)"] = consumed(shipped, "from_feature_tensors", json_spec(tf.string))
    json_inputs = {"JSON numbers (serve_typed_features)": numbers, "JSON texts (serve_features)": texts}
    table = []
    for batch in (1, 64, 1024):
        x = tf.constant(rows[:batch])
        inputs = {k: x for k in timed}
        inputs.update({k: {c: tf.constant(v[:batch]) for c, v in cols.items()} for k, cols in json_inputs.items()})
        outs = {k: f(x) for k, f in fns.items()}
        for k, cols in json_inputs.items():  # the JSON entry point gives the tf.Example inputs too
            outs[k] = shipped.from_feature_tensors(inputs[k])
        for k, out in outs.items():  # identical model inputs
            for name, want in outs["feature by feature"].items():
                got = out[name]
                parts = (("indices", "values", "dense_shape") if isinstance(want, tf.SparseTensor) else ())
                same = (all(np.array_equal(getattr(got, p).numpy(), getattr(want, p).numpy()) for p in parts)
                        if parts else np.array_equal(got.numpy(), want.numpy()))
                if not same:
                    raise SystemExit(f"{k}: feature {name} differs at batch {batch}")
        for k, f in timed.items():
            for _ in range(10):
                f(inputs[k])
        times = {k: [] for k in timed}
        calls = args.calls if batch < 1024 else max(args.calls // 5, 20)
        for _ in range(calls):
            for k, f in timed.items():
                t = time.perf_counter()
                f(inputs[k])
                times[k].append((time.perf_counter() - t) * 1e3)
        base = float(np.median(times["fused, int64 tables"]))
        for k, ts in times.items():
            table.append({"batch": batch, "transform": k, "p50_ms": round(float(np.median(ts)), 3),
                          "vs_shipped": round(float(np.median(ts)) / base, 2)})
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "transform.json"), "w") as fh:
        json.dump({"features": args.features, "vocabulary": args.vocabulary, "rows": table}, fh, indent=1)
    print("| batch | transform | p50 ms | / fused with int64 tables |")
    print("| --- | --- | --- | --- |")
    for r in table:
        print(f"| {r['batch']} | {r['transform']} | {r['p50_ms']} | {r['vs_shipped']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
