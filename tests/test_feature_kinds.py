"""Issue 18 end to end: configs/features.yaml (identity, hashed, list and file vocabularies, a
shared identity table fed by a multi-hot history, per-table optimizers, the embedding gradient
multiplier, a configured initializer) through the whole pipeline on generated data with the extra
columns (`features_run`): ExampleGen -> Preprocess -> Trainer (run_fn) -> Exporter, which blesses
only on parity of the serving model on raw examples with the trained model, -> Pusher."""
import dataclasses
import json
import os

import numpy as np
import pytest

import components  # noqa: F401
import tensorflow as tf

from components.contracts.manifest import VocabularyManifest
from components.contracts.plan import EmbeddingPlan
from components.contracts.statistics import EmbeddingStatistics
from components.example_gen.synthetic_data import token_of

def _manifest(a):
    return VocabularyManifest.from_json(open(os.path.join(a["vocabulary"].uri, "manifest.json")).read())


@pytest.mark.slow(reason="the pipeline on the feature showcase config")
def test_manifest_and_vocabulary_files_follow_each_kind(features_run):
    cfg, a, _ = features_run
    m = _manifest(a)
    v = m.vocabularies
    assert (v["items"].kind, v["items"].size, v["items"].num_oov_buckets, v["items"].rows, v["items"].default_value) == (
        "identity", 1000, 0, 1000, 0)
    assert (v["C4"].kind, v["C4"].size, v["C4"].rows) == ("hashed", 0, 2000)
    assert (v["C9"].kind, v["C9"].size, v["C9"].rows) == ("list", 8, 10)
    assert (v["C10"].kind, v["C10"].size, v["C10"].rows) == ("file", 40, 41)
    lines = open(os.path.join(a["vocabulary"].uri, v["C9"].file), "rb").read().split(b"\n")[:-1]
    assert lines == [t.encode() for t in cfg.table("C9").vocabulary.values]  # the given order, not by count
    lines = open(os.path.join(a["vocabulary"].uri, v["C10"].file), "rb").read().split(b"\n")[:-1]
    assert lines == [t.encode() for t in token_of(9, np.arange(40))]
    for empty in ("items", "C4"):
        assert open(os.path.join(a["vocabulary"].uri, v[empty].file), "rb").read() == b""
    assert v["C2"].kind == "counted" and v["C2"].size > 0


@pytest.mark.slow(reason="the pipeline on the feature showcase config")
def test_statistics_count_each_kind(features_run):
    _, a, _ = features_run
    stats = EmbeddingStatistics.from_json(open(os.path.join(a["statistics"].uri, "statistics.json")).read())
    d = stats.to_dict()
    item = d["features"]["item"]["splits"]["train"]
    # item_id holds IDs up to 1199: those >= 1000 go to the default row, counted as oov
    assert item["oov_ids"] > 0 and item["invalid_values"] == {}
    assert d["tables"]["C4"]["vocabulary"]["covered_by_vocabulary"] == 1.0  # every hashed value has a row
    assert [d["tables"][t]["kind"] for t in ("items", "C4", "C9", "C10", "C2")] == ["identity", "hashed", "list", "file", "counted"]
    report = open(os.path.join(a["statistics"].uri, "statistics.html")).read()
    assert "<td>identity</td>" in report and "<td>hashed</td>" in report
    c9 = d["tables"]["C9"]["vocabulary"]
    assert c9["vocabulary_size"] == 8 and c9["covered_by_vocabulary"] > 0.5  # C9's few values are its top ranks
    assert d["tables"]["items"]["memory"]["optimizer"] == "adagrad"  # the table's own optimizer's slots
    assert d["tables"]["C2"]["memory"]["optimizer"] == "ftrl"


@pytest.mark.slow(reason="the pipeline on the feature showcase config")
def test_plan_carries_table_optimizers_and_the_multiplier(features_run):
    _, a, _ = features_run
    plan = EmbeddingPlan.from_json(open(os.path.join(a["model"].uri, "embedding_plan.json")).read())
    assert plan.tables["items"].optimizer["name"] == "adagrad" and plan.tables["items"].rows == 1000
    assert plan.tables["C1"].optimizer["learning_rate"] == 0.2 and plan.tables["C1"].optimizer["name"] == "ftrl"
    assert plan.embedding_gradient_multiplier["schedule"]["warmup_steps"] == 10
    assert plan.tables["C12"].initializer.name == "random_uniform"
    assert not plan.features["C14"].validate_weights_and_indices  # item 5, also in the parity run
    history, c12 = plan.features["history"], plan.features["C12"]  # sequence features (item 1)
    assert (c12.max_sequence_length, c12.sequence_pooling, c12.sequence_length_source) == (3, "mean", "config")
    assert plan.tables["items"].placement == "tpu_embedding"  # history: through the TPU layer's sequence lookup
    assert history.sequence_pooling == "attention" and history.sequence_query == "item"
    assert 1 <= history.max_sequence_length <= 10 and history.sequence_length_source.startswith("statistics: train p90")
    assert any("model/sequence_pooling/history/" in k for k in
               tf.train.load_checkpoint(os.path.join(a["model"].uri, "checkpoints")).get_variable_to_shape_map())
    reader = tf.train.load_checkpoint(os.path.join(a["model"].uri, "checkpoints"))
    keys = reader.get_variable_to_shape_map()
    assert any("table_embedding_optimizers/C1/" in k for k in keys)  # C1's FTRL at its own rate
    assert any("table_embedding_optimizers/items/accumulator" in k for k in keys)


@pytest.mark.slow(reason="the pipeline on the feature showcase config")
def test_exporter_blesses_on_parity_with_every_kind(features_run):
    _, a, _ = features_run
    blessing, serving = a["blessing"], a["serving"]
    assert blessing.get_int_custom_property("blessed") == 1
    assert serving.get_float_custom_property("parity_max_abs_diff") <= 1e-5
    assert blessing.get_int_custom_property("parity_examples") > 0


@pytest.mark.slow(reason="the pipeline on the feature showcase config")
def test_serving_model_maps_raw_ids_like_preprocessing(features_run):
    """The serving model on raw JSON columns: an in-range item ID, one beyond num_buckets (the
    default row) and a non-integer text score as the rulebook says (default row 0 = '0')."""
    cfg, a, _ = features_run
    loaded = tf.saved_model.load(os.path.join(a["serving"].uri, "Format-Serving"))
    fn = loaded.signatures["serve_features"]
    m = _manifest(a)
    columns = {}
    for name, spec in fn.structured_input_signature[1].items():
        columns[name] = tf.constant([""] * 4) if spec.dtype == tf.string else tf.constant([float("nan")] * 4)
    columns["item_id"] = tf.constant(["0", "5000", "abc", "7"])
    probs = fn(**columns)["probabilities"].numpy()[:, 0]
    assert probs[0] == pytest.approx(probs[1], abs=1e-7) == pytest.approx(probs[2], abs=1e-7)
    assert m.vocabularies["items"].default_value == 0
    assert np.isfinite(probs).all()


def _store_scores(store, version_dir, requests):
    """Scores through the store path: keys, rows from `store`, pooled, the pushed dense model."""
    from components.embedding_exporter import store_client, store_model

    model_dir = os.path.join(version_dir, "store", store_model.STORE_MODEL_DIR)
    feed = store_client.dense_model_inputs(store, store_model.read_inputs(model_dir), requests)
    dense = tf.saved_model.load(model_dir).signatures["serve_vectors"]
    return dense(**{k: tf.constant(v) for k, v in feed.items()})["probabilities"].numpy().reshape(-1)


def _full_scores(version_dir, manifest, requests):
    from components.embedding_exporter.serving import RawFeatureTransform

    inputs = RawFeatureTransform(manifest, manifest.vocabulary_dir).serving_inputs()
    fn = tf.saved_model.load(version_dir).signatures["serve_features"]
    cols = {i.input: tf.constant([r[i.column] for r in requests], tf.float32 if i.dtype == "float32" else tf.string)
            for i in inputs}
    return fn(**cols)["probabilities"].numpy().reshape(-1)


@pytest.mark.slow(reason="the pipeline on the feature showcase config")
def test_the_store_path_scores_as_the_serving_model_on_every_kind(features_run):
    """The export's own check (store_export.py): raw eval rows, and rows with an unknown and an
    empty feature, through keys, row files, pooling and the dense model, as the serving model."""
    cfg, a, _ = features_run
    report = json.load(open(os.path.join(a["serving"].uri, "export_report.json")))
    store, p = report["store"], report["store"]["parity"]
    assert p["passed"] and p["rows"] > 100 and p["edge_rows"] > 10 and p["max_abs_diff"] <= cfg.export.parity_tolerance, p
    inputs = store_model_inputs(a)
    kinds = {i["feature"]: i for i in inputs["vector_inputs"]}
    assert kinds["history"]["sequence_length"] > 0 and kinds["C1"]["weight_column"] == "weight"
    assert any(i["wide_of"] == "history" for i in inputs["vector_inputs"]), "the wide part of a sequence feature"
    saved = tf.train.list_variables(os.path.join(a["serving"].uri, "store", "dense_model", "variables", "variables"))
    assert not [(n, s) for n, s in saved if s and s[0] >= 1000], "a table inside the dense model"
    assert any("top_mlp" in n for n, _ in saved)
    assert store["rows"] == sum(t["rows"] for t in json.load(open(os.path.join(
        a["serving"].uri, "tables", "tables_manifest.json")))["tables"].values())


def store_model_inputs(a):
    from components.embedding_exporter import store_model

    return store_model.read_inputs(os.path.join(a["serving"].uri, "store", store_model.STORE_MODEL_DIR))


@pytest.mark.slow(reason="the pipeline on the feature showcase config, a second export and push")
def test_sqlite_store_serves_the_pushed_rows_and_a_second_push_delta_in_place(features_run, tmp_path):
    """The pushed version's row files loaded into SQLite score eval rows as the pushed model does;
    an export with int8 tables (int8 row files with their scales) pushed next carries a delta
    against them, which applied in place in SQLite gives that version's rows, and its scores."""
    from components.data_io.examples_io import serialized_examples
    from components.embedding_exporter import store_client, store_export
    from components.embedding_exporter.export import export_serving_model
    from components.embedding_exporter.serving import RawFeatureTransform
    from components.model_registry import registry

    cfg, a, root = features_run
    m = _manifest(a)
    serving_dir = str(root / "out" / "serving")  # the run's push destination
    found = registry.lookup(serving_dir)
    first, entry = found.served_model, found.entry
    assert entry["store"]["delta"] is None and "load the full rows" in entry["store"]["delta_reason"]
    raw = serialized_examples(os.path.join(a["examples"].uri, "Split-eval", "*"), 64)
    inputs = RawFeatureTransform(m, m.vocabulary_dir).serving_inputs()
    strings = [i.column for i in inputs if i.dtype == "string"]
    requests = store_export.with_edge_rows(store_export.example_requests(raw, inputs), strings,
                                           [c for c in strings if m.raw_feature_kinds.get(c) == "int64"])
    db = store_client.SqliteStore(str(tmp_path / "store.db"))
    assert db.load_full(os.path.join(first, "store", "rows")) == entry["store"]["rows"]
    assert np.abs(_store_scores(db, first, requests) - _full_scores(first, m, requests)).max() <= 1e-5

    out = tmp_path / "second"  # the next export keeps int8 tables: rows quantized, most of them changed
    exported = export_serving_model(dataclasses.replace(cfg, export=dataclasses.replace(cfg.export, table_dtype="int8")),
                                    a["model"].uri, os.path.join(a["examples"].uri, "Split-eval", "*"), str(out))
    # int8 row files with their scales, held to the int8 serving model by the export's own check
    assert exported["store"]["parity"]["passed"] and exported["store"]["parity"]["max_abs_diff"] <= 1e-5
    stored = json.load(open(out / "store" / "rows" / "rows_manifest.json"))["tables"].values()
    assert {t["dtype"] for t in stored if not t["wide_of"]} == {"int8"}  # the wide parts' dim-1 tables stay float32
    assert exported["store"]["beam_args"]  # export.store.beam: the Pusher writes the delta by Beam too
    second = registry.push(str(out / "Format-Serving"), serving_dir, dict(entry, run="second"),
                           store_dir=str(out / "store"), store_beam_args=exported["store"]["beam_args"])
    delta = second["store"]["delta"]
    changed = sum(t["changed"] for t in delta["tables"].values())
    assert delta["base_version"] == os.path.basename(first) and changed > 0 and delta["bytes_vs_full"] <= 1.05, delta
    counts = db.apply_delta(os.path.join(second["serving_model"], "store", "delta"),
                            os.path.join(second["serving_model"], "store", "rows"))
    assert counts["put"] == changed + sum(t["new"] for t in delta["tables"].values())
    assert sum(db.count(t) for t in db.tables) == second["store"]["rows"]
    from pipelines.summary import store_line  # what the run's summary prints under the serving model
    assert "no delta: no row files in the served version" in store_line(entry["store"])
    line = store_line(second["store"])
    assert f"delta against version {os.path.basename(first)}: " in line and " changed, " in line and "% of the full rows" in line
    assert np.abs(_store_scores(db, second["serving_model"], requests)
                  - _full_scores(second["serving_model"], m, requests)).max() <= 1e-5


@pytest.mark.slow(reason="the pipeline on the feature showcase config")
def test_pipeline_runs_the_features_config_and_pushes(features_run):
    """`python -m pipelines run`'s entry point (TFX's LocalDagRunner, every component wired as in
    production) on configs/features.yaml with its data generated by the documented command: exit 0
    (make_features_run), a pushed serving model, a balanced ledger, the rows scored by BulkInferrer."""
    _, a, root = features_run
    summary = json.load(open(root / "out" / "summary.json"))
    assert summary["serving_model"] and summary["pushed_by_this_run"]
    assert summary["ledger"]["balanced"] and all(stage["balanced"] for stage in summary["ledger"]["stages"])
    assert summary["bulk_inference"]["scored"] and summary["bulk_inference"]["output"] == a["inference"].uri
    assert summary["bulk_inference"]["rows"] == {"eval": a["copy"].get_int_custom_property("eval_rows")}
