"""The real pipeline (LocalDagRunner, Beam multi-processing) on generated data, end to end.

Runs `configs/demo.yaml` (the default config) on 100k generated rows (another seed than the demo's)
for a third of the demo's steps (tests/stages.py, PIPELINE_RUN_ROWS and PIPELINE_RUN_STEPS).
Asserts: vocabularies equal an independent count over ExampleGen's train split; eval AUC within
0.02 of the generator's best achievable AUC (the AUC of the true click probability); the pushed serving model, loaded
in a fresh process, scores the raw eval examples as the trained model scores the same examples
after preprocessing (within 1e-5); the serving model holds no optimizer slot variables.
"""
import glob
import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

import components  # noqa: F401
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import tensorflow as tf

from components.embedding_preprocess import vocabulary
from tests.stages import PIPELINE_RUN_ROWS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = PIPELINE_RUN_ROWS  # see tests/stages.py: the default config within 0.02 of the best AUC on this much


def _raw_examples(out, split):
    from components.data_io.examples_io import serialized_examples

    pattern = str(out / "pipeline_root" / "EmbeddingExampleGen" / "examples" / "*" / f"Split-{split}" / "*")
    assert glob.glob(pattern)
    return serialized_examples(pattern, 1 << 40)


def _tokens_counted(column, labelled, separator, max_length):
    """The tokens a list column holds for the vocabulary, by pyarrow's kernels and NumPy (the rule
    is short; a Python loop over the demo's multi-hot columns took 14 s): every value of a labelled
    row split on `separator` (None: whole), empty tokens dropped, a row's first `max_length` kept."""
    rows = np.asarray(pc.list_parent_indices(column))
    values = pc.list_flatten(column)
    if separator:
        parts = pc.split_pattern(values, separator)
        rows, values = rows[np.asarray(pc.list_parent_indices(parts))], pc.list_flatten(parts)
    kept = np.asarray(pc.and_(pc.is_valid(values), pc.greater(pc.binary_length(values), 0)).fill_null(False))
    rows, values = rows[kept], values.filter(pa.array(kept))
    if max_length:  # a token's place among its row's kept tokens (rows are in order)
        first = np.asarray(max_length > np.arange(len(rows)) - np.searchsorted(rows, rows, side="left"))
        rows, values = rows[first], values.filter(pa.array(first))
    return values.filter(pa.array(labelled[rows]))


@pytest.mark.slow(reason="the whole pipeline on the demo config and 100k rows")
def test_vocabularies_equal_independent_count(pipeline_run):
    cfg, out, summary, _ = pipeline_run
    counts = {t.name: Counter() for t in cfg.tables}
    # ExampleGen's train split, column by column (Parquet read by pyarrow): single-token columns
    # counted by pyarrow's value_counts, the others by the plain-Python rule below; neither is
    # preprocessing's Arrow code
    files = sorted(glob.glob(str(out / "pipeline_root" / "EmbeddingExampleGen" / "examples" / "*" / "Split-train" / "*")))
    assert files and all(f.endswith(".parquet") for f in files), files
    for path in files:
        table = pq.read_table(path)
        labelled = [v is not None and v != [] for v in table.column("label").to_pylist()]  # a label 0 counts
        for f in cfg.categorical_features:
            if f.source not in table.column_names:
                continue
            column = table.column(f.source).combine_chunks()
            if pa.types.is_list(column.type):
                values = _tokens_counted(column, np.asarray(labelled), f.separator, f.max_length)
                counts[cfg.feature_table(f).name].update(
                    {v["values"].as_py(): v["counts"].as_py() for v in pc.value_counts(values)})
                continue
            tokens = []
            for has_label, values in zip(labelled, column.to_pylist()):
                if not has_label:
                    continue
                if values is not None and not isinstance(values, list):
                    values = [values]
                row = [t for v in values or [] for t in (v.split(f.separator.encode()) if f.separator else [v]) if t]
                tokens += row[: f.max_length] if f.max_length else row
            counts[cfg.feature_table(f).name].update(tokens)
    vocab_dir = glob.glob(str(out / "pipeline_root" / "EmbeddingPreprocess" / "vocabulary" / "*"))[0]
    for t in cfg.tables:
        ordered = sorted(counts[t.name].items(), key=lambda kv: (-kv[1], kv[0]))
        expected = [tok for tok, c in ordered if c >= t.vocabulary.min_frequency]
        assert vocabulary.read_vocabulary(vocab_dir, t.name) == expected, t.name
        assert summary["vocabulary_sizes"][t.name] == len(expected)
    assert summary["rows_read"]["train"] + summary["rows_read"]["eval"] == ROWS
    # The ledger: every generated row counted in, every row out, both stages balanced.
    led = summary["ledger"]
    assert led["balanced"] and [s["stage"] for s in led["stages"]] == ["EmbeddingExampleGen", "EmbeddingPreprocess"]
    gen, pre = led["stages"]
    assert gen["rows_in"] == ROWS and sum(gen["rows_out"].values()) == ROWS and gen["malformed"] == {}
    assert pre["rows_in"] == gen["rows_out"] == pre["rows_out"]


@pytest.mark.slow(reason="the whole pipeline on the demo config and 100k rows")
def test_eval_auc_within_0_02_of_best(pipeline_run):
    cfg, _, summary, meta = pipeline_run
    auc, best = summary["eval_auc"], meta["best_achievable_auc"]
    assert auc > best - 0.02, (auc, best)
    # that AUC is the kept model's, and the summary names its step; epochs count the rows trained on
    t = summary["training"]
    assert summary["eval_model"]["step"] == t.get("model_step", t["steps"]), (summary["eval_model"], t)
    assert t["trained_rows"] == cfg.training.trained_rows(t["train_rows"]) < t["train_rows"]
    assert t["epochs"] == round(t["steps"] * cfg.training.batch_size / t["trained_rows"], 2)


SCORE_IN_FRESH_PROCESS = r"""
import sys, json, numpy as np
import components, tensorflow as tf
model = tf.saved_model.load(sys.argv[1])
from components.data_io.examples_io import serialized_examples
records = serialized_examples(sys.argv[2], 1 << 40)
probs = model.signatures["serving_default"](examples=tf.constant(records))["probabilities"].numpy().ravel()
np.save(sys.argv[3], probs)
"""


@pytest.mark.slow(reason="the whole pipeline on the demo config and 100k rows")
def test_pushed_model_scores_raw_examples_like_trained_model(pipeline_run, tmp_path):
    from pipelines.summary import EXIT_PUSHED, exit_status

    _, out, summary, _ = pipeline_run
    pushed = summary["serving_model"]
    assert pushed and pushed.startswith(str(out / "serving"))
    assert summary["pushed_by_this_run"] and exit_status(summary) == EXIT_PUSHED
    assert os.path.exists(summary["report_html"])
    assert summary["export_parity"]["passed"]

    raw_files = str(out / "pipeline_root" / "EmbeddingExampleGen" / "examples" / "*" / "Split-eval" / "*")
    script = tmp_path / "score.py"
    script.write_text(SCORE_IN_FRESH_PROCESS)
    env = dict(os.environ, PYTHONPATH=REPO, TF_USE_LEGACY_KERAS="1")
    r = subprocess.run(
        [sys.executable, str(script), pushed, raw_files, str(tmp_path / "serving.npy")],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    serving = np.sort(np.load(tmp_path / "serving.npy"))

    trained_dir = glob.glob(str(out / "pipeline_root" / "Trainer" / "model" / "*" / "Format-Serving"))[0]
    trained = tf.saved_model.load(trained_dir)
    from components.embedding_trainer.resolved_input import read_manifest
    from tests.stages import examples_uri
    from components.data_io.examples_io import transformed_rows

    tx_dir = glob.glob(str(out / "pipeline_root" / "EmbeddingPreprocess" / "transformed_examples" / "*" / "Split-eval"))[0]
    tx_pattern = tx_dir + "/*"
    tx = transformed_rows(tx_pattern, read_manifest(examples_uri([tx_pattern])), 1 << 30)
    scores = trained.signatures["serving_default"](examples=tf.constant(tx))["probabilities"].numpy().ravel()
    # Beam does not keep row order, so compare the two score multisets (every eval row is labelled here).
    assert len(serving) == len(scores)
    np.testing.assert_allclose(serving, np.sort(scores), atol=1e-5, rtol=0)


@pytest.mark.slow(reason="the whole pipeline on the demo config and 100k rows")
def test_serving_model_has_no_slots_and_json_signature_agrees(pipeline_run):
    from components.embedding_exporter.export import saved_variable_shapes

    cfg, out, summary, _ = pipeline_run
    pushed = summary["serving_model"]
    shapes = sorted(saved_variable_shapes(pushed).values())
    manifest = json.loads(open(glob.glob(str(out / "pipeline_root" / "Trainer" / "model" / "*" / "embedding_manifest.json"))[0]).read())
    rows_of_dim = {}
    for v in manifest["vocabularies"].values():
        rows_of_dim[v["dim"]] = rows_of_dim.get(v["dim"], 0) + v["rows"]
    tables = sorted([rows, dim] for dim, rows in rows_of_dim.items())
    # exactly one variable per table dim (the tables of one dim stacked, ServingTables), plus kernel and bias of each dense layer, plus each DCN-v2
    # cross layer's (low rank: U kernel, V kernel and bias; full rank: kernel and bias); a DLRM with
    # every table at the interaction dim has no projections. Any optimizer slot would be one more.
    t = cfg.training
    dense = 2 * (len(t.bottom_mlp) + len(t.top_mlp) + 1)
    if t.model == "dcn_v2":
        dense += t.cross_layers * (3 if t.cross_projection_dim else 2)
    # and each dense feature's bucket embeddings (training.dense_buckets; no wide part here)
    plan = json.loads(open(glob.glob(str(out / "pipeline_root" / "Trainer" / "model" / "*" / "embedding_plan.json"))[0]).read())
    boundaries = plan["dense_buckets"]["boundaries"]
    assert set(boundaries) == {d.name for d in cfg.dense_features} and not t.wide.enabled
    dense += len(boundaries)
    for name, b in boundaries.items():
        assert [len(b) + 1, t.dense_buckets.dim] in shapes, name
    assert len(shapes) == len(tables) + dense
    for table_shape in tables:
        assert table_shape in shapes
    model = tf.saved_model.load(pushed)
    assert set(model.signatures) == {"serving_default", "serve_features"}
    records = _raw_examples(out, "eval")[:64]
    by_example = model.signatures["serving_default"](examples=tf.constant(records))["probabilities"].numpy()
    columns = {}
    for f in cfg.dense_features:
        columns[f.source] = [
            (tf.train.Example.FromString(r).features.feature[f.source].float_list.value or [float("nan")])[0]
            for r in records
        ]
    for f in cfg.categorical_features:
        columns[f.source] = [
            (tf.train.Example.FromString(r).features.feature[f.source].bytes_list.value or [b""])[0] for r in records
        ]
    tensors = {
        k: tf.constant(v, tf.string) if k.startswith("C") else tf.constant(np.array(v, np.float32)) for k, v in columns.items()
    }
    by_feature = model.signatures["serve_features"](**tensors)["probabilities"].numpy()
    np.testing.assert_allclose(by_feature, by_example, atol=1e-6, rtol=0)


@pytest.mark.slow(reason="the whole pipeline on the demo config and 100k rows")
def test_export_refuses_a_serving_graph_that_differs(pipeline_run, tmp_path):
    """A serving graph that preprocesses differently (here: C3 truncated to 1 value instead of 5)
    is refused, and nothing is left where a pusher would look."""
    import shutil

    from components.contracts.artifacts import SERVING_DIR
    from components.embedding_exporter.export import export_serving_model
    from components.embedding_model.restore import ExportRefused

    cfg, out, _, _ = pipeline_run
    model_uri = glob.glob(str(out / "pipeline_root" / "Trainer" / "model" / "*"))[0]
    tampered = tmp_path / "model"
    shutil.copytree(model_uri, tampered)
    manifest = json.loads((tampered / "embedding_manifest.json").read_text())
    for f in manifest["categorical_features"]:
        if f["name"] == "C3":
            f["max_length"] = 1
    (tampered / "embedding_manifest.json").write_text(json.dumps(manifest))
    eval_pattern = glob.glob(str(out / "pipeline_root" / "EmbeddingExampleGen" / "examples" / "*" / "Split-eval"))[0] + "/*"
    with pytest.raises(ExportRefused, match="differs from the trained model"):
        export_serving_model(cfg, str(tampered), eval_pattern, str(tmp_path / "serving"))
    assert not os.path.exists(tmp_path / "serving" / SERVING_DIR)
    assert os.listdir(tmp_path / "serving") == []
