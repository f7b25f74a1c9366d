"""A check, runnable on CPU, that the input and the model obey the rules a TPU step imposes.

On a TPU the training step is compiled by XLA once, for fixed shapes, and the embedding engine
looks IDs up in tables sharded over the chips. Violations show up there as recompilation per batch,
silently wrong rows, or a failed compile on hardware nobody can debug from here; this check finds
them on the machine the pipeline is developed on:

- static shapes: every input has a known batch dimension (batches built with `drop_remainder`),
  dense features a fully known shape, IDs a known rank;
- TensorCore-table features as padded dense IDs (a SparseTensor's value count varies per batch);
- IDs within table bounds: every categorical ID in the checked batches is in [0, rows) of the
  table the plan gives its feature (rows = vocabulary + OOV buckets); the TPU embedding engine
  does not bounds-check, so an out-of-range ID would read another table's row or another shard;
- no string tensors in the step: the input carries no strings, and the traced forward + backward
  step contains no op with a string input or output (vocabulary lookups belong in preprocessing).

`check_tpu_rules` returns a report (written into the Model artifact) and `TPURulesError` names
every violation: feature, table, offending ID or op, and what to change.
"""
from __future__ import annotations

from typing import Any, Dict, List

import components  # noqa: F401
import numpy as np
import tensorflow as tf

from components.contracts.plan import EmbeddingPlan
from components.embedding_model.input import PAD_ID
from components.config.choices import Placement

# Ops whose string tensors are metadata of the graph itself, not data flowing through the step.
_METADATA_OPS = {"NoOp", "Const", "Assert", "PrintV2", "StringFormat", "VarHandleOp", "ReadVariableOp",
                 "Placeholder", "SaveV2", "RestoreV2"}


class TPURulesError(ValueError):
    """The input or the model breaks a TPU rule; the message lists each violation and the fix."""


def _spec_violations(element_spec) -> List[str]:
    features, label = element_spec
    out: List[str] = []
    for name, spec in sorted(dict(features, __label__=label).items()):
        shown = "label" if name == "__label__" else f"feature {name!r}"
        if spec.dtype == tf.string:
            out.append(f"{shown} is a string tensor; map values to integer IDs in preprocessing")
        shape = spec.shape
        if shape.rank is None:
            out.append(f"{shown} has unknown rank; give it a fixed rank")
            continue
        if shape.rank == 0 or shape[0] is None:
            out.append(f"{shown} has no static batch dimension ({shape}); batch with drop_remainder=True")
        elif not isinstance(spec, tf.SparseTensorSpec) and not shape.is_fully_defined():
            out.append(f"{shown} has a dynamic dense shape {shape}; dense inputs must be fully static")
    return out


def _id_violations(features: Dict[str, Any], plan: EmbeddingPlan) -> List[str]:
    out: List[str] = []
    for name, f in plan.features.items():
        source = f.wide_of or name  # a wide feature reads its feature's IDs
        if source not in features:
            out.append(f"feature {source!r} (table {f.table!r}) is missing from the input")
            continue
        t = features[source]
        placement = plan.tables[f.table].placement
        if isinstance(t, tf.SparseTensor) and placement == Placement.TENSOR_CORE:
            out.append(
                f"feature {name!r} (TensorCore table {f.table!r}) is a SparseTensor: its value count changes "
                "per batch, which the XLA-compiled step cannot take; feed padded dense IDs "
                "(make_dataset(dense_id_widths=plan.dense_id_widths(plan)))"
            )
        ids = t.values if isinstance(t, tf.SparseTensor) else t
        if ids.dtype not in (tf.int32, tf.int64):
            out.append(f"feature {name!r} carries {ids.dtype.name} IDs; embedding IDs must be int32/int64")
            continue
        ids = np.asarray(ids.numpy()).ravel()
        if not isinstance(t, tf.SparseTensor):
            ids = ids[ids != PAD_ID]  # padding of dense ID rows
        if ids.size == 0:
            continue
        rows = plan.tables[f.table].rows
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= rows:
            bad = lo if lo < 0 else hi
            out.append(
                f"feature {name!r}: ID {bad} outside table {f.table!r} bounds [0, {rows}); the examples and "
                "the vocabularies come from different preprocessing runs, or the table config changed"
            )
    return out


def _graph_string_ops(model: tf.keras.Model, features: Dict[str, Any], labels: tf.Tensor) -> List[str]:
    """Ops in the traced forward + backward step that take or produce strings."""

    def step(x, y):
        with tf.GradientTape() as tape:
            probs = model(x, training=True)
            loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(y, probs))
        return tape.gradient(loss, model.trainable_variables)

    graph = tf.function(step).get_concrete_function(features, labels).graph
    out: List[str] = []
    for op in graph.get_operations():
        if op.type in _METADATA_OPS:
            continue
        if any(t.dtype == tf.string for t in list(op.inputs) + list(op.outputs)):
            out.append(f"op {op.name} ({op.type}) handles strings in the step; keep string work out of the model")
    return out


def check_tpu_rules(model: tf.keras.Model, plan: EmbeddingPlan, dataset: tf.data.Dataset, batches: int = 2,
                    raise_on_violation: bool = True) -> Dict[str, Any]:
    """Checks `dataset` (batched (features, label) pairs as fed to training) and `model` against the
    TPU rules.

    Args:
      model: a CPU twin of the model (built here by its first call).
      plan: the embedding plan (tables, bounds, placements).
      dataset: batched (features, label) pairs as fed to training.
      batches: how many batches to check.
      raise_on_violation: False returns the report instead of raising.

    Returns:
      {"passed", "batches_checked", "rules", "violations"}.

    Raises:
      TPURulesError: some rule is broken (every violation listed), unless `raise_on_violation` is False.
    """
    violations = _spec_violations(dataset.element_spec)
    checked = 0
    first = None
    for features, labels in dataset.take(batches):
        first = first or (features, labels)
        violations += _id_violations(features, plan)
        checked += 1
    if first is not None and not any("string" in v for v in violations):
        model(first[0])  # builds the variables outside the traced step
        violations += _graph_string_ops(model, *first)
    report = {
        "passed": not violations,
        "batches_checked": checked,
        "rules": [
            "static batch and dense shapes", "TensorCore-table features as padded dense IDs",
            "IDs within table bounds", "no string tensors in the step",
        ],
        "violations": sorted(set(violations)),
    }
    if violations and raise_on_violation:
        raise TPURulesError("input or model breaks TPU rules:\n  - " + "\n  - ".join(report["violations"]))
    return report
