"""TPU smoke test: what only a TPU can show, in one command on a single-host TPU VM.

    python -m components.embedding_trainer.tpu_smoke --rows 20000 --steps 200
    python -m components.embedding_trainer.tpu_smoke --dry-run    # any CPU machine: every step that needs no TPU

It ships in the package (the TPU image, docker/Dockerfile.tpu, installs it; its build imports this
module) and imports nothing from the repository's tests/ or bench/. Run it from a directory holding
the configs (the image's working directory does) or pass --config. Not run by CI (it has no TPU), so
a run on a TPU VM is the only TPU evidence. Prints one `PASS name: detail` / `FAIL name: error` / `SKIP name: why` line per check,
then a summary, and exits 1 on any failure.

Checks (those marked TPU are skipped by --dry-run, which says so):
1. tpu_init (TPU): the TPU runtime initialises under TPUStrategy (class TPUStrategyV2 at runtime);
   the embedding hardware (V1 embedding engine or V2 SparseCore) and SparseCores per chip.
2. data: generated data preprocessed (config, generator, Beam preprocessing).
3. plan: the parity configuration's plan (`parity_raw_config`: the config with the wide part on,
   no dropout, no pipelining, and an Adagrad table beside the FTRL ones) has what the parity check
   must cover on this topology (--dry-run: --dry-replicas x --dry-sparse-cores-per-chip): an FTRL
   and an Adagrad TPU-embedding table, a SparseCore stack of several tables (rotations, row
   offsets) and a one-dimensional wide table (padded to 8 columns; lazy Adam, the wide part's
   default optimizer).
4. sparsecore_optimizer: every TPU-embedding table's optimizer in that plan passes the project's
   SparseCore check (optimizers.check_sparsecore_optimizer: TF 2.16's TPUEmbeddingV2 ignores
   clipping), and Adagrad with clipvalue is refused there.
5. sparsecore_training (TPU): the core check (`sparsecore_training`). The Trainer's model,
   optimizers and train_step (model_building.build_model) trained for --parity-steps steps under
   TPUStrategy, and the same model trained on the host CPU (one variable per table, layout A) for
   the same steps on the same examples (the Trainer's input: the replicas' batches of a step are
   the CPU's global batch), both from the same tables, slots and dense weights (the Trainer's
   warm-start path places the CPU model's start into the SparseCore stacks). Each table is read
   back from the TPU run's checkpoint by the exporter's reader (layouts.CheckpointTables: layout B
   on SparseCore, A on TPU v2-v4) and compared row by row with the CPU run's, and the TPU-embedding
   tables' optimizer slots likewise (TensorFlow's own `unshuffle_from_sc_to_cpu`). What is compared
   is each table's and slot's change from the start, TPU against CPU, relative to the CPU run's
   largest change (3 steps move an Adagrad accumulator by about 3e-5: an absolute tolerance would
   pass one never written back). Each value's difference counts only beyond ROUNDING_STEPS float32
   steps at its magnitude (two summation orders round apart). FAILS on a difference above
   --parity-tolerance (1e-2 of the change), on a table or slot that did not move on either run
   (untrained, or not looked up: untested), and on one whose change float32 cannot resolve (the
   rounding allowance above MAX_ROUNDING of the change: not tested). tests/test_smoke_mutations.py breaks the CPU SparseCore step seven ways and requires
   this check to fail on each.
   Float32 matmuls run at full precision for this check (TensorFloat-32 / bfloat16 passes off).
6. trainer_tpu (TPU): the whole Trainer (`run_fn` with training.tpu = local) on the data with the
   given config: training ends at --steps under TPUStrategy, the artifact is complete, the recorded
   checkpoint layout (A on V1, B on SparseCore) matches the hardware, and the SavedModel (rebuilt
   for CPU from the TPU checkpoint) loads and scores. This shows the run completes; that it
   trains what the CPU trains is check 5.
Without a TPU, tests/test_sparsecore_training.py runs `sparsecore_training` itself with the test
harness's 2-replica strategy and a CPU SparseCore step in place of the TPU.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
import traceback
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Tuple

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import numpy as np
import tensorflow as tf
import yaml
from tensorflow.python.tpu import tpu_embedding_v3_utils

from components.config.loading import parse_config
from components.config.schema import OptimizerConfig
from components.contracts import artifacts
from components.contracts.plan import CheckpointLayout, optimizer_spec
from components.data_io.sampling import sample_transformed_rows
from components.embedding_model import optimizers as optimizers_lib
from components.embedding_model.layouts import CheckpointTables
from components.embedding_model.checkpoint_keys import CHECKPOINT_ROOT, VARIABLE_VALUE
from components.embedding_model.sparsecore_layout import plan_sparse_core_layouts
from components.embedding_model.tf_objects import learning_rate
from components.embedding_trainer import hardware, model_building, resolved_input, trainer_module, training_data, training_state
from components.embedding_trainer.run_plan import derive_plan
from components.example_gen.synthetic_data import GeneratorSpec, write_csv
from components.tfx_wiring.component_keys import CONFIG_KEY, EXAMPLES_URI_KEY
from components.config.choices import LayoutKind, Placement

RESULTS: List[Tuple[str, str]] = []  # (name, "PASS" | "FAIL" | "SKIP")

# tf.distribute.TPUStrategy is class TPUStrategyV2 at runtime (tensorflow/python/distribute/
# tpu_strategy.py); the trainer records type(strategy).__name__.
TPU_STRATEGY_NAMES = ("TPUStrategy", "TPUStrategyV2")
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PARITY_ADAGRAD = {"name": "adagrad", "learning_rate": 0.1}
SLOT_MARK = "/.OPTIMIZER_SLOT/"
NO_TPU = "needs the TPU runtime (--dry-run)"


class ParityError(AssertionError):
    """The TPU run's tables are not the CPU run's; says which and by how much."""


def check(name: str, fn: Callable[[], Any]):
    """Runs one check and prints its `PASS` or `FAIL` line; a failure is reported, never raised.

    Args:
      name: the check's name, as printed and recorded in RESULTS.
      fn: the check; returns its detail line, or (detail line, value to hand on).

    Returns:
      The value handed on (the detail itself when `fn` returns no pair), None when the check failed.
    """
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


def skip(name: str, why: str) -> None:
    """Records and prints a `SKIP name: why` line."""
    RESULTS.append((name, "SKIP"))
    print(f"SKIP {name}: {why}", flush=True)


def tpu_init(args):
    """Initialises the TPU runtime under TPUStrategy and reads the embedding hardware it reports.

    Args:
      args: the parsed command line (`--tpu`: the TPU's name or address).

    Returns:
      (the facts as a JSON line, (strategy, facts)): facts hold the strategy's class, TPU cores,
      replicas, the embedding feature, whether it is SparseCore (V2) and SparseCores per chip.
    """
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


# ---- configuration -----------------------------------------------------------------------------


def config_path(path: str) -> str:
    """The config file's path: as given when it exists, else relative to the checkout or image root.

    Args:
      path: `--config`.

    Returns:
      `path` itself when absolute or present, else `path` under the root that holds configs/.
    """
    if os.path.isabs(path) or os.path.exists(path):
        return path
    return os.path.join(PACKAGE_ROOT, path)


def base_raw_config(args, root: str) -> Dict[str, Any]:
    """The raw config of `--config`, reading the generated `train.csv` under `root`.

    Args:
      args: the parsed command line (`--config`, `--size-threshold`).
      root: the work directory.

    Returns:
      The config as parsed YAML, with input.path and, if given, the embedding size threshold set.
    """
    with open(config_path(args.config), encoding="utf-8") as fh:
        raw = yaml.safe_load(fh)
    raw["input"]["path"] = os.path.join(root, "train.csv")
    if args.size_threshold is not None:
        raw["training"].setdefault("embedding", {})["size_threshold"] = args.size_threshold
    return raw


def trainer_raw_config(args, root: str, tpu: Optional[str]) -> Dict[str, Any]:
    """trainer_tpu's raw config: the given one, trained for --steps steps.

    The held-out selection runs (its CPU twin reading the TPU checkpoints) but never stops the run
    before --steps.

    Args:
      args: the parsed command line.
      root: the work directory.
      tpu: training.tpu (`local` on a TPU VM).

    Returns:
      The raw config.
    """
    raw = base_raw_config(args, root)
    raw["training"].update(train_steps=args.steps, checkpoint_every_steps=args.steps, tpu=tpu,
                           pipeline_execution_with_tensor_core=args.pipelining,
                           early_stopping={"evaluations": 2, "patience": 1_000_000})
    return raw


def parity_raw_config(raw: Dict[str, Any]) -> Dict[str, Any]:
    """The configuration `sparsecore_training` compares (a copy of `raw`): its model and
    optimizers with the wide part on beside every table (one-dimensional tables with the wide
    optimizer: lazy Adam by default), and nothing that makes a
    multi-replica TPU step differ from a CPU step by design: no dropout (masks are drawn per
    replica), no pipelining (the SparseCore then looks up with the previous step's tables), no
    early stopping. Stays on CPU (training.tpu unset): `sparsecore_training` takes the strategy.

    Args:
      raw: a raw config (parsed YAML).

    Returns:
      The parity configuration, a deep copy.
    """
    raw = copy.deepcopy(raw)
    t = raw.setdefault("training", {})
    t.update(dropout=0.0, input_dropout=0.0, pipeline_execution_with_tensor_core=False, tpu=None,
             early_stopping={"enabled": False})
    t.setdefault("wide", {})["enabled"] = True
    return raw


def with_adagrad_table(raw: Dict[str, Any], plan) -> Dict[str, Any]:
    """`raw` with an Adagrad TPU-embedding table beside the FTRL ones when the plan has none: the
    largest TPU-embedding table that belongs to one feature gets `optimizer: adagrad` (that
    feature's own). Unchanged when one is there already.

    Args:
      raw: the parity configuration (raw).
      plan: its embedding plan.

    Returns:
      `raw` itself, or a deep copy with one feature's optimizer set to Adagrad.

    Raises:
      AssertionError: no TPU-embedding table of a feature of its own exists.
    """
    tpu = plan.tables_placed("tpu_embedding")
    if any(t.optimizer.get("name") == "adagrad" for t in tpu.values()):
        return raw
    own = {f["name"] for f in raw["categorical_features"] if f.get("table") in (None, f["name"])}
    candidates = sorted((t.rows, n) for n, t in tpu.items() if n in own and not t.wide_of)
    if not candidates:
        raise AssertionError("no TPU-embedding table of a feature of its own to train with Adagrad; "
                             "lower --size-threshold or raise --rows")
    raw = copy.deepcopy(raw)
    name = candidates[-1][1]
    next(f for f in raw["categorical_features"] if f["name"] == name)["optimizer"] = dict(PARITY_ADAGRAD)
    return raw


def parity_plan(raw: Dict[str, Any], examples_uri: str):
    """The parity configuration on the transformed data.

    Args:
      raw: the base raw config (`base_raw_config`).
      examples_uri: the transformed examples' directory (`examples_dir`).

    Returns:
      (config, plan, manifest) of the parity configuration (`parity_raw_config`, with an Adagrad table).
    """
    manifest, statistics = resolved_input.read_manifest(examples_uri), resolved_input.read_statistics(examples_uri)
    raw = parity_raw_config(raw)
    plan = derive_plan(parse_config(raw), manifest, statistics)
    raw = with_adagrad_table(raw, plan)
    cfg = parse_config(raw)
    plan = derive_plan(cfg, manifest, statistics).with_run(vocabulary_dir=manifest.vocabulary_dir)
    return cfg, plan, manifest


def coverage(plan, replicas: int, sparse_cores_per_chip: int) -> str:
    """What the parity plan covers on this topology.

    Args:
      plan: the parity plan.
      replicas: the TPU's replicas.
      sparse_cores_per_chip: SparseCores per chip.

    Returns:
      One line: the TPU-embedding tables, their optimizers and SparseCore stacks.

    Raises:
      AssertionError: the plan lacks an FTRL or an Adagrad TPU-embedding table, a SparseCore stack
        of several tables or a one-dimensional wide table.
    """
    tpu = plan.tables_placed("tpu_embedding")
    layouts = plan_sparse_core_layouts(plan, replicas, sparse_cores_per_chip, plan.global_batch_size // replicas)
    stacks: Dict[str, List[str]] = {}
    for name, layout in layouts.items():
        stacks.setdefault(layout.stacked_table_name, []).append(name)
    optimizers = {t.optimizer.get("name") for t in tpu.values()}
    wide = sorted(n for n, t in tpu.items() if t.wide_of and t.dim == 1)
    rotated = [s for s, ns in stacks.items() if len(ns) > 1]
    missing = [what for what, ok in (("an FTRL table", "ftrl" in optimizers), ("an Adagrad table", "adagrad" in optimizers),
                                     ("a stack of several tables", bool(rotated)), ("a dim-1 wide table", bool(wide)))
               if not ok]
    if missing:
        raise AssertionError(f"the parity plan's TPU-embedding tables ({sorted(tpu)}) lack {', '.join(missing)}; "
                             "lower --size-threshold or raise --rows")
    return (f"{len(tpu)} TPU-embedding tables ({', '.join(f'{o}' for o in sorted(optimizers))}) in {len(stacks)} "
            f"SparseCore stacks on {replicas} replicas x {sparse_cores_per_chip} SparseCores; stacks of several: "
            f"{', '.join(rotated)}; dim-1 wide tables: {', '.join(wide)}")


# ---- the parity check --------------------------------------------------------------------------


def global_batches(per_replica: tf.data.Dataset, replicas: int) -> tf.data.Dataset:
    """The CPU run's input: each step's `replicas` consecutive per-replica batches (what the TPU
    strategy hands its replicas from one input pipeline) as one batch, replica after replica, so
    both runs see the same examples whatever the input's block layout.

    Args:
      per_replica: batches of per-replica size.
      replicas: how many make one step.

    Returns:
      A dataset of global batches.
    """

    def merge(x):
        if isinstance(x, tf.SparseTensor):
            return tf.sparse.reshape(x, tf.concat([[-1], x.dense_shape[2:]], 0))
        if isinstance(x, tf.RaggedTensor):
            return x.merge_dims(0, 1)
        return tf.reshape(x, tf.concat([[-1], tf.shape(x)[2:]], 0))

    return per_replica.batch(replicas, drop_remainder=True).map(
        lambda *batch: tf.nest.map_structure(merge, batch if len(batch) > 1 else batch[0]))


def _fit(model, dataset, steps: int) -> None:
    model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)
    done = int(model.dense_optimizer.iterations.numpy())
    if done != steps:
        raise ParityError(f"{done} steps trained, expected {steps}")


def _compile(model) -> None:
    model.compile(optimizer=model.dense_optimizer, loss=tf.keras.losses.BinaryCrossentropy(), steps_per_execution=1)


def _slots(prefix: str, plan, table: str, source) -> Dict[str, np.ndarray]:
    """A TPU-embedding table's optimizer slots in a checkpoint, by their key below the slot mark:
    layout A the table's own keys, layout B its rows out of the stack's slot variables
    (TensorFlow's unshuffle_from_sc_to_cpu)."""
    reader = tf.train.load_checkpoint(prefix)
    base = source.key[: -len(VARIABLE_VALUE)] + SLOT_MARK
    out = {}
    t = plan.tables[table]
    for key in reader.get_variable_to_shape_map():
        if not key.startswith(base):
            continue
        value = reader.get_tensor(key)
        if source.kind == LayoutKind.B:
            s = source.shard
            value = tpu_embedding_v3_utils.unshuffle_from_sc_to_cpu(tf.constant(value), s["num_sparse_cores"], s["offset"], s["size"],
                                               s["rotation"]).numpy()
        out[key[len(base):]] = np.asarray(value)[: t.rows, : t.dim]
    return out


DEFAULT_TOLERANCE = 1e-2  # of each table's and slot's change over the parity steps
ROUNDING_STEPS = 2  # float32 steps of a value by which two summation orders may differ
MAX_ROUNDING = 0.1  # of a change: a larger rounding allowance leaves the comparison saying nothing


def _difference(a: np.ndarray, b: np.ndarray) -> float:
    """max over elements of |a - b| (inf when the shapes differ)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("inf")
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def change_difference(trained, reference, start) -> Dict[str, float]:
    """How far the trained run's change from `start` is from the reference run's.

    The change, not the value: 3 steps move an Adagrad accumulator of 0.1 by about 3e-5, so an
    absolute tolerance on values would pass an accumulator never written back. Normalised by the
    reference's largest change, so the tolerance means "this fraction of what training moved".

    Args:
      trained, reference, start: arrays of one shape ([rows, dim]).

    Returns:
      {"relative": max (|dT - dR| less ROUNDING_STEPS float32 steps of the value) / max |dR|
      (inf when the reference did not move but the trained run did, or the shapes differ; 0 when
      neither moved), "rounding": that allowance's largest value / max |dR|, "max_diff": max |T - R|, "moved":
      max |dT|, "moved_reference": max |dR|} with dT = trained - start, dR = reference - start.
    """
    t, r, s = (np.asarray(x, np.float64) for x in (trained, reference, start))
    if not (t.shape == r.shape == s.shape):
        return {"relative": float("inf"), "max_diff": float("inf"), "moved": float("inf"), "moved_reference": float("inf"),
                "shapes": f"{t.shape} against the CPU's {r.shape} (start {s.shape})"}
    dt, dr = t - s, r - s
    moved, moved_reference = (float(np.max(np.abs(d))) if d.size else 0.0 for d in (dt, dr))
    # Two runs that sum the same gradients in another order may store a value one float32 step
    # apart: an Adagrad accumulator of 0.1 moved by 3.7e-5 is then 7.45e-9 off, 2e-4 of its
    # change, which failed a 1e-4 tolerance on CI (2 replicas). Each element's gap counts only
    # beyond ROUNDING_STEPS float32 steps at its magnitude; an update missing or applied twice
    # differs by the whole change, thousands of steps. `rounding` is that allowance against the
    # change: above MAX_ROUNDING the comparison cannot tell a partial update from rounding.
    steps = ROUNDING_STEPS * np.spacing(np.maximum(np.abs(t), np.abs(r)).astype(np.float32)).astype(np.float64)
    gap = float(np.max(np.maximum(np.abs(dt - dr) - steps, 0.0))) if dt.size else 0.0
    relative = gap / moved_reference if moved_reference > 0 else (float("inf") if gap > 0 else 0.0)
    rounding = float(np.max(steps)) / moved_reference if moved_reference > 0 and steps.size else 0.0
    return {"relative": relative, "max_diff": _difference(t, r), "moved": moved, "moved_reference": moved_reference,
            "rounding": rounding}


def judge(trained: Dict[str, np.ndarray], reference: Dict[str, np.ndarray], start: Dict[str, np.ndarray],
          tolerance: float, slots: Optional[Dict[str, Dict[str, Tuple[np.ndarray, np.ndarray, np.ndarray]]]] = None
          ) -> Tuple[Dict[str, Dict[str, Any]], List[str]]:
    """Per table and per optimizer slot: its change from `start` in the run under test against
    the reference run's (`change_difference`). Returns (the report, the failures): a change that
    differs by more than `tolerance` of the reference's change, a table or slot that the
    reference run left where it started (not looked up: untested), or one the run under test
    never moved.

    Args:
      trained: {table: values [rows, dim]} of the run under test.
      reference: {table: values [rows, dim]} of the reference run.
      start: {table: values [rows, dim]} both runs started from.
      tolerance: the largest difference of the changes allowed, as a fraction of the reference's
        largest change.
      slots: {table: {slot: (trained, reference, start)}} optimizer slots, each [rows, dim].

    Returns:
      (report, failures): {table: {change_diff, max_diff, moved, moved_reference, rows_moved,
      slots: {slot: change_diff}}}, and one sentence per failure.
    """
    report: Dict[str, Dict[str, Any]] = {}
    failures: List[str] = []

    def verdict(what: str, d: Dict[str, Any], rows_moved: str = "") -> None:
        if "shapes" in d:
            failures.append(f"{what}: read back as {d['shapes']}")
        elif d["moved_reference"] == 0.0:
            failures.append(f"{what}: the CPU run left it where it started (not looked up: untested)")
        elif d["moved"] == 0.0:
            failures.append(f"{what}: never trained (equal to its start), the CPU run moved it{rows_moved}")
        elif d.get("rounding", 0.0) > MAX_ROUNDING:
            failures.append(f"{what}: float32 cannot resolve its change (rounding allowance {d['rounding']:.3g} of the "
                            f"CPU run's change {d['moved_reference']:.3g}; not tested): train more steps")
        elif d["relative"] > tolerance:
            failures.append(f"{what}: its change differs from the CPU run's by {d['relative']:.3g} of that change "
                            f"(max |diff| {d['max_diff']:.3g}, the CPU run moved it up to {d['moved_reference']:.3g}) "
                            f"> {tolerance:g}")

    for name in sorted(reference):
        d = change_difference(trained[name], reference[name], start[name])
        entry = {"change_diff": d["relative"], "max_diff": d["max_diff"], "moved": d["moved"],
                 "moved_reference": d["moved_reference"],
                 "rows_moved": int(np.any(np.asarray(reference[name]) != start[name], axis=1).sum())
                 if np.shape(reference[name]) == np.shape(start[name]) else 0}
        verdict(name, d, f" ({entry['rows_moved']} rows)")
        for slot, (a, b, s0) in sorted((slots or {}).get(name, {}).items()):
            ds = change_difference(a, b, s0)
            entry.setdefault("slots", {})[slot] = ds["relative"]
            verdict(f"{name} slot {slot}", ds)
        report[name] = entry
    return report, failures


def sparsecore_training(strategy, cfg, plan, manifest, train_files: List[str], steps: int, workdir: str,
                        tolerance: float = DEFAULT_TOLERANCE) -> Dict[str, Any]:
    """The TPU run of the Trainer's model against the same steps on CPU, table by table.

    Check 5 of the module docstring.

    Args:
      strategy: TPUStrategy, or a stand-in the trainer's `is_tpu_strategy` accepts.
      cfg: the parity configuration (`parity_plan`).
      plan: its embedding plan.
      manifest: preprocessing's manifest.
      train_files: the transformed train split's file patterns.
      steps: the steps each run trains.
      workdir: where the start, TPU and CPU checkpoints are written.
      tolerance: the largest difference of a table's or slot's change from the start, TPU
        against CPU, as a fraction of the CPU run's largest change (`judge`).

    Returns:
      The report {"layout", "replicas", "steps", "placement",
      "tables": {table: {change_diff, max_diff, moved, moved_reference, rows_moved, slots}}}.

    Raises:
      ValueError: the configuration or the strategy cannot be compared step by step.
      ParityError: a table differs beyond `tolerance`, did not move, or sits in another layout.
    """
    per_replica = _comparable_per_replica_batch(strategy, cfg, plan)
    replicas = strategy.num_replicas_in_sync
    layout = hardware.checkpoint_layout(strategy, per_replica)
    os.makedirs(workdir, exist_ok=True)
    start_prefix, tpu_prefix, cpu_prefix = _train_on_both(strategy, cfg, plan, manifest, train_files, steps, workdir,
                                                          per_replica, layout)
    return _compare_checkpoints(plan, layout, replicas, steps, tolerance, start_prefix, tpu_prefix, cpu_prefix)


def _comparable_per_replica_batch(strategy, cfg, plan) -> int:
    """Each replica's batch, once the config and the strategy are known to compare step by step."""
    t = cfg.training
    if t.dropout or t.input_dropout or t.pipeline_execution_with_tensor_core:
        raise ValueError("training.dropout, input_dropout and pipeline_execution_with_tensor_core must be off "
                         "for a step-by-step comparison (parity_raw_config)")
    if not hardware.is_tpu_strategy(strategy):
        raise ValueError(f"{type(strategy).__name__} is not a TPU strategy: nothing to compare")
    replicas = strategy.num_replicas_in_sync
    if plan.global_batch_size % replicas:
        raise ValueError(f"training.batch_size {plan.global_batch_size} is not a multiple of {replicas} replicas")
    return plan.global_batch_size // replicas


def _train_on_both(strategy, cfg, plan, manifest, train_files: List[str], steps: int, workdir: str, per_replica: int,
                   layout: CheckpointLayout) -> Tuple[str, str, str]:
    """Trains the model from one start under `strategy` and on the host CPU; returns the
    checkpoint prefixes of (the start, the TPU run, the CPU run)."""
    replicas = strategy.num_replicas_in_sync
    full_precision = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)  # TPUs: float32 matmuls not in bfloat16
    try:
        # The CPU run, on the host: its start (tables, slots, dense weights) is both runs' start.
        with tf.device("/cpu:0"):
            cpu = model_building.build_model(plan, manifest, cfg, for_training=True)
            _compile(cpu)
            train_input = training_data.training_input(train_files, manifest, plan, cfg.training, per_replica, 0, replicas)
            # (a dataset of its own: a second iterator of one dataset would reshuffle)
            sample, _ = next(iter(global_batches(train_input(), replicas)))
            cpu(sample)
            cpu.create_optimizer_slots()
            start_prefix = tf.train.Checkpoint(**{CHECKPOINT_ROOT: cpu}).save(os.path.join(workdir, "start", "ckpt"))
        with strategy.scope():
            tpu = model_building.build_model(plan, manifest, cfg, for_training=True, on_tpu=True, per_replica_batch=per_replica)
            _compile(tpu)
        if layout.kind == LayoutKind.B:  # the Trainer's warm start into SparseCore stacks
            training_state.warm_start_sparse_core(tpu, plan, layout, start_prefix, strategy)
        else:
            tf.train.Checkpoint(**{CHECKPOINT_ROOT: tpu}).restore(start_prefix).assert_existing_objects_matched()
        tpu_ds = strategy.distribute_datasets_from_function(
            train_input, tf.distribute.InputOptions(experimental_fetch_to_device=False))
        _fit(tpu, tpu_ds, steps)
        with tf.device("/cpu:0"):
            _fit(cpu, global_batches(train_input(), replicas), steps)
        tpu_prefix = tf.train.Checkpoint(**{CHECKPOINT_ROOT: tpu}).save(os.path.join(workdir, "tpu", "ckpt"))
        cpu_prefix = tf.train.Checkpoint(**{CHECKPOINT_ROOT: cpu}).save(os.path.join(workdir, "cpu", "ckpt"))
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(full_precision)
    return start_prefix, tpu_prefix, cpu_prefix


def _compare_checkpoints(plan, layout: CheckpointLayout, replicas: int, steps: int, tolerance: float,
                         start_prefix: str, tpu_prefix: str, cpu_prefix: str) -> Dict[str, Any]:
    """The TPU run's tables and slots against the CPU run's, read as the exporter reads a training checkpoint."""
    plan_tpu = plan.with_run(checkpoint_layout=layout)
    plan_cpu = plan.with_run(checkpoint_layout=CheckpointLayout(kind="A", embedding_api="TPUEmbeddingForServing (CPU/GPU variables)"))
    read_tpu = CheckpointTables(tpu_prefix, plan_tpu)
    read_cpu = CheckpointTables(cpu_prefix, plan_cpu)
    read_start = CheckpointTables(start_prefix, plan_cpu)
    wrong = {n: s.kind for n, s in read_tpu.sources.items()
             if s.kind != (layout.kind if plan.tables[n].placement == Placement.TPU_EMBEDDING else "A")}
    if wrong:
        raise ParityError(f"tables located in another layout than the run's ({layout.kind}): {wrong}")
    names = sorted(plan.tables)
    slots = {}
    for n in plan.tables_placed("tpu_embedding"):
        ours, theirs = _slots(tpu_prefix, plan, n, read_tpu.sources[n]), _slots(cpu_prefix, plan, n, read_cpu.sources[n])
        first = _slots(start_prefix, plan, n, read_start.sources[n])
        if sorted(ours) != sorted(theirs) or sorted(first) != sorted(theirs) or not theirs:
            raise ParityError(f"table {n}: slots {sorted(ours)} in the TPU checkpoint, {sorted(theirs)} in the CPU one, "
                              f"{sorted(first)} at the start")
        slots[n] = {k.split("/")[-3]: (ours[k], theirs[k], first[k]) for k in theirs}
    report, failures = judge({n: read_tpu.read(n) for n in names}, {n: read_cpu.read(n) for n in names},
                             {n: read_start.read(n) for n in names}, tolerance, slots)
    result = {"layout": layout.kind, "replicas": replicas, "steps": steps, "tables": report,
              "placement": {n: plan.tables[n].placement for n in names}}
    if failures:
        raise ParityError("; ".join(failures) + " | " + describe(result))
    return result


def describe(result: Dict[str, Any]) -> str:
    """One line per table of a `sparsecore_training` report.

    Args:
      result: `sparsecore_training`'s report.

    Returns:
      The layout, replicas and steps, then each table's differences and rows moved.
    """
    parts = []
    for name, e in result["tables"].items():
        slots = "".join(f", {s} {d:.2g}" for s, d in sorted(e.get("slots", {}).items()))
        parts.append(f"{name} ({result['placement'][name]}): change differs by {e['change_diff']:.2g} of the CPU's{slots}; "
                     f"max |diff| {e['max_diff']:.2g}; {e['rows_moved']} rows moved (up to {e['moved_reference']:.2g})")
    return (f"layout {result['layout']}, {result['replicas']} replicas, {result['steps']} steps: " + "; ".join(parts))


def sparsecore_optimizer(plan) -> str:
    """The parity plan's TPU-embedding optimizers (every table's) pass the SparseCore check.

    Args:
      plan: the parity plan.

    Returns:
      One line: clipped Adagrad refused, and the optimizers accepted.

    Raises:
      AssertionError: Adagrad with clipvalue was accepted, or refused for another reason.
      EmbeddingOptimizerError: a table's optimizer fails the SparseCore check.
    """

    def tpu_opt(spec):
        return optimizers_lib.tpu_optimizer(spec, learning_rate(spec), step_fn=lambda: 0)

    clipped = optimizer_spec(OptimizerConfig(name="adagrad", learning_rate=0.1, clipvalue=0.5))
    try:
        optimizers_lib.check_sparsecore_optimizer(tpu_opt(clipped))
    except optimizers_lib.EmbeddingOptimizerError as err:
        if "clipvalue" not in str(err):
            raise AssertionError(f"clipped Adagrad refused for another reason: {err}") from None
    else:
        raise AssertionError("Adagrad with clipvalue was accepted for SparseCore, which ignores clipping")
    specs: Dict[str, List[str]] = {}
    for name, t in sorted(plan.tables_placed("tpu_embedding").items()):
        optimizers_lib.check_sparsecore_optimizer(tpu_opt(dict(t.optimizer)), f"the optimizer of table {name!r}")
        specs.setdefault(f"{t.optimizer['name']} lr {t.optimizer['learning_rate']}", []).append(name)
    return ("adagrad with clipvalue 0.5 refused on SparseCore; the TPU-embedding tables' optimizers accepted: "
            + "; ".join(f"{k} ({len(v)} tables)" for k, v in specs.items()))


# ---- data and the whole Trainer ------------------------------------------------------------------


def prepare_data(args, root: str) -> str:
    """Generates train and eval CSVs under `root` and preprocesses them with Beam.

    Args:
      args: the parsed command line (`--rows`, `--config`).
      root: the work directory; the transformed splits go to `root/tx`.

    Returns:
      One line: the rows generated and preprocessed.
    """
    # lazy: keeps Beam off the checks that tests import without preprocessing
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from components.embedding_preprocess.run import run_preprocessing

    write_csv(GeneratorSpec(rows=args.rows, seed=11), os.path.join(root, "train.csv"))
    write_csv(GeneratorSpec(rows=max(args.rows // 5, 1000), seed=12), os.path.join(root, "eval.csv"))
    # One preprocessing for both trainings: the parity configuration changes the model only.
    run_preprocessing(
        beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=in_memory"])),
        parse_config(base_raw_config(args, root)),
        {"train": os.path.join(root, "train.csv"), "eval": os.path.join(root, "eval.csv")},
        os.path.join(root, "vocab"), {s: os.path.join(examples_dir(root), f"Split-{s}") for s in ("train", "eval")},
        os.path.join(root, "stats"), input_format="csv",
    )
    return f"{args.rows} train rows generated and preprocessed"


def examples_dir(root: str) -> str:
    """The transformed examples' directory under the work directory `root` (`prepare_data` writes it)."""
    return os.path.join(root, "tx")


def split_files(root: str, split: str) -> List[str]:
    """The file pattern of a transformed split under `root`, as the Trainer's FnArgs give it."""
    return [os.path.join(examples_dir(root), f"Split-{split}", "*")]


def eval_records(root: str, n: int = 64, seed: int = 0):
    """`n` transformed eval rows drawn across the split, as serialized tf.Examples (what the
    Trainer's signature takes); never its first rows, which in a sorted split are one part of it.

    Drawn by `sampling.sample_transformed_rows` (blocks cut back into rows).

    Args:
      root: the work directory.
      n: how many rows.
      seed: the draw's seed (the same seed and split give the same rows).

    Returns:
      min(n, rows in the split) serialized tf.Examples, a list of bytes.
    """
    files = split_files(root, "eval")
    return sample_transformed_rows(files[0], resolved_input.read_manifest(examples_dir(root)), n, seed)


def trainer_tpu(args, root: str, expect_v2: bool) -> str:
    """The whole Trainer under TPUStrategy: run_fn completes and its artifact is complete.

    Args:
      args: the parsed command line (`--tpu`, `--steps`).
      root: the work directory holding the transformed splits.
      expect_v2: whether the TPU has SparseCore (the checkpoint layout must then be B).

    Returns:
      One line: the steps, strategy, layout and eval AUC.

    Raises:
      AssertionError: the run used another strategy, ended at another step, recorded another
        layout, saved a SparseCore plan sized for another number of chips than its replicas, or its
        SavedModel scores non-finite probabilities.
    """
    cfg = parse_config(trainer_raw_config(args, root, args.tpu))
    model_uri = os.path.join(root, "Trainer", "model", "tpu")
    trainer_module.run_fn(SimpleNamespace(
        custom_config={CONFIG_KEY: cfg.to_json(), EXAMPLES_URI_KEY: examples_dir(root)}, train_files=split_files(root, "train"),
        eval_files=split_files(root, "eval"), serving_model_dir=os.path.join(model_uri, "Format-Serving"),
        model_run_dir=os.path.join(root, "Trainer", "model_run", "tpu"), train_steps=None,
    ))

    def read(name):
        with open(os.path.join(model_uri, name), encoding="utf-8") as fh:
            return json.load(fh)

    run, plan, metrics = read(artifacts.TRAINING_RUN_FILE), read("embedding_plan.json"), read(artifacts.EVAL_METRICS_FILE)
    kind = "B" if expect_v2 else "A"
    if run["strategy"] not in TPU_STRATEGY_NAMES:
        raise AssertionError(f"trained under {run['strategy']}, not a TPU strategy ({' or '.join(TPU_STRATEGY_NAMES)})")
    if run["final_step"] != args.steps:
        raise AssertionError(f"training ended at step {run['final_step']}, expected {args.steps}")
    if plan["checkpoint_layout"]["kind"] != kind:
        raise AssertionError(f"recorded checkpoint layout {plan['checkpoint_layout']}, expected kind {kind}")
    if expect_v2 and plan["topology"]["num_chips"] != run["replicas"]:  # a SparseCore chip is one replica
        raise AssertionError(f"the plan saved with the model is sized for {plan['topology']['num_chips']} chips, "
                             f"the run had {run['replicas']} replicas (hardware.plan_for_hardware re-sizes it)")
    probs = tf.saved_model.load(os.path.join(model_uri, "Format-Serving")).signatures["serving_default"](
        examples=tf.constant(eval_records(root)))["probabilities"].numpy()
    if not np.isfinite(probs).all():
        raise AssertionError("the SavedModel scores non-finite probabilities")
    return (f"{run['final_step']} steps under {run['strategy']}, checkpoint layout {kind}, artifact complete, "
            f"eval AUC {metrics['auc']:.4f} (completion only: training parity is sparsecore_training)")


# ---- main -------------------------------------------------------------------------------------------


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the checks and prints their lines and a summary.

    Args:
      argv: the command line without the program name; None reads sys.argv.

    Returns:
      The exit status: 1 on any failure, else 0.
    """
    args = _parser().parse_args(argv)
    RESULTS.clear()
    root = args.workdir or tempfile.mkdtemp(prefix="tpu_smoke_")
    os.makedirs(root, exist_ok=True)
    mode = "dry run (no TPU)" if args.dry_run else f"TPU {args.tpu}"
    print(f"tensorflow {tf.__version__}; {mode}; config {config_path(args.config)}; work dir {root}", flush=True)
    hardware = _tpu_or_dry_run(args)
    if hardware is None:
        return summary(args)
    data = check("data", lambda: prepare_data(args, root))
    if data is None:
        for name in ("sparsecore_optimizer", "plan", "sparsecore_training", "trainer_tpu"):
            skip(name, "needs the data step, which failed")
        return summary(args)
    _plan_and_training_checks(args, root, *hardware)
    return summary(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tpu", default="local", help="TPU name or grpc address (local: this TPU VM)")
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--steps", type=int, default=200, help="trainer_tpu's training steps")
    parser.add_argument("--parity-steps", type=int, default=3, help="sparsecore_training's steps on each platform")
    parser.add_argument("--parity-tolerance", type=float, default=DEFAULT_TOLERANCE,
                        help="sparsecore_training: largest difference of a table's or slot's change, TPU against CPU, "
                             "as a fraction of the CPU run's change")
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--pipelining", action="store_true",
                        help="trainer_tpu with pipeline_execution_with_tensor_core (sparsecore_training runs without)")
    parser.add_argument("--size-threshold", type=int, default=None,
                        help="training.embedding.size_threshold (default: the config's)")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--dry-run", action="store_true",
                        help="no TPU: run every step that does not need the TPU runtime on CPU, skip the others")
    parser.add_argument("--dry-replicas", type=int, default=2, help="--dry-run: replicas of the SparseCore layout")
    parser.add_argument("--dry-sparse-cores-per-chip", type=int, default=4,
                        help="--dry-run: SparseCores per chip of the SparseCore layout")
    return parser


def _tpu_or_dry_run(args):
    """(strategy, replicas, SparseCores per chip, SparseCore or not): the TPU's, or --dry-run's
    stand-ins with no strategy; None when the TPU did not initialise."""
    if args.dry_run:
        skip("tpu_init", NO_TPU)
        return None, args.dry_replicas, args.dry_sparse_cores_per_chip, True
    init = check("tpu_init", lambda: tpu_init(args))
    if init is None:
        return None
    strategy, facts = init
    return strategy, facts["replicas"], facts["sparse_cores_per_chip"], facts["v2"]


def _plan_and_training_checks(args, root: str, strategy, replicas: int, per_chip: int, v2: bool) -> None:
    """Checks 3 to 6 of the module docstring, on the preprocessed data under `root`."""

    def plan_step():
        cfg, plan, manifest = parity_plan(base_raw_config(args, root), examples_dir(root))
        return coverage(plan, replicas, per_chip), (cfg, plan, manifest)

    parity = check("plan", plan_step)
    if parity is None:
        skip("sparsecore_optimizer", "needs the plan step, which failed")
    else:
        check("sparsecore_optimizer", lambda: sparsecore_optimizer(parity[1]))
    if args.dry_run:
        skip("sparsecore_training", f"the TPU run {NO_TPU}; tests/test_sparsecore_training.py runs this check with a "
                                    "CPU SparseCore step in place of the TPU")
        skip("trainer_tpu", NO_TPU)
        return
    if parity is None:
        skip("sparsecore_training", "needs the plan step, which failed")
    else:
        cfg, plan, manifest = parity
        check("sparsecore_training", lambda: describe(sparsecore_training(
            strategy, cfg, plan, manifest, split_files(root, "train"), args.parity_steps,
            os.path.join(root, "parity"), args.parity_tolerance)))
    check("trainer_tpu", lambda: trainer_tpu(args, root, v2))


def summary(args) -> int:
    """Prints the passed, skipped and failed checks and the verdict.

    Args:
      args: the parsed command line (`--dry-run` changes the verdict's wording).

    Returns:
      The exit status: 1 on any failure, else 0.
    """
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
