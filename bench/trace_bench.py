"""Graph-building (tracing) benchmark: what the trainer and the exporter pay before any example runs.

    .venv/bin/python bench/trace_bench.py [--rows 3000] [--repeats 3]

Every training traces the model's step (the TPU-rules check, fit's train function, evaluation, the
trainer's SavedModel signature) and every export traces the serving model's two signatures. On the
2-core machine these traces, not the arithmetic, were most of a small training and of an export.
Two side-by-side comparisons on the demo config (26 categorical features, 13 dense) over generated
data preprocessed by our Beam code (in-process DirectRunner; trainer_bench.prepare, the data cached
under data/bench):

- step: the first trace of the forward + backward step of `RankingModel` as shipped (its `call`
  and `train_step` are `tf.autograph.experimental.do_not_convert`) vs the baseline, the same model
  with AutoGraph converting its `call`, `train_step` and every subclassed layer's (what tf-keras
  does by default). AutoGraph caches conversions per process, so each contender runs in a fresh
  child process, alternating, `--repeats` times; each child also reports its second trace (a new
  tf.function: conversions cached) and then a whole 30-step training (`training_loop.train`:
  the TPU-rules check, fit, checkpoints) on the same data.
- serving: tracing the exporter's `serving_default` transform (parse, tokens, IDs) as shipped
  (components/embedding_exporter/serving.py: RaggedFeature parsing, per-feature work only where a
  feature's own column, separator and table matter, the rest fused over all features, issue 17)
  vs two baselines: the feature-by-feature transform it replaced (serving_reference.py, ragged
  values handled on their row splits) and that transform with TensorFlow's general ragged ops
  (`VarLenFeature` + `RaggedTensor.from_sparse`, `tf.ragged.boolean_mask`,
  `tf.strings.split(...).merge_dims`, ragged slicing, `to_tensor`), alternating in one process, a
  fresh tf.function each time. All three run on the same 256 eval rows and must give identical
  model inputs (checked; the bench fails otherwise).

Results go to bench/results/trace.json and print as a markdown table. Targets (baseline / ours):
training >= 2, serving transform >= 2.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics as st
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
RESULTS = os.path.join(REPO, "bench", "results")
TRAIN_STEPS = 30


def _model_and_batch(workdir: str):
    from components.config.loading import config_from_json
    from components.embedding_model.tf_objects import dense_id_widths
    from components.planning.run_plan import derive_plan
    from components.embedding_trainer import resolved_input
    from tests.stages import examples_uri
    from components.embedding_model.input import make_dataset

    with open(os.path.join(workdir, "config.json")) as fh:
        cfg = config_from_json(fh.read())
    files = [os.path.join(workdir, "tx", "Split-train", "*")]
    manifest = resolved_input.read_manifest(examples_uri(files))
    plan = derive_plan(cfg, manifest, resolved_input.read_statistics(examples_uri(files)))
    batch = next(iter(make_dataset(files, manifest, 64, training=True, seed=1, dense_id_widths=dense_id_widths(plan))))
    return cfg, plan, manifest, batch


def child_step(workdir: str, autograph: bool) -> None:
    """One contender of `step` and `train` in this (fresh) process: prints {"first": s,
    "second": s, "train": s}."""
    import components  # noqa: F401
    import tensorflow as tf

    from components.embedding_model import model as model_lib
    from components.embedding_trainer import model_building, training_loop

    if autograph:  # the baseline: tf-keras' default, `call` and `train_step` converted (and the layers called)
        model_lib.RankingModel.call = model_lib.RankingModel.call.__wrapped__
        model_lib.RankingModel.train_step = model_lib.RankingModel.train_step.__wrapped__
    cfg, plan, manifest, (x, y) = _model_and_batch(workdir)
    model = model_building.build_model(plan, manifest, cfg, for_training=False)
    model(x)  # variables built eagerly, as the trainer's check does

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(y, model(x, training=True)))
        return tape.gradient(loss, model.trainable_variables)

    out = {}
    for name in ("first", "second"):
        start = time.perf_counter()
        tf.function(step).get_concrete_function(x, y)
        out[name] = time.perf_counter() - start
    # A whole small training in the same process (conversions of `call` cached by the traces
    # above): the TPU-rules check, fit's train function for TRAIN_STEPS steps, checkpoints.
    files = [os.path.join(workdir, "tx", "Split-train", "*")]
    start = time.perf_counter()
    training_loop.train(cfg, plan, manifest, files, files, tempfile.mkdtemp(), train_steps=TRAIN_STEPS)
    out["train"] = time.perf_counter() - start
    print(json.dumps(out))


class LibraryOps:
    """The feature-by-feature serving transform's ragged handling with TensorFlow's general ops
    (the first baseline)."""

    def __enter__(self):
        import tensorflow as tf

        from components.embedding_exporter import serving_reference
        from components.embedding_exporter.serving import _DTYPES

        self.saved = {k: getattr(serving_reference, k) for k in ("keep_values", "_split", "_first_n", "first_or_nan")}
        self.saved_spec = serving_reference.FeatureByFeatureTransform.example_spec
        self.saved_from_examples = serving_reference.FeatureByFeatureTransform.from_examples
        serving_reference.keep_values = lambda values, mask: tf.ragged.boolean_mask(values, values.with_flat_values(mask))
        serving_reference._split = lambda values, sep: tf.strings.split(values, sep).merge_dims(1, 2)
        serving_reference._first_n = lambda values, n: values[:, :n]
        serving_reference.first_or_nan = lambda values: tf.cast(values[:, :1], tf.float32).to_tensor(
            default_value=float("nan"), shape=[None, 1])
        serving_reference.FeatureByFeatureTransform.example_spec = lambda self: {
            c: tf.io.VarLenFeature(_DTYPES[self.kinds[c]]) for c in self.raw_columns()}
        serving_reference.FeatureByFeatureTransform.from_examples = lambda self, serialized: self._to_model_inputs({
            c: tf.RaggedTensor.from_sparse(t) for c, t in tf.io.parse_example(serialized, self.example_spec()).items()})
        return self

    def __exit__(self, *exc):
        from components.embedding_exporter import serving_reference

        for k, v in self.saved.items():
            setattr(serving_reference, k, v)
        serving_reference.FeatureByFeatureTransform.example_spec = self.saved_spec
        serving_reference.FeatureByFeatureTransform.from_examples = self.saved_from_examples


def serving(workdir: str, data: str, repeats: int):
    import contextlib

    import components  # noqa: F401
    import numpy as np
    import tensorflow as tf

    from components.embedding_exporter.serving import RawFeatureTransform
    from components.embedding_exporter.serving_reference import FeatureByFeatureTransform

    _, _, manifest, _ = _model_and_batch(workdir)
    transforms = {
        "ours": RawFeatureTransform(manifest, manifest.vocabulary_dir),
        "feature_by_feature": FeatureByFeatureTransform(manifest, manifest.vocabulary_dir),
    }
    transforms["library_ops"] = transforms["feature_by_feature"]
    rows = _raw_examples(transforms["ours"].kinds, data, 256)

    def trace_and_run(transform):
        fn = tf.function(transform.from_examples, input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
        start = time.perf_counter()
        concrete = fn.get_concrete_function()
        seconds = time.perf_counter() - start
        ops = len(concrete.graph.get_operations())
        return seconds, ops, fn(tf.constant(rows))

    times = {name: [] for name in transforms}
    ops, outputs = {}, {}
    for _ in range(repeats):
        for name, transform in transforms.items():
            with LibraryOps() if name == "library_ops" else contextlib.nullcontext():
                seconds, ops[name], outputs[name] = trace_and_run(transform)
            times[name].append(seconds)
    for baseline in ("feature_by_feature", "library_ops"):
        for k, a in outputs["ours"].items():  # same model inputs, value for value
            b = outputs[baseline][k]
            if isinstance(a, tf.SparseTensor):
                same = all(np.array_equal(x.numpy(), y.numpy()) for x, y in
                           ((a.indices, b.indices), (a.values, b.values), (a.dense_shape, b.dense_shape)))
            else:
                same = np.array_equal(a.numpy(), b.numpy(), equal_nan=True)
            if not same:
                raise SystemExit(f"serving transforms differ on feature {k!r} ({baseline})")
    return times, ops


def _raw_examples(kinds, data: str, n: int):
    """The first `n` CSV rows as tf.Examples typed as preprocessing saw them (the manifest's raw
    kinds: bytes, int, float), missing cells left out, serialized."""
    import csv

    import tensorflow as tf

    from components.rules import rulebook

    with open(data, newline="", encoding="utf-8") as fh:
        rows = [r for _, r in zip(range(n), csv.DictReader(fh))]
    out = []
    for r in rows:
        f = {}
        for c, kind in kinds.items():
            v = r.get(c, "")
            if v == "":
                continue
            if kind == rulebook.KIND_INT:
                f[c] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v)]))
            elif kind == rulebook.KIND_FLOAT:
                f[c] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(v)]))
            else:
                f[c] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode()]))
        out.append(tf.train.Example(features=tf.train.Features(feature=f)).SerializeToString())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child-step", choices=["ours", "autograph"], help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_step:
        child_step(args.workdir, args.child_step == "autograph")
        return 0
    from trainer_bench import prepare  # the same generated data and in-process preprocessing

    workdir = tempfile.mkdtemp(prefix="trace_bench_")
    cfg, _ = prepare(args.rows, workdir, training={})  # the demo config as it is
    data = cfg.input.path
    with open(os.path.join(workdir, "config.json"), "w") as fh:  # what the child processes read
        fh.write(cfg.to_json())

    step = {"ours": [], "autograph": []}
    for _ in range(args.repeats):
        for name in ("ours", "autograph"):
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child-step", name, "--workdir", workdir],
                                 check=True, capture_output=True, text=True).stdout
            step[name].append(json.loads(out.strip().splitlines()[-1]))
    serve_times, serve_ops = serving(workdir, data, args.repeats)

    def med(xs):
        return round(st.median(xs), 2)

    result = {
        "rows": args.rows, "repeats": args.repeats,
        "step_first_trace_s": {k: [round(r["first"], 2) for r in v] for k, v in step.items()},
        "step_second_trace_s": {k: [round(r["second"], 2) for r in v] for k, v in step.items()},
        "train_s": {k: [round(r["train"], 2) for r in v] for k, v in step.items()},
        "serving_trace_s": {k: [round(x, 2) for x in v] for k, v in serve_times.items()},
        "serving_graph_ops": serve_ops,
    }

    def ratio(times, baseline, ours):
        return round(st.median(times[baseline]) / st.median(times[ours]), 2)

    first, second, train = result["step_first_trace_s"], result["step_second_trace_s"], result["train_s"]
    result["step_ratio_first"] = ratio(first, "autograph", "ours")
    result["serving_ratio"] = ratio(serve_times, "library_ops", "ours")
    result["serving_ratio_vs_feature_by_feature"] = ratio(serve_times, "feature_by_feature", "ours")
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "trace.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    print("| trace | ours (median s) | baseline (median s) | baseline / ours |")
    print("| --- | --- | --- | --- |")
    for label, times in (("model step, first in a process", first), ("model step, second", second),
                         (f"training, {TRAIN_STEPS} steps of 64 (after the traces above)", train)):
        print(f"| {label} | {med(times['ours'])} | {med(times['autograph'])} (AutoGraph) | {ratio(times, 'autograph', 'ours')} |")
    for baseline, label in (("library_ops", "feature by feature, library ragged ops"),
                            ("feature_by_feature", "feature by feature, row splits")):
        print(f"| serving_default transform | {med(serve_times['ours'])} ({serve_ops['ours']} ops) | "
              f"{med(serve_times[baseline])} ({serve_ops[baseline]} ops, {label}) | {ratio(serve_times, baseline, 'ours')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
