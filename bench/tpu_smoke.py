"""TPU smoke test: what only a TPU can show, in one command on a single-host TPU VM.

    python bench/tpu_smoke.py --rows 20000 --steps 200
    python bench/tpu_smoke.py --dry-run          # on any CPU machine: every step that needs no TPU

Run it in the TPU trainer image (docker/Dockerfile.tpu) or any environment with
tensorflow-tpu==2.16.2 and this repository installed. Not run by CI on a TPU (no TPU there); never
run by the authors on one either (no TPU reachable): its first run on a TPU is the first TPU
evidence. Its `--dry-run` runs in the tests (tests/test_tpu_smoke.py). Prints one
`PASS name: detail` / `FAIL name: error` / `SKIP name: why` line per check, then a summary, and
exits 1 on any failure.

Checks (those marked TPU are skipped by --dry-run, which says so):
1. tpu_init (TPU): the TPU runtime initialises under TPUStrategy (class TPUStrategyV2 at runtime);
   the embedding hardware (V1 TensorCore embedding engine or V2 SparseCore) and SparseCores per
   chip as TensorFlow reports them.
2. sparsecore_optimizer: the optimizers SparseCore is given pass the project's check
   (optimizers.check_sparsecore_optimizer: TF 2.16's TPUEmbeddingV2 ignores clipping), and Adagrad
   with clipvalue is refused there.
3. embedding_rule (TPU): one embedding step on the TPU (Adagrad, the trainer's TPU optimizer; with
   clipvalue on V1, without on SparseCore, which cannot clip) against TensorFlow's documented
   update rule (tests/optimizer_reference.py, the reference the CPU path is held to in tests/test_optimizer_rules.py, sized
   for this table): max |difference| of the table after the step, the table read from a checkpoint
   saved at the model's path (model/embedding_layer/_tpu_embedding) by the exporter's reader
   (layouts.CheckpointTables: layout A on V1, B on SparseCore, recomputed from a plan).
   --dry-run: `embedding_rule_readback` writes the reference's table in layout B (TensorFlow's
   own index mapping, `sparsecore_layout.stacked_variables`) and A, and reads it back the same way.
4. data: generated data preprocessed (config, generator, Beam preprocessing).
5. plan: the embedding plan of that data, its TPU-embedding tables and their SparseCore stacks on
   this topology (--dry-run: --dry-replicas x --dry-sparse-cores-per-chip).
6. trainer_tpu (TPU): the whole Trainer (`run_fn` with training.tpu = local) on the data: training
   ends at train_steps under TPUStrategy, the artifact is complete, the recorded checkpoint layout
   (A on V1, B on SparseCore) matches the hardware, the SavedModel (rebuilt for CPU from the TPU
   checkpoint) scores finite probabilities.
7. trainer_cpu: the same config trained on CPU, the same artifact checks (layout A).
8. export_layout_b: trainer_cpu's checkpoint with its TPU-embedding tables rewritten in layout B
   (TensorFlow's index mapping, this topology) goes through the exporter's conversion (layout
   reader, dense restore, table writer): every exported table equals the trained one, and the
   converted model scores as the Trainer's SavedModel.
9. cpu_vs_tpu (TPU): eval AUC of trainer_tpu vs trainer_cpu (not zero: TPU arithmetic, and
   pipelining when pipeline_execution_with_tensor_core is on). Fails above --max-auc-gap.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from types import SimpleNamespace

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import components  # noqa: E402,F401
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import yaml  # noqa: E402

RESULTS = []  # (name, "PASS" | "FAIL" | "SKIP")

# tf.distribute.TPUStrategy is class TPUStrategyV2 at runtime (tensorflow/python/distribute/
# tpu_strategy.py); the trainer records type(strategy).__name__.
TPU_STRATEGY_NAMES = ("TPUStrategy", "TPUStrategyV2")

# embedding_rule's table and step
RULE_ROWS, RULE_DIM, RULE_PER_REPLICA, RULE_GRADIENT = 64, 8, 8, 0.3


def check(name, fn):
    start = time.time()
    try:
        detail = fn()
        RESULTS.append((name, "PASS"))
        text = detail[0] if isinstance(detail, tuple) else detail
        print(f"PASS {name}: {text} ({time.time() - start:.0f} s)", flush=True)
        return detail[1] if isinstance(detail, tuple) else detail
    except Exception as err:  # noqa: BLE001 - report every failure and go on
        RESULTS.append((name, "FAIL"))
        print(f"FAIL {name}: {type(err).__name__}: {err}", flush=True)
        traceback.print_exc(limit=3)
        return None


def skip(name, why):
    RESULTS.append((name, "SKIP"))
    print(f"SKIP {name}: {why}", flush=True)


def tpu_init(args):
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=args.tpu)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    strategy = tf.distribute.TPUStrategy(resolver)  # a TPUStrategyV2, as the trainer builds it
    hw = strategy.extended.tpu_hardware_feature
    v2 = hw.embedding_feature == tf.tpu.experimental.HardwareFeature.EmbeddingFeature.V2
    facts = {
        "strategy": type(strategy).__name__,
        "tpu_cores": len(tf.config.list_logical_devices("TPU")),
        "replicas": strategy.num_replicas_in_sync,
        "embedding_feature": str(hw.embedding_feature),
        "v2": bool(v2),
        "sparse_cores_per_chip_reported": int(getattr(hw, "num_embedding_devices_per_chip", 0)),
        # TPUEmbeddingV2 (and the trainer's recorded layout) take 4 when the hardware does not say.
        "sparse_cores_per_chip": int(getattr(hw, "num_embedding_devices_per_chip", 0) or 4),
    }
    return json.dumps(facts), (strategy, facts)


# ---- the embedding update rule -------------------------------------------------------------------


def rule_optimizer(sparse_core: bool):
    """embedding_rule's optimizer: Adagrad, clipped where the hardware clips (V1). SparseCore
    (TF 2.16's TPUEmbeddingV2) passes no clipping limits to its kernels, and the project refuses
    clipvalue there (optimizers.check_sparsecore_optimizer)."""
    from components.config import OptimizerConfig

    if sparse_core:
        return OptimizerConfig(name="adagrad", learning_rate=0.1)
    return OptimizerConfig(name="adagrad", learning_rate=0.1, clipvalue=0.5)


def rule_optimizers(sparse_core: bool):
    """(spec, Keras optimizer, TPU optimizer) as the trainer builds them (the Keras one owns the slots)."""
    from components.embedding_model import optimizers as O
    from components.embedding_trainer import plan as P

    spec = P.optimizer_spec(rule_optimizer(sparse_core))
    keras_opt = O.keras_optimizer(spec, P.learning_rate(spec))
    tpu_opt = O.tpu_optimizer(spec, P.learning_rate(spec), step_fn=lambda: keras_opt.iterations, keras_opt=keras_opt)
    return spec, keras_opt, tpu_opt


def sparsecore_optimizer(args, root, sparse_core: bool):
    from components.config import parse_config
    from components.embedding_model import optimizers as O
    from components.embedding_trainer import plan as P

    _, _, accepted = rule_optimizers(sparse_core=True)
    O.check_sparsecore_optimizer(accepted)
    _, _, clipped = rule_optimizers(sparse_core=False)
    try:
        O.check_sparsecore_optimizer(clipped)
    except O.EmbeddingOptimizerError as err:
        if "clipvalue" not in str(err):
            raise AssertionError(f"clipped Adagrad refused for another reason: {err}") from None
    else:
        raise AssertionError("Adagrad with clipvalue was accepted for SparseCore, which ignores clipping")
    detail = "adagrad without clipping accepted on SparseCore, adagrad with clipvalue 0.5 refused there"
    if not sparse_core:
        return detail + " (this TPU has no SparseCore: the config's optimizer is not held to it)"
    cfg = parse_config(config(args, root, tpu=None))
    spec = P.optimizer_spec(cfg.training.embedding_optimizer)
    O.check_sparsecore_optimizer(O.tpu_optimizer(spec, P.learning_rate(spec), step_fn=lambda: 0))
    return detail + f"; the config's embedding optimizer ({spec_text(spec)}) accepted"


def rule_reference(spec, tpu_opt, init: np.ndarray, ids: np.ndarray, g: float) -> np.ndarray:
    """The table after one step of the TPU embedding engine's documented rule (float64): the
    parameters the TPU is sent (the optimizer's OptimizationParameters proto), d loss / d
    activation = g for every element of every sample (one ID per sample, combiner sum)."""
    if spec["name"] != "adagrad":
        raise ValueError(f"the reference's slots here are Adagrad's, not {spec['name']}'s")
    rows, dim = init.shape
    w = init.astype(np.float64)
    slots = {"accumulators": np.full((rows, dim), float(spec["initial_accumulator_value"]))}
    lr = tpu_opt.learning_rate
    lr = float(lr() if callable(lr) else lr)
    from tests.optimizer_reference import optimization_parameters, tpu_reference_step

    tpu_reference_step(optimization_parameters(tpu_opt), lr, w, slots, ids, np.full((len(ids), dim), g, np.float32))
    return w


def rule_inputs(replicas: int):
    init = np.random.default_rng(0).normal(0, 0.1, size=(RULE_ROWS, RULE_DIM)).astype(np.float32)
    ids = np.random.default_rng(1).integers(0, RULE_ROWS, size=RULE_PER_REPLICA * replicas).astype(np.int64)
    return init, ids


def rule_plan(spec, replicas: int, sparse_cores_per_chip: int, sparse_core: bool):
    """The plan of embedding_rule's one table `t` (feature `f`, per-replica batch RULE_PER_REPLICA)
    with the run's checkpoint layout, as the trainer records it (trainer_module.checkpoint_layout)."""
    from components.contracts.plan import CheckpointLayout, EmbeddingPlan

    plan = EmbeddingPlan.for_tables(
        {"t": (RULE_ROWS, RULE_DIM, "tpu_embedding")}, features={"f": "t"},
        global_batch_size=RULE_PER_REPLICA * replicas, num_chips=replicas,
        sparse_cores_per_chip=sparse_cores_per_chip, optimizer=spec, combiner="sum",
    )
    if sparse_core:
        layout = CheckpointLayout(kind="B", embedding_api="TPUEmbeddingV2 (SparseCore)", num_replicas=replicas,
                                  sparse_cores_per_chip=sparse_cores_per_chip, per_replica_batch_size=RULE_PER_REPLICA)
    else:
        layout = CheckpointLayout(kind="A", embedding_api="TPUEmbedding", num_replicas=replicas,
                                  per_replica_batch_size=RULE_PER_REPLICA)
    return plan.with_run(checkpoint_layout=layout)


def at_model_path(mid) -> tf.train.Checkpoint:
    """A checkpoint holding the TPU embedding object where the model holds it
    (model.TPU_EMBEDDING_CHECKPOINT_PATH: model/embedding_layer/_tpu_embedding), so its keys are
    the model's (`<path>/<variable>/.ATTRIBUTES/VARIABLE_VALUE`) and the exporter's reader finds them."""
    from components.embedding_model import model as M

    obj = mid
    for name in reversed(M.TPU_EMBEDDING_CHECKPOINT_PATH.split("/")):
        obj = tf.train.Checkpoint(**{name: obj})
    return obj


def read_rule_table(path: str, plan) -> tuple:
    """Table `t` read back by the exporter's reader: (values, how it was located)."""
    from components.embedding_model import layouts as L

    tables = L.CheckpointTables(path, plan)
    source = tables.sources["t"]
    want = plan.checkpoint_layout.kind
    if source.kind != want:
        raise AssertionError(f"table t located as layout {source.kind} ({source.source}), expected {want}")
    return tables.read("t"), source


def rule_initializer(init: np.ndarray):
    """embedding_rule's table initializer: `init`, zero-padded to the shape asked for.
    TPUEmbeddingV2 pads rows to a multiple of 8 x the SparseCores and asks for the padded table
    (tpu_embedding_v3.py, _round_table_sizes; a constant initializer of the logical shape fails
    there from 4 replicas x 4 SparseCores on)."""

    def initializer(shape, dtype=tf.float32):
        full = np.zeros([int(d) for d in shape], np.float32)
        full[: init.shape[0], : init.shape[1]] = init
        return tf.constant(full, dtype=dtype)

    return initializer


def build_rule_mid(strategy, v2: bool, init: np.ndarray):
    """(spec, TPU optimizer, mid-level API object) of embedding_rule's table `t` (feature `f`),
    built under `strategy` as the hardware needs: TPUEmbeddingV2 on SparseCore, else TPUEmbedding."""
    table = tf.tpu.experimental.embedding.TableConfig(
        vocabulary_size=RULE_ROWS, dim=RULE_DIM, combiner="sum", name="t", initializer=rule_initializer(init))
    feature = tf.tpu.experimental.embedding.FeatureConfig(table=table, name="f", output_shape=[RULE_PER_REPLICA])
    with strategy.scope():
        spec, _, tpu_opt = rule_optimizers(sparse_core=v2)
        if v2:
            mid = tf.tpu.experimental.embedding.TPUEmbeddingV2(feature_config={"f": feature}, optimizer=tpu_opt)
            mid.build()
        else:
            mid = tf.tpu.experimental.embedding.TPUEmbedding(feature_config={"f": feature}, optimizer=tpu_opt)
            mid.build(per_replica_batch_size=RULE_PER_REPLICA)
    return spec, tpu_opt, mid


def embedding_rule(strategy, facts):
    """One Adagrad step of the TPU embedding engine vs the documented rule."""
    v2 = facts["v2"]
    replicas = strategy.num_replicas_in_sync
    init, ids = rule_inputs(replicas)
    global_batch = RULE_PER_REPLICA * replicas
    spec, tpu_opt, mid = build_rule_mid(strategy, v2, init)
    sparse = tf.sparse.SparseTensor(np.stack([np.arange(global_batch), np.zeros(global_batch, np.int64)], 1),
                                    ids, [global_batch, 1])
    g = RULE_GRADIENT
    dataset = tf.data.Dataset.from_tensors({"f": sparse}).unbatch().batch(global_batch, drop_remainder=True).repeat()
    it = iter(strategy.experimental_distribute_dataset(
        dataset, options=tf.distribute.InputOptions(experimental_fetch_to_device=False)))

    @tf.function
    def step():
        batch = next(it)
        if v2:
            def fn(features):
                activations, preserved = mid(features)
                mid.apply_gradients({"f": tf.ones_like(activations["f"]) * g}, preserved_outputs=preserved)
            strategy.run(fn, args=(batch,))
        else:
            mid.enqueue(batch, training=True)

            def fn():
                activations = mid.dequeue()
                mid.apply_gradients({"f": tf.ones_like(activations["f"]) * g})
            strategy.run(fn)

    step()
    ckpt_dir = tempfile.mkdtemp(prefix="tpu_smoke_rule_")
    path = at_model_path(mid).save(os.path.join(ckpt_dir, "ckpt"))
    sc_per_chip = mid._num_sc_per_chip if v2 else facts["sparse_cores_per_chip"]  # pylint: disable=protected-access
    trained, source = read_rule_table(path, rule_plan(spec, replicas, sc_per_chip, v2))
    expected = rule_reference(spec, tpu_opt, init, ids, g)
    diff = float(np.abs(trained - expected).max())
    if diff > 1e-5:
        raise AssertionError(f"table after one TPU step differs from the documented rule by {diff:.3g}")
    return (f"{'SparseCore' if v2 else 'V1'} ({spec_text(spec)}) max |TPU - rule| = {diff:.2g} over "
            f"{RULE_ROWS}x{RULE_DIM}; read as layout {source.kind}: {source.source}")


def spec_text(spec) -> str:
    clip = f", clipvalue {spec['clipvalue']}" if spec.get("clipvalue") is not None else ""
    return f"{spec['name']} lr {spec['learning_rate']}{clip}"


def embedding_rule_readback(replicas: int, sparse_cores_per_chip: int):
    """--dry-run: embedding_rule without the TPU step. The documented rule's table after the step
    is written as each hardware would save it (B: stacked and sharded by TensorFlow's own index
    mapping for `replicas` x `sparse_cores_per_chip` SparseCores; A: one variable) at the model's
    checkpoint path, and read back as embedding_rule reads the TPU's checkpoint."""
    from components.embedding_model import layouts as L

    init, ids = rule_inputs(replicas)
    work = tempfile.mkdtemp(prefix="tpu_smoke_rule_dry_")
    out = []
    for sparse_core in (True, False):
        spec, _, tpu_opt = rule_optimizers(sparse_core)
        expected = rule_reference(spec, tpu_opt, init, ids, RULE_GRADIENT)
        changed = int((np.abs(expected - init) > 0).any(axis=1).sum())
        if changed != len(np.unique(ids)):
            raise AssertionError(f"the reference step changed {changed} rows, {len(np.unique(ids))} were looked up")
        plan = rule_plan(spec, replicas, sparse_cores_per_chip, sparse_core)
        emb = tf.train.Checkpoint()  # stands for the mid-level API object
        if sparse_core:
            layouts = L.plan_sparse_core_layouts(plan, replicas, sparse_cores_per_chip, RULE_PER_REPLICA)
            for stacked, value in L.stacked_variables({"t": expected.astype(np.float32)}, layouts).items():
                setattr(emb, stacked, tf.Variable(value))
        else:
            emb.t = tf.Variable(expected.astype(np.float32))
        path = at_model_path(emb).write(os.path.join(work, plan.checkpoint_layout.kind, "ckpt"))
        trained, source = read_rule_table(path, plan)
        diff = float(np.abs(trained - expected).max())
        if diff > 1e-6:
            raise AssertionError(f"layout {source.kind}: the table read back differs from the one written by {diff:.3g}")
        out.append(f"layout {source.kind} ({spec_text(spec)}; {changed} rows updated; {source.source}): "
                   f"max |read - rule| = {diff:.2g}")
    return f"reference step at {RULE_ROWS}x{RULE_DIM}: " + "; ".join(out)


# ---- data, plan, training --------------------------------------------------------------------------


def prepare_data(args, root):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from components.config import parse_config
    from components.embedding_preprocess.run import run_preprocessing
    from components.synthetic_data import GeneratorSpec, write_csv

    write_csv(GeneratorSpec(rows=args.rows, seed=11), os.path.join(root, "train.csv"))
    write_csv(GeneratorSpec(rows=max(args.rows // 5, 1000), seed=12), os.path.join(root, "eval.csv"))
    cfg = config(args, root, tpu=None)
    run_preprocessing(
        beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=in_memory"])),
        parse_config(cfg), {"train": os.path.join(root, "train.csv"), "eval": os.path.join(root, "eval.csv")},
        os.path.join(root, "vocab"), {s: os.path.join(root, "tx", f"Split-{s}") for s in ("train", "eval")},
        os.path.join(root, "stats"), input_format="csv",
    )
    return f"{args.rows} train rows generated and preprocessed"


def config(args, root, tpu):
    with open(os.path.join(REPO, args.config), encoding="utf-8") as fh:
        raw = yaml.safe_load(fh)
    raw["input"]["path"] = os.path.join(root, "train.csv")
    raw["training"].update(train_steps=args.steps, checkpoint_every_steps=args.steps, tpu=tpu,
                           pipeline_execution_with_tensor_core=args.pipelining,
                           # the held-out selection runs (its CPU twin reads the TPU checkpoints),
                           # but never stops the run before train_steps
                           early_stopping={"evaluations": 2, "patience": 1_000_000})
    if args.size_threshold is not None:
        raw["training"].setdefault("embedding", {})["size_threshold"] = args.size_threshold
    return raw


def split_files(root, split):
    return [os.path.join(root, "tx", f"Split-{split}", "*")]


def plan_check(args, root, replicas: int, sparse_cores_per_chip: int):
    from components.config import parse_config
    from components.embedding_model import layouts as L
    from components.embedding_trainer import plan as P
    from components.embedding_trainer import trainer_module as tm

    cfg = parse_config(config(args, root, tpu=None))
    train_files = split_files(root, "train")
    plan = P.derive_plan(cfg, tm.read_manifest_for(train_files), tm.read_statistics_for(train_files))
    tpu_tables = sorted(plan.tables_placed("tpu_embedding"))
    if not tpu_tables:
        raise AssertionError(
            f"no table has more rows than training.embedding.size_threshold ({plan.size_threshold}): nothing "
            "would be trained in TPU embedding; raise --rows or lower --size-threshold")
    if plan.global_batch_size % replicas:
        raise AssertionError(f"training.batch_size {plan.global_batch_size} is not a multiple of {replicas} replicas")
    layouts = L.plan_sparse_core_layouts(plan, replicas, sparse_cores_per_chip, plan.global_batch_size // replicas)
    if sorted(layouts) != tpu_tables:
        raise AssertionError(f"SparseCore layouts for {sorted(layouts)}, TPU-embedding tables {tpu_tables}")
    stacks = sorted({layout.stacked_table_name for layout in layouts.values()})
    return (f"{len(plan.tables)} tables, {len(tpu_tables)} in TPU embedding ({', '.join(tpu_tables)}); on "
            f"{replicas} replicas x {sparse_cores_per_chip} SparseCores they form {len(stacks)} stack(s): "
            f"{', '.join(stacks)}")


def train(args, root, tpu, name):
    from components.config import parse_config
    from components.embedding_trainer import trainer_module as tm

    cfg = parse_config(config(args, root, tpu))
    model_uri = os.path.join(root, "Trainer", "model", name)
    tm.run_fn(SimpleNamespace(
        custom_config={tm.CONFIG_KEY: cfg.to_json()},
        train_files=split_files(root, "train"),
        eval_files=split_files(root, "eval"),
        serving_model_dir=os.path.join(model_uri, "Format-Serving"),
        model_run_dir=os.path.join(root, "Trainer", "model_run", name),
        train_steps=None,
    ))
    return model_uri


def eval_records(root, n: int = 64):
    """`n` transformed eval rows as serialized tf.Examples (what the Trainer's signature takes)."""
    from components.embedding_trainer import trainer_module as tm
    from components.examples_io import transformed_rows

    files = split_files(root, "eval")
    return transformed_rows(files[0], tm.read_manifest_for(files), n)


def check_model_artifact(args, root, model_uri, on_tpu: bool, layout_kind: str):
    """The Trainer's artifact: the run's record, the plan's checkpoint layout, the SavedModel."""
    from components.embedding_trainer import trainer_module as tm

    def read(name):
        with open(os.path.join(model_uri, name), encoding="utf-8") as fh:
            return json.load(fh)

    run = read(tm.TRAINING_RUN_FILE)
    plan = read("embedding_plan.json")
    metrics = read(tm.EVAL_METRICS_FILE)
    if (run["strategy"] in TPU_STRATEGY_NAMES) != on_tpu:
        raise AssertionError(f"trained under {run['strategy']}; expected {'a' if on_tpu else 'no'} TPU strategy "
                             f"({' or '.join(TPU_STRATEGY_NAMES)})")
    if run["final_step"] != args.steps:
        raise AssertionError(f"training ended at step {run['final_step']}, expected {args.steps}")
    if plan["checkpoint_layout"]["kind"] != layout_kind:
        raise AssertionError(f"recorded checkpoint layout {plan['checkpoint_layout']}, expected kind {layout_kind}")
    probs = tf.saved_model.load(os.path.join(model_uri, "Format-Serving")).signatures["serving_default"](
        examples=tf.constant(eval_records(root)))["probabilities"].numpy()
    if not np.isfinite(probs).all():
        raise AssertionError("the SavedModel scores non-finite probabilities")
    detail = (f"{run['final_step']} steps under {run['strategy']}, checkpoint layout {layout_kind}, "
              f"eval AUC {metrics['auc']:.4f}")
    return detail, metrics


def trainer_tpu(args, root, expect_v2: bool):
    return check_model_artifact(args, root, train(args, root, args.tpu, "tpu"), True, "B" if expect_v2 else "A")


def trainer_cpu(args, root):
    return check_model_artifact(args, root, train(args, root, None, "cpu"), False, "A")


# ---- export of a layout-B checkpoint ----------------------------------------------------------------


def write_layout_b(checkpoint_a: str, plan_b, prefix: str) -> dict:
    """A copy of a layout-A training checkpoint whose TPU-embedding tables are stored as
    TPUEmbeddingV2 stores them (layout B: `plan_b`'s recorded topology, stacked and sharded by
    TensorFlow's own index mapping, sparsecore_layout.stacked_variables); the tables' own keys and
    slots are left out, everything else (dense network, object graph) is copied. Returns the
    logical tables written."""
    from components.embedding_model import layouts as L

    run = plan_b.checkpoint_layout
    reader = tf.train.load_checkpoint(checkpoint_a)
    tpu_tables = sorted(plan_b.tables_placed("tpu_embedding"))
    values = {n: reader.get_tensor(L.table_key(n, "tpu_embedding")) for n in tpu_tables}
    own = tuple(L.TPU_PREFIX + L.escape_name(n) + "/" for n in tpu_tables)
    names = [k for k in sorted(reader.get_variable_to_dtype_map()) if not k.startswith(own)]
    tensors = [reader.get_tensor(k) for k in names]
    layouts = L.plan_sparse_core_layouts(plan_b, run.num_replicas, run.sparse_cores_per_chip, run.per_replica_batch_size)
    for stacked, value in L.stacked_variables(values, layouts).items():
        names.append(L.TPU_PREFIX + L.escape_name(stacked) + L.ATTR)
        tensors.append(value)
    tf.io.gfile.makedirs(os.path.dirname(prefix))
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[tf.constant(t) for t in tensors])
    return values


def export_layout_b(args, root, cpu_uri, replicas: int, sparse_cores_per_chip: int):
    from components.config import parse_config
    from components.contracts.plan import CheckpointLayout
    from components.embedding_exporter import tables as T
    from components.embedding_exporter.export import read_model_manifest
    from components.embedding_model import layouts as L
    from components.embedding_model import restore as R
    from components.embedding_model.input import parse_batch
    from components.embedding_trainer import trainer_module as tm

    cfg = parse_config(config(args, root, tpu=None))
    plan_a = tm.read_plan(cpu_uri)
    manifest = read_model_manifest(cpu_uri)
    checkpoint_a = tf.train.latest_checkpoint(os.path.join(cpu_uri, tm.CHECKPOINT_DIR))
    plan_b = plan_a.with_run(checkpoint_layout=CheckpointLayout(
        kind="B", embedding_api="TPUEmbeddingV2 (SparseCore)", num_replicas=replicas,
        sparse_cores_per_chip=sparse_cores_per_chip, per_replica_batch_size=plan_a.global_batch_size // replicas))
    work = os.path.join(root, "export_layout_b")
    checkpoint_b = os.path.join(work, "checkpoint", "ckpt")
    if not write_layout_b(checkpoint_a, plan_b, checkpoint_b):
        raise AssertionError("no TPU-embedding table in the plan: layout B untested; raise --rows or lower --size-threshold")
    # The exporter's conversion (export.prepare / convert): tables located, dense network restored,
    # each table read in its layout and written out.
    tables = R.open_checkpoint_tables(checkpoint_b, plan_b, cfg.export.layout)
    wrong = {n: s.kind for n, s in tables.sources.items()
             if s.kind != ("B" if plan_b.tables[n].placement == "tpu_embedding" else "A")}
    if wrong:
        raise AssertionError(f"tables located in the wrong layout: {wrong}")
    records = tf.constant(eval_records(root))
    features, _ = parse_batch(records, manifest)
    model = R.build_serving_model(plan_b, manifest, cfg, "float32", features)
    R.restore_dense(model, checkpoint_b)
    writer = T.TableWriter(work, manifest, manifest.vocabulary_dir)
    R.load_tables(model, tables, lambda name, source, values: writer.write(name, plan_b.tables[name], values, None))
    writer.finish()
    reader = tf.train.load_checkpoint(checkpoint_a)
    for name, t in plan_b.tables.items():
        exported = np.load(os.path.join(writer.dir, f"{name}.npy"))
        trained = reader.get_tensor(L.table_key(name, t.placement))
        if exported.shape != trained.shape or not np.array_equal(exported, trained):
            raise AssertionError(f"exported table {name} is not the trained one (layout {tables.sources[name].kind})")
    trainer = tf.saved_model.load(os.path.join(cpu_uri, "Format-Serving")).signatures["serving_default"]
    p_trainer = trainer(examples=records)["probabilities"].numpy().ravel()
    p_export = model(features).numpy().ravel()
    diff = float(np.abs(p_trainer - p_export).max())
    if diff > cfg.export.parity_tolerance:
        raise AssertionError(f"converted model differs from the Trainer's SavedModel by {diff:.3g}")
    n_b = len(plan_b.tables_placed("tpu_embedding"))
    return (f"{n_b} TPU-embedding tables written in layout B ({replicas} replicas x {sparse_cores_per_chip} "
            f"SparseCores), {len(plan_b.tables) - n_b} TensorCore tables as trained: all {len(plan_b.tables)} "
            f"exported tables equal the trained ones; converted model vs Trainer's SavedModel max |diff| "
            f"{diff:.2g} on {len(records.numpy())} eval examples")


# ---- main -------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tpu", default="local", help="TPU name or grpc address (local: this TPU VM)")
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--pipelining", action="store_true", help="pipeline_execution_with_tensor_core: true")
    parser.add_argument("--size-threshold", type=int, default=None,
                        help="training.embedding.size_threshold (default: the config's)")
    parser.add_argument("--max-auc-gap", type=float, default=0.02)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--dry-run", action="store_true",
                        help="no TPU: run every step that does not need the TPU runtime on CPU, skip the others")
    parser.add_argument("--dry-replicas", type=int, default=2, help="--dry-run: replicas of the SparseCore layout")
    parser.add_argument("--dry-sparse-cores-per-chip", type=int, default=4,
                        help="--dry-run: SparseCores per chip of the SparseCore layout")
    args = parser.parse_args(argv)
    RESULTS.clear()
    root = args.workdir or tempfile.mkdtemp(prefix="tpu_smoke_")
    os.makedirs(root, exist_ok=True)
    mode = "dry run (no TPU)" if args.dry_run else f"TPU {args.tpu}"
    print(f"tensorflow {tf.__version__}; {mode}; work dir {root}", flush=True)
    no_tpu = "needs the TPU runtime (--dry-run)"

    if args.dry_run:
        skip("tpu_init", no_tpu)
        strategy = None
        replicas, per_chip, v2 = args.dry_replicas, args.dry_sparse_cores_per_chip, True
    else:
        init = check("tpu_init", lambda: tpu_init(args))
        if init is None:
            return summary(args)
        strategy, facts = init
        replicas, per_chip, v2 = facts["replicas"], facts["sparse_cores_per_chip"], facts["v2"]

    check("sparsecore_optimizer", lambda: sparsecore_optimizer(args, root, v2))
    if args.dry_run:
        skip("embedding_rule", f"the TPU step {no_tpu}; its reference and read-back run as embedding_rule_readback")
        check("embedding_rule_readback", lambda: embedding_rule_readback(replicas, per_chip))
    else:
        check("embedding_rule", lambda: embedding_rule(strategy, facts))

    data = check("data", lambda: prepare_data(args, root))
    after_data = "needs the data step, which failed"
    if data is None:
        check_plan = None
        skip("plan", after_data)
    else:
        check_plan = check("plan", lambda: plan_check(args, root, replicas, per_chip))

    tpu_metrics = None
    if args.dry_run:
        skip("trainer_tpu", no_tpu)
    elif data is None:
        skip("trainer_tpu", after_data)
    else:
        tpu_metrics = check("trainer_tpu", lambda: trainer_tpu(args, root, v2))

    cpu_metrics = None
    if data is None:
        skip("trainer_cpu", after_data)
        skip("export_layout_b", after_data)
    else:
        cpu_metrics = check("trainer_cpu", lambda: trainer_cpu(args, root))
        if cpu_metrics is None or check_plan is None:
            skip("export_layout_b", "needs trainer_cpu's model and the plan step")
        else:
            check("export_layout_b", lambda: export_layout_b(
                args, root, os.path.join(root, "Trainer", "model", "cpu"), replicas, per_chip))

    if args.dry_run:
        skip("cpu_vs_tpu", f"needs trainer_tpu, which {no_tpu}")
    elif tpu_metrics is None or cpu_metrics is None:
        skip("cpu_vs_tpu", "needs trainer_tpu and trainer_cpu, which did not both pass")
    else:
        def compare():
            gap = abs(cpu_metrics["auc"] - tpu_metrics["auc"])
            if gap > args.max_auc_gap:
                raise AssertionError(f"eval AUC TPU {tpu_metrics['auc']:.4f} vs CPU {cpu_metrics['auc']:.4f}, "
                                     f"gap {gap:.4f} > {args.max_auc_gap}")
            return f"eval AUC TPU {tpu_metrics['auc']:.4f}, CPU {cpu_metrics['auc']:.4f}"

        check("cpu_vs_tpu", compare)
    return summary(args)


def summary(args) -> int:
    by = {s: [n for n, status in RESULTS if status == s] for s in ("PASS", "FAIL", "SKIP")}
    print(f"passed: {', '.join(by['PASS']) or '-'}", flush=True)
    if by["SKIP"]:
        print(f"skipped: {', '.join(by['SKIP'])}", flush=True)
    if by["FAIL"]:
        print(f"failed: {', '.join(by['FAIL'])}", flush=True)
    elif args.dry_run:
        print("dry run passed: every step that needs no TPU; run without --dry-run on a TPU VM for the rest", flush=True)
    else:
        print("all checks passed", flush=True)
    return 1 if by["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
