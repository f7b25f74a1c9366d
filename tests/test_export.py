"""Exporter on the executors' chain's trained model (2,500 rows, tables on both placements): every
checkpoint layout gives the same, verified serving model; compression; the tables on their own;
refusals; the standalone CLI.

The layout-B and -C checkpoints are the Trainer's own checkpoint rewritten key by key: its tables
re-laid out as SparseCore stacks (TensorFlow's stacking function and row placement, with and
without the `_sparse_core_table_layouts` record) or as div/mod host partitions, every dense weight
copied unchanged. The exporter must recover each table bit for bit and pass the parity check.
"""
from __future__ import annotations

import glob
import json
import os
import shutil

import numpy as np
import pytest

import components  # noqa: F401
import tensorflow as tf
from tensorflow.core.tpu.kernels import sparse_core_layout_pb2

from components.embedding_model import layouts as layouts_lib
from components.embedding_model.sparsecore_layout import recompute_sparse_core_layouts, stacked_variables
from components.contracts.artifacts import EXPORT_REPORT_FILE as REPORT_FILE, SERVING_DIR
from components.embedding_exporter.export import export_serving_model
from components.embedding_model.restore import ExportRefused
from components.contracts.artifacts import TABLES_DIR, TABLES_MANIFEST_FILE


def _trained(chain):
    """(config, the Trainer's Model artifact, ExampleGen's raw eval split) of the executors' chain."""
    cfg, a, _ = chain
    return cfg, a["model"].uri, os.path.join(a["examples"].uri, "Split-eval", "*")


def _fast(cfg, **export):
    """The config with a cheaper export (no compression comparison, 2000 AUC examples)."""
    import copy

    c = copy.deepcopy(cfg)
    c.export.compare_compression = False
    c.export.auc_sample_size = 2000
    for k, v in export.items():
        setattr(c.export, k, v)
    return c


def _relayout(model_uri, dst, kind, replicas=2, per_chip=4, record=True, strategy="mod", parts=3, sliced=False):
    """Copies the Model artifact with its checkpoint's TPU-embedding tables in layout B or C."""
    shutil.copytree(model_uri, dst)
    ckpt_dir = os.path.join(dst, "checkpoints")
    src = tf.train.latest_checkpoint(os.path.join(model_uri, "checkpoints"))
    for f in glob.glob(os.path.join(ckpt_dir, "*")):
        os.remove(f)
    plan = json.load(open(os.path.join(model_uri, "embedding_plan.json")))
    reader = tf.train.load_checkpoint(src)
    dtypes = reader.get_variable_to_dtype_map()
    tpu = {n: t for n, t in plan["tables"].items() if t["placement"] == "tpu_embedding"}
    table_keys = {layouts_lib.table_key(n, "tpu_embedding") for n in tpu}
    slot_prefixes = tuple(k[: -len(layouts_lib.ATTR)] + "/.OPTIMIZER_SLOT" for k in table_keys)
    names, specs, tensors = [], [], []
    for key in dtypes:
        if key in table_keys or key.startswith(slot_prefixes):
            continue
        names.append(key)
        specs.append("")
        tensors.append(tf.constant(reader.get_tensor(key), dtype=dtypes[key]))
    values = {n: reader.get_tensor(layouts_lib.table_key(n, "tpu_embedding")) for n in tpu}
    if kind == "B":
        order = []
        for f in sorted(plan["features"]):
            t = plan["features"][f]["table"]
            if t in tpu and t not in order:
                order.append(t)
        per_replica = plan["global_batch_size"] // replicas
        samples = {t: per_replica * sum(1 for f in plan["features"].values() if f["table"] == t) for t in order}
        layouts = recompute_sparse_core_layouts(
            [{"name": t, "rows": tpu[t]["rows"], "dim": tpu[t]["dim"], "samples": samples[t],
              "group": json.dumps(tpu[t]["optimizer"], sort_keys=True)} for t in order],
            replicas, per_chip,
        )
        for stacked, value in stacked_variables(values, layouts).items():
            names.append(layouts_lib.TPU_PREFIX + layouts_lib.escape_name(stacked) + layouts_lib.ATTR)
            specs.append("")
            tensors.append(tf.constant(value))
        if record:
            proto = sparse_core_layout_pb2.SparseCoreTableLayouts(tables=list(layouts.values()))
            names.append(layouts_lib.LAYOUT_RECORD_KEY)
            specs.append("")
            tensors.append(tf.constant(proto.SerializeToString()))
        else:
            plan["checkpoint_layout"] = {"kind": "B", "num_replicas": replicas, "sparse_cores_per_chip": per_chip,
                                         "per_replica_batch_size": per_replica}
            json.dump(plan, open(os.path.join(dst, "embedding_plan.json"), "w"))
    else:
        for t, table in values.items():
            rows = table.shape[0]
            sizes = layouts_lib.div_partition_sizes(rows, parts)
            starts = np.cumsum([0] + sizes)
            blocks = [table[i::parts] if strategy == "mod" else table[starts[i]: starts[i + 1]] for i in range(parts)]
            base = layouts_lib.table_key(t, "tpu_embedding")
            for i, block in enumerate(blocks):
                if sliced:  # one key saved as slices of the full [rows, dim] table
                    names.append(base)
                    specs.append(f"{rows} {table.shape[1]} {starts[i]},{sizes[i]}:-")
                else:
                    names.append(base[: -len(layouts_lib.ATTR)] + f"/part_{i}" + layouts_lib.ATTR)
                    specs.append("")
                tensors.append(tf.constant(block))
    prefix = os.path.join(ckpt_dir, "ckpt-1")
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=specs, tensors=tensors)
    with open(os.path.join(ckpt_dir, "checkpoint"), "w") as fh:
        fh.write('model_checkpoint_path: "ckpt-1"\nall_model_checkpoint_paths: "ckpt-1"\n')
    return values


@pytest.fixture(scope="module")
def layout_a_export(chain, tmp_path_factory):
    cfg, model, eval_pattern = _trained(chain)
    dst = tmp_path_factory.mktemp("export_a")
    report = export_serving_model(_fast(cfg), model, eval_pattern, str(dst))
    return dst, report


@pytest.mark.slow(reason="exports the executors' chain's model with parity")
def test_layout_a_export_report_and_table_files(chain, layout_a_export):
    cfg, model, _ = _trained(chain)
    dst, report = layout_a_export
    assert report["layout"]["kinds"] == ["A"]
    plan = json.load(open(os.path.join(model, "embedding_plan.json")))
    if "checkpoint_layout" in plan:  # recorded by the trainer (DEV runs may reuse older models)
        assert plan["checkpoint_layout"]["kind"] == "A"  # trained on CPU
    assert report["parity"]["passed"] and report["parity"]["max_abs_diff"] <= 1e-5
    assert abs(report["eval_auc"]["trained_model"] - report["eval_auc"]["serving_float32"]) < 1e-6
    assert json.loads((dst / REPORT_FILE).read_text())["parity"] == report["parity"]
    manifest = json.loads((dst / TABLES_DIR / TABLES_MANIFEST_FILE).read_text())["tables"]
    assert set(manifest) == set(plan["tables"])
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(os.path.join(model, "checkpoints")))
    for name, entry in manifest.items():
        values = np.load(dst / TABLES_DIR / entry["files"]["values"])
        placement = plan["tables"][name]["placement"]
        np.testing.assert_array_equal(values, reader.get_tensor(layouts_lib.table_key(name, placement)))
        vocab = (dst / TABLES_DIR / entry["vocabulary_file"]).read_text(encoding="utf-8").splitlines()
        # row-aligned: vocabulary entries, then the OOV buckets
        assert len(vocab) == entry["vocabulary_size"] and entry["rows"] == len(vocab) + entry["num_oov_buckets"]
        assert entry["features"] == plan["tables"][name]["features"] and entry["dtype"] == "float32"
    assert report["conversion"]["serving_table_bytes"] == sum(
        t["rows"] * t["dim"] * 4 for t in plan["tables"].values()
    )


@pytest.mark.parametrize(
    "kind,options,expect",
    [
        ("B", dict(record=True), "record"),
        ("B", dict(record=False), "recomputed"),
        ("C", dict(strategy="mod", parts=3), "mod"),
        ("C", dict(strategy="div", parts=4, sliced=True), "div"),
    ],
    ids=["B-record", "B-recomputed", "C-mod-parts", "C-div-sliced"],
)
@pytest.mark.slow(reason="exports the executors' chain's model with parity")
def test_every_layout_exports_the_same_verified_model(chain, layout_a_export, tmp_path, kind, options, expect):
    cfg, model, eval_pattern = _trained(chain)
    relaid = tmp_path / "model"
    _relayout(model, str(relaid), kind, **options)
    export_opts = {}
    if kind == "C":
        export_opts = {"layout": type(cfg.export.layout)(partition_strategy=options["strategy"],
                                                        num_partitions=options.get("parts") if options.get("sliced") else None)}
    report = export_serving_model(_fast(cfg, **export_opts), str(relaid), eval_pattern, str(tmp_path / "out"))
    tpu_layouts = {r["layout"] for n, r in report["tables"].items() if r["placement"] == "tpu_embedding"}
    assert tpu_layouts == {kind}
    assert all(expect in r["layout_source"] for r in report["tables"].values() if r["placement"] == "tpu_embedding")
    assert report["parity"]["passed"] and report["parity"]["max_abs_diff"] <= 1e-5
    a_dir, a_report = layout_a_export
    assert report["eval_auc"]["serving_float32"] == a_report["eval_auc"]["serving_float32"]
    for name, entry in json.loads((tmp_path / "out" / TABLES_DIR / TABLES_MANIFEST_FILE).read_text())["tables"].items():
        np.testing.assert_array_equal(
            np.load(tmp_path / "out" / TABLES_DIR / entry["files"]["values"]),
            np.load(a_dir / TABLES_DIR / entry["files"]["values"]),
        )
    if kind == "B":  # padding counted in what training held
        b = [r for r in report["tables"].values() if r["layout"] == "B"]
        assert sum(r["trained_bytes"] for r in b) > sum(a_report["tables"][n]["trained_bytes"] for n, r in report["tables"].items() if r["layout"] == "B")


@pytest.mark.slow(reason="exports the executors' chain's model with parity")
def test_int8_serving_model_and_compression_report(chain, tmp_path):
    cfg, model, eval_pattern = _trained(chain)
    c = _fast(cfg, table_dtype="int8", compare_compression=True)
    report = export_serving_model(c, model, eval_pattern, str(tmp_path))
    comp = report["compression"]
    assert set(comp) == {"float32", "float16", "int8"}
    plan = json.load(open(os.path.join(model, "embedding_plan.json")))
    assert comp["int8"]["table_bytes"] == sum(t["rows"] * (t["dim"] + 4) for t in plan["tables"].values())  # + scale
    assert comp["float16"]["table_bytes"] == comp["float32"]["table_bytes"] // 2
    for d in ("float16", "int8"):
        assert abs(comp[d]["auc_change"]) < c.export.max_auc_drop
        assert comp[d]["auc_change"] == pytest.approx(comp[d]["eval_auc"] - comp["float32"]["eval_auc"])
    assert report["eval_auc"]["serving"] == comp["int8"]["eval_auc"]
    # The written serving model holds int8 tables with their scales, and no float32 copy.
    from components.embedding_exporter.export import saved_variable_shapes

    reader = tf.train.load_checkpoint(os.path.join(str(tmp_path), SERVING_DIR, "variables", "variables"))
    dtypes = reader.get_variable_to_dtype_map()
    int8_tables = [k for k, d in dtypes.items() if d == tf.int8]
    # the tables of one dim stacked in one int8 variable (ServingTables), every row once
    assert len(int8_tables) == len({t["dim"] for t in plan["tables"].values()})
    shapes = reader.get_variable_to_shape_map()
    assert sum(shapes[k][0] for k in int8_tables) == sum(t["rows"] for t in plan["tables"].values())
    assert len(saved_variable_shapes(os.path.join(str(tmp_path), SERVING_DIR))) == report["serving_variables"]
    manifest = json.loads((tmp_path / TABLES_DIR / TABLES_MANIFEST_FILE).read_text())["tables"]
    entry = next(iter(manifest.values()))
    values = np.load(tmp_path / TABLES_DIR / entry["files"]["values"])
    scale = np.load(tmp_path / TABLES_DIR / entry["files"]["scale"])
    assert values.dtype == np.int8 and scale.shape == (entry["rows"],) and entry["dtype"] == "int8"
    assert not os.path.exists(tmp_path / "_incomplete_export")
    # The serving check's record (warm-up requests and their scores) is the written int8 model's:
    # loaded afresh and its warm-up file replayed as the check's fresh process replays it, it
    # answers each request with the recorded score.
    from components.embedding_exporter.serving_check import CHECK_FILE, TOLERANCE
    from components.embedding_exporter.serving_check_child import replay

    served = os.path.join(str(tmp_path), SERVING_DIR)
    record = json.loads(open(os.path.join(served, CHECK_FILE)).read())
    answers = replay(tf, tf.saved_model.load(served), served, [])
    answered = [a["outputs"][record["output"]][0] for a in answers if a["signature"] == record["signature"]]
    recorded = record["expected"]
    assert len(recorded) == len(answered) > 0 and np.abs(np.array(answered) - recorded).max() <= TOLERANCE


def _assert_nothing_written(out_dir):
    assert not os.path.exists(out_dir) or os.listdir(out_dir) == []


@pytest.mark.slow(reason="exports the executors' chain's model with parity")
def test_refusals_name_the_table_and_write_nothing(chain, tmp_path):
    cfg, model, eval_pattern = _trained(chain)
    plan = json.load(open(os.path.join(model, "embedding_plan.json")))
    big = sorted((n for n, t in plan["tables"].items() if t["placement"] == "tpu_embedding"))[0]

    # rows disagree with the vocabulary: the plan (from the vocabulary) says one row more
    tampered = tmp_path / "rows"
    shutil.copytree(model, tampered)
    p = json.loads((tampered / "embedding_plan.json").read_text())
    p["tables"][big]["rows"] += 1
    (tampered / "embedding_plan.json").write_text(json.dumps(p))
    with pytest.raises(ExportRefused, match=f"'{big}'.*rows but the vocabulary has"):
        export_serving_model(_fast(cfg), str(tampered), eval_pattern, str(tmp_path / "o1"))
    _assert_nothing_written(tmp_path / "o1")

    # a table missing from the checkpoint
    missing = tmp_path / "missing"
    _relayout(model, str(missing), "C", strategy="mod", parts=2)
    for f in glob.glob(str(missing / "checkpoints" / "*")):
        os.remove(f)
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(os.path.join(model, "checkpoints")))
    keep = [k for k in reader.get_variable_to_dtype_map() if not k.startswith(layouts_lib.table_key(big, "tpu_embedding")[: -len(layouts_lib.ATTR)])]
    tf.raw_ops.SaveV2(prefix=str(missing / "checkpoints" / "ckpt-1"), tensor_names=keep, shape_and_slices=[""] * len(keep),
                      tensors=[tf.constant(reader.get_tensor(k)) for k in keep])
    (missing / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    with pytest.raises(ExportRefused, match=f"table '{big}' is missing"):
        export_serving_model(_fast(cfg), str(missing), eval_pattern, str(tmp_path / "o2"))
    _assert_nothing_written(tmp_path / "o2")

    # an inconsistent SparseCore layout: the record describes another slice than the stacks
    incons = tmp_path / "incons"
    _relayout(model, str(incons), "B", record=False)
    plan_b = json.loads((incons / "embedding_plan.json").read_text())
    plan_b["checkpoint_layout"]["num_replicas"] = 4
    (incons / "embedding_plan.json").write_text(json.dumps(plan_b))
    with pytest.raises(ExportRefused, match="layout inconsistent"):
        export_serving_model(_fast(cfg), str(incons), eval_pattern, str(tmp_path / "o3"))
    _assert_nothing_written(tmp_path / "o3")

    # host partitions without the strategy that made them
    parts = tmp_path / "parts"
    _relayout(model, str(parts), "C", strategy="mod", parts=3)
    with pytest.raises(ExportRefused, match="partition_strategy"):
        export_serving_model(_fast(cfg), str(parts), eval_pattern, str(tmp_path / "o4"))
    _assert_nothing_written(tmp_path / "o4")


@pytest.mark.slow(reason="exports the executors' chain's model with parity")
def test_cli_runs_the_same_conversion_and_reports_errors(chain, tmp_path, capsys):
    from components.embedding_exporter.__main__ import main

    cfg, model, eval_pattern = _trained(chain)
    assert os.path.exists(os.path.join(model, "pipeline_config.json"))  # the trainer stores its config
    code = main(["--model", model, "--output", str(tmp_path / "cli"), "--examples", eval_pattern,
                 "--table-dtype", "float16", "--no-tables", "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)  # --json: the export report, nothing else on stdout
    assert summary["table_dtype"] == "float16" and summary["parity"]["passed"]
    # without --json: the same aligned summary as every tool of the product (what main prints of
    # the same report, rendered without a second export)
    from components.embedding_exporter.__main__ import export_summary
    from components.reporting.report import emit

    emit(export_summary(summary, str(tmp_path / "cli")))
    text = capsys.readouterr().out
    assert "=== export summary ===" in text and "parity:               passed: max |trained - serving|" in text
    assert os.path.isdir(tmp_path / "cli" / SERVING_DIR) and not os.path.exists(tmp_path / "cli" / TABLES_DIR)
    assert main(["--model", model, "--output", str(tmp_path / "x"), "--examples", eval_pattern,
                 "--table-key", "no-equals-sign"]) == 2
    assert "TABLE=CHECKPOINT_KEY" in capsys.readouterr().err
    assert main(["--model", model, "--output", str(tmp_path / "y"), "--examples", eval_pattern,
                 "--layout", "C"]) == 2  # C needs a partition strategy
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: export.layout.kind: C needs export.layout.partition_strategy (div or mod, as in training)"]
    assert main(["--model", model, "--output", str(tmp_path / "z"), "--examples", str(tmp_path / "none*")]) == 3
    refusal = capsys.readouterr().err.strip().splitlines()
    assert len(refusal) == 1 and refusal[0].startswith("error: export refused: no eval examples match")  # one line
    _assert_nothing_written(tmp_path / "z")
