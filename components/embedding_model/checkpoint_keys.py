"""Where the training model's variables are in a training checkpoint.

The trainer saves `tf.train.Checkpoint(model=<RankingModel>)`, and object-based checkpoint keys are
the attribute path from that root. Readers of training checkpoints (the exporter, warm start, the
layout reader) take the paths from here, so they depend on this statement rather than on the
model's attribute names; tests/test_export_layouts.py checks them against a checkpoint of a real
RankingModel.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict
from components.config.choices import Placement

if TYPE_CHECKING:
    from components.embedding_model.model import RankingModel
    from components.embedding_model.serving_model import ServingRankingModel

CHECKPOINT_ROOT = "model"
VARIABLE_VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"  # suffix of a variable's value under its object path
SLOT_MARK = "/.OPTIMIZER_SLOT/"  # between a variable's object path and each of its optimizer slots'
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"  # the object graph itself, not a variable
# Tables placed in `tpu_embedding`: the TFRS layer's mid-level API object (TPUEmbedding,
# TPUEmbeddingV2 or TPUEmbeddingForServing) holds one variable per table, named by the table
# (TPUEmbeddingV2: one per SparseCore stack, named by joining its tables' names with '_').
TPU_EMBEDDING_CHECKPOINT_PATH = CHECKPOINT_ROOT + "/embedding_layer/_tpu_embedding"
# Tables placed on the `tensor_core`: one TensorCoreTable per table, its weight `embeddings`.
TENSOR_CORE_TABLES_CHECKPOINT_PATH = CHECKPOINT_ROOT + "/tensor_core_tables"
# The dense tower's sublayers (attributes of the model, so checkpoint names under the root): MLPs
# always; `projections` only for dlrm with tables of another width; `cross` only for dcn_v2.
DENSE_CHECKPOINT_PARTS = ("bottom_mlp", "top_mlp", "projections", "cross", "sequence_pooling", "wide_dense", "bucket_tables")


def checkpoint_name(name: str) -> str:
    """A name as it appears in an object-based checkpoint key.

    Args:
      name: an attribute or table name.

    Returns:
      The name with TensorFlow's escaping of '.' and '/'.
    """
    return name.replace(".", "..").replace("/", ".S")


def tpu_embedding_checkpoint_key(variable: str) -> str:
    """Key of a variable held directly by the TPU embedding object.

    Args:
      variable: a table, a SparseCore stack or TensorFlow's `_sparse_core_table_layouts` record.

    Returns:
      The variable's value key in a training checkpoint.
    """
    return f"{TPU_EMBEDDING_CHECKPOINT_PATH}/{checkpoint_name(variable)}{VARIABLE_VALUE}"


def table_checkpoint_key(table: str, placement: str) -> str:
    """Key of a plan table's [rows, dim] variable where the model saves one variable per table
    (CPU/GPU, TPUEmbedding on TPU v2-v4).

    Args:
      table: the plan table's name.
      placement: the plan's `tpu_embedding` or `tensor_core`.

    Returns:
      The table's value key in a training checkpoint.
    """
    if placement == Placement.TENSOR_CORE:
        return f"{TENSOR_CORE_TABLES_CHECKPOINT_PATH}/{checkpoint_name(table)}/embeddings{VARIABLE_VALUE}"
    return tpu_embedding_checkpoint_key(table)


def dense_checkpoint_parts(model: "RankingModel | ServingRankingModel") -> Dict[str, Any]:
    """The model's dense sublayers that exist, under their checkpoint names.

    Args:
      model: a training or serving ranking model (both hold the same dense tower).

    Returns:
      {name from DENSE_CHECKPOINT_PARTS: layer, or dict/list of layers}.
    """
    return model.dense_tower.checkpoint_parts()
