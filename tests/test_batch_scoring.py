"""Scoring a file with a serving model (components/embedding_exporter/batch_scoring.py, `python -m
pipelines score`): one output row per input row with its row number, the model's columns from its
record, a missing column refused before scoring, malformed rows counted by number, the output
written whole or not at all; and, on the exporter's own model, the scores equal `serving_default`'s
on the same rows."""
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import components  # noqa: F401
import tensorflow as tf

from components.embedding_exporter.batch_scoring import ScoreError, score_file
from tests.stages import save_toy_serving_model


def _toy_expected(i1, name):
    x = 0.0 if (i1 is None or np.isnan(i1)) else i1
    return 1 / (1 + np.exp(-(x + len(name or "") / 10.0)))


@pytest.fixture(scope="module")
def toy_model(tmp_path_factory):
    return save_toy_serving_model(tmp_path_factory.mktemp("toy") / "1")


CSV = ('id,I1,Class Name,notes\n'
       '7,0.5,abc,"free text, with a comma"\n'
       '8,,,\n'  # missing values: NaN and ''
       '9,1e3\n'  # malformed: too few fields (data row 2)
       '10,x,"multi\nline",n\n'  # a non-numeric dense value scores as missing; a quoted line break
       '11,-2,z,q\n')


def test_a_csv_file_is_scored_row_by_row_with_its_row_numbers_and_carried_ids(toy_model, tmp_path):
    (tmp_path / "in.csv").write_text(CSV)
    report = score_file(toy_model, str(tmp_path / "in.csv"), str(tmp_path / "scores.parquet"), carry=["id"])
    out = pq.read_table(tmp_path / "scores.parquet").to_pydict()
    assert out["row"] == [0, 1, 3, 4] and out["id"] == ["7", "8", "10", "11"]
    expected = [_toy_expected(0.5, "abc"), _toy_expected(None, ""), _toy_expected(None, "multi\nline"),
                _toy_expected(-2.0, "z")]
    np.testing.assert_allclose(out["score"], expected, rtol=1e-6)
    assert (report.rows_read, report.rows_scored, report.malformed) == (5, 4, [2])
    assert [n for n in os.listdir(tmp_path) if ".tmp" in n] == []


def test_another_delimiter_is_read_as_commas_are_and_a_bad_one_refused(toy_model, tmp_path):
    """`--delimiter ';'`: the same rows and scores as the comma file; quoting and line breaks alike."""
    (tmp_path / "in.csv").write_text(CSV)
    (tmp_path / "semi.csv").write_text(CSV.replace(",", ";").replace("free text; with a comma", "free text, with a comma"))
    score_file(toy_model, str(tmp_path / "in.csv"), str(tmp_path / "a.parquet"), carry=["id"])
    report = score_file(toy_model, str(tmp_path / "semi.csv"), str(tmp_path / "b.parquet"), carry=["id"], delimiter=";")
    assert pq.read_table(tmp_path / "b.parquet").equals(pq.read_table(tmp_path / "a.parquet")) and report.malformed == [2]
    for bad in (";;", '"', ""):
        with pytest.raises(ScoreError, match="--delimiter"):
            score_file(toy_model, str(tmp_path / "semi.csv"), str(tmp_path / "c.parquet"), delimiter=bad)
    with pytest.raises(ScoreError, match="lacks the column"):  # a semicolon file read with commas: one column
        score_file(toy_model, str(tmp_path / "semi.csv"), str(tmp_path / "c.parquet"))


def test_parquet_in_and_csv_out(toy_model, tmp_path):
    pq.write_table(pa.table({"I1": pa.array([1.0, None], pa.float64()), "Class Name": ["ab", None],
                             "other": [1, 2]}), tmp_path / "in.parquet")
    score_file(toy_model, str(tmp_path / "in.parquet"), str(tmp_path / "scores.csv"))
    lines = (tmp_path / "scores.csv").read_text().splitlines()
    assert lines[0] == '"row","score"' and len(lines) == 3
    assert abs(float(lines[1].split(",")[1]) - _toy_expected(1.0, "ab")) < 1e-6


def test_the_beam_job_scores_every_row_group_as_the_local_scorer_does(toy_model, tmp_path):
    """batch_scoring_beam on Beam's local runner (2 threads): one work item per row group, the
    parts streamed into the output in row order; the same rows, ids and scores as `score_file`."""
    from components.embedding_exporter.batch_scoring_beam import score_file_beam

    rng = np.random.default_rng(3)
    n = 50
    i1 = [None if k % 7 == 0 else float(v) for k, v in enumerate(rng.normal(size=n))]
    names = [None if k % 5 == 0 else "x" * (k % 9) for k in range(n)]
    pq.write_table(pa.table({"id": [f"u{k}" for k in range(n)], "I1": i1, "Class Name": names}),
                   tmp_path / "in.parquet", row_group_size=8)  # 7 row groups
    local = score_file(toy_model, str(tmp_path / "in.parquet"), str(tmp_path / "local.parquet"), carry=["id"])
    report = score_file_beam(toy_model, str(tmp_path / "in.parquet"), str(tmp_path / "beam.parquet"), carry=["id"],
                             beam_args=["--runner=DirectRunner", "--direct_running_mode=multi_threading",
                                        "--direct_num_workers=2"])
    a, b = pq.read_table(tmp_path / "local.parquet").to_pydict(), pq.read_table(tmp_path / "beam.parquet").to_pydict()
    assert b["row"] == list(range(n)) and b["id"] == a["id"] and report.rows_scored == local.rows_scored == n
    np.testing.assert_allclose(b["score"], a["score"], rtol=1e-6)
    assert sorted(os.listdir(tmp_path)) == ["beam.parquet", "in.parquet", "local.parquet"]  # no parts, no temporary
    with tf.io.gfile.GFile("ram://beam/in.parquet", "wb") as fh:  # remote input, parts and output (gs:// on Dataflow)
        fh.write((tmp_path / "in.parquet").read_bytes())
    score_file_beam(toy_model, "ram://beam/in.parquet", "ram://beam/out/beam.parquet", carry=["id"],
                    beam_args=["--runner=DirectRunner", "--direct_running_mode=in_memory"])
    with tf.io.gfile.GFile("ram://beam/out/beam.parquet", "rb") as fh:
        assert pq.read_table(pa.BufferReader(fh.read())).equals(pq.read_table(tmp_path / "beam.parquet"))
    assert tf.io.gfile.listdir("ram://beam/out") == ["beam.parquet"]
    (tmp_path / "in.csv").write_text(CSV)
    with pytest.raises(ScoreError, match="--beam scores Parquet files"):
        score_file_beam(toy_model, str(tmp_path / "in.csv"), str(tmp_path / "x.parquet"))


def test_a_missing_column_is_refused_before_scoring_and_nothing_is_written(toy_model, tmp_path):
    (tmp_path / "in.csv").write_text("id,I1\n1,2\n")
    with pytest.raises(ScoreError, match=r"lacks the column\(s\) 'Class Name' the model reads"):
        score_file(toy_model, str(tmp_path / "in.csv"), str(tmp_path / "scores.parquet"))
    with pytest.raises(ScoreError, match=r"--carry nope: not a column"):
        (tmp_path / "ok.csv").write_text("id,I1,Class Name\n1,2,a\n")
        score_file(toy_model, str(tmp_path / "ok.csv"), str(tmp_path / "scores.parquet"), carry=["nope"])
    assert sorted(os.listdir(tmp_path)) == ["in.csv", "ok.csv"]


def test_the_command_line_scores_and_refuses_in_one_line(toy_model, tmp_path, capsys):
    from pipelines.__main__ import main

    (tmp_path / "in.csv").write_text(CSV)
    mine = tmp_path / "mine.txt"
    mine.write_text("the user's own file")
    os.symlink(mine, tmp_path / "scores.parquet")  # a link at the output's name is replaced, never written through
    assert main(["score", "--model", toy_model, "--input", str(tmp_path / "in.csv"),
                 "--output", str(tmp_path / "scores.parquet")]) == 0
    out = capsys.readouterr().out
    assert "scored:" in out and "4 of 5 rows" in out and "1 malformed row(s)" in out
    assert mine.read_text() == "the user's own file" and not os.path.islink(tmp_path / "scores.parquet")
    (tmp_path / "bad.csv").write_text("I1\n1\n")
    assert main(["score", "--model", toy_model, "--input", str(tmp_path / "bad.csv"),
                 "--output", str(tmp_path / "x.parquet")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --input {tmp_path / 'bad.csv'} lacks the column(s) 'Class Name' the model reads; add them (an empty "
        "column scores as missing values) or score another file"]


@pytest.mark.slow(reason="the executors' chain (a trained and exported model) and two scorings of its eval rows")
def test_scores_equal_serving_default_on_the_same_rows(chain, tmp_path):
    """The exporter's serving model: the input's rows scored by `score` and, as tf.Examples of the
    same raw values, by `serving_default`, agree within float32 rounding."""
    import csv

    cfg, a, _ = chain
    model_dir = os.path.join(a["serving"].uri, "Format-Serving")
    rows = list(csv.DictReader(open(cfg.input.path, newline="", encoding="utf-8")))[:400]
    columns = list(rows[0])
    path = tmp_path / "rows.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, columns)
        w.writeheader()
        w.writerows(rows)
    score_file(model_dir, str(path), str(tmp_path / "scores.parquet"))
    scores = pq.read_table(tmp_path / "scores.parquet").column("score").to_numpy()
    dense = {d.column or d.name for d in cfg.dense_features}

    def example(row):
        feats = {}
        for k, v in row.items():
            if v == "" or k == cfg.label:
                continue
            feats[k] = (tf.train.Feature(float_list=tf.train.FloatList(value=[float(v)])) if k in dense
                        else tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode()])))
        return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()

    fn = tf.saved_model.load(model_dir).signatures["serving_default"]
    want = fn(examples=tf.constant([example(r) for r in rows]))["probabilities"].numpy().reshape(-1)
    assert len(scores) == len(rows) and len(np.unique(scores)) > len(rows) // 2
    np.testing.assert_allclose(scores, want, rtol=0, atol=1e-6)


# ---- the same scoring as a pipeline step: bulk_inference.path ---------------------------------------


def _step_artifacts(tmp_path, toy_model, blessed):
    import shutil

    from tfx.types import standard_artifacts

    from components.tfx_wiring.artifact_types import ScoredFile
    from tests.stages import artifact

    model = artifact(standard_artifacts.Model, tmp_path / "serving_model")
    shutil.copytree(toy_model, tmp_path / "serving_model" / "Format-Serving")
    blessing = artifact(standard_artifacts.ModelBlessing, tmp_path / "blessing")
    blessing.set_int_custom_property("blessed", int(blessed))
    return model, blessing, artifact(ScoredFile, tmp_path / "scores")


@pytest.mark.parametrize("blessed", [True, False])
def test_the_file_scoring_step_scores_the_configured_file_with_the_blessed_model(toy_model, tmp_path, blessed):
    from tfx.types import standard_component_specs as specs

    from components.embedding_exporter.scoring_step import FileScoringExecutor

    (tmp_path / "in.csv").write_text(CSV)
    model, blessing, out = _step_artifacts(tmp_path, toy_model, blessed)
    FileScoringExecutor().Do({specs.MODEL_KEY: [model], specs.MODEL_BLESSING_KEY: [blessing]}, {"scores": [out]},
                             {"input_path": str(tmp_path / "in.csv"), "carry": json.dumps(["id"])})
    record = json.loads(open(os.path.join(out.uri, "scoring_record.json")).read())
    if not blessed:
        assert record == {"scored": False, "input": str(tmp_path / "in.csv"),
                          "why_not": "the model was not blessed (the validation gate kept it back)"}
        assert not os.path.exists(os.path.join(out.uri, "scores.parquet"))
        return
    assert (record["scored"], record["rows_read"], record["rows_scored"], record["malformed"]) == (True, 5, 4, 1)
    assert pq.read_table(os.path.join(out.uri, "scores.parquet")).to_pydict()["id"] == ["7", "8", "10", "11"]


def test_bulk_inference_path_adds_the_step_and_is_checked(tmp_path):
    from components.config.loading import load_config, parse_config
    from components.config.schema import ConfigError
    from pipelines.pipeline import create_pipeline
    from tests.stages import minimal_raw_config

    raw = minimal_raw_config()
    raw["input"]["path"] = str(tmp_path / "x.csv")
    (tmp_path / "x.csv").write_text("label\n1\n")
    raw["bulk_inference"] = {"enabled": True, "splits": [], "path": "new/rows.parquet", "carry": ["id"]}
    (tmp_path / "cfg.yaml").write_text(json.dumps(raw))
    cfg = load_config(str(tmp_path / "cfg.yaml"))
    assert cfg.bulk_inference.path == str(tmp_path / "new" / "rows.parquet")  # relative to the config file
    raw["bulk_inference"]["path"] = "gs://bucket/new/rows.parquet"  # a remote file: read through tf.io.gfile
    assert parse_config(raw).bulk_inference.path == "gs://bucket/new/rows.parquet"
    raw["bulk_inference"]["path"] = "new/rows.parquet"
    p = create_pipeline(cfg, pipeline_root=str(tmp_path / "root"), metadata_path=None, serving_dir=str(tmp_path / "s"))
    ids = [c.id for c in p.components]
    assert "FileScoring" in ids and "BulkInferrer" not in ids, ids
    for bad, message in (({"path": "rows.txt"}, "is not a .csv or .parquet file"),
                         ({"path": None, "carry": ["id"]}, "bulk_inference.carry: set bulk_inference.path"),
                         ({"path": None, "splits": []}, "or a file (bulk_inference.path)")):
        raw["bulk_inference"] = dict({"enabled": True, "splits": ["eval"]}, **bad)
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            parse_config(raw)


def test_a_remote_input_and_output_are_read_and_written_through_tensorflows_file_systems(toy_model, tmp_path):
    """TensorFlow's own `ram://` file system stands for gs://: the CSV read through it (the header
    by ExampleGen's rule), the scores uploaded whole to a temporary name and renamed."""
    tf.io.gfile.makedirs("ram://bucket/in")
    with tf.io.gfile.GFile("ram://bucket/in/in.csv", "w") as fh:
        fh.write(CSV)
    report = score_file(toy_model, "ram://bucket/in/in.csv", "ram://bucket/out/scores.parquet", carry=["id"])
    with tf.io.gfile.GFile("ram://bucket/out/scores.parquet", "rb") as fh:
        out = pq.read_table(pa.BufferReader(fh.read())).to_pydict()
    assert out["row"] == [0, 1, 3, 4] and out["id"] == ["7", "8", "10", "11"] and report.malformed == [2]
    assert tf.io.gfile.listdir("ram://bucket/out") == ["scores.parquet"]
    with pytest.raises(ScoreError, match="lacks the column"):
        with tf.io.gfile.GFile("ram://bucket/in/bad.csv", "w") as fh:
            fh.write("id,other\n1,2\n")
        score_file(toy_model, "ram://bucket/in/bad.csv", "ram://bucket/out/x.parquet")
    with pytest.raises(ScoreError, match="no such file"):
        score_file(toy_model, "ram://bucket/in/none.csv", "ram://bucket/out/x.parquet")
