"""Where the serving model's CPU time goes at batch 1024, on one thread (issue 17).

    .venv/bin/python bench/serving_cpu.py [--batch 1024] [--rounds 150] [--threads 1]   # after `make demo`

`export_bench.py latency` times wall clock on two threads, which on the 2-core development VM moves
by 10-30% between runs (steal time, threads stalling each other). This bench counts CPU time
(`time.process_time`) on one inter-op and one intra-op thread instead, so each op's work is counted
once and the figures hold still (about +-5% between runs): the budget that issue 17's p50 target
leaves the raw-feature transform, and what its parts cost against it.

Everything is built in this process from the newest demo Model artifact (no export, no SavedModel
load for the serving side; table values do not change the op costs) and called alternating, call
by call, `--rounds` times; each contender's median CPU ms per call is reported:
- `trainer's SavedModel`: the baseline of the latency target, on preprocessed tf.Examples;
- `serving model`: `ServingModule.serve_examples` (transform + pooling + network) on raw tf.Examples;
- `transform: <variant>`: `RawFeatureTransform.from_examples` alone, as the product builds it
  (`full`) and with parts taken out by `bench/serving_floor.py`'s stubs (`no_misses`,
  `no_misses_no_t7`, `hash_not_lookup`) or here (`no_dense`: the dense matrix is zeros);
- `raw parse only` / `preprocessed parse only`: `tf.io.parse_example` with the transform's spec on
  the raw rows, and with the trainer's spec on the preprocessed rows (each reduced to a scalar);
- `essential`: the raw parse, the multi-hot splits and the 26 vocabulary lookups, nothing else
  (no OOV rows, validity, truncation, stacking or dense work): what any transform on raw strings
  with TensorFlow's ops pays.
Derived: the serving model's CPU / the trainer's, and the transform budget for 1.25x: the CPU the
transform may take beyond the raw parse so that the serving model costs 1.25x the trainer's
(assuming the pooling and network cost what they cost now), next to what the essential ops and the
rest ("glue") take. Results go to bench/results/serving_cpu.json and print as a markdown table.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

RESULTS = os.path.join(REPO, "bench", "results")
TRAINER = "trainer's SavedModel (preprocessed)"
SERVING = "serving model (raw)"
VARIANTS = ("full", "no_dense", "no_misses", "no_misses_no_t7", "hash_not_lookup")


def _no_dense(serving) -> None:
    import tensorflow as tf

    def dense(self, stacked, batch, from_json):
        return {serving.DENSE_KEY: tf.zeros(tf.stack([batch, len(self._manifest.dense_features)]))}

    serving.RawFeatureTransform._dense = dense


def run(args) -> dict:
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    sys.path.insert(0, os.path.join(REPO, "bench"))
    import serving_floor

    from components.config.loading import config_from_json
    from components.embedding_exporter import export
    from components.embedding_exporter import serving
    from components.embedding_model.restore import build_serving_model
    from components.contracts.artifacts import TRAINER_CONFIG_FILE
    from components.embedding_model.input import feature_spec

    model_dir = args.model or max(glob.glob(os.path.join(REPO, "output/demo/pipeline_root/Trainer/model/*")), key=os.path.getmtime)
    root = os.path.dirname(os.path.dirname(os.path.dirname(model_dir)))  # the pipeline root
    raw_pattern = glob.glob(os.path.join(root, "EmbeddingExampleGen/examples/*/Split-eval"))[0] + "/*"
    pre_pattern = max(glob.glob(os.path.join(root, "EmbeddingPreprocess/transformed_examples/*/Split-eval")), key=os.path.getmtime) + "/*"
    cfg = config_from_json(open(os.path.join(model_dir, TRAINER_CONFIG_FILE)).read())
    plan, manifest = export.read_model_plan(model_dir), export.read_model_manifest(model_dir)
    sample = export.read_eval_sample(cfg, manifest, raw_pattern)
    raw, pre = serving_floor._records(raw_pattern, args.batch), serving_floor._records(pre_pattern, args.batch)

    fns = {}
    trainer = tf.saved_model.load(os.path.join(model_dir, "Format-Serving")).signatures["serving_default"]
    fns[TRAINER] = lambda: trainer(examples=pre)
    model = build_serving_model(plan, manifest, cfg, "float32", sample.features)
    module = serving.ServingModule(model, serving.RawFeatureTransform(manifest, manifest.vocabulary_dir))
    fns[SERVING] = lambda: module.serve_examples(raw)
    groups = model.serving_fusion_groups()

    # Each variant's transform is traced with its stubs in place, then the class is restored.
    methods, module_attrs = dict(vars(serving.RawFeatureTransform)), dict(vars(serving))
    for variant in args.variants:
        if variant == "no_dense":
            _no_dense(serving)
        else:
            serving_floor._stub(variant)
        transform = serving.RawFeatureTransform(manifest, manifest.vocabulary_dir)
        transform.fuse(groups)
        fn = tf.function(transform.from_examples, autograph=False)
        fn.get_concrete_function(tf.TensorSpec([None], tf.string))
        fns[f"transform: {variant}"] = (lambda fn=fn: fn(raw))
        for k, v in methods.items():
            if not k.startswith("__"):
                setattr(serving.RawFeatureTransform, k, v)
        for k, v in module_attrs.items():
            setattr(serving, k, v)

    transform = serving.RawFeatureTransform(manifest, manifest.vocabulary_dir)
    raw_spec, pre_spec = transform.example_spec(), feature_spec(manifest)

    def size(t) -> tf.Tensor:
        values = t.flat_values if isinstance(t, tf.RaggedTensor) else t.values if isinstance(t, tf.SparseTensor) else t
        return tf.size(values, out_type=tf.int64)

    @tf.function(autograph=False)
    def raw_parse(x):
        return tf.add_n([size(t) for t in tf.io.parse_example(x, raw_spec).values()])

    @tf.function(autograph=False)
    def pre_parse(x):
        return tf.add_n([size(t) for t in tf.io.parse_example(x, pre_spec).values()])

    @tf.function(autograph=False)
    def essential(x):
        parsed = tf.io.parse_example(x, raw_spec)
        found = []
        for f in manifest.categorical_features:
            tokens = parsed[f.column].flat_values
            if f.separator is not None:
                tokens = tf.raw_ops.StringSplitV2(input=tokens, sep=f.separator, maxsplit=-1).values
            found.append(tf.reduce_sum(transform.lookup(f.table, tokens)))
        return tf.add_n(found)

    fns["raw parse only"] = lambda: raw_parse(raw)
    fns["preprocessed parse only"] = lambda: pre_parse(pre)
    fns["essential: raw parse + splits + lookups"] = lambda: essential(raw)

    for fn in fns.values():  # warm-up (traces, kernels, tables)
        for _ in range(10):
            fn()
    cpu = {k: [] for k in fns}
    for _ in range(args.rounds):
        for k, fn in fns.items():
            start = time.process_time()
            fn()
            cpu[k].append((time.process_time() - start) * 1e3)
    ms = {k: float(np.median(v)) for k, v in cpu.items()}
    spread = {k: [float(np.percentile(v, 25)), float(np.percentile(v, 75))] for k, v in cpu.items()}
    beyond_parse = ms["transform: full"] - ms["raw parse only"]
    rest = ms[SERVING] - ms["transform: full"]  # pooling and network
    budget = 1.25 * ms[TRAINER] - rest - ms["raw parse only"]
    essential_ms = ms["essential: raw parse + splits + lookups"] - ms["raw parse only"]
    derived = {
        "serving_over_trainer": ms[SERVING] / ms[TRAINER],
        "transform_beyond_parse_ms": beyond_parse,
        "pooling_and_network_ms": rest,
        "transform_budget_for_1_25x_ms": budget,
        "essential_beyond_parse_ms": essential_ms,
        "glue_ms": beyond_parse - essential_ms,
        "parts_ms": {v: ms["transform: full"] - ms[f"transform: {v}"] for v in args.variants if v != "full"},
    }
    return {"model": model_dir, "batch": args.batch, "threads": args.threads, "rounds": args.rounds,
            "cpu_ms_per_call": ms, "cpu_ms_iqr": spread, "derived": derived, "machine": {"cpus": os.cpu_count()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a Trainer Model artifact (default: the newest under output/demo)")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=150)
    p.add_argument("--threads", type=int, default=1, help="inter-op and intra-op threads")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    args = p.parse_args()
    if "full" not in args.variants:
        args.variants.insert(0, "full")
    result = run(args)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "serving_cpu.json"), "w") as f:
        json.dump(result, f, indent=1)
    ms, iqr, d = result["cpu_ms_per_call"], result["cpu_ms_iqr"], result["derived"]
    print(f"\nbatch {result['batch']}, {result['threads']} thread(s), median of {result['rounds']} alternating calls")
    print("\n| contender | CPU ms per call | IQR |")
    print("|---|---|---|")
    for k, v in ms.items():
        print(f"| {k} | {v:.2f} | {iqr[k][0]:.2f}-{iqr[k][1]:.2f} |")
    print(f"\nserving model / trainer's SavedModel: {d['serving_over_trainer']:.2f}x")
    print(f"transform beyond the raw parse: {d['transform_beyond_parse_ms']:.2f} ms "
          f"(essential {d['essential_beyond_parse_ms']:.2f}, glue {d['glue_ms']:.2f}); "
          f"budget for 1.25x: {d['transform_budget_for_1_25x_ms']:.2f} ms")
    print("parts (full minus variant): " + ", ".join(f"{k} {v:.2f} ms" for k, v in d["parts_ms"].items()))


if __name__ == "__main__":
    main()
