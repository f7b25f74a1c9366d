"""The `blocks` layout of transformed examples (`transformed_examples.format: blocks`, named in
`contracts.manifest`): the transformed rows of `block_rows` consecutive rows as one record
(`to_blocks`, what preprocessing writes), and those records cut back into one row per transformed
row (`from_blocks`, what `examples_io.transformed_rows` and the samples of `sampling` read), both
over Arrow list columns (`as_list_array`)."""
from __future__ import annotations

from typing import Dict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from components.config.schema import PipelineConfig
from components.contracts.manifest import ROW_LENGTHS_SUFFIX, row_lengths_key, weights_key


def as_list_array(values, lengths: np.ndarray) -> pa.Array:
    """A ListArray of `values` (numpy or Arrow) cut into consecutive lists of `lengths`."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), values if isinstance(values, pa.Array) else pa.array(values))


def to_blocks(cfg: PipelineConfig, rb: pa.RecordBatch, block_rows: int) -> pa.RecordBatch:
    """A transformed batch (`embedding_preprocess.transform.transform_batch`'s) -> one row per block of `block_rows`
    consecutive rows (the last block holds the rest), in the `blocks` layout of
    `contracts.manifest`: each column's values of the block's rows as one list, plus each
    categorical feature's IDs per row (`row_lengths_key`). Encoded, each row is one tf.Example.
    Vectorised: the block boundaries only re-cut the columns' offsets; no value is copied per row."""
    n = rb.num_rows
    starts = np.unique(np.minimum(np.arange(0, n + block_rows, block_rows), n))  # [0, b, 2b, ..., n]
    row_cuts = pa.array(starts.astype(np.int32))
    categorical = {f.name: weights_key(f.name) if f.weight_column else None for f in cfg.categorical_features}
    # A categorical feature's cuts serve its weights too (transform.transform_batch puts the weights after it).
    cuts_of: Dict[str, np.ndarray] = {}
    names, arrays = [], []
    for name in rb.schema.names:
        col = rb.column(rb.schema.get_field_index(name))
        if name in categorical:
            lengths = np.asarray(pc.list_value_length(col), dtype=np.int64)
            cuts_of[name] = cuts = np.concatenate([[0], np.cumsum(lengths)])[starts]
            if categorical[name]:
                cuts_of[categorical[name]] = cuts
            names.append(row_lengths_key(name))
            arrays.append(pa.ListArray.from_arrays(row_cuts, pa.array(lengths)))
        names.append(name)
        cuts = cuts_of.get(name, starts)  # label and dense values: one per row
        arrays.append(pa.ListArray.from_arrays(pa.array(cuts.astype(np.int32)), col.flatten()))
    return pa.RecordBatch.from_arrays(arrays, names)


def from_blocks(cfg_or_manifest, blocks: pa.RecordBatch) -> pa.RecordBatch:
    """`to_blocks`' inverse: decoded blocks (one row per block) -> one row per transformed row,
    the columns `transform.transform_batch` writes. `cfg_or_manifest`: a PipelineConfig or a
    VocabularyManifest (both name the categorical features)."""
    cats = cfg_or_manifest.categorical_features
    weights_of = {weights_key(f.name): f.name for f in cats if f.weight_column}
    categorical = {f.name for f in cats}
    names, arrays = [], []
    for name in blocks.schema.names:
        if name.endswith(ROW_LENGTHS_SUFFIX):
            continue
        values = blocks.column(blocks.schema.get_field_index(name)).flatten()
        owner = weights_of.get(name, name)
        if owner in categorical:
            lengths = np.asarray(blocks.column(blocks.schema.get_field_index(row_lengths_key(owner))).flatten(),
                                 dtype=np.int64)
        else:  # label and dense values: one per row
            lengths = np.ones(len(values), np.int64)
        arrays.append(as_list_array(values, lengths))
        names.append(name)
    return pa.RecordBatch.from_arrays(arrays, names)
