"""tf.data input over the transformed examples written by preprocessing.

Categorical features arrive as int64 SparseTensors of embedding IDs (no string work in the step),
dense features as float32 [batch, 1], the label as float32 [batch, 1]. Training batches have a
static size (`drop_remainder=True`), as TPUs require.

Features of TensorCore tables can instead be fed as padded dense IDs ([batch, width] int64, PAD_ID
where a row has fewer IDs): a SparseTensor's values have a different length in every batch, which
the TPU step (compiled by XLA for fixed shapes) cannot take, while the TPU embedding engine takes
SparseTensors from the host. `dense_id_widths` (from the plan) selects them; the trainer uses it on
every platform, so CPU runs feed the TPU step's exact input.

With several input pipelines (hosts: tf.distribute's `InputContext`), pipeline i of P reads only
the files i, i+P, ... of the sorted file list and feeds its own replicas; with fewer files than
pipelines, every pipeline reads all files and keeps every P-th batch (`make_dataset`).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Optional, Tuple

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import numpy as np
import tensorflow as tf
from absl import logging

from components.embedding_model import autograph_rules  # noqa: F401  (rules before any trace)
from components.config.choices import FORMAT_BLOCKS
from components.contracts.manifest import TAIL_PREFIX, VocabularyManifest, row_lengths_key, weights_key
from components.data_io.tfrecords import compression_type

PAD_ID = -1  # padding of dense ID rows; TensorCoreTable and the TPU-rules check skip it
LENGTH_SUFFIX = "__length"  # a sequence feature's positions per row, computed on the host


# The training shuffle buffer's default, in rows (`training.shuffle_buffer_rows`). Transformed rows
# keep the input's order (files are read in byte ranges, written where they were read), and real
# input is often ordered by time: a buffer of 16 batches leaves a date-ordered dataset's batches
# far from shuffled and costs AUC, this one trains as well as rows shuffled at the source
# (bench/README.md "Defaults on real data"). About 10 MB of serialized rows for the demo's features.
DEFAULT_SHUFFLE_ROWS = 65_536

# The train split's held-out slice (training.early_stopping): records whose content key falls in
# the first `fraction` of HOLDOUT_BUCKETS buckets. A record is a row or a block of rows. The key
# reads the record's content, not its bytes: a tf.Example's bytes are not canonical (the encoder
# writes the feature map in an order that differs between processes: the same blocks written by
# two pipeline runs can have other bytes), so the slice is the same for the same transformed rows
# whatever process wrote them, and it never touches the eval split (other files).
HOLDOUT_BUCKETS = 1_000_000

# Files an input pipeline reads at once (the interleave's cycle length). A constant, not AUTOTUNE:
# the order of a deterministic interleave depends on its cycle length, and AUTOTUNE derives it from
# the host's core count, so a run resumed on a host of another shape would skip the right number
# of batches of another stream. The reads themselves stay parallel (num_parallel_calls AUTOTUNE,
# deterministic order); 16 open files is enough to keep remote reads (GCS) in flight.
INTERLEAVE_CYCLE = 16
PARTS = ("all", "train", "holdout")
_FILTER_BATCH = 256  # records keyed at once (decode_proto is vectorised)
_HOLDOUT_READ_BATCH = 1024  # records keyed at once by read_holdout's single pass


def holdout_buckets(fraction: float) -> int:
    """How many of HOLDOUT_BUCKETS buckets the held-out slice takes.

    Args:
      fraction: the held-out slice's fraction of the train split, in [0, 1].

    Returns:
      The number of buckets, rounded to the nearest.
    """
    return int(round(float(fraction) * HOLDOUT_BUCKETS))


def record_keys(records: tf.Tensor) -> tf.Tensor:
    """Content keys of serialized tf.Examples, the same for the same content in any map order.

    A key is the sum (wrapping) of the Fingerprint64 buckets of the record's feature map entries
    (each entry's bytes: the name and its values, which the writer encodes one way). Stock ops
    only: `decode_proto` of tensorflow.Example, then of tensorflow.Features.

    Args:
      records: string [n], serialized tf.Examples (rows or blocks of rows).

    Returns:
      int64 [n], one key per record.
    """
    top = tf.io.decode_proto(records, "tensorflow.Example", ["features"], [tf.string])
    # one `features` per record; a record without it (padded to "" here) has no entries
    features = tf.reshape(tf.pad(top.values[0], [[0, 0], [0, 1]])[:, :1], [-1])
    entries = tf.io.decode_proto(features, "tensorflow.Features", ["feature"], [tf.string])
    hashes = tf.strings.to_hash_bucket_fast(entries.values[0], 1 << 62)
    present = tf.sequence_mask(entries.sizes[:, 0], tf.shape(hashes)[1])  # not the batch's padding
    return tf.reduce_sum(tf.where(present, hashes, tf.zeros_like(hashes)), axis=1)


def record_buckets(records: tf.Tensor) -> tf.Tensor:
    """Each serialized record's held-out bucket: its content key modulo HOLDOUT_BUCKETS.

    Args:
      records: string [n], serialized tf.Examples.

    Returns:
      int64 [n], in [0, HOLDOUT_BUCKETS).
    """
    return tf.math.floormod(record_keys(records), HOLDOUT_BUCKETS)


def in_holdout(records: tf.Tensor, fraction: float) -> tf.Tensor:
    """Whether each serialized record is in the train split's held-out slice.

    Args:
      records: string [n], serialized tf.Examples.
      fraction: the held-out slice's fraction of the train split.

    Returns:
      bool [n].
    """
    return record_buckets(records) < holdout_buckets(fraction)


def _ALL(ds: tf.data.Dataset) -> tf.data.Dataset:
    return ds


def _records_of(part: str, fraction: float):
    """A TFRecordDataset -> the records of `part` (all; the part trained on; the held-out slice)."""
    if part not in PARTS:
        raise ValueError(f"part {part!r} is not one of {', '.join(PARTS)}")
    if part == "all" or (part == "train" and holdout_buckets(fraction) == 0):
        return _ALL
    keep = part == "holdout"

    def pick(records):
        return tf.boolean_mask(records, tf.equal(in_holdout(records, fraction), keep))

    # keyed a batch of records at a time; the order of the records kept is the file's
    return lambda ds: ds.batch(_FILTER_BATCH).map(pick).unbatch()


@dataclasses.dataclass(frozen=True)
class HeldOutSlice:
    """The held-out slice's serialized records, read once (`read_holdout`).

    Attributes:
      records: string [n], the records kept, in the order the files are read (sorted, interleaved).
      rows: the rows of `records`.
      slice_rows: the rows of the whole slice in the split (more than `rows` where the cap applied).
      bucket_bound: the records kept are those of the slice whose bucket is below this bound
        (`holdout_buckets(fraction)` when the cap did not apply).
    """

    records: tf.Tensor
    rows: int
    slice_rows: int
    bucket_bound: int


def read_holdout(file_patterns: List[str], manifest: VocabularyManifest, fraction: float,
                 max_rows: Optional[int] = None) -> HeldOutSlice:
    """The train split's held-out slice (`in_holdout`) as serialized records, in one pass.

    Every record of the split is read and keyed once (files INTERLEAVE_CYCLE at a time, keyed
    in batches, in parallel); only the slice's records are kept. Where the slice holds more than
    `max_rows` rows (its fraction was not capped by a known row count), a uniform part of it is
    kept: the records of the lowest buckets (their content keys decide, as for the slice itself),
    so memory stays under about twice `max_rows` rows' records while reading. Every record kept
    is held out of training (`part="train"` leaves the whole slice out).

    Args:
      file_patterns: globs of the train split's TFRecord files.
      manifest: the transformed data's manifest (rows per record in the `blocks` layout).
      fraction: the held-out slice's fraction of the train split.
      max_rows: the most rows to keep, None for all (a single record over it is still kept).

    Returns:
      The records kept and their row counts.

    Raises:
      ValueError: no file matches `file_patterns`, or `max_rows` is below 1.
    """
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"read_holdout: max_rows {max_rows} must be at least 1 (training.early_stopping.max_holdout_rows)")
    files = _matching_files(file_patterns)
    if not files:
        raise ValueError(f"no transformed examples match {file_patterns}")
    bound = holdout_buckets(fraction)
    ds = _slice_batches(files, manifest, bound)
    parts: List[Tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    held = slice_rows = 0
    for records, buckets, rows in ds.as_numpy_iterator():
        slice_rows += int(rows.sum())
        if max_rows is not None and bound < holdout_buckets(fraction):
            below = buckets < bound
            records, buckets, rows = records[below], buckets[below], rows[below]
        parts.append((records, buckets, rows))
        held += int(rows.sum())
        if max_rows is not None and held > 2 * max_rows:
            parts, held, bound = _lowest_buckets(parts, max_rows, bound)
    if max_rows is not None and held > max_rows:
        parts, held, bound = _lowest_buckets(parts, max_rows, bound)
    kept_records = np.concatenate([p[0] for p in parts]) if parts else np.zeros([0], dtype=object)
    if held < slice_rows:
        logging.info("held-out slice: %d of its %d rows kept (training.early_stopping.max_holdout_rows %d): "
                     "the records of its lowest content buckets", held, slice_rows, max_rows)
    return HeldOutSlice(tf.constant(kept_records, dtype=tf.string), held, slice_rows, bound)


def _slice_batches(files: List[str], manifest: VocabularyManifest, bound: int) -> tf.data.Dataset:
    """`read_holdout`'s batches of the records of `files` (INTERLEAVE_CYCLE files at a time, keyed in
    parallel) whose bucket is below `bound`: (records, buckets, rows each holds), [n] each."""
    compression = compression_type(files)
    blocks = manifest.transformed_format == FORMAT_BLOCKS
    label_spec = {manifest.label: tf.io.RaggedFeature(tf.float32)}

    def kept(records):
        buckets = record_buckets(records)
        chosen = buckets < bound
        records, buckets = tf.boolean_mask(records, chosen), tf.boolean_mask(buckets, chosen)
        if blocks:  # a block's rows: its label's values
            rows = tf.cast(tf.io.parse_example(records, label_spec)[manifest.label].row_lengths(), tf.int64)
        else:
            rows = tf.ones_like(buckets)
        return records, buckets, rows

    return _file_names(files, False, 0).interleave(
        lambda f: tf.data.TFRecordDataset(f, compression_type=compression).batch(_HOLDOUT_READ_BATCH).map(
            kept, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True),
        cycle_length=INTERLEAVE_CYCLE, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True,
    ).prefetch(tf.data.AUTOTUNE)


def _lowest_buckets(parts: List[Tuple[np.ndarray, np.ndarray, np.ndarray]], max_rows: int, bound: int
                    ) -> Tuple[List[Tuple[np.ndarray, np.ndarray, np.ndarray]], int, int]:
    """The records of `parts` ((records, buckets, rows) arrays) whose bucket is below the highest
    bound that keeps at most `max_rows` rows (or the lowest bucket's records alone), in their
    order; returns (parts, rows kept, the bound)."""
    buckets = np.concatenate([p[1] for p in parts])
    rows = np.concatenate([p[2] for p in parts])
    order = np.argsort(buckets, kind="stable")
    within = int(np.searchsorted(np.cumsum(rows[order]), max_rows, side="right"))
    sorted_buckets = buckets[order]
    new_bound = int(sorted_buckets[within]) if within < len(order) else bound
    new_bound = max(new_bound, int(sorted_buckets[0]) + 1)  # never nothing
    kept = [(r[b < new_bound], b[b < new_bound], n[b < new_bound]) for r, b, n in parts]
    return kept, int(sum(int(n.sum()) for _, _, n in kept)), min(bound, new_bound)


def records_dataset(records: tf.Tensor, manifest: VocabularyManifest, batch_size: int,
                    dense_id_widths: Optional[Dict[str, int]] = None,
                    sequence_lengths: Optional[Dict[str, int]] = None) -> tf.data.Dataset:
    """Batches of (features, label) of serialized records held in memory (`read_holdout`), for
    evaluation: in order, the last batch shorter; in the `blocks` layout a batch is
    `batch_size / block_rows` whole blocks (short blocks included), so its rows vary a little.

    Args:
      records: string [n], serialized transformed records of `manifest`'s layout.
      manifest: the transformed data's manifest.
      batch_size: rows per batch (rounded down to whole blocks, at least one, with blocks).
      dense_id_widths: {feature: width} fed as padded dense IDs.
      sequence_lengths: {feature: max_sequence_length} whose row lengths come with the batch.

    Returns:
      A dataset of (features, label), as `make_dataset` gives them with `training=False`.
    """
    ds = tf.data.Dataset.from_tensor_slices(tf.convert_to_tensor(records, tf.string))
    if manifest.transformed_format != FORMAT_BLOCKS:
        return ds.batch(batch_size).map(
            lambda s: parse_batch(s, manifest, None, dense_id_widths, sequence_lengths),
            num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    ds = _whole_block_batches(ds, manifest, max(1, batch_size // max(1, manifest.block_rows)), training=False)
    return _block_rows_as_inputs(ds, manifest, None, dense_id_widths, sequence_lengths)


def _block_rows_as_inputs(ds: tf.data.Dataset, manifest: VocabularyManifest, static: Optional[int],
                          dense_id_widths: Optional[Dict[str, int]], sequence_lengths: Optional[Dict[str, int]]
                          ) -> tf.data.Dataset:
    """Batches of rows parsed from blocks ({name: values}) -> (features, label), in parallel, prefetched."""
    to_inputs = lambda p: model_inputs(  # noqa: E731
        rows_as_parsed(p, manifest, dense_id_widths, sequence_lengths), manifest, static, dense_id_widths,
        sequence_lengths)
    return ds.map(to_inputs, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def length_key(feature: str) -> str:
    """Where a sequence feature's lengths travel among the model inputs.

    Args:
      feature: the sequence feature's name.

    Returns:
      The key of its int32 [batch] lengths (IDs per row, at most its max_sequence_length).
    """
    return feature + LENGTH_SUFFIX


def feature_spec(manifest: VocabularyManifest) -> Dict[str, Any]:
    """The `tf.io.parse_example` spec of one transformed example per record.

    Args:
      manifest: the transformed data's manifest.

    Returns:
      {name: FixedLenFeature([1], float32)} for the label and dense features,
      VarLenFeature(int64) for categorical IDs, VarLenFeature(float32) for their weights.
    """
    spec: Dict[str, Any] = {manifest.label: tf.io.FixedLenFeature([1], tf.float32)}
    for name in manifest.dense_names:
        spec[name] = tf.io.FixedLenFeature([1], tf.float32)
    for name in manifest.categorical_names:
        spec[name] = tf.io.VarLenFeature(tf.int64)
    for name in manifest.weighted_names:  # W1: one weight per ID, the same positions
        spec[weights_key(name)] = tf.io.VarLenFeature(tf.float32)
    return spec


def to_dense_ids(ids: tf.SparseTensor, width: int) -> tf.Tensor:
    """Each row's first `width` IDs (or weights) as a padded dense tensor.

    Args:
      ids: int64 IDs (or float32 weights), a SparseTensor [batch, None].
      width: the columns kept.

    Returns:
      [batch, width] of the input's dtype: int64 padded with PAD_ID, float32 with 0.
    """
    shape = tf.stack([tf.shape(ids, out_type=tf.int64)[0], tf.constant(width, tf.int64)])
    kept = tf.sparse.reset_shape(tf.sparse.slice(ids, [0, 0], shape), shape)
    dense = tf.sparse.to_dense(kept, default_value=PAD_ID if ids.dtype == tf.int64 else 0.0)
    dense.set_shape([ids.shape[0], width])
    return dense


def parse_batch(
    serialized: tf.Tensor,
    manifest: VocabularyManifest,
    static_batch: Optional[int] = None,
    dense_id_widths: Optional[Dict[str, int]] = None,
    sequence_lengths: Optional[Dict[str, int]] = None,
) -> Tuple[Dict[str, Any], tf.Tensor]:
    """Parses a batch of serialized transformed examples into the model's inputs.

    Args:
      serialized: string [batch], one tf.Example per row.
      manifest: the transformed data's manifest.
      static_batch: when set, every tensor, SparseTensors included (parse_example leaves their
        dense shape unknown), gets this static batch dimension, as the TPU step requires.
      dense_id_widths: {feature: width} of the features fed as padded dense IDs.
      sequence_lengths: {feature: max_sequence_length}; each also gets `length_key(feature)`,
        the rows' positions the model masks with (counted here, on the host: sparse ops have no
        place in a TPU step).

    Returns:
      (features, label): label float32 [batch, 1]; dense features float32 [batch, 1]; IDs int64
      SparseTensors [batch, None] or [batch, width] int64 (`dense_id_widths`); lengths int32 [batch].
    """
    return model_inputs(tf.io.parse_example(serialized, feature_spec(manifest)), manifest, static_batch,
                        dense_id_widths, sequence_lengths)


def block_spec(manifest: VocabularyManifest) -> Dict[str, Any]:
    """The parse spec of one block of transformed rows (the `blocks` layout of contracts.manifest).

    Args:
      manifest: the transformed data's manifest.

    Returns:
      {name: RaggedFeature}: label and dense values one per row (float32), each categorical
      feature (int64) and its weights (float32) ragged by its row lengths.
    """
    spec: Dict[str, Any] = {manifest.label: tf.io.RaggedFeature(tf.float32)}
    for name in manifest.dense_names:
        spec[name] = tf.io.RaggedFeature(tf.float32)
    weighted = set(manifest.weighted_names)
    for name in manifest.categorical_names:
        rows = [tf.io.RaggedFeature.RowLengths(row_lengths_key(name))]
        spec[name] = tf.io.RaggedFeature(tf.int64, partitions=rows, row_splits_dtype=tf.int64)
        if name in weighted:
            spec[weights_key(name)] = tf.io.RaggedFeature(
                tf.float32, value_key=weights_key(name), partitions=rows, row_splits_dtype=tf.int64)
    return spec


def parse_block(serialized: tf.Tensor, manifest: VocabularyManifest) -> Dict[str, Any]:
    """Parses one serialized block of transformed rows.

    Args:
      serialized: a string scalar, one block.
      manifest: the transformed data's manifest.

    Returns:
      {name: values}: float32 [rows] for the label and dense features, [rows, None] RaggedTensors
      (int64 IDs, float32 weights) for categorical features.
    """
    return tf.io.parse_single_example(serialized, block_spec(manifest))


def rows_as_parsed(
    rows: Dict[str, Any],
    manifest: VocabularyManifest,
    dense_id_widths: Optional[Dict[str, int]] = None,
    sequence_lengths: Optional[Dict[str, int]] = None,
) -> Dict[str, Any]:
    """A batch of rows parsed from blocks in the form `model_inputs` takes.

    The features of `dense_id_widths` are padded and the lengths of `sequence_lengths` counted
    straight from the ragged rows: cheaper than through a SparseTensor, with the same values.

    Args:
      rows: {name: float32 [batch] values or [batch, None] RaggedTensor}, as `parse_block` gives.
      manifest: the transformed data's manifest.
      dense_id_widths: {feature: width} of the features fed as padded dense IDs.
      sequence_lengths: {feature: max_sequence_length} whose lengths to count.

    Returns:
      {name: tensor}: float32 [batch, 1] label and dense values; IDs (and weights) as
      SparseTensors [batch, None], or padded [batch, width]; int32 [batch] sequence lengths.
    """
    widths, lengths = dense_id_widths or {}, sequence_lengths or {}
    owner = {weights_key(n): n for n in manifest.weighted_names}
    out: Dict[str, Any] = {}
    for name, t in rows.items():
        if not isinstance(t, tf.RaggedTensor):
            out[name] = tf.expand_dims(t, 1)
            continue
        if name in lengths:
            out[length_key(name)] = tf.minimum(tf.cast(t.row_lengths(), tf.int32), lengths[name])
        width = widths.get(owner.get(name, name))
        if width is None:
            out[name] = t.to_sparse()
        else:
            pad = PAD_ID if t.dtype == tf.int64 else 0.0
            out[name] = t[:, :width].to_tensor(default_value=tf.cast(pad, t.dtype), shape=[None, width])
    return out


def model_inputs(
    parsed: Dict[str, Any],
    manifest: VocabularyManifest,
    static_batch: Optional[int] = None,
    dense_id_widths: Optional[Dict[str, int]] = None,
    sequence_lengths: Optional[Dict[str, int]] = None,
) -> Tuple[Dict[str, Any], tf.Tensor]:
    """Parsed transformed rows as the model reads them (see `parse_batch`).

    Args:
      parsed: {name: tensor}: label and dense values float32 [batch, 1], IDs as SparseTensors
        (or already padded and counted, `rows_as_parsed`); updated in place.
      manifest: the transformed data's manifest.
      static_batch: the static batch dimension to set, or None.
      dense_id_widths: {feature: width} of the features fed as padded dense IDs.
      sequence_lengths: {feature: max_sequence_length} whose lengths come with the batch.

    Returns:
      (features, label), as `parse_batch` returns them.
    """
    rows = tf.shape(parsed[manifest.label])[0]
    for name, length in (sequence_lengths or {}).items():
        if length_key(name) in parsed:  # counted already (rows_as_parsed)
            continue
        ids = parsed[name]
        counts = tf.math.bincount(tf.cast(ids.indices[:, 0], tf.int32), minlength=rows, maxlength=rows)
        parsed[length_key(name)] = tf.minimum(counts, length)
    for name, width in (dense_id_widths or {}).items():
        for key in (name, weights_key(name)):
            if isinstance(parsed.get(key), tf.SparseTensor):  # not padded already (rows_as_parsed)
                parsed[key] = to_dense_ids(parsed[key], width)
    if static_batch is not None:
        for name, t in parsed.items():
            if isinstance(t, tf.SparseTensor):
                t.set_shape([static_batch, None])
            elif t.shape.rank == 1:  # sequence lengths
                t.set_shape([static_batch])
            else:
                t.set_shape([static_batch, t.shape[1]])
    label = parsed.pop(manifest.label)
    return parsed, label


def _pipeline_of(input_context: Optional[tf.distribute.InputContext]) -> Tuple[int, int]:
    """(this input pipeline's index, the number of input pipelines); (0, 1) without a context."""
    if input_context is None:
        return 0, 1
    return int(input_context.input_pipeline_id), int(input_context.num_input_pipelines)


def _reads_own_files(main_files: List[str], pipelines: int, file_patterns: List[str]) -> bool:
    """Whether each of `pipelines` input pipelines gets files of its own (the whole-block files
    with blocks: the tail files hold a few rows each). Otherwise every pipeline reads every file
    and keeps its share of the batches: correct, at `pipelines` times the reading, so it is logged."""
    if pipelines <= 1 or len(main_files) >= pipelines:
        return True
    logging.warning(
        "input: %d file(s) of transformed examples in %s for %d input pipelines: every pipeline reads all "
        "of them and keeps every %d-th batch; to read each file on one host only, have preprocessing write "
        "at least %d files (its Beam write leaves the count to the runner: more workers write more files)",
        len(main_files), ", ".join(file_patterns), pipelines, pipelines, pipelines)
    return False


def _pipeline_share(unit: int, skip_batches: int, batch_size: int, pipelines: int) -> Tuple[int, int]:
    """(the rows a pipeline reads per step, the batches it skips) of the step's `unit` rows and the
    `skip_batches` per-replica batches of all pipelines: each feeds `pipelines`-th of the replicas."""
    if unit % (batch_size * pipelines):
        raise ValueError(f"input: global_batch {unit} is not batch_size {batch_size} x a multiple of the "
                         f"{pipelines} input pipelines; use a replica count that is a multiple of the pipelines")
    if skip_batches % pipelines:
        raise ValueError(f"input: skip_batches {skip_batches} is not a multiple of the {pipelines} input pipelines; "
                         "skip steps x replicas batches")
    return unit // pipelines, skip_batches // pipelines


def make_dataset(
    file_patterns: List[str],
    manifest: VocabularyManifest,
    batch_size: int,
    training: bool,
    seed: int = 0,
    skip_batches: int = 0,
    dense_id_widths: Optional[Dict[str, int]] = None,
    sequence_lengths: Optional[Dict[str, int]] = None,
    global_batch: Optional[int] = None,
    shuffle_rows: int = DEFAULT_SHUFFLE_ROWS,
    part: str = "all",
    holdout_fraction: float = 0.0,
    input_context: Optional[tf.distribute.InputContext] = None,
) -> tf.data.Dataset:
    """The batches of (features, label) of a split's transformed examples, in either layout.

    Training input repeats, shuffles (seeded) and has a static batch size. Files are read in
    parallel, INTERLEAVE_CYCLE at a time (a fixed cycle: the order does not depend on the host's
    cores); parsing is vectorised per batch and runs in parallel with training (AUTOTUNE). With a
    `global_batch` of several replicas, files are read and examples shuffled in units of it, so
    the replicas' consecutive batches of a step hold the examples one replica would get as that
    step's global batch.

    With P input pipelines (`input_context`), pipeline i reads the files i, i+P, ... of the sorted
    file list and yields the per-replica batches of its own replicas, in units of its share of the
    global batch; with fewer files than pipelines, every pipeline reads all files and keeps every
    P-th batch of the one stream (logged).

    Args:
      file_patterns: globs of the split's TFRecord files.
      manifest: the transformed data's manifest (features, label, layout).
      batch_size: rows per batch (per replica when distributed).
      training: repeat, shuffle and drop the last partial batch.
      seed: the shuffles' and the blocks' stream choice's seed.
      skip_batches: per-replica batches of all pipelines to fast-forward (steps x replicas): a
        resumed run continues where the killed run stopped; skipped batches are read, not parsed.
      dense_id_widths: {feature: width} fed as padded dense IDs (see the module docstring).
      sequence_lengths: {feature: max_sequence_length} whose row lengths come with the batch.
      global_batch: rows per step over all replicas; default `batch_size` x the replicas.
      shuffle_rows: the training shuffle buffer in rows (at least 16 global batches).
      part: `all` records, `train` (outside the held-out slice) or `holdout` (see `in_holdout`).
      holdout_fraction: the held-out slice's fraction of the train split.
      input_context: tf.distribute's InputContext; None is one pipeline.

    Returns:
      A dataset of (features, label): label float32 [batch, 1], dense features float32
      [batch, 1], IDs int64 SparseTensors [batch, None] (or [batch, width] with
      `dense_id_widths`), sequence lengths int32 [batch]; batch static when training.

    Raises:
      ValueError: no file matches, `part` is unknown, or the batches do not split evenly over
        the input pipelines.
    """
    select = _records_of(part, holdout_fraction)
    index, pipelines = _pipeline_of(input_context)
    unit = global_batch or batch_size * (input_context.num_replicas_in_sync if input_context else 1)
    build = _blocks_dataset if manifest.transformed_format == FORMAT_BLOCKS else _examples_dataset
    return build(file_patterns, manifest, batch_size, training, seed, skip_batches, dense_id_widths,
                 sequence_lengths, unit, shuffle_rows, select, (index, pipelines))


def _matching_files(file_patterns: List[str]) -> List[str]:
    """The files matching any of `file_patterns`, each once, sorted (the list pipelines split)."""
    return sorted({f for p in file_patterns for f in tf.io.gfile.glob(p)})


def _share_of_pipeline(
    groups: List[List[str]], main_files: List[str], shard: Tuple[int, int], unit: int, skip_batches: int,
    batch_size: int, file_patterns: List[str],
) -> Tuple[List[List[str]], int, int, int]:
    """This pipeline's files of each of `groups`, its rows per step and batches to skip, and
    `keep_every`: 1, or P where every pipeline reads every file and keeps every P-th batch of the
    one stream (`main_files` decide, `_reads_own_files`). `shard`: (index, P)."""
    index, pipelines = shard
    if pipelines > 1 and main_files and _reads_own_files(main_files, pipelines, file_patterns):
        unit, skip_batches = _pipeline_share(unit, skip_batches, batch_size, pipelines)
        return [g[index::pipelines] for g in groups], unit, skip_batches, 1
    return groups, unit, skip_batches, pipelines if pipelines > 1 else 1


def _file_names(files: List[str], training: bool, seed: int) -> tf.data.Dataset:
    """The file names to read, in a seeded order reshuffled every epoch when training."""
    names = tf.data.Dataset.from_tensor_slices(files)
    if training:
        names = names.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    return names


def _read_records(names: tf.data.Dataset, select, compression: str, block_length: Optional[int] = None
                  ) -> tf.data.Dataset:
    """The records `select` keeps of the files in `names`, INTERLEAVE_CYCLE files open at once,
    `block_length` consecutive records of a file per visit (None: one), in a deterministic order."""
    return names.interleave(
        lambda f: select(tf.data.TFRecordDataset(f, compression_type=compression)),
        cycle_length=INTERLEAVE_CYCLE,
        block_length=block_length,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )


def _this_pipelines_batches(ds: tf.data.Dataset, skip_batches: int, keep_every: int, index: int
                            ) -> tf.data.Dataset:
    """`ds` past its first `skip_batches`, every `keep_every`-th batch from `index` on: applied
    before parsing, so skipped batches and the other pipelines' batches are not parsed."""
    if skip_batches:
        ds = ds.skip(skip_batches)
    if keep_every > 1:
        ds = ds.shard(keep_every, index)
    return ds


def _examples_dataset(
    file_patterns: List[str],
    manifest: VocabularyManifest,
    batch_size: int,
    training: bool,
    seed: int,
    skip_batches: int,
    dense_id_widths: Optional[Dict[str, int]],
    sequence_lengths: Optional[Dict[str, int]],
    unit: int,
    shuffle_rows: int,
    select,
    shard: Tuple[int, int],
) -> tf.data.Dataset:
    """`make_dataset` over one transformed example per record; `unit` and `skip_batches` count all
    pipelines, `shard` is (this pipeline's index, the number of pipelines)."""
    static = batch_size if training else None
    files = _matching_files(file_patterns)
    if not files:
        raise ValueError(f"no transformed examples match {file_patterns}")
    compression = compression_type(files)
    (files,), unit, skip_batches, keep_every = _share_of_pipeline(
        [files], files, shard, unit, skip_batches, batch_size, file_patterns)
    shuffle_rows = max(int(shuffle_rows), 16 * unit)
    # A block of `unit` records at a time from each file: handing records over one by one through
    # the parallel interleave is several times slower.
    ds = _read_records(_file_names(files, training, seed), select, compression, block_length=unit)
    if training:
        ds = ds.shuffle(shuffle_rows, seed=seed, reshuffle_each_iteration=True).repeat()
    ds = ds.batch(batch_size, drop_remainder=training)
    ds = _this_pipelines_batches(ds, skip_batches, keep_every, shard[0])
    ds = ds.map(lambda s: parse_batch(s, manifest, static, dense_id_widths, sequence_lengths),
                num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


def _blocks_dataset(
    file_patterns: List[str],
    manifest: VocabularyManifest,
    batch_size: int,
    training: bool,
    seed: int,
    skip_batches: int,
    dense_id_widths: Optional[Dict[str, int]],
    sequence_lengths: Optional[Dict[str, int]],
    unit: int,
    shuffle_rows: int,
    select=None,
    shard: Tuple[int, int] = (0, 1),
) -> tf.data.Dataset:
    """`make_dataset` over blocks of rows (the `blocks` layout of contracts.manifest).

    A batch is `batch_size / block_rows` whole blocks, parsed together by one `parse_example`
    call: no per-row work in tf.data. The shorter last blocks of preprocessing's batches (the
    TAIL_PREFIX files, a few rows per 16,384) are parsed one by one and their rows re-cut into
    batches. Training draws each step's batches (the global batch, or this pipeline's share of it)
    from one stream or the other (seeded; in proportion to their bytes), so every replica of a
    step fed by this pipeline reads the same stream. The shuffle buffer holds as many rows as with
    examples (`shuffle_rows`), as blocks; preprocessing shuffled each block's rows within its batch.

    `shard` (this input pipeline's index, the number of pipelines P; `make_dataset`'s
    `input_context`): the whole-block files and the tail files are each split i, i+P, ... (a
    pipeline may get no tail file); `unit` and `skip_batches` count all pipelines. With fewer
    whole-block files than pipelines, every pipeline reads all files and keeps every P-th batch."""
    select = select or _ALL
    files = _matching_files(file_patterns)
    compression = compression_type(files)
    whole, tail = _whole_and_tail_files(files)
    (whole, tail), unit, skip_batches, keep_every = _share_of_pipeline(
        [whole, tail], whole or tail, shard, unit, skip_batches, batch_size, file_patterns)
    shuffle_rows = max(int(shuffle_rows), 16 * unit)
    per_batch = batch_size // manifest.block_rows if batch_size % manifest.block_rows == 0 else 0
    if not per_batch:  # a batch size that is no multiple of block_rows: every block re-cut (slower)
        tail, whole = sorted(whole + tail), []
    kept_tail_bytes = None
    if training and select is not _ALL:
        whole, tail, kept_tail_bytes = _without_emptied_streams(whole, tail, select, compression)
    streams = []
    if whole:
        blocks = _shuffled_blocks(whole, select, compression, training, seed, shuffle_rows, manifest.block_rows)
        streams.append(_whole_block_batches(blocks, manifest, per_batch, training))
    if tail:
        blocks = _shuffled_blocks(tail, select, compression, training, seed, shuffle_rows, manifest.block_rows)
        streams.append(_tail_row_batches(blocks, manifest, batch_size, training))
    if not streams:
        raise ValueError(f"no transformed examples match {file_patterns}")
    if len(streams) == 1:
        ds = streams[0]
    elif not training:
        ds = streams[0].concatenate(streams[1])
    else:
        ds = _drawn_per_step(streams, seed, _tail_share(whole, tail, kept_tail_bytes), max(1, unit // batch_size))
    ds = _this_pipelines_batches(ds, skip_batches, keep_every, shard[0])
    return _block_rows_as_inputs(ds, manifest, batch_size if training else None, dense_id_widths, sequence_lengths)


def _whole_and_tail_files(files: List[str]) -> Tuple[List[str], List[str]]:
    """(the whole-block files, the TAIL_PREFIX files) of `files`, each in the order of `files`."""
    is_tail = [os.path.basename(f).startswith(TAIL_PREFIX) for f in files]
    tail = [f for f, t in zip(files, is_tail) if t]
    whole = [f for f, t in zip(files, is_tail) if not t]
    return whole, tail


def _without_emptied_streams(whole: List[str], tail: List[str], select, compression: str
                             ) -> Tuple[List[str], List[str], Optional[int]]:
    """(whole, tail, kept_tail_bytes): the streams `select` leaves records in, and with both, the
    bytes it leaves of the tail (its share of the training draws; None otherwise).

    The held-out slice can take every record of a stream (the tail files hold one short block per
    preprocessing batch: a handful on small data), and an empty stream would end the endless
    training input the first time it is drawn. The tail files are small: read whole here."""
    records = lambda names: select(tf.data.TFRecordDataset(names, compression_type=compression))  # noqa: E731
    kept_tail_bytes = None
    if whole and next(records(whole).take(1).as_numpy_iterator(), None) is None:
        whole = []
    if tail and whole:
        kept_tail_bytes = sum(len(r) for r in records(tail).as_numpy_iterator())
        tail = tail if kept_tail_bytes else []
    elif tail and next(records(tail).take(1).as_numpy_iterator(), None) is None:
        tail = []
    return whole, tail, kept_tail_bytes


def _shuffled_blocks(names: List[str], select, compression: str, training: bool, seed: int, shuffle_rows: int,
                     block_rows: int) -> tf.data.Dataset:
    """The serialized blocks of the files `names`, one at a time from each file in turn; when
    training, shuffled (a buffer of `shuffle_rows` rows as blocks, at least 16) and repeated."""
    ds = _read_records(_file_names(names, training, seed), select, compression)
    if training:
        ds = ds.shuffle(max(16, -(-shuffle_rows // block_rows)), seed=seed, reshuffle_each_iteration=True).repeat()
    return ds


def _whole_block_batches(blocks: tf.data.Dataset, manifest: VocabularyManifest, per_batch: int, training: bool
                         ) -> tf.data.Dataset:
    """Batches of `per_batch` whole blocks, parsed by one `parse_example` call each, their rows
    flattened into one batch of parsed rows ({name: [rows] or [rows, None] RaggedTensor})."""
    spec = block_spec(manifest)
    return blocks.batch(per_batch, drop_remainder=training).map(
        lambda s: {k: v.merge_dims(0, 1) if v.ragged_rank > 1 else v.values
                   for k, v in tf.io.parse_example(s, spec).items()},
        num_parallel_calls=tf.data.AUTOTUNE)


def _tail_row_batches(blocks: tf.data.Dataset, manifest: VocabularyManifest, batch_size: int, training: bool
                      ) -> tf.data.Dataset:
    """The rows of `blocks` (parsed one block at a time) re-cut into batches of `batch_size`."""
    return (blocks.map(lambda s: parse_block(s, manifest), num_parallel_calls=tf.data.AUTOTUNE)
            .unbatch().batch(batch_size, drop_remainder=training))


def _tail_share(whole: List[str], tail: List[str], kept_tail_bytes: Optional[int]) -> float:
    """The tail stream's share of the bytes of both streams (`kept_tail_bytes`: what the held-out
    filter left of the tail, when it was counted)."""
    size = {f: tf.io.gfile.stat(f).length for f in tail + whole}
    tail_bytes = sum(size[f] for f in tail) if kept_tail_bytes is None else kept_tail_bytes
    whole_bytes = sum(size[f] for f in whole)
    return tail_bytes / max(1, tail_bytes + whole_bytes)


def _drawn_per_step(streams: List[tf.data.Dataset], seed: int, tail_share: float, per_step: int
                    ) -> tf.data.Dataset:
    """The training input of the whole-block and tail `streams`: one seeded draw per step (the
    tail with probability `tail_share`), repeated for its `per_step` per-replica batches (this
    pipeline's share of the global batch), so a step's replicas read the same stream."""
    choices = (tf.data.Dataset.random(seed=seed)
               .map(lambda r: tf.cast(r % 1_000_000 < int(tail_share * 1_000_000), tf.int64))
               .flat_map(lambda c: tf.data.Dataset.from_tensors(c).repeat(per_step)))
    return tf.data.Dataset.choose_from_datasets(streams, choices)
