"""Exporter: trained tables read back exactly from layouts A, B (SparseCore) and C (host partitions).

Layout-B checkpoints are built from known tables with TensorFlow's own SparseCore code (stacking:
`_pywrap_tpu_embedding.stack_tables`; row placement: `tpu_embedding_v3_utils.map_indices_in_shard`;
the record: `sparse_core_layout_pb2`) and, where the record is present, the recovered tables are
cross-checked against TensorFlow's own `TPUEmbeddingForServing` restore and its
`unshuffle_from_sc_to_cpu` / `remove_padding_from_sc`. Layout-C checkpoints are written by
TensorFlow 1 partitioned variables and checked against TensorFlow's partitioned `embedding_lookup`
with the same `partition_strategy`.
"""
from __future__ import annotations

import os

import components  # noqa: F401
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.tpu.kernels import sparse_core_layout_pb2
from tensorflow.python.tpu import tpu_embedding_v3_utils

from components.config.schema import ExportLayoutConfig

from components.embedding_model import layouts as layouts_lib
from components.embedding_model.sparsecore_layout import recompute_sparse_core_layouts, stacked_variables
from components.planning.derivation import hand_built_plan
from components.contracts.plan import CheckpointLayout
from components.planning.fitting import with_run


def _plan(tables, topology=(2, 4), batch=64):
    """tables: {name: (rows, dim, placement)}; one feature per table, named f_<table>."""
    return hand_built_plan(tables, global_batch_size=batch, num_chips=topology[0],
                                    sparse_cores_per_chip=topology[1],
                                    optimizer={"name": "adagrad", "learning_rate": 0.1})


def _known(rows, dim, seed):
    return np.random.default_rng(seed).normal(size=(rows, dim)).astype(np.float32)


def _write_b(tmp_path, values, layouts, with_record):
    emb = tf.train.Checkpoint()
    for stacked, value in stacked_variables(values, layouts).items():
        setattr(emb, stacked, tf.Variable(value))
    if with_record:
        record = sparse_core_layout_pb2.SparseCoreTableLayouts(tables=list(layouts.values()))
        setattr(emb, layouts_lib.SPARSECORE_LAYOUTS_KEY, tf.Variable(record.SerializeToString()))
    root = tf.train.Checkpoint(model=tf.train.Checkpoint(embedding_layer=tf.train.Checkpoint(_tpu_embedding=emb)))
    return root.write(os.path.join(str(tmp_path), "ckpt"))


TABLES_B = {  # several dims (so several stacks), uneven row counts, one table smaller than 8 x N
    "users": (1000, 16, "tpu_embedding"),
    "items": (357, 16, "tpu_embedding"),
    "tags": (50, 8, "tpu_embedding"),
    "cats": (77, 12, "tpu_embedding"),
    "ads": (2049, 8, "tpu_embedding"),
}


def _b_layouts(plan, replicas, per_chip):
    tables = [
        {"name": n, "rows": t.rows, "dim": t.dim, "group": "adagrad", "samples": 32}
        for n, t in sorted(plan.tables.items())
    ]
    return recompute_sparse_core_layouts(tables, replicas, per_chip)


@pytest.mark.parametrize("replicas,per_chip", [(1, 4), (2, 4), (4, 2)])
def test_layout_b_with_record_recovers_tables_exactly(tmp_path, replicas, per_chip):
    plan = _plan(TABLES_B, (replicas, per_chip))
    values = {n: _known(t[0], t[1], i) for i, (n, t) in enumerate(TABLES_B.items())}
    layouts = _b_layouts(plan, replicas, per_chip)
    stacks = {l.stacked_table_name for l in layouts.values()}
    assert len(stacks) >= 2  # dims 16 and 12 (padded to 16) stack apart from dim 8
    # Rotations are sparse_cores_per_chip x (index in stack): a real shift once N > per_chip.
    assert any(l.sparse_core_shard_rotation % (replicas * per_chip) for l in layouts.values()) == (replicas > 1)
    path = _write_b(tmp_path, values, layouts, with_record=True)

    tables = layouts_lib.CheckpointTables(path, plan)
    assert {s.kind for s in tables.sources.values()} == {"B"}
    assert all("record" in s.source for s in tables.sources.values())
    reader = tf.train.load_checkpoint(path)
    for name, want in values.items():
        got = tables.read(name)
        np.testing.assert_array_equal(got, want)
        # TensorFlow's own inverse on the whole stacked variable agrees.
        layout = layouts[name]
        stacked = reader.get_tensor(layouts_lib.TPU_PREFIX + layout.stacked_table_name + layouts_lib.ATTR)
        tf_table = tpu_embedding_v3_utils.remove_padding_from_sc(
            tpu_embedding_v3_utils.unshuffle_from_sc_to_cpu(
                tf.constant(stacked), layout.num_sparse_cores, layout.sparse_core_shard_row_offset,
                layout.unsharded_padded_shape[0] // layout.num_sparse_cores, layout.sparse_core_shard_rotation,
            ),
            tuple(layout.unsharded_shape),
        )
        np.testing.assert_array_equal(got, tf_table.numpy())


def test_layout_b_matches_tensorflows_own_serving_restore(tmp_path):
    plan = _plan(TABLES_B, (2, 4))
    values = {n: _known(t[0], t[1], 10 + i) for i, (n, t) in enumerate(TABLES_B.items())}
    layouts = _b_layouts(plan, 2, 4)
    path = _write_b(tmp_path, values, layouts, with_record=True)
    configs = {
        n: tf.tpu.experimental.embedding.TableConfig(vocabulary_size=r, dim=d, name=n) for n, (r, d, _) in TABLES_B.items()
    }
    features = {f"f_{n}": tf.tpu.experimental.embedding.FeatureConfig(table=c) for n, c in configs.items()}
    mid = tf.tpu.experimental.embedding.TPUEmbeddingForServing(features, optimizer=None)
    tf.train.Checkpoint(model=tf.train.Checkpoint(embedding_layer=tf.train.Checkpoint(_tpu_embedding=mid))).restore(path)
    mid.build()  # TensorFlow restores the stacked tables from the record at creation
    ours = layouts_lib.CheckpointTables(path, plan)
    for config, var in mid.embedding_tables.items():
        np.testing.assert_array_equal(ours.read(config.name), var.numpy())
        np.testing.assert_array_equal(var.numpy(), values[config.name])


def test_layout_b_without_record_is_recomputed_from_the_topology(tmp_path):
    plan = _plan(TABLES_B, (2, 4), batch=64)
    # The recompute's inputs: per-replica batch 32 per feature (64 over 2 replicas), as written here.
    values = {n: _known(t[0], t[1], 20 + i) for i, (n, t) in enumerate(TABLES_B.items())}
    tables_in = []
    for fname in sorted(plan.features):
        n = plan.features[fname].table
        tables_in.append({"name": n, "rows": TABLES_B[n][0], "dim": TABLES_B[n][1], "samples": 32,
                          "group": '{"learning_rate": 0.1, "name": "adagrad"}'})
    layouts = recompute_sparse_core_layouts(tables_in, 2, 4)
    path = _write_b(tmp_path, values, layouts, with_record=False)
    tables = layouts_lib.CheckpointTables(path, plan)
    assert all("recomputed" in s.source for s in tables.sources.values())
    for name, want in values.items():
        np.testing.assert_array_equal(tables.read(name), want)
    # The wrong topology gives other stacks/padding: refused, not misread.
    wrong = _plan(TABLES_B, (4, 4), batch=64)
    with pytest.raises(layouts_lib.LayoutError, match="layout inconsistent.*topology"):
        layouts_lib.CheckpointTables(path, wrong)


def test_a_sparse_core_override_that_contradicts_the_runs_record_is_refused(tmp_path):
    """A lone 2^k table is padded alike for 8 and 16 SparseCores: read with the override 16, a
    2-replica x 4 checkpoint has the same stacked shape but its rows permuted. The override is
    checked against the run's record (the plan's checkpoint_layout) and refused naming both; one
    that agrees with it, or one without a record, is used."""
    tables = {"hashed": (1024, 16, "tpu_embedding")}
    plan = _plan(tables, (2, 4), batch=64)
    values = {"hashed": _known(1024, 16, 7)}
    path = _write_b(tmp_path, values, _b_layouts(plan, 2, 4), with_record=False)
    wrong = _b_layouts(plan, 4, 4)["hashed"]
    assert list(wrong.unsharded_padded_shape) == list(_b_layouts(plan, 2, 4)["hashed"].unsharded_padded_shape)
    recorded = with_run(plan, checkpoint_layout=CheckpointLayout(kind="B", num_replicas=2, sparse_cores_per_chip=4,
                                                                 per_replica_batch_size=32))
    with pytest.raises(layouts_lib.LayoutError, match=r"num_sparse_cores 16 contradicts .*recorded 2 replicas x 4 "
                                                      r"SparseCores per chip .*: 8 SparseCores"):
        layouts_lib.CheckpointTables(path, recorded, ExportLayoutConfig(num_sparse_cores=16))
    with pytest.raises(layouts_lib.LayoutError, match=r"sparse_cores_per_chip 2 contradicts"):
        layouts_lib.CheckpointTables(path, recorded, ExportLayoutConfig(sparse_cores_per_chip=2))
    agreeing = layouts_lib.CheckpointTables(path, recorded, ExportLayoutConfig(num_sparse_cores=8))
    np.testing.assert_array_equal(agreeing.read("hashed"), values["hashed"])
    # without a record the override is what there is: 16 reads the rows permuted (why the record wins)
    unrecorded = layouts_lib.CheckpointTables(path, plan, ExportLayoutConfig(num_sparse_cores=16))
    assert not np.array_equal(unrecorded.read("hashed"), values["hashed"])


def test_layout_b_handmade_rotation_and_offsets(tmp_path):
    """A layout not produced by the stacking rules (rotation 3, table second in its stack)."""
    n = 4
    a, b = _known(30, 8, 1), _known(45, 8, 2)
    la = sparse_core_layout_pb2.SparseCoreTableLayout(
        table_name="a", stacked_table_name="b_a", num_sparse_cores=n, num_partitions=1,
        total_rows_per_sparse_core_shard=(48 + 32) // n, unsharded_shape=[30, 8], unsharded_padded_shape=[32, 8],
        sparse_core_shard_row_offset=48 // n, sparse_core_shard_rotation=3,
    )
    lb = sparse_core_layout_pb2.SparseCoreTableLayout(
        table_name="b", stacked_table_name="b_a", num_sparse_cores=n, num_partitions=1,
        total_rows_per_sparse_core_shard=(48 + 32) // n, unsharded_shape=[45, 8], unsharded_padded_shape=[48, 8],
        sparse_core_shard_row_offset=0, sparse_core_shard_rotation=0,
    )
    path = _write_b(tmp_path, {"a": a, "b": b}, {"a": la, "b": lb}, with_record=True)
    plan = _plan({"a": (30, 8, "tpu_embedding"), "b": (45, 8, "tpu_embedding")}, (1, 4))
    tables = layouts_lib.CheckpointTables(path, plan)
    np.testing.assert_array_equal(tables.read("a"), a)
    np.testing.assert_array_equal(tables.read("b"), b)
    # A record whose table disagrees with the plan's vocabulary is refused.
    bad = _plan({"a": (31, 8, "tpu_embedding"), "b": (45, 8, "tpu_embedding")}, (1, 4))
    with pytest.raises(layouts_lib.LayoutError, match="'a'.*unsharded shape"):
        layouts_lib.CheckpointTables(path, bad)


@pytest.mark.parametrize("strategy", ["div", "mod"])
@pytest.mark.parametrize("rows,parts", [(103, 4), (64, 8), (5, 3)])
def test_layout_c_sliced_key_matches_tensorflows_partitioned_lookup(tmp_path, strategy, rows, parts):
    dim, key = 6, "input_layer/t_embedding/embedding_weights"
    want = _known(rows, dim, rows + parts)
    graph = tf.Graph()
    with graph.as_default():
        var = tf.compat.v1.get_variable(
            key, shape=[rows, dim], partitioner=tf.compat.v1.fixed_size_partitioner(parts),
            initializer=tf.compat.v1.zeros_initializer(),
        )
        pieces = list(var)
        sizes = layouts_lib.div_partition_sizes(rows, parts)
        assert [p.shape[0] for p in pieces] == sizes
        starts = np.cumsum([0] + sizes)
        ids = tf.constant(np.arange(rows), tf.int64)
        lookup = tf.compat.v1.nn.embedding_lookup(pieces, ids, partition_strategy=strategy)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            # Train-time semantics: place logical rows where TensorFlow's lookup will find them.
            for i, p in enumerate(pieces):
                sess.run(p.assign(want[i::parts] if strategy == "mod" else want[starts[i]: starts[i + 1]]))
            np.testing.assert_array_equal(sess.run(lookup), want)
            path = tf.compat.v1.train.Saver().save(sess, os.path.join(str(tmp_path), "model.ckpt"))
    plan = _plan({"t": (rows, dim, "tpu_embedding")})
    opts = ExportLayoutConfig(partition_strategy=strategy, num_partitions=parts, table_keys={"t": key})
    tables = layouts_lib.CheckpointTables(path, plan, opts)
    assert tables.sources["t"].kind == "C"
    np.testing.assert_array_equal(tables.read("t"), want)
    if strategy == "mod" and parts > 1 and rows > parts:
        # Reading the saved tensor as one table (what a layout-unaware exporter does) is wrong for mod.
        assert not np.array_equal(tf.train.load_checkpoint(path).get_tensor(key), want)


@pytest.mark.parametrize("strategy", ["div", "mod"])
def test_layout_c_partition_keys(tmp_path, strategy):
    rows, dim, parts = 103, 4, 4
    want = _known(rows, dim, 5)
    sizes = layouts_lib.div_partition_sizes(rows, parts)
    starts = np.cumsum([0] + sizes)
    blocks = [want[i::parts] if strategy == "mod" else want[starts[i]: starts[i + 1]] for i in range(parts)]
    base = layouts_lib.table_key("t", "tpu_embedding")[: -len(layouts_lib.ATTR)]
    prefix = os.path.join(str(tmp_path), "ckpt")
    names = [f"{base}/part_{i}{layouts_lib.ATTR}" for i in range(parts)]
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * parts, tensors=[tf.constant(b) for b in blocks])
    plan = _plan({"t": (rows, dim, "tpu_embedding")})
    tables = layouts_lib.CheckpointTables(prefix, plan, ExportLayoutConfig(partition_strategy=strategy))
    np.testing.assert_array_equal(tables.read("t"), want)
    with pytest.raises(layouts_lib.LayoutError, match="partition_strategy"):
        layouts_lib.CheckpointTables(prefix, plan)  # the strategy cannot be read from the checkpoint
    # Uneven partitions that no strategy produces are an inconsistent layout.
    odd = os.path.join(str(tmp_path), "odd")
    tf.raw_ops.SaveV2(prefix=odd, tensor_names=names[:2], shape_and_slices=["", ""],
                      tensors=[tf.constant(want[:100]), tf.constant(want[100:])])
    with pytest.raises(layouts_lib.LayoutError, match="inconsistent layout"):
        layouts_lib.CheckpointTables(odd, plan, ExportLayoutConfig(partition_strategy=strategy))


def test_layout_a_and_refusals(tmp_path):
    users, small = _known(40, 8, 1), _known(5, 8, 2)
    prefix = os.path.join(str(tmp_path), "ckpt")
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=[layouts_lib.table_key("users", "tpu_embedding"), layouts_lib.table_key("small", "tensor_core")],
        shape_and_slices=["", ""], tensors=[tf.constant(users), tf.constant(small)],
    )
    plan = _plan({"users": (40, 8, "tpu_embedding"), "small": (5, 8, "tensor_core")})
    tables = layouts_lib.CheckpointTables(prefix, plan)
    assert tables.summary()["kinds"] == ["A"]
    np.testing.assert_array_equal(tables.read("users"), users)
    np.testing.assert_array_equal(tables.read("small"), small)
    with pytest.raises(layouts_lib.LayoutError, match="'users'.*40 rows but the vocabulary has 41"):
        layouts_lib.CheckpointTables(prefix, _plan({"users": (41, 8, "tpu_embedding"), "small": (5, 8, "tensor_core")}))
    with pytest.raises(layouts_lib.LayoutError, match="'items' is missing"):
        layouts_lib.CheckpointTables(prefix, _plan({"users": (40, 8, "tpu_embedding"), "items": (9, 8, "tpu_embedding")}))
    with pytest.raises(layouts_lib.LayoutError, match="'users'.*shape \\[40, 8\\], expected \\[40, 16\\]"):
        layouts_lib.CheckpointTables(prefix, _plan({"users": (40, 16, "tpu_embedding"), "small": (5, 8, "tensor_core")}))
    # kind B forced on one plain variable per table: the recomputed stack does not fit it
    with pytest.raises(layouts_lib.LayoutError, match=r"'users'.*layout inconsistent: stacked variable shape \[40, 8\]"):
        layouts_lib.CheckpointTables(prefix, plan, ExportLayoutConfig(kind="B"))
    with pytest.raises(layouts_lib.LayoutError, match="num_partitions"):
        layouts_lib.CheckpointTables(prefix, plan, ExportLayoutConfig(kind="C", partition_strategy="mod"))


def test_layout_b_saved_in_per_device_slices(tmp_path):
    """TPUEmbeddingV2 saves each stacked variable as one slice per TPU device (its sharded
    saveable); those are read with RestoreV2 slice reads instead of the memory map."""
    replicas, per_chip = 2, 4
    plan = _plan(TABLES_B, (replicas, per_chip))
    values = {n: _known(t[0], t[1], 30 + i) for i, (n, t) in enumerate(TABLES_B.items())}
    layouts = _b_layouts(plan, replicas, per_chip)
    names, specs, tensors = [], [], []
    for stacked, full in stacked_variables(values, layouts).items():
        rows_per_device = full.shape[0] // replicas
        for d in range(replicas):
            names.append(layouts_lib.TPU_PREFIX + stacked + layouts_lib.ATTR)
            specs.append(f"{full.shape[0]} {full.shape[1]} {d * rows_per_device},{rows_per_device}:-")
            tensors.append(tf.constant(full[d * rows_per_device: (d + 1) * rows_per_device]))
    record = sparse_core_layout_pb2.SparseCoreTableLayouts(tables=list(layouts.values()))
    names.append(layouts_lib.LAYOUT_RECORD_KEY)
    specs.append("")
    tensors.append(tf.constant(record.SerializeToString()))
    prefix = os.path.join(str(tmp_path), "ckpt")
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=specs, tensors=tensors)
    tables = layouts_lib.CheckpointTables(prefix, plan)
    assert tables.index.ok
    for name, want in values.items():
        assert tables.index.rows(tables.sources[name].key, [1, 1]) is None  # sliced: not mapped
        np.testing.assert_array_equal(tables.read(name), want)


@pytest.mark.parametrize("model_type", ["dlrm", "dcn_v2"])
def test_model_publishes_where_its_tables_are_in_a_checkpoint(tmp_path, model_type):
    """The checkpoint keys the exporter reads (model.table_checkpoint_key, the dense parts) are the
    ones a trained RankingModel writes, for both placements and a shared table (named with `_`: a
    table's name is a plain identifier, refused otherwise when the config loads); the exporter reads
    the checkpoint back as the model holds it."""
    from components.config.loading import parse_config
    from components.embedding_model.restore import build_serving_model, load_tables, restore_dense
    from components.embedding_model import checkpoint_keys as model_lib
    from components.planning.run_plan import derive_plan
    from components.embedding_trainer import model_building

    cfg = parse_config({
        "input": {"path": "unused.csv"},
        "label": "label",
        "dense_features": [{"name": "I1"}],
        "tables": [{"name": "sha_red", "dim": 8}],
        "categorical_features": [
            {"name": "A", "table": "sha_red"}, {"name": "B", "table": "sha_red"},
            {"name": "big", "dim": 8}, {"name": "small", "dim": 4},
        ],
        "training": {"model": model_type, "bottom_mlp": [16, 8], "top_mlp": [8],
                     "embedding": {"size_threshold": 50}},
    })
    from components.contracts.manifest import (
        CategoricalFeatureEntry, DenseFeatureEntry, VocabularyEntry, VocabularyManifest,
    )

    sizes = {"sha_red": 100, "big": 200, "small": 10}  # + 1 OOV bucket each
    manifest = VocabularyManifest(
        "unused", "label", {},
        (DenseFeatureEntry("I1", "I1", 0.0),),
        tuple(CategoricalFeatureEntry(n, n, cfg.feature_table(cfg.categorical_features[i]).name, None, None)
              for i, n in enumerate(("A", "B", "big", "small"))),
        {n: VocabularyEntry(f"{n}.txt", f"{n}.counts.txt", s, s, 1, s + 1, None, "mean", ()) for n, s in sizes.items()},
    )
    plan = derive_plan(cfg, manifest)
    assert {t.placement for t in plan.tables.values()} == {"tpu_embedding", "tensor_core"}
    features = {"I1": tf.constant([[1.0], [2.0]])}
    for n, rows in (("A", 101), ("B", 101), ("big", 201), ("small", 11)):
        features[n] = tf.sparse.from_dense(tf.constant([[1, 3], [rows - 1, 0]], tf.int64))
    model = model_building.build_model(plan, manifest, cfg, for_training=True)
    model(features)
    path = tf.train.Checkpoint(model=model).save(os.path.join(str(tmp_path), "ckpt"))  # as the trainer saves
    shapes = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    for name, t in plan.tables.items():
        key = model_lib.table_checkpoint_key(name, t.placement)
        assert shapes.get(key) == [t.rows, t.dim], (key, sorted(shapes))
    assert layouts_lib.table_key is model_lib.table_checkpoint_key and layouts_lib.TPU_PREFIX == model_lib.TPU_EMBEDDING_CHECKPOINT_PATH + "/"
    parts = model_lib.dense_checkpoint_parts(model)
    assert set(parts) <= set(model_lib.DENSE_CHECKPOINT_PARTS) and ("cross" in parts) == (model_type == "dcn_v2")
    for part in parts:
        assert any(k.startswith(f"{model_lib.CHECKPOINT_ROOT}/{part}/") for k in shapes), part

    served = build_serving_model(plan, manifest, cfg, "float32", features)
    assert restore_dense(served, path) > 0
    load_tables(served, layouts_lib.CheckpointTables(path, plan))
    np.testing.assert_allclose(served(features).numpy(), model(features).numpy(), rtol=1e-6, atol=1e-6)
