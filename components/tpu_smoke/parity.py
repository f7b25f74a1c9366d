"""The smoke test's core check (components/tpu_smoke, check 5): the Trainer's model trained the same
steps under TPUStrategy and on the host CPU from the same start, and every variable the step trains
read back from the TPU run's checkpoint and compared with the CPU run's: each table row by row (TPU
embedding and TensorCore) with its optimizer slots, and the dense network's weights, their
optimizer slots and the optimizers' step counters; then the judge of their changes."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import numpy as np
import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_v3_utils

from components.contracts.plan import CheckpointLayout
from components.embedding_model.layouts import CheckpointTables
from components.embedding_model.checkpoint_keys import CHECKPOINT_ROOT, OBJECT_GRAPH_KEY, SLOT_MARK, VARIABLE_VALUE
from components.embedding_trainer import hardware, model_building, training_data, training_state
from components.config.choices import LayoutKind, OptimizerName, Placement
from components.planning.fitting import with_run


class ParityError(AssertionError):
    """The TPU run's tables are not the CPU run's; says which and by how much."""


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
    """A table's optimizer slots in a checkpoint, by their key below the slot mark: layout A (every
    TensorCore table, and TPU-embedding tables of TPUEmbedding or a CPU run) the table's own keys,
    layout B its rows out of the stack's slot variables (TensorFlow's unshuffle_from_sc_to_cpu)."""
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


@dataclass(frozen=True)
class Tolerances:
    """How far the TPU run's changes may be from the CPU run's, by what is compared.

    Attributes:
      element: each element's gap, as a fraction of the reference's largest change (tables, slots).
      scale: |the change's least-squares scale against the reference's - 1| of each table's values
        (`change_difference`'s `scale`: a learning rate or a gradient scale off shows there, where
        elementwise rounding averages out); None: not checked.
      dense_element: `element` for the variables outside the tables; None: not checked.
      dense_scale: `scale` for those; None: not checked.
    """

    element: float
    scale: Optional[float] = None
    dense_element: Optional[float] = None
    dense_scale: Optional[float] = None
    slot_scale: Optional[float] = None  # `scale` for the tables' optimizer slots
    slot_element: Optional[float] = None  # `element` for the tables' optimizer slots; None: `element`


def tolerances_for(precision: str, element: Optional[float] = None) -> Tolerances:
    """The judge's tolerances for a run of the dense network in `precision`.

    float32: every element within `element` (DEFAULT_TOLERANCE) of the change, tables and dense
    variables alike. mixed_bfloat16 (both runs' dense networks compute in bfloat16: 8 bits of
    mantissa, a relative resolution of 2**-8): on the SparseCore harness the correct step's tables
    differed by up to 1.4% of a change element by element and 0.23% in scale; their optimizer slots
    (sums of squared, rounded gradients) by up to 5.7% element by element (6.9% with oneDNN off,
    13.7% on another CI host's CPU: an FTRL `linear` slot, where gradients near zero round apart)
    and, from run to run as the replicas' threads sum in another order, up to 3.2% in scale; the dense variables by up to
    53% element by element (Adam's first steps are lr x sign(g): a rounding in a near-zero gradient
    flips a whole step) and 2.3% in scale. So in bfloat16 each element within 2**-3 (gross errors: a
    row missed, rotated or padded wrong), each table's values within 2**-7 in scale (two bfloat16
    steps: one stack's learning rate x1.02 is caught, at 2%), each slot's elements within 2**-2
    (every broken step of tests/test_smoke_mutations.py still fails) and its scale within 2**-3, each dense
    variable within 2**-4 in scale (a dropped dense step moved them by 32%); dense variables element
    by element not at all.
    """
    if precision == "mixed_bfloat16":
        return Tolerances(element if element is not None else 2**-3, 2**-7, None, 2**-4, 2**-3,
                          element if element is not None else 2**-2)
    element = DEFAULT_TOLERANCE if element is None else element
    return Tolerances(element, None, element, None)


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
      max |dT|, "moved_reference": max |dR|, "scale": <dT, dR> / <dR, dR> (the least-squares factor
      of dT against dR: 1 when the changes agree, 1.02 under a learning rate 2% off)} with
      dT = trained - start, dR = reference - start.
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
    norm = float(np.sum(dr * dr))
    scale = float(np.sum(dt * dr)) / norm if norm > 0 else (1.0 if not np.any(dt) else float("inf"))
    return {"relative": relative, "max_diff": _difference(t, r), "moved": moved, "moved_reference": moved_reference,
            "rounding": rounding, "scale": scale}


def _verdict(what: str, d: Dict[str, Any], tolerance: Optional[float], rows_moved: str = "",
             scale: Optional[float] = None) -> Optional[str]:
    """The failure sentence of one compared variable (`change_difference`'s result), or None;
    `tolerance` None: elements not compared; `scale` None: the scale not compared."""
    if "shapes" in d:
        return f"{what}: read back as {d['shapes']}"
    if d["moved_reference"] == 0.0:
        return f"{what}: the CPU run left it where it started (not looked up: untested)"
    if d["moved"] == 0.0:
        return f"{what}: never trained (equal to its start), the CPU run moved it{rows_moved}"
    if d.get("rounding", 0.0) > MAX_ROUNDING:
        return (f"{what}: float32 cannot resolve its change (rounding allowance {d['rounding']:.3g} of the "
                f"CPU run's change {d['moved_reference']:.3g}; not tested): train more steps")
    if tolerance is not None and d["relative"] > tolerance:
        return (f"{what}: its change differs from the CPU run's by {d['relative']:.3g} of that change "
                f"(max |diff| {d['max_diff']:.3g}, the CPU run moved it up to {d['moved_reference']:.3g}) "
                f"> {tolerance:g}")
    if scale is not None and abs(d["scale"] - 1.0) > scale:
        return (f"{what}: its change is {d['scale']:.4g} times the CPU run's (least squares over its elements, "
                f"|scale - 1| > {scale:g}): a learning rate or a gradient scaled wrong")
    return None


def judge(trained: Dict[str, np.ndarray], reference: Dict[str, np.ndarray], start: Dict[str, np.ndarray],
          tolerance: float, slots: Optional[Dict[str, Dict[str, Tuple[np.ndarray, np.ndarray, np.ndarray]]]] = None,
          scale: Optional[float] = None, slot_scale: Optional[float] = None, slot_element: Optional[float] = None
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
      scale: the largest |scale - 1| of each table's change (Tolerances.scale); None: not compared.
      slot_scale: the same of each slot's (Tolerances.slot_scale).
      slot_element: `tolerance` for each slot's elements (Tolerances.slot_element); None: `tolerance`.

    Returns:
      (report, failures): {table: {change_diff, max_diff, moved, moved_reference, rows_moved, scale,
      slots: {slot: change_diff}, slot_scales}}, and one sentence per failure.
    """
    report: Dict[str, Dict[str, Any]] = {}
    failures: List[str] = []

    def verdict(what: str, d: Dict[str, Any], rows_moved: str = "", within: Optional[float] = None,
                elements: float = tolerance) -> None:
        failure = _verdict(what, d, elements, rows_moved, within)
        if failure:
            failures.append(failure)

    for name in sorted(reference):
        d = change_difference(trained[name], reference[name], start[name])
        entry = {"change_diff": d["relative"], "max_diff": d["max_diff"], "moved": d["moved"],
                 "moved_reference": d["moved_reference"], "scale": d.get("scale"),
                 "rows_moved": int(np.any(np.asarray(reference[name]) != start[name], axis=1).sum())
                 if np.shape(reference[name]) == np.shape(start[name]) else 0}
        verdict(name, d, f" ({entry['rows_moved']} rows)", scale)
        for slot, (a, b, s0) in sorted((slots or {}).get(name, {}).items()):
            ds = change_difference(a, b, s0)
            entry.setdefault("slots", {})[slot] = ds["relative"]
            entry.setdefault("slot_scales", {})[slot] = ds.get("scale")
            verdict(f"{name} slot {slot}", ds, within=slot_scale,
                    elements=tolerance if slot_element is None else slot_element)
        report[name] = entry
    return report, failures


def judge_variables(variables: Dict[str, Tuple[Optional[np.ndarray], np.ndarray, np.ndarray]],
                    tolerance: Optional[float], scale: Optional[float] = None) -> Tuple[Dict[str, Any], List[str]]:
    """The variables outside the tables (the dense network's weights, every optimizer slot of
    theirs, the optimizers' step counters and hyperparameters), by checkpoint key: one the CPU run
    changed must change as much in the run under test (`change_difference`, as tables); one the
    CPU run left where it started (a hyperparameter, a weight no gradient reached) must be left
    there too.

    Args:
      variables: {key: (trained, reference, start)}; trained is None when the run under test's
        checkpoint lacks the key.
      tolerance: as `judge`'s; None: elements not compared (only the scale, moved or not).
      scale: as `judge`'s.

    Returns:
      ({"compared", "trained", "max_change_diff", "worst", "max_scale_off", "worst_scale"}, one
      sentence per failure).
    """
    failures: List[str] = []
    worst, trained, off_scale = (0.0, ""), 0, (0.0, "")
    for key, (t, r, s) in sorted(variables.items()):
        what = key[: -len(VARIABLE_VALUE)] if key.endswith(VARIABLE_VALUE) else key
        kept = _difference(r, s) == 0.0
        if t is None:
            if not kept:
                failures.append(f"{what}: the CPU run trained it; the TPU checkpoint lacks it")
            continue
        if kept:
            if _difference(t, s) != 0.0:
                failures.append(f"{what}: the CPU run left it where it started, the TPU run moved it by up to "
                                f"{_difference(t, s):.3g}")
            continue
        trained += 1
        d = change_difference(t, r, s)
        failure = _verdict(what, d, tolerance, scale=scale)
        if failure:
            failures.append(failure)
        worst = max(worst, (d["relative"], what))
        off_scale = max(off_scale, (abs(d["scale"] - 1.0), what))
    return {"compared": len(variables), "trained": trained, "max_change_diff": worst[0], "worst": worst[1],
            "max_scale_off": off_scale[0], "worst_scale": off_scale[1]}, failures


def sparsecore_training(strategy, cfg, plan, manifest, train_files: List[str], steps: int, workdir: str,
                        tolerance: Optional[float] = None, precision: str = "float32",
                        reference: Optional[Dict[str, Tuple[str, str]]] = None) -> Dict[str, Any]:
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
        against CPU, as a fraction of the CPU run's largest change (`judge`); None: the
        precision's (`tolerances_for`).
      precision: the dense network's precision both runs train in (`float32`, or `mixed_bfloat16`,
        what a TPU trains in under `training.precision: auto`); it sets the judge's tolerances.
      reference: a cache of CPU runs across calls (one dict; None: none): several TPU runs judged
        against the same CPU run train it once (a CPU run does not depend on the TPU step).

    Returns:
      The report {"layout", "replicas", "steps", "placement",
      "tables": {table: {change_diff, max_diff, moved, moved_reference, rows_moved, slots}},
      "variables": judge_variables' summary of the dense network, its slots and the step counters}.

    Raises:
      ValueError: the configuration or the strategy cannot be compared step by step.
      ParityError: a table, a slot or a dense variable differs beyond `tolerance` or did not move,
        or a table sits in another layout.
    """
    per_replica = _comparable_per_replica_batch(strategy, cfg, plan)
    replicas = strategy.num_replicas_in_sync
    layout = hardware.checkpoint_layout(strategy, per_replica)
    os.makedirs(workdir, exist_ok=True)
    start_prefix, tpu_prefix, cpu_prefix = _train_on_both(strategy, cfg, plan, manifest, train_files, steps, workdir,
                                                          per_replica, layout, precision, reference)
    return _compare_checkpoints(plan, layout, replicas, steps, tolerances_for(precision, tolerance), start_prefix,
                                tpu_prefix, cpu_prefix)


def _reference_key(cfg, plan, train_files: List[str], steps: int, per_replica: int, replicas: int,
                   precision: str) -> str:
    """What decides a CPU reference run: the config, the plan, the data, the steps, the batches, the precision."""
    return json.dumps([cfg.to_json(), plan.to_dict(), sorted(train_files), steps, per_replica, replicas, precision],
                      sort_keys=True, default=str)


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
                   layout: CheckpointLayout, precision: str = "float32",
                   reference: Optional[Dict[str, Tuple[str, str]]] = None) -> Tuple[str, str, str]:
    """Trains the model from one start under `strategy` and on the host CPU; returns the
    checkpoint prefixes of (the start, the TPU run, the CPU run). `reference`: CPU runs already
    made, by what decides them (`_reference_key`): one found there is reused, one made is added."""
    replicas = strategy.num_replicas_in_sync
    key = _reference_key(cfg, plan, train_files, steps, per_replica, replicas, precision)
    full_precision = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)  # TPUs: float32 matmuls not in bfloat16
    try:
        train_input = training_data.training_input(train_files, manifest, plan, cfg.training, per_replica, 0, replicas)
        if reference is not None and key in reference:
            start_prefix, cpu_prefix = reference[key]
            cpu = None
        else:  # the CPU run, on the host: its start (tables, slots, dense weights) is both runs' start
            with tf.device("/cpu:0"):
                cpu = model_building.build_model(plan, manifest, cfg, for_training=True, precision=precision)
                _compile(cpu)
                # (a dataset of its own: a second iterator of one dataset would reshuffle)
                sample, _ = next(iter(global_batches(train_input(), replicas)))
                cpu(sample)
                cpu.create_optimizer_slots()
                start_prefix = tf.train.Checkpoint(**{CHECKPOINT_ROOT: cpu}).save(os.path.join(workdir, "start", "ckpt"))
        with strategy.scope():
            tpu = model_building.build_model(plan, manifest, cfg, for_training=True, on_tpu=True, per_replica_batch=per_replica,
                                             precision=precision)
            _compile(tpu)
        if layout.kind == LayoutKind.B:  # the Trainer's warm start into SparseCore stacks
            training_state.warm_start_sparse_core(tpu, plan, layout, start_prefix, strategy)
        else:
            tf.train.Checkpoint(**{CHECKPOINT_ROOT: tpu}).restore(start_prefix).assert_existing_objects_matched()
        tpu_ds = strategy.distribute_datasets_from_function(
            train_input, tf.distribute.InputOptions(experimental_fetch_to_device=False))
        # Built before the fit (the start's pending restore applied as the first step would): one trace of the step.
        model_building.create_variables(tpu, tpu_ds.element_spec, strategy)
        _fit(tpu, tpu_ds, steps)
        tpu_prefix = tf.train.Checkpoint(**{CHECKPOINT_ROOT: tpu}).save(os.path.join(workdir, "tpu", "ckpt"))
        if cpu is not None:
            with tf.device("/cpu:0"):
                _fit(cpu, global_batches(train_input(), replicas), steps)
            cpu_prefix = tf.train.Checkpoint(**{CHECKPOINT_ROOT: cpu}).save(os.path.join(workdir, "cpu", "ckpt"))
            if reference is not None:
                reference[key] = (start_prefix, cpu_prefix)
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(full_precision)
    return start_prefix, tpu_prefix, cpu_prefix


def _compare_checkpoints(plan, layout: CheckpointLayout, replicas: int, steps: int, tolerance: Tolerances,
                         start_prefix: str, tpu_prefix: str, cpu_prefix: str) -> Dict[str, Any]:
    """The TPU run's tables and slots against the CPU run's, read as the exporter reads a training checkpoint."""
    plan_tpu = with_run(plan, checkpoint_layout=layout)
    plan_cpu = with_run(plan, checkpoint_layout=CheckpointLayout(kind="A", embedding_api="TPUEmbeddingForServing (CPU/GPU variables)"))
    read_tpu = CheckpointTables(tpu_prefix, plan_tpu)
    read_cpu = CheckpointTables(cpu_prefix, plan_cpu)
    read_start = CheckpointTables(start_prefix, plan_cpu)
    wrong = {n: s.kind for n, s in read_tpu.sources.items()
             if s.kind != (layout.kind if plan.tables[n].placement == Placement.TPU_EMBEDDING else "A")}
    if wrong:
        raise ParityError(f"tables located in another layout than the run's ({layout.kind}): {wrong}")
    names = sorted(plan.tables)
    slots = {}
    for n in names:  # every table's slots: TPU embedding's (layout B: out of the stacks) and TensorCore's
        ours, theirs = _slots(tpu_prefix, plan, n, read_tpu.sources[n]), _slots(cpu_prefix, plan, n, read_cpu.sources[n])
        first = _slots(start_prefix, plan, n, read_start.sources[n])
        stateless = plan.tables[n].optimizer.get("name") == OptimizerName.SGD
        if sorted(ours) != sorted(theirs) or sorted(first) != sorted(theirs) or not (theirs or stateless):
            raise ParityError(f"table {n}: slots {sorted(ours)} in the TPU checkpoint, {sorted(theirs)} in the CPU one, "
                              f"{sorted(first)} at the start")
        slots[n] = {k.split("/")[-3]: (ours[k], theirs[k], first[k]) for k in theirs}
    report, failures = judge({n: read_tpu.read(n) for n in names}, {n: read_cpu.read(n) for n in names},
                             {n: read_start.read(n) for n in names}, tolerance.element, slots, tolerance.scale,
                             tolerance.slot_scale, tolerance.slot_element)
    variables, more = judge_variables(_variables_outside_tables(read_cpu, start_prefix, tpu_prefix, cpu_prefix),
                                      tolerance.dense_element, tolerance.dense_scale)
    result = {"layout": layout.kind, "replicas": replicas, "steps": steps, "tables": report, "variables": variables,
              "placement": {n: plan.tables[n].placement for n in names}}
    if failures or more:
        raise ParityError("; ".join(failures + more) + " | " + describe(result))
    return result


def _variables_outside_tables(read_cpu: CheckpointTables, start_prefix: str, tpu_prefix: str, cpu_prefix: str
                              ) -> Dict[str, Tuple[Optional[np.ndarray], np.ndarray, np.ndarray]]:
    """{key: (TPU run's value or None, CPU run's, start's)} of every variable of the CPU run's
    checkpoint but the tables and their slots (compared row by row) and the save counter: both
    models hold the dense network, its slots and the optimizers at the same keys."""
    table_keys = [s.key for s in read_cpu.sources.values()]
    slot_bases = tuple(k[: -len(VARIABLE_VALUE)] + SLOT_MARK for k in table_keys)
    readers = [tf.train.load_checkpoint(p) for p in (tpu_prefix, cpu_prefix, start_prefix)]
    in_tpu = readers[0].get_variable_to_shape_map()
    out = {}
    for key in readers[1].get_variable_to_shape_map():
        if key == OBJECT_GRAPH_KEY or key.startswith("save_counter/") or key in table_keys or key.startswith(slot_bases):
            continue
        out[key] = (readers[0].get_tensor(key) if key in in_tpu else None, readers[1].get_tensor(key), readers[2].get_tensor(key))
    return out


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
    v = result.get("variables")
    if v:
        parts.append(f"{v['compared']} variables outside the tables (dense layers, their slots, step counters): "
                     f"{v['trained']} trained, change differs by up to {v['max_change_diff']:.2g} of the CPU's"
                     + (f" ({v['worst']})" if v["worst"] else ""))
    return (f"layout {result['layout']}, {result['replicas']} replicas, {result['steps']} steps: " + "; ".join(parts))
