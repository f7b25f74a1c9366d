"""The training input over several input pipelines (hosts; tf.distribute's InputContext), on a
hand-built transformed split of both formats (examples, and blocks with tail files):

- each pipeline reads only its own files (i, i+P, ... of the sorted list), together they read
  the split once, in the order of an interleave with the fixed cycle INTERLEAVE_CYCLE (a plain
  Python model of it: no term for the host's cores);
- a pipeline resumed at step k (`training_data.training_input`) with one tf.data thread on one
  CPU yields what the uninterrupted pipeline (default threads, all CPUs) yields from step k;
- with fewer files than pipelines, every pipeline reads all files and keeps every P-th batch of
  the one stream.

Every row carries its ID in the dense feature `d`.
"""
import os
from types import SimpleNamespace

import pytest

import components  # noqa: F401
import tensorflow as tf

from components.config.choices import FORMAT_BLOCKS, FORMAT_EXAMPLES
from components.contracts.manifest import (TAIL_PREFIX, TRANSFORMED_PREFIX, CategoricalFeatureEntry,
                                           DenseFeatureEntry, VocabularyManifest, row_lengths_key)
from components.embedding_model import input as input_lib
from components.embedding_trainer import training_data

PIPELINES = 2
FILES = PIPELINES * (input_lib.INTERLEAVE_CYCLE + 1)  # more files per pipeline than the cycle holds
ROWS = 5  # rows per examples file: more than one interleave block (2 rows) each
BLOCK, BLOCKS = 4, 2  # rows per block, whole blocks per blocks file
TAILS, TAIL_ROWS = 3, 2  # tail files (one short block each): pipeline 1 gets one, pipeline 0 two


def _floats(values):
    return tf.train.Feature(float_list=tf.train.FloatList(value=values))


def _ints(values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def _ids_of(row):
    return list(range(row % 3))  # 0-2 IDs per row


def _record(rows, block=False):
    """One transformed record of `rows`: a tf.Example of one row, or a block of rows (label and `d`
    one value per row, `c` the rows' IDs back to back with their row lengths)."""
    feature = {
        "label": _floats([float(r % 2) for r in rows]),
        "d": _floats([float(r) for r in rows]),
        "c": _ints([i for r in rows for i in _ids_of(r)]),
    }
    if block:
        feature[row_lengths_key("c")] = _ints([len(_ids_of(r)) for r in rows])
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _write(path, records):
    with tf.io.TFRecordWriter(str(path)) as w:
        for r in records:
            w.write(r)


def _manifest(fmt):
    return VocabularyManifest(
        vocabulary_dir="", label="label", raw_feature_kinds={},
        dense_features=(DenseFeatureEntry("d", "d", 0.0),),
        categorical_features=(CategoricalFeatureEntry("c", "c", "t", None, None),),
        vocabularies={}, transformed_format=fmt, block_rows=BLOCK if fmt == FORMAT_BLOCKS else 0)


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """{format: (manifest, directory, {file name: [blocks of row IDs]})}: FILES files named as
    preprocessing names them; blocks have TAILS tail files besides."""
    root = tmp_path_factory.mktemp("sharded")
    out = {}
    for fmt in (FORMAT_EXAMPLES, FORMAT_BLOCKS):
        d = root / fmt
        d.mkdir()
        files = {}
        for f in range(FILES):
            rows = [f * 100 + k for k in range(ROWS if fmt == FORMAT_EXAMPLES else BLOCK * BLOCKS)]
            step = 1 if fmt == FORMAT_EXAMPLES else BLOCK
            name = f"{TRANSFORMED_PREFIX}-{f:05d}-of-{FILES:05d}"
            files[name] = [rows[k:k + step] for k in range(0, len(rows), step)]
        if fmt == FORMAT_BLOCKS:
            for t in range(TAILS):
                files[f"{TAIL_PREFIX}-{t:05d}-of-{TAILS:05d}"] = [[10_000 + t * 100 + k for k in range(TAIL_ROWS)]]
        for name, blocks in files.items():
            _write(d / name, [_record(b, fmt == FORMAT_BLOCKS) for b in blocks])
        out[fmt] = (_manifest(fmt), d, files)
    return out


def _batches(ds, n=None):
    """The row IDs of each batch (of the first `n`)."""
    return [[int(v) for v in f["d"].numpy().ravel()] for f, _ in (ds.take(n) if n else ds)]


def _interleave(inputs, cycle, block):
    """tf.data's deterministic interleave in plain Python: `cycle` inputs open at once, visited
    in turn, `block` elements from each per visit; a finished input's slot takes the next input
    when its turn comes again."""
    pending, slots, out, at = [iter(x) for x in inputs], [None] * cycle, [], 0
    while pending or any(s is not None for s in slots):
        if slots[at] is None and pending:
            slots[at] = pending.pop(0)
        if slots[at] is not None:
            got = [e for _, e in zip(range(block), slots[at])]
            out += got
            if len(got) < block:
                slots[at] = None
        at = (at + 1) % cycle
    return out


def _own(files, i, count=PIPELINES):
    """Pipeline i's files: i, i+count, ... of the sorted whole-block (or examples) and tail files."""
    whole = sorted(n for n in files if not n.startswith(TAIL_PREFIX))
    tail = sorted(n for n in files if n.startswith(TAIL_PREFIX))
    return whole[i::count], tail[i::count]


@pytest.mark.parametrize("fmt", [FORMAT_EXAMPLES, FORMAT_BLOCKS])
def test_each_pipeline_reads_its_own_files_in_a_fixed_cycle_order(split, fmt):
    manifest, d, files = split[fmt]
    visit = 2 if fmt == FORMAT_EXAMPLES else BLOCK  # rows the interleave takes from a file in turn
    batch = visit if fmt == FORMAT_EXAMPLES else 2 * BLOCK  # one replica per pipeline
    seen = []
    for i in range(PIPELINES):
        ctx = tf.distribute.InputContext(PIPELINES, i, num_replicas_in_sync=PIPELINES)
        got = [r for b in _batches(input_lib.make_dataset([str(d / "*")], manifest, batch, training=False, input_context=ctx))
               for r in b]
        whole, tail = _own(files, i)
        if fmt == FORMAT_EXAMPLES:  # records in blocks of the pipeline's share of the global batch
            want = _interleave([[r for rec in files[n] for r in rec] for n in whole], input_lib.INTERLEAVE_CYCLE, batch)
        else:  # whole blocks one at a time, then the tail files' rows
            want = [r for b in _interleave([files[n] for n in whole], input_lib.INTERLEAVE_CYCLE, 1) for r in b]
            want += [r for b in _interleave([files[n] for n in tail], input_lib.INTERLEAVE_CYCLE, 1) for r in b]
        assert got == want
        seen.append(got)
    every = sorted(r for blocks in files.values() for b in blocks for r in b)
    assert set(seen[0]).isdisjoint(seen[1]) and sorted(seen[0] + seen[1]) == every
    # the cycle shows in the order: the second visit reads another file (with one file open at a
    # time, as AUTOTUNE's cycle on a 2-core host, it would read on in the first)
    assert len({r // 100 for r in seen[0][:2 * visit]}) == 2


def _stand_ins():
    """What training_input reads of the plan (no padded or sequence features) and the config."""
    return SimpleNamespace(features={}, tables={}), SimpleNamespace(seed=5, shuffle_buffer_rows=64)


def _on_one_cpu_and_thread(build):
    """The batches of `build(options)`'s (dataset, count), built and read with one tf.data thread
    on one CPU: a host of another shape. (AUTOTUNE's cycle follows the CPUs the building thread may
    use: on 4 or more CPUs one CPU changes it; on 2 it is 1 either way, and the fixed-cycle order
    test above is the check there.)"""
    cpus = os.sched_getaffinity(0)
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    try:
        os.sched_setaffinity(0, {min(cpus)})
        return _batches(*build(options))
    finally:
        os.sched_setaffinity(0, cpus)


@pytest.mark.parametrize("fmt", [FORMAT_EXAMPLES, FORMAT_BLOCKS])
def test_a_pipeline_resumed_on_a_host_of_another_shape_continues_at_its_next_batch(split, fmt):
    """Four replicas on two pipelines, two batches per pipeline per step: pipeline 1 resumed at
    step 5, with one tf.data thread on one CPU, yields the batches the uninterrupted pipeline
    (default threads, every CPU) yields from its 11th on, all from its own files."""
    manifest, d, files = split[fmt]
    plan, t = _stand_ins()
    replicas, per_replica, start = 4, 4, 5
    fn = lambda s, r=replicas: training_data.training_input([str(d / "*")], manifest, plan, t, per_replica, s, r)  # noqa: E731
    local = replicas // PIPELINES
    ctx = tf.distribute.InputContext(PIPELINES, 1, num_replicas_in_sync=replicas)
    whole = _batches(fn(0)(ctx), local * (start + 3))
    resumed = _on_one_cpu_and_thread(lambda options: (fn(start)(ctx).with_options(options), local * 3))
    assert resumed == whole[local * start:]
    own = {r for n in sum(_own(files, 1), []) for b in files[n] for r in b}
    assert all(len(b) == per_replica and set(b) <= own for b in whole)
    assert len({tuple(b) for b in whole}) > 1  # the comparison can tell batches apart
    with pytest.raises(ValueError, match="global_batch 12 is not batch_size 4 x a multiple of the 2 input pipelines"):
        fn(0, 3)(tf.distribute.InputContext(PIPELINES, 0, num_replicas_in_sync=3))


@pytest.mark.parametrize("fmt", [FORMAT_EXAMPLES, FORMAT_BLOCKS])
def test_with_fewer_files_than_pipelines_each_keeps_every_pth_batch(split, fmt, caplog):
    """One file (and one tail file), two pipelines of one replica: pipeline 1 resumed at step 3
    gets the batches 7, 9, ... (from 0) of the one stream, and the fallback is logged."""
    manifest, d, _ = split[fmt]
    pattern = [str(d / "*-00000-of-*")]
    batch, start = 4, 3

    def stream(ctx=None, skip=0, n=8):
        return _batches(input_lib.make_dataset(pattern, manifest, batch, training=True, seed=2, global_batch=batch * PIPELINES,
                                       skip_batches=skip, input_context=ctx), n)

    one = stream(n=PIPELINES * (start + 4))
    ctx = tf.distribute.InputContext(PIPELINES, 1, num_replicas_in_sync=PIPELINES)
    assert stream(ctx, skip=start * PIPELINES, n=4) == one[start * PIPELINES + 1::PIPELINES]
    assert len({tuple(b) for b in one}) > 1
    assert "1 file(s) of transformed examples" in caplog.text and "for 2 input pipelines" in caplog.text
