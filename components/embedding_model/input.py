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

import os
from typing import Any, Dict, List, Optional, Tuple

import components  # noqa: F401
import tensorflow as tf
from absl import logging

from components.contracts.manifest import (
    FORMAT_BLOCKS, TAIL_PREFIX, VocabularyManifest, row_lengths_key, weights_key,
)

PAD_ID = -1  # padding of dense ID rows; TensorCoreTable and the TPU-rules check skip it
LENGTH_SUFFIX = "__length"  # a sequence feature's positions per row, computed on the host


# The training shuffle buffer's default, in rows (`training.shuffle_buffer_rows`). Transformed rows
# keep the input's order (files are read in byte ranges, written where they were read), and real
# input is often ordered by time: with 4,096 rows (16 batches) a date-ordered public dataset
# (flights, 262k train rows) reached eval AUC 0.7456, with 65,536 rows 0.7889, and 0.7851 with
# its rows shuffled in the CSV itself (bench/README.md "Defaults on real data"). About 10 MB of
# serialized rows for the demo's features.
DEFAULT_SHUFFLE_ROWS = 65_536

# The train split's held-out slice (training.early_stopping): records whose content key falls in
# the first `fraction` of HOLDOUT_BUCKETS buckets. A record is a row or a block of rows. The key
# reads the record's content, not its bytes: a tf.Example's bytes are not canonical (the encoder
# writes the feature map in an order that differs between processes: the same blocks written by
# two pipeline runs had other bytes), so the slice is the same for the same transformed rows
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


def holdout_buckets(fraction: float) -> int:
    """How many of HOLDOUT_BUCKETS buckets the held-out slice takes."""
    return int(round(float(fraction) * HOLDOUT_BUCKETS))


def record_keys(records: tf.Tensor) -> tf.Tensor:
    """int64 per serialized tf.Example ([n]): the sum (wrapping) of the Fingerprint64 buckets of
    its feature map's entries (each entry's bytes: the name and its values, which the writer
    encodes one way), so the same content gives the same key in any map order. Stock ops only:
    `decode_proto` of tensorflow.Example, then of tensorflow.Features."""
    top = tf.io.decode_proto(records, "tensorflow.Example", ["features"], [tf.string])
    # one `features` per record; a record without it (padded to "" here) has no entries
    features = tf.reshape(tf.pad(top.values[0], [[0, 0], [0, 1]])[:, :1], [-1])
    entries = tf.io.decode_proto(features, "tensorflow.Features", ["feature"], [tf.string])
    hashes = tf.strings.to_hash_bucket_fast(entries.values[0], 1 << 62)
    present = tf.sequence_mask(entries.sizes[:, 0], tf.shape(hashes)[1])  # not the batch's padding
    return tf.reduce_sum(tf.where(present, hashes, tf.zeros_like(hashes)), axis=1)


def in_holdout(records: tf.Tensor, fraction: float) -> tf.Tensor:
    """bool per serialized record ([n]): whether it is in the train split's held-out slice."""
    return tf.math.floormod(record_keys(records), HOLDOUT_BUCKETS) < holdout_buckets(fraction)


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


def length_key(feature: str) -> str:
    """Where a sequence feature's [batch] int32 lengths (IDs per row, at most its length) travel."""
    return feature + LENGTH_SUFFIX


def feature_spec(manifest: VocabularyManifest) -> Dict[str, Any]:
    spec: Dict[str, Any] = {manifest.label: tf.io.FixedLenFeature([1], tf.float32)}
    for name in manifest.dense_names:
        spec[name] = tf.io.FixedLenFeature([1], tf.float32)
    for name in manifest.categorical_names:
        spec[name] = tf.io.VarLenFeature(tf.int64)
    for name in manifest.weighted_names:  # W1: one weight per ID, the same positions
        spec[weights_key(name)] = tf.io.VarLenFeature(tf.float32)
    return spec


def to_dense_ids(ids: tf.SparseTensor, width: int) -> tf.Tensor:
    """[batch, width] int64 IDs, each row's first `width` IDs, PAD_ID after them (float weights:
    0 after them)."""
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
    """(features, label) of a batch of serialized examples. With `static_batch`, every tensor,
    SparseTensors included (parse_example leaves their dense shape unknown), gets that static batch
    dimension, as the TPU step requires. Features named in `dense_id_widths` come as padded dense
    IDs of that width. Features named in `sequence_lengths` ({feature: max_sequence_length}) also
    get `length_key(feature)`: each row's positions, a dense [batch] tensor the model masks with
    (computed here, on the host: sparse ops have no place in a TPU step)."""
    return model_inputs(tf.io.parse_example(serialized, feature_spec(manifest)), manifest, static_batch,
                        dense_id_widths, sequence_lengths)


def block_spec(manifest: VocabularyManifest) -> Dict[str, Any]:
    """The parse spec of one block of transformed rows (the `blocks` layout of contracts.manifest):
    label and dense values one per row, each categorical feature (and its weights) ragged by its
    row lengths."""
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
    """One serialized block -> {name: [rows] values (label, dense) or [rows, None] RaggedTensor}."""
    return tf.io.parse_single_example(serialized, block_spec(manifest))


def rows_as_parsed(
    rows: Dict[str, Any],
    manifest: VocabularyManifest,
    dense_id_widths: Optional[Dict[str, int]] = None,
    sequence_lengths: Optional[Dict[str, int]] = None,
) -> Dict[str, Any]:
    """A batch of rows parsed from blocks -> what `model_inputs` takes: [batch, 1] label and dense
    values, SparseTensors of IDs; the features of `dense_id_widths` already padded and the lengths
    of `sequence_lengths` already counted, straight from the ragged rows (cheaper than through a
    SparseTensor; the same values, tests/test_transformed_blocks.py)."""
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
    """Parsed transformed rows (label and dense values [batch, 1], IDs as SparseTensors) ->
    (features, label) as the model reads them (see `parse_batch`)."""
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
    """Batches of (features, label). `batch_size` is per replica when distributed. Training input
    repeats, shuffles (seeded) and has a static batch size; `skip_batches` fast-forwards a resumed
    run to where the killed run stopped (the same batch order as an uninterrupted run; skipped
    batches are read but not parsed). Files are read in parallel, INTERLEAVE_CYCLE at a time (a
    fixed cycle: the order does not depend on the host's cores), parsing is vectorised per batch
    (`tf.io.parse_example`) and runs in parallel with training (AUTOTUNE). `dense_id_widths`:
    features fed as padded dense IDs (see the module docstring); `sequence_lengths`: sequence
    features whose row lengths come with the batch (`parse_batch`). `global_batch` (several
    replicas, `batch_size` per replica): files are read and examples shuffled in units of the
    global batch, so the replicas' consecutive batches of a step hold the examples one replica
    would get as that step's global batch. `shuffle_rows`: the training shuffle buffer, in rows
    (at least 16 global batches; `training.shuffle_buffer_rows`). `part` with `holdout_fraction`:
    every record (`all`), those outside the train split's held-out slice (`train`) or the slice
    itself (`holdout`; see `in_holdout`).

    `input_context` (tf.distribute's InputContext) with P input pipelines: this pipeline (index
    i) reads the files i, i+P, ... of the sorted file list and yields the per-replica batches of
    its own replicas, in units of its share of the global batch (`global_batch` / P; default
    `batch_size` x the context's replicas); `global_batch` and `skip_batches` still count all
    replicas (steps x replicas), and the pipeline skips its share. With fewer files than pipelines,
    every pipeline reads all files and keeps every P-th batch of the one stream (logged). One
    pipeline (or none) is the single stream above."""
    from components.data_io.tfrecords import compression_type

    select = _records_of(part, holdout_fraction)
    index, pipelines = _pipeline_of(input_context)
    unit = global_batch or batch_size * (input_context.num_replicas_in_sync if input_context else 1)
    if manifest.transformed_format == FORMAT_BLOCKS:
        return _blocks_dataset(file_patterns, manifest, batch_size, training, seed, skip_batches,
                               dense_id_widths, sequence_lengths, unit, shuffle_rows, select, (index, pipelines))
    static = batch_size if training else None
    files = sorted({f for p in file_patterns for f in tf.io.gfile.glob(p)})
    if not files:
        raise ValueError(f"no transformed examples match {file_patterns}")
    compression = compression_type(files)
    keep_every = 1  # with fewer files than pipelines: this pipeline's batches of the one stream
    if pipelines > 1 and _reads_own_files(files, pipelines, file_patterns):
        files = files[index::pipelines]
        unit, skip_batches = _pipeline_share(unit, skip_batches, batch_size, pipelines)
    elif pipelines > 1:
        keep_every = pipelines
    shuffle_rows = max(int(shuffle_rows), 16 * unit)
    names = tf.data.Dataset.from_tensor_slices(files)
    if training:
        names = names.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    # Files are read in parallel, a block of `unit` records at a time from each: measured on the
    # trainer benchmark's data, TFRecordDataset(num_parallel_reads=AUTOTUNE) hands records over
    # one by one through the parallel interleave and read 36k records/s; blocks read 220k/s.
    ds = names.interleave(
        lambda f: select(tf.data.TFRecordDataset(f, compression_type=compression)),
        cycle_length=INTERLEAVE_CYCLE,
        block_length=unit,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    if training:
        ds = ds.shuffle(shuffle_rows, seed=seed, reshuffle_each_iteration=True).repeat()
    ds = ds.batch(batch_size, drop_remainder=training)
    if skip_batches:
        ds = ds.skip(skip_batches)
    if keep_every > 1:
        ds = ds.shard(keep_every, index)  # before parsing: the other pipelines' batches are not parsed
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
    step fed by this pipeline reads the same stream. The shuffle buffer holds
    as many rows as with examples (`shuffle_rows`), as blocks, and the rows of each block were
    shuffled within their batch by preprocessing. With a batch size that is no multiple of
    `block_rows`, every block takes the re-cut path (correct, slower).

    `shard` (this input pipeline's index, the number of pipelines P; `make_dataset`'s
    `input_context`): the whole-block files and the tail files are each split i, i+P, ... (a
    pipeline may get no tail file); `unit` and `skip_batches` count all pipelines. With fewer
    whole-block files than pipelines, every pipeline reads all files and keeps every P-th batch."""
    from components.data_io.tfrecords import compression_type

    select = select or _ALL
    index, pipelines = shard
    files = sorted({f for p in file_patterns for f in tf.io.gfile.glob(p)})
    compression = compression_type(files)
    is_tail = [os.path.basename(f).startswith(TAIL_PREFIX) for f in files]
    tail = [f for f, t in zip(files, is_tail) if t]
    whole = [f for f, t in zip(files, is_tail) if not t]
    keep_every = 1  # with fewer files than pipelines: this pipeline's batches of the one stream
    if pipelines > 1 and files and _reads_own_files(whole or tail, pipelines, file_patterns):
        whole, tail = whole[index::pipelines], tail[index::pipelines]
        unit, skip_batches = _pipeline_share(unit, skip_batches, batch_size, pipelines)
    elif pipelines > 1:
        keep_every = pipelines
    shuffle_rows = max(int(shuffle_rows), 16 * unit)
    per_batch = batch_size // manifest.block_rows if batch_size % manifest.block_rows == 0 else 0
    if not per_batch:
        tail, whole = sorted(whole + tail), []
    kept_tail_bytes = None
    if training and select is not _ALL:
        # The held-out slice can take every record of a stream (the tail files hold one short
        # block per preprocessing batch: a handful on small data). An empty stream would end the
        # endless training input the first time it is drawn, so it is left out; with both
        # streams, the tail's share of the draws is the bytes the filter leaves of it (the tail
        # files are small: read whole here).
        records = lambda names: select(tf.data.TFRecordDataset(names, compression_type=compression))  # noqa: E731
        if whole and next(records(whole).take(1).as_numpy_iterator(), None) is None:
            whole = []
        if tail and whole:
            kept_tail_bytes = sum(len(r) for r in records(tail).as_numpy_iterator())
            tail = tail if kept_tail_bytes else []
        elif tail and next(records(tail).take(1).as_numpy_iterator(), None) is None:
            tail = []
    static = batch_size if training else None
    to_inputs = lambda p: model_inputs(  # noqa: E731
        rows_as_parsed(p, manifest, dense_id_widths, sequence_lengths), manifest, static, dense_id_widths,
        sequence_lengths)

    def blocks(names: List[str]) -> tf.data.Dataset:
        ds = tf.data.Dataset.from_tensor_slices(names)
        if training:
            ds = ds.shuffle(len(names), seed=seed, reshuffle_each_iteration=True)
        ds = ds.interleave(lambda f: select(tf.data.TFRecordDataset(f, compression_type=compression)),
                           cycle_length=INTERLEAVE_CYCLE, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        if training:
            ds = ds.shuffle(max(16, -(-shuffle_rows // manifest.block_rows)), seed=seed,
                            reshuffle_each_iteration=True).repeat()
        return ds

    streams = []
    if whole:
        spec = block_spec(manifest)
        streams.append(
            blocks(whole).batch(per_batch, drop_remainder=training)
            .map(lambda s: {k: v.merge_dims(0, 1) if v.ragged_rank > 1 else v.values
                            for k, v in tf.io.parse_example(s, spec).items()},
                 num_parallel_calls=tf.data.AUTOTUNE)
        )
    if tail:
        streams.append(
            blocks(tail).map(lambda s: parse_block(s, manifest), num_parallel_calls=tf.data.AUTOTUNE)
            .unbatch().batch(batch_size, drop_remainder=training)
        )
    if not streams:
        raise ValueError(f"no transformed examples match {file_patterns}")
    if len(streams) == 1:
        ds = streams[0]
    elif not training:
        ds = streams[0].concatenate(streams[1])
    else:
        # One choice per step (this pipeline's share of the global batch), repeated for its
        # per-replica batches.
        size = {f: tf.io.gfile.stat(f).length for f in tail + whole}
        tail_bytes = sum(size[f] for f in tail) if kept_tail_bytes is None else kept_tail_bytes
        whole_bytes = sum(size[f] for f in whole)
        tail_share = tail_bytes / max(1, tail_bytes + whole_bytes)
        per_step = max(1, unit // batch_size)
        choices = (tf.data.Dataset.random(seed=seed)
                   .map(lambda r: tf.cast(r % 1_000_000 < int(tail_share * 1_000_000), tf.int64))
                   .flat_map(lambda c: tf.data.Dataset.from_tensors(c).repeat(per_step)))
        ds = tf.data.Dataset.choose_from_datasets(streams, choices)
    if skip_batches:
        ds = ds.skip(skip_batches)
    if keep_every > 1:
        ds = ds.shard(keep_every, index)  # before the rows become model inputs
    return ds.map(to_inputs, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
