"""Trainer benchmark on CPU: our ranking model vs the same architecture in plain Keras, and the
input pipeline alone vs the training step.

    .venv/bin/python bench/trainer_bench.py [--rows 50000] [--steps 300] [--repeats 3]
        [--variants default,...] [--variant NAME='{"training field": value, ...}' ...] [--no-input]

One process, one machine, the demo config (configs/demo.yaml) with `model: dlrm`, no dropout, no
input dropout, no dense buckets and no wide part (the baseline's architecture) on generated data
preprocessed by our Beam code (in-process DirectRunner):
- ours: `RankingModel` built from the embedding plan (tables through tensorflow-recommenders'
  TPUEmbedding, which on CPU is TPUEmbeddingForServing, or the TensorCore tables, per the plan),
  its own train_step with the embedding / dense optimizer split, fed as the trainer feeds it;
- plain Keras: the same DLRM (bottom MLP, dot interaction, top MLP, same widths, same pooled
  combiners, same optimizer split) with one `tf.keras.layers.Embedding` per table on padded IDs
  with a masked mean/sum, the baseline a user would write without this product;
- input: `make_dataset` (parallel TFRecord reads, vectorised parsing, static batches) consumed
  inside TensorFlow (`Dataset.reduce`) without a model, on the transformed examples as written by
  default (`transformed_examples.format: blocks`, a block of rows per record) and, beside it, on
  the same rows written one tf.Example per row (`format: examples`).
Beside them, `--variants` (comma-separated names from VARIANTS; `all` for every one; default
`default`) and `--variant NAME=JSON` (training-section fields merged over the defaults' model) train
other models of ours on the same batches, each reported as its ratio to the plain model: `default`
is the model a config gets when it states no training field of the model's shape (dcn_v2, two
rank-32 cross layers, input dropout 0.2 with the byte mask, the dense features' embedded buckets;
the demo's optimizers), `former_default` the defaults before (three full-rank cross layers, the
float mask), the others switch parts of the former defaults off or try a cheaper form of them. `--no-input` skips the input rates.
Training throughput is measured on batches cached in memory (so it measures the step, not the
input), after a warm-up of the same length, alternating contenders `--repeats` times. The
headline is each contender's best repeat (the least disturbed: on the shared 2-core machine single
repeats of either contender drop to ~20k examples/s when something else runs), medians beside it. Results go to bench/results/trainer.json and print as a markdown table.
Targets: ours / plain >= 0.9; input / ours >= 4.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics as st
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import components  # noqa: E402,F401
import tensorflow as tf  # noqa: E402
import tensorflow_recommenders as tfrs  # noqa: E402

from components.config.training_schema import TrainingConfig  # noqa: E402
from components.planning.derivation import optimizer_spec  # noqa: E402
from components.embedding_model import tf_objects  # noqa: E402
from components.planning.run_plan import derive_plan  # noqa: E402
from components.embedding_trainer import model_building, resolved_input  # noqa: E402
from tests.stages import examples_uri  # noqa: E402
from components.embedding_model.input import make_dataset  # noqa: E402
from components.embedding_model.dense_tower import mlp as _mlp  # noqa: E402

# The model a config gets when it states no field of the model's shape (TrainingConfig's defaults,
# read from it), as training-section overrides of the demo config (whose optimizers and batch size stay).
_T = TrainingConfig()
DEFAULT_MODEL = {"model": str(_T.model.value), "cross_layers": _T.cross_layers,
                 "cross_projection_dim": _T.cross_projection_dim,
                 "dropout": _T.dropout, "input_dropout": _T.input_dropout, "input_dropout_mask": _T.input_dropout_mask,
                 "dense_buckets": {"enabled": True, "into": _T.dense_buckets.into}, "wide": {"enabled": False}}
# The defaults before the cheaper model (dcn_v2, three full-rank cross layers, buckets beside the
# features, a float mask): the variants below but `default` and `dlrm_as_plain` change these, so
# that their names keep the meaning of bench/README.md's earlier runs.
FORMER_DEFAULT = {"model": "dcn_v2", "cross_layers": 3, "cross_projection_dim": None, "dropout": 0.0,
                  "input_dropout": 0.2, "input_dropout_mask": "float",
                  "dense_buckets": {"enabled": True, "into": "interaction"}, "wide": {"enabled": False}}
# The baseline's architecture in ours: a DLRM without the defaults the plain model lacks.
SAME_AS_PLAIN = {"model": "dlrm", "dropout": 0.0, "input_dropout": 0.0, "dense_buckets": {"enabled": False},
                 "wide": {"enabled": False}}
_BOTTOM = {"enabled": True, "into": "bottom_mlp"}


def _former(**fields):
    return {**FORMER_DEFAULT, **fields}


# Named variants: training-section overrides merged over DEFAULT_MODEL (a dict value replaces the
# default's dict value as a whole).
VARIANTS = {
    "default": {},
    "dlrm_as_plain": SAME_AS_PLAIN,
    "former_default": FORMER_DEFAULT,
    "no_buckets": _former(dense_buckets={"enabled": False}),
    "no_input_dropout": _former(input_dropout=0.0),
    "neither": _former(dense_buckets={"enabled": False}, input_dropout=0.0),
    "buckets_bottom": _former(dense_buckets=_BOTTOM),
    "low_rank_16": _former(cross_projection_dim=16),
    "low_rank_32": _former(cross_projection_dim=32),
    "bottom_low_rank_16": _former(cross_projection_dim=16, dense_buckets=_BOTTOM),
    "bottom_low_rank_32": _former(cross_projection_dim=32, dense_buckets=_BOTTOM),
    "lr32_bottom_no_input_dropout": _former(cross_projection_dim=32, dense_buckets=_BOTTOM, input_dropout=0.0),
    "lr32_neither": _former(cross_projection_dim=32, dense_buckets={"enabled": False}, input_dropout=0.0),
    "lr32_bottom_2_layers": _former(cross_projection_dim=32, dense_buckets=_BOTTOM, cross_layers=2),
    "lr32_bottom_1_layer": _former(cross_projection_dim=32, dense_buckets=_BOTTOM, cross_layers=1),
    "byte_mask": _former(input_dropout_mask="byte"),
    "low_rank_32_no_input_dropout": _former(cross_projection_dim=32, input_dropout=0.0),
    "low_rank_32_byte_mask": _former(cross_projection_dim=32, input_dropout_mask="byte"),
    "low_rank_16_byte_mask": _former(cross_projection_dim=16, input_dropout_mask="byte"),
    "low_rank_64": _former(cross_projection_dim=64),
    "low_rank_64_byte_mask": _former(cross_projection_dim=64, input_dropout_mask="byte"),
    "lr32_bottom_byte_mask": _former(cross_projection_dim=32, dense_buckets=_BOTTOM, input_dropout_mask="byte"),
    "default_dlrm": _former(model="dlrm"),
    "dlrm_buckets_bottom": _former(model="dlrm", dense_buckets=_BOTTOM),
    "dlrm_bottom_byte": _former(model="dlrm", dense_buckets=_BOTTOM, input_dropout_mask="byte"),
    "lr32_1_layer_byte_mask": _former(cross_layers=1, cross_projection_dim=32, input_dropout_mask="byte"),
    "lr32_2_layers_byte_mask": _former(cross_layers=2, cross_projection_dim=32, input_dropout_mask="byte"),
    "lr64_1_layer_byte_mask": _former(cross_layers=1, cross_projection_dim=64, input_dropout_mask="byte"),
    "full_rank_1_layer_byte_mask": _former(cross_layers=1, input_dropout_mask="byte"),
}


class PlainKerasDLRM(tf.keras.Model):
    """The same DLRM with tf.keras.layers.Embedding tables (padded IDs, masked pooling)."""

    def __init__(self, plan, manifest, training, embedding_optimizer, dense_optimizer):
        super().__init__()
        self.dense_names = manifest.dense_names
        self.features = {n: plan.features[n].table for n in manifest.categorical_names}
        self.tables = {
            name: tf.keras.layers.Embedding(t.rows, t.dim, name=f"emb_{name}",
                                            embeddings_initializer=tf.initializers.TruncatedNormal(stddev=t.initializer.stddev))
            for name, t in plan.tables.items()
        }
        self.combiner = {name: t.combiner for name, t in plan.tables.items()}
        width = training.bottom_mlp[-1]
        self.projections = {
            n: tf.keras.layers.Dense(width, use_bias=False) for n, t in self.features.items() if plan.tables[t].dim != width
        }
        self.bottom_mlp = _mlp(training.bottom_mlp, "bottom")
        self.interaction = tfrs.layers.feature_interaction.DotInteraction(self_interaction=False)
        self.top_mlp = _mlp(list(training.top_mlp) + [1], "top", last_activation=None)
        self.embedding_optimizer, self.dense_optimizer = embedding_optimizer, dense_optimizer

    def pooled(self, name, ids):
        dense_ids = tf.sparse.to_dense(ids, default_value=-1)
        mask = tf.cast(dense_ids >= 0, tf.float32)[..., None]
        vectors = self.tables[self.features[name]](tf.maximum(dense_ids, 0)) * mask
        total = tf.reduce_sum(vectors, axis=1)
        if self.combiner[self.features[name]] == "sum":
            return total
        return total / tf.maximum(tf.reduce_sum(mask, axis=1), 1.0)

    def call(self, inputs, training=False):
        dense = tf.concat([tf.reshape(inputs[n], [-1, 1]) for n in self.dense_names], axis=1)
        bottom = self.bottom_mlp(tf.sign(dense) * tf.math.log1p(tf.abs(dense)))
        vectors = [bottom]
        for n in self.features:
            v = self.pooled(n, inputs[n])
            vectors.append(self.projections[n](v) if n in self.projections else v)
        return tf.sigmoid(self.top_mlp(tf.concat([bottom, self.interaction(vectors)], axis=1)))

    def train_step(self, data):
        features, labels = data
        with tf.GradientTape() as tape:
            probs = self(features, training=True)
            loss = self.compiled_loss(labels, probs)
        variables = self.trainable_variables
        grads = tape.gradient(loss, variables)
        emb = {id(v) for t in self.tables.values() for v in t.trainable_variables}
        self.dense_optimizer.apply_gradients([(g, v) for g, v in zip(grads, variables) if id(v) not in emb])
        self.embedding_optimizer.apply_gradients([(g, v) for g, v in zip(grads, variables) if id(v) in emb])
        return {}


def prepare(rows: int, workdir: str, training=None, formats=("blocks",), preprocess=True):
    """Generated rows (cached under data/bench) preprocessed by our Beam code into `workdir`, with
    the demo config; `training` overrides its training section (default: the baseline's DLRM
    without dropout). Each of `formats` (transformed_examples.format) is written to
    `<workdir>/tx` (the first) or `<workdir>/tx_<format>` (`preprocess` False: already there, only
    the config is parsed). Returns (config, data metadata)."""
    import apache_beam as beam
    import yaml
    from apache_beam.options.pipeline_options import PipelineOptions

    from components.config.loading import parse_config
    from components.embedding_preprocess.run import run_preprocessing
    from components.example_gen.synthetic_data import GeneratorSpec, ensure_dataset

    data = os.path.join(REPO, "data", "bench", f"trainer_{rows}.csv")
    meta = ensure_dataset(data, GeneratorSpec(rows=rows, seed=2024))
    with open(os.path.join(REPO, "configs", "demo.yaml")) as fh:
        raw = yaml.safe_load(fh)
    raw["input"]["path"] = data
    # The baseline below is a DLRM without dropout: ours is measured as the same architecture (no
    # input dropout, no embedded dense buckets, no wide part: defaults that the baseline lacks).
    raw["training"].update(SAME_AS_PLAIN if training is None else training)
    opts = PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=in_memory"])
    for i, fmt in enumerate(formats if preprocess else ()):
        raw["transformed_examples"] = {"format": fmt}
        cfg = parse_config(raw)
        name = "" if i == 0 else f"_{fmt}"
        run_preprocessing(beam.Pipeline(options=opts), cfg, {"train": data}, os.path.join(workdir, "vocab" + name),
                          {"train": os.path.join(workdir, "tx" + name, "Split-train")},
                          os.path.join(workdir, "stats" + name), input_format="csv")
    return parse_config({**raw, "transformed_examples": {"format": formats[0]}}), meta


def variant_config(cfg, overrides):
    """`cfg` with its training section's model fields at DEFAULT_MODEL, then `overrides` merged.

    Args:
      cfg: the parsed config `prepare` returned.
      overrides: training-section fields (a dict value replaces the default's as a whole).

    Returns:
      The parsed config.
    """
    import yaml  # lazy: as in prepare

    from components.config.loading import parse_config  # lazy: as in prepare

    with open(os.path.join(REPO, "configs", "demo.yaml")) as fh:
        raw = yaml.safe_load(fh)
    raw["input"]["path"] = cfg.input.path
    raw["training"].update({**DEFAULT_MODEL, **overrides})
    raw["transformed_examples"] = {"format": "blocks"}  # as main's `prepare` writes the measured rows
    return parse_config(raw)


def examples_per_second(model, batches, steps, batch_size, warmup=True, cpu=None):
    """Training examples a wall-clock second (and, into `cpu`, a second of this process's CPU time).

    Args:
      model: a compiled model.
      batches: the cached batches it trains on.
      steps: steps measured.
      batch_size: examples a step.
      warmup: whether to train `steps` steps first (traces the step).
      cpu: a list the examples per CPU-second (all threads of the process) is appended to; on a
        machine shared with other work it moves less than the wall-clock rate.

    Returns:
      Examples per wall-clock second.
    """
    if warmup:
        model.fit(batches, epochs=1, steps_per_epoch=steps, verbose=0)
    start, start_cpu = time.perf_counter(), time.process_time()
    model.fit(batches, epochs=1, steps_per_epoch=steps, verbose=0)
    if cpu is not None:
        cpu.append(steps * batch_size / (time.process_time() - start_cpu))
    return steps * batch_size / (time.perf_counter() - start)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", default="default",
                    help=f"comma-separated, of: {', '.join(VARIANTS)}; all: every one; none: only ours as plain")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=JSON",
                    help="another variant: training-section fields merged over the defaults' model")
    ap.add_argument("--no-input", action="store_true", help="skip the input pipeline's rates")
    ap.add_argument("--workdir", help="keep the preprocessed rows here and reuse them when present (default: a new temp dir)")
    args = ap.parse_args()
    names = [] if args.variants == "none" else list(VARIANTS) if args.variants == "all" else args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")
    variants = {n: VARIANTS[n] for n in names}
    for spec in args.variant:
        name, _, text = spec.partition("=")
        try:
            variants[name] = json.loads(text)
        except json.JSONDecodeError as err:
            raise SystemExit(f"--variant {spec!r}: not NAME=JSON ({err})")
    workdir = args.workdir or tempfile.mkdtemp(prefix="trainer_bench_")
    formats = ("blocks",) if args.no_input else ("blocks", "examples")
    done = os.path.join(workdir, f"prepared_{args.rows}_{'_'.join(formats)}")
    cfg, meta = prepare(args.rows, workdir, formats=formats, preprocess=not os.path.exists(done))
    open(done, "w").close()
    root = os.path.join(workdir, "tx")
    files = [os.path.join(root, "Split-train", "*")]
    manifest = resolved_input.read_manifest(examples_uri(files))
    example_files = [os.path.join(workdir, "tx_examples", "Split-train", "*")]
    example_manifest = None if args.no_input else resolved_input.read_manifest(examples_uri(example_files))
    plan = derive_plan(cfg, manifest, resolved_input.read_statistics(examples_uri(files)))
    t = cfg.training
    bs = t.batch_size

    def input_ds(dense_id_widths=None, per_row=False):
        if per_row:
            return make_dataset(example_files, example_manifest, bs, training=True, seed=t.seed,
                                dense_id_widths=dense_id_widths)
        return make_dataset(files, manifest, bs, training=True, seed=t.seed, dense_id_widths=dense_id_widths)

    def input_rate(per_row: bool) -> float:
        # Consumed inside TensorFlow (Dataset.reduce), as the training loop consumes it; iterating
        # from Python would add per-batch conversion of ~40 tensors that training never pays.
        input_ds(widths, per_row).take(20).reduce(tf.constant(0, tf.int64), lambda a, x: a + 1)
        ds = input_ds(widths, per_row).take(args.steps)
        start = time.perf_counter()
        ds.reduce(tf.constant(0, tf.int64), lambda a, x: a + 1)
        return args.steps * bs / (time.perf_counter() - start)

    # Ours gets the trainer's input (TensorCore-table features as padded dense IDs), the baseline
    # SparseTensors (it pads them itself).
    widths = tf_objects.dense_id_widths(plan)
    cached = input_ds().take(64).cache().repeat()
    cached_ours = input_ds(widths).take(64).cache().repeat()
    for _ in cached.take(64):  # fill the caches
        pass
    for _ in cached_ours.take(64):
        pass

    ours = model_building.build_model(plan, manifest, cfg, for_training=True)
    ours.compile(optimizer=ours.dense_optimizer, loss=tf.keras.losses.BinaryCrossentropy())
    plain = PlainKerasDLRM(plan, manifest, t, tf_objects.keras_optimizer(optimizer_spec(t.embedding_optimizer)),
                           tf_objects.keras_optimizer(optimizer_spec(t.dense_optimizer)))
    plain.compile(optimizer=plain.dense_optimizer, loss=tf.keras.losses.BinaryCrossentropy())
    models = {}
    for name, overrides in variants.items():
        vcfg = variant_config(cfg, overrides)
        vplan = derive_plan(vcfg, manifest, resolved_input.read_statistics(examples_uri(files)))
        model = model_building.build_model(vplan, manifest, vcfg, for_training=True)
        model.compile(optimizer=model.dense_optimizer, loss=tf.keras.losses.BinaryCrossentropy())
        models[name] = model

    results = {"ours": [], "plain_keras": [], **{f"variant:{n}": [] for n in models}}
    cpu = {k: [] for k in results}  # examples per CPU-second
    if not args.no_input:
        results.update(input=[], input_per_row_examples=[])
    for r in range(args.repeats):
        results["ours"].append(examples_per_second(ours, cached_ours, args.steps, bs, r == 0, cpu["ours"]))
        results["plain_keras"].append(examples_per_second(plain, cached, args.steps, bs, r == 0, cpu["plain_keras"]))
        for name, model in models.items():
            key = f"variant:{name}"
            results[key].append(examples_per_second(model, cached_ours, args.steps, bs, r == 0, cpu[key]))
        if not args.no_input:
            results["input"].append(input_rate(per_row=False))
            results["input_per_row_examples"].append(input_rate(per_row=True))
        print(f"repeat {r + 1}: " + ", ".join(f"{k} {v[-1]:,.0f} ({cpu[k][-1]:,.0f} a CPU-s)" if k in cpu else
                                              f"{k} {v[-1]:,.0f}" for k, v in results.items()), flush=True)
    med = {k: st.median(v) for k, v in results.items()}
    best = {k: max(v) for k, v in results.items()}
    out = {
        "rows": args.rows,
        "steps": args.steps,
        "batch_size": bs,
        "repeats": args.repeats,
        "cpus": os.cpu_count(),
        "placement": sorted({tb.placement for tb in plan.tables.values()}),
        "examples_per_second": results,
        "median": med,
        "best": best,
        "ours_vs_plain": best["ours"] / best["plain_keras"],
        "median_ours_vs_plain": med["ours"] / med["plain_keras"],
        "examples_per_cpu_second": cpu,
        "variants": {n: {"training": variants[n], "vs_plain": best[f"variant:{n}"] / best["plain_keras"],
                         "median_vs_plain": med[f"variant:{n}"] / med["plain_keras"],
                         "cpu_vs_plain": max(cpu[f"variant:{n}"]) / max(cpu["plain_keras"]),
                         "median_cpu_vs_plain": st.median(cpu[f"variant:{n}"]) / st.median(cpu["plain_keras"])}
                     for n in models},
    }
    if not args.no_input:
        out.update({
            "input_vs_ours": best["input"] / best["ours"],
            "median_input_vs_ours": med["input"] / med["ours"],
            "input_blocks_vs_per_row": best["input"] / best["input_per_row_examples"],
            "median_input_blocks_vs_per_row": med["input"] / med["input_per_row_examples"],
        })
    os.makedirs(os.path.join(REPO, "bench", "results"), exist_ok=True)
    result_name = "trainer.json" if not args.no_input and not args.variant else "trainer_variants.json"
    with open(os.path.join(REPO, "bench", "results", result_name), "w") as fh:
        json.dump(out, fh, indent=2)
    print(f"| contender | examples/s, best of {args.repeats} | median | ratio (best; median) |")
    print("|---|---|---|---|")
    print(f"| plain Keras (tf.keras.layers.Embedding) train step | {best['plain_keras']:,.0f} | {med['plain_keras']:,.0f} | 1.00 |")
    print(f"| ours (embedding plan: {' + '.join(out['placement'])}) train step | {best['ours']:,.0f} | {med['ours']:,.0f} | "
          f"{out['ours_vs_plain']:.2f}; {out['median_ours_vs_plain']:.2f} vs plain (target >= 0.9) |")
    for n, v in out["variants"].items():
        print(f"| ours, variant `{n}` {json.dumps(variants[n])} | {best['variant:' + n]:,.0f} | "
              f"{med['variant:' + n]:,.0f} | {v['vs_plain']:.2f}; {v['median_vs_plain']:.2f} vs plain "
              f"(a CPU-second: {v['cpu_vs_plain']:.2f}; {v['median_cpu_vs_plain']:.2f}) |")
    if args.no_input:
        return 0
    print(f"| input pipeline alone | {best['input']:,.0f} | {med['input']:,.0f} | "
          f"{out['input_vs_ours']:.2f}x; {out['median_input_vs_ours']:.2f}x our step (target >= 4) |")
    print(f"| input pipeline, one tf.Example per row | {best['input_per_row_examples']:,.0f} | "
          f"{med['input_per_row_examples']:,.0f} | blocks read {out['input_blocks_vs_per_row']:.2f}x; "
          f"{out['median_input_blocks_vs_per_row']:.2f}x as fast |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
