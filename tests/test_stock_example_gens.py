"""TFX's own ExampleGens feeding our components, and TFX's own Evaluator reading our serving model.

Stock `CsvExampleGen` infers each CSV column's type (integer-valued columns become int64 features,
a column with one cell of text becomes text) and stock `ImportExampleGen` keeps whatever
tf.Examples it is given. Preprocessing records the types it read in the vocabulary manifest
(`raw_feature_kinds`), and the exported model's `serving_default` parses each raw column as that
type, so TFX's Evaluator (TFMA), which feeds the model the stock ExampleGen's own records, scores
the model. The round trip runs every executor directly on 500 rows, bad input included (a dense
column of text, a configured column no example holds, a row without a label); the pieces that
word the refusals are checked on hand-built values.
"""
import csv
import json
import os

import pytest

from components.rules import rulebook
from tests.stages import artifact, beam_context, trainer_raw_config
from components.tfx_wiring.component_keys import CONFIG_KEY
from components.tfx_wiring import component_keys

CATEGORICAL = ("C1", "C2", "C3")  # C3: multi-hot ('|', max_length)
# T1: a dense column holding one cell of text per split (CsvExampleGen types it as text);
# I9: a configured dense column no example holds. Both allowed (input.allow_invalid), so the run
# goes on and their health entries say why they are unusable.
COLUMNS = ("label", "I1", "I2", "I3", "T1") + CATEGORICAL
BAD_DENSE = ("T1", "I9")
TRAIN_ROWS, EVAL_ROWS = 300, 200


def _write_csvs(root, train_rows=TRAIN_ROWS, eval_rows=EVAL_ROWS):
    """train/data.csv and eval/data.csv under `root` with COLUMNS only (integer-valued I columns
    with empty cells, hex-string C columns, T1 numbers and one 'n/a'); returns {split: [row dicts]}."""
    from components.example_gen.synthetic_data import GeneratorSpec, write_csv
    from tests.stages import small_cardinalities

    out = {}
    for split, rows, seed in (("train", train_rows, 21), ("eval", eval_rows, 22)):
        full = root / f"full_{split}.csv"
        write_csv(GeneratorSpec(rows=rows, seed=seed, cardinalities=small_cardinalities(200)), str(full))
        with open(full, newline="") as fh:
            out[split] = [{c: r["I5" if c == "T1" else c] for c in COLUMNS} for r in csv.DictReader(fh)]
        out[split][1]["T1"] = "n/a"
        (root / split).mkdir()
        _write_rows(root / split / "data.csv", out[split])
    return out


def _write_rows(path, rows):
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(COLUMNS))
        w.writeheader()
        w.writerows(rows)


def _typed_example(row):
    """One CSV row as a tf.Example of mixed types: label, I1, I3 int64; I2 float; C2 int64 (its hex
    value); C1, C3, T1 bytes. An empty cell is an absent feature."""
    import tensorflow as tf

    feats = {}
    for name, value in row.items():
        if value == "":
            continue
        if name in ("label", "I1", "I3"):
            f = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))
        elif name == "I2":
            f = tf.train.Feature(float_list=tf.train.FloatList(value=[float(value) + 0.25]))
        elif name == "C2":
            f = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value, 16)]))
        else:
            f = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
        feats[name] = f
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


def _all_float_example(row):
    """A CSV row as a tf.Example with every I column float (C columns bytes, the label int64)."""
    import tensorflow as tf

    feats = {"label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(row["label"])]))}
    for name in ("I1", "I2", "I3"):
        if row[name] != "":
            feats[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(row[name])]))
    for name in CATEGORICAL:
        feats[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[row[name].encode()]))
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


def _write_tfrecords(root, rows):
    """train/ and eval/ TFRecord files of `_typed_example`s under `root`."""
    import tensorflow as tf

    for split, split_rows in rows.items():
        (root / split).mkdir(parents=True)
        with tf.io.TFRecordWriter(str(root / split / "data.tfrecord")) as w:
            for r in split_rows:
                w.write(_typed_example(r))


def _stock_example_gen(kind, input_dir, out_uri):
    """Stock CsvExampleGen's or ImportExampleGen's executor on `input_dir`'s train/ and eval/
    files (the input's own splits, no hashing): an Examples artifact of gzipped tf.Examples."""
    from tfx.components.example_gen.csv_example_gen import executor as csv_executor
    from tfx.components.example_gen.import_example_gen import executor as import_executor
    from tfx.proto import example_gen_pb2
    from tfx.types import standard_artifacts, standard_component_specs as specs
    from tfx.utils import proto_utils

    examples = artifact(standard_artifacts.Examples, out_uri)
    executor = {"csv": csv_executor.Executor, "import": import_executor.Executor}[kind]
    input_config = example_gen_pb2.Input(splits=[
        example_gen_pb2.Input.Split(name=s, pattern=f"{s}/*") for s in ("train", "eval")])
    executor(beam_context()).Do({}, {specs.EXAMPLES_KEY: [examples]}, {
        specs.INPUT_BASE_KEY: str(input_dir),
        specs.INPUT_CONFIG_KEY: proto_utils.proto_to_json(input_config),
        specs.OUTPUT_CONFIG_KEY: proto_utils.proto_to_json(example_gen_pb2.Output()),
        specs.OUTPUT_DATA_FORMAT_KEY: example_gen_pb2.FORMAT_TF_EXAMPLE,
        specs.OUTPUT_FILE_FORMAT_KEY: example_gen_pb2.FORMAT_TFRECORDS_GZIP,
    })
    return examples


def _config(root, **training):
    from components.config.loading import parse_config

    # A few steps: the model only has to be the one both AUCs score.
    raw = trainer_raw_config(root, categorical=CATEGORICAL, batch_size=32, train_steps=10, eval_steps=2,
                             checkpoint_every_steps=10, **training)
    raw["dense_features"] += [{"name": n} for n in BAD_DENSE]
    raw["input"]["allow_invalid"] = list(BAD_DENSE)
    # Every eval row in the exporter's AUC sample, so that it and the Evaluator score the same rows.
    raw["export"].update(compare_compression=False, auc_sample_size=EVAL_ROWS, parity_sample_size=64)
    return parse_config(raw)


def _preprocess(cfg, examples, root):
    from components.tfx_wiring.artifact_types import EmbeddingStatistics, EmbeddingVocabulary
    from tfx.types import standard_artifacts

    from components.embedding_preprocess import executor as ex

    out = {
        "transformed": artifact(standard_artifacts.Examples, root / "Preprocess" / "transformed"),
        "vocabulary": artifact(EmbeddingVocabulary, root / "Preprocess" / "vocabulary"),
        "statistics": artifact(EmbeddingStatistics, root / "Preprocess" / "statistics"),
    }
    ex.Executor(beam_context()).Do(
        {component_keys.EXAMPLES_KEY: [examples]},
        {component_keys.TRANSFORMED_EXAMPLES_KEY: [out["transformed"]], component_keys.VOCABULARY_KEY: [out["vocabulary"]],
         component_keys.STATISTICS_KEY: [out["statistics"]]},
        {CONFIG_KEY: cfg.to_json()},
    )
    return out


def _train_and_export(cfg, examples, pre, root):
    from components.embedding_trainer.executors import TrainerExecutor
    from tfx.proto import trainer_pb2
    from tfx.types import standard_artifacts, standard_component_specs as specs
    from tfx.utils import proto_utils

    from components.embedding_exporter import executor as export_executor
    from components.tfx_wiring.component_keys import CONFIG_KEY as TRAINER_CONFIG_KEY
    from tests.stages import RUN_FN

    model = artifact(standard_artifacts.Model, root / "Trainer" / "model")
    TrainerExecutor().Do(
        {specs.EXAMPLES_KEY: [pre["transformed"]]},
        {specs.MODEL_KEY: [model], specs.MODEL_RUN_KEY: [artifact(standard_artifacts.ModelRun, root / "Trainer" / "run")]},
        {
            specs.RUN_FN_KEY: RUN_FN,
            specs.TRAIN_ARGS_KEY: proto_utils.proto_to_json(trainer_pb2.TrainArgs(num_steps=cfg.training.train_steps)),
            specs.EVAL_ARGS_KEY: proto_utils.proto_to_json(trainer_pb2.EvalArgs(num_steps=cfg.training.eval_steps)),
            specs.CUSTOM_CONFIG_KEY: json.dumps({TRAINER_CONFIG_KEY: cfg.to_json()}),
        },
    )
    serving = artifact(standard_artifacts.Model, root / "Exporter" / "serving_model")
    blessing = artifact(standard_artifacts.ModelBlessing, root / "Exporter" / "blessing")
    export_executor.Executor().Do(
        {component_keys.MODEL_KEY: [model], component_keys.EXAMPLES_KEY: [examples]},
        {component_keys.SERVING_MODEL_KEY: [serving], component_keys.BLESSING_KEY: [blessing]},
        {CONFIG_KEY: cfg.to_json()},
    )
    return serving


def _evaluate(examples, serving, root):
    """Stock Evaluator's executor (TFMA) on the eval split, the serving model's `serving_default`:
    (its AUC, its example count)."""
    import tensorflow_model_analysis as tfma
    from tfx.components.evaluator import executor as evaluator_executor
    from tfx.types import standard_artifacts, standard_component_specs as specs
    from tfx.utils import proto_utils

    eval_config = tfma.EvalConfig(
        model_specs=[tfma.ModelSpec(signature_name="serving_default", label_key="label", prediction_key="probabilities")],
        metrics_specs=[tfma.MetricsSpec(metrics=[tfma.MetricConfig(class_name="AUC"),
                                                 tfma.MetricConfig(class_name="ExampleCount")])],
        slicing_specs=[tfma.SlicingSpec()],
    )
    evaluation = artifact(standard_artifacts.ModelEvaluation, root / "Evaluator" / "evaluation")
    blessing = artifact(standard_artifacts.ModelBlessing, root / "Evaluator" / "blessing")
    evaluator_executor.Executor(beam_context()).Do(
        {specs.EXAMPLES_KEY: [examples], specs.MODEL_KEY: [serving]},
        {specs.EVALUATION_KEY: [evaluation], specs.BLESSING_KEY: [blessing]},
        {specs.EVAL_CONFIG_KEY: proto_utils.proto_to_json(eval_config),
         specs.EXAMPLE_SPLITS_KEY: json.dumps(["eval"])},
    )
    metrics = tfma.load_eval_result(evaluation.uri).slicing_metrics[0][1][""][""]
    return metrics["auc"]["doubleValue"], metrics["example_count"]["doubleValue"]


# kind -> the raw kinds preprocessing must record (and serving_default parse) for its columns
EXPECTED_KINDS = {
    "csv": {"label": "int64", "I1": "int64", "I2": "int64", "I3": "int64", "C1": "bytes", "C2": "bytes", "C3": "bytes",
            "T1": "bytes", "I9": "float"},
    "import": {"label": "int64", "I1": "int64", "I2": "float", "I3": "int64", "C1": "bytes", "C2": "int64", "C3": "bytes",
               "T1": "bytes", "I9": "float"},
}


@pytest.mark.slow(reason="stock ExampleGen, preprocessing, Trainer, exporter and TFMA Evaluator executors on 500 rows")
@pytest.mark.parametrize("kind", ["csv", "import"])
def test_stock_example_gen_round_trip_to_the_stock_evaluator(tmp_path, kind):
    import tensorflow as tf

    from components.contracts import artifacts
    from components.contracts.manifest import VocabularyManifest

    rows = _write_csvs(tmp_path / "csv")
    rows["train"][0]["label"] = ""  # a null label: dropped and counted, not lost silently
    _write_rows(tmp_path / "csv" / "train" / "data.csv", rows["train"])
    if kind == "import":
        _write_tfrecords(tmp_path / "tfrecord", rows)
    input_dir = tmp_path / ("csv" if kind == "csv" else "tfrecord")
    examples = _stock_example_gen(kind, input_dir, tmp_path / "ExampleGen")
    cfg = _config(tmp_path)

    pre = _preprocess(cfg, examples, tmp_path)
    manifest = VocabularyManifest.from_json(
        open(os.path.join(pre["vocabulary"].uri, artifacts.VOCABULARY_MANIFEST_FILE)).read())
    assert dict(manifest.raw_feature_kinds) == EXPECTED_KINDS[kind]
    # bad input: every row counted by reason, each unusable column's entry saying why
    stats = json.load(open(os.path.join(pre["statistics"].uri, artifacts.STATISTICS_FILE)))
    train = stats["splits"]["train"]
    assert (train["examples_read"], train["examples_dropped"]["missing_label"], train["examples_written"]) == (
        TRAIN_ROWS, 1, TRAIN_ROWS - 1)
    kept = rows["train"][1:]  # the rows with a label
    empty = sum(r["T1"] == "" for r in kept)  # empty cells are missing, the others text
    health = stats["feature_health"]["features"]
    assert health["T1"]["reasons"] == {rulebook.INVALID_NOT_NUMERIC: len(kept) - empty, "missing": empty}
    assert health["T1"]["column"].startswith("the examples store column 'T1' as text (bytes), not numbers")
    assert health["I9"]["reasons"] == {"missing": len(kept)}
    assert health["I9"]["column"] == "column 'I9' holds no value in any example (absent from the input?)"
    assert {n for n, e in health.items() if "column" in e} == set(BAD_DENSE)
    assert {health[n]["status"] for n in BAD_DENSE} == {"allowed"}

    serving = _train_and_export(cfg, examples, pre, tmp_path)
    report = json.load(open(os.path.join(serving.uri, artifacts.EXPORT_REPORT_FILE)))
    assert report["eval_auc"]["examples"] == EVAL_ROWS and report["parity"]["max_abs_diff"] <= 1e-5

    # TFMA feeds serving_default the stock ExampleGen's own records: it parses them as they are
    auc, count = _evaluate(examples, serving, tmp_path)
    assert count == EVAL_ROWS
    assert abs(auc - report["eval_auc"]["serving_float32"]) < 0.002, (auc, report["eval_auc"])

    # Examples of other types (every I column float) fail serving_default's parse; the exporter
    # refuses them with one line naming each column, before scoring anything.
    other = tmp_path / "other" / "data.tfrecord"
    other.parent.mkdir()
    with tf.io.TFRecordWriter(str(other)) as w:
        for r in rows["eval"][:8]:
            w.write(_all_float_example(r))
    loaded = tf.saved_model.load(os.path.join(serving.uri, artifacts.SERVING_DIR))
    with pytest.raises(tf.errors.InvalidArgumentError, match="Data types don't match"):
        loaded.signatures["serving_default"](examples=tf.constant([_all_float_example(rows["eval"][0])]))
    from components.embedding_exporter.export import read_eval_sample
    from components.embedding_model.restore import ExportRefused

    with pytest.raises(ExportRefused) as refused:
        read_eval_sample(cfg, manifest, str(other))
    ints = [c for c in ("I1", "I2", "I3") if EXPECTED_KINDS[kind][c] == rulebook.KIND_INT]
    assert "\n" not in str(refused.value)
    for c in ints:
        assert f"{c} (float in the examples, parsed as int64)" in str(refused.value)


# ---- fast: the pieces, on hand-built values --------------------------------------------------------


def test_a_column_of_two_types_in_one_batch_is_one_line_naming_the_files_and_the_feature():
    import pyarrow as pa
    from tfx_bsl.coders import example_coder

    from components.embedding_preprocess.beam_pipeline import _DecodeExamples

    def examples(values, value_type):  # tf.Examples with one feature, I1, by tfx_bsl's encoder
        rb = pa.RecordBatch.from_arrays([pa.array([values], pa.large_list(value_type))], ["I1"])
        return example_coder.RecordBatchToExamplesEncoder().encode(rb)

    decode = _DecodeExamples("in/Split-train/*")
    decode.setup()
    good = examples([3], pa.int64())
    assert next(decode.process(good)).schema.field("I1").type.value_type == pa.int64()
    with pytest.raises(ValueError) as e:
        next(decode.process(good + examples([b"x"], pa.large_binary())))
    assert str(e.value) == (
        'tf.Examples at in/Split-train/*: Feature had wrong type, expected int64_list, found bytes_list for '
        'feature "I1"; a column must hold one type (bytes, int64 or float) in every example')


def test_kind_mismatches_name_each_column_the_examples_hold_as_another_type():
    """What the exporter refuses eval examples with (serving_default would fail to parse them)."""
    from components.contracts.manifest import CategoricalFeatureEntry, DenseFeatureEntry, VocabularyManifest

    manifest = VocabularyManifest(
        vocabulary_dir="v", label="label",
        raw_feature_kinds={"label": rulebook.KIND_INT, "I1": rulebook.KIND_INT, "I2": rulebook.KIND_FLOAT, "C1": rulebook.KIND_INT, "C2": rulebook.KIND_BYTES},
        dense_features=(DenseFeatureEntry("I1", "I1", 0.0), DenseFeatureEntry("I2", "I2", 0.0)),
        categorical_features=(CategoricalFeatureEntry("C1", "C1", "C1", None, None),
                              CategoricalFeatureEntry("C2", "C2", "C2", None, None)),
        vocabularies={},
    )
    same = {"label": rulebook.KIND_FLOAT, "I1": rulebook.KIND_INT, "I2": rulebook.KIND_FLOAT, "C1": rulebook.KIND_INT}
    assert manifest.kind_mismatches(same) == []  # the label is not parsed; C2 holds no value
    assert manifest.kind_mismatches({"I1": rulebook.KIND_FLOAT, "I2": rulebook.KIND_INT, "C1": rulebook.KIND_BYTES}) == [
        "I1 (float in the examples, parsed as int64)", "I2 (int64 in the examples, parsed as float)",
        "C1 (bytes in the examples, parsed as int64)"]


def test_column_notes_say_why_a_column_type_leaves_a_feature_unusable():
    from components.config.loading import parse_config
    from components.embedding_preprocess import partials
    from components.embedding_preprocess.run import _raw_kinds, column_notes

    cfg = parse_config({
        "input": {"path": "unused.csv"}, "label": "label",
        "dense_features": [{"name": "I1"}, {"name": "I2"}, {"name": "I3"}],
        "categorical_features": [{"name": "C1"}, {"name": "C2"}, {"name": "C3", "weight_column": "W"}],
    })
    seen = {("label", rulebook.KIND_INT), ("I1", rulebook.KIND_INT), ("I2", rulebook.KIND_BYTES), ("I3", rulebook.KIND_NONE),
            ("C1", rulebook.KIND_INT), ("C2", rulebook.KIND_FLOAT), ("C3", rulebook.KIND_BYTES), ("W", rulebook.KIND_BYTES)}
    raw = {partials.raw_kind(c, k): 1 for c, k in seen}
    notes = column_notes(cfg, raw)
    assert sorted(notes) == ["C2", "I2", "I3", "W"]
    assert notes["I3"].startswith("column 'I3' holds no value in any example")
    assert notes["I2"].startswith("the examples store column 'I2' as text (bytes)")
    assert notes["W"].startswith("the examples store column 'W' as text (bytes)")
    assert notes["C2"] == "the examples store column 'C2' as float: categorical values must be text or int64"
    # what serving_default parses: the kinds seen, a column without a value its feature's natural kind
    assert _raw_kinds(cfg, raw) == {"label": rulebook.KIND_INT, "I1": rulebook.KIND_INT, "I2": rulebook.KIND_BYTES, "I3": rulebook.KIND_FLOAT,
                                    "C1": rulebook.KIND_INT, "C2": rulebook.KIND_FLOAT, "C3": rulebook.KIND_BYTES, "W": rulebook.KIND_BYTES}
    # a column of two types (CsvExampleGen's input splits typed apart): serving_default can parse one
    with pytest.raises(ValueError, match=r"^column 'I1' holds values of several types \(float, int64\) across "
                                         r"examples; store one type per column \(a stock CsvExampleGen"):
        _raw_kinds(cfg, {**raw, partials.raw_kind("I1", rulebook.KIND_FLOAT): 1})


def test_the_health_stop_line_carries_each_column_note():
    """What a run stops with when such columns are not allowed: one line, a clause per feature with
    its reasons and why its column is unusable."""
    from components.embedding_preprocess.health import check_health
    from components.reporting.errors import FeatureHealthError

    def entry(reasons, column):
        return {"kind": "dense", "share": 1.0, "status": "stop", "reasons": reasons, "column": column}

    health = {"rows": 299, "max_invalid_share": 0.5, "stopped": ["I9", "T1"], "features": {
        "T1": entry({"not_numeric": 270, "missing": 29}, "the examples store column 'T1' as text (bytes)"),
        "I9": entry({"missing": 299}, "column 'I9' holds no value in any example"),
    }}
    with pytest.raises(FeatureHealthError) as stopped:
        check_health(health)
    assert str(stopped.value) == (
        "feature health: I9 (dense): 100.0% of 299 train rows unusable (299 rows missing; column 'I9' holds no "
        "value in any example); T1 (dense): 100.0% of 299 train rows unusable (270 rows not a number, 29 rows "
        "missing; the examples store column 'T1' as text (bytes)); above input.max_invalid_share 50%. Fix the "
        "column, or list the feature under input.allow_invalid")
