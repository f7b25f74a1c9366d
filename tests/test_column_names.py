"""Every header a CSV or Parquet file can have works end to end, or is refused at config load.

- The serving input name rule (components/rules/names.py, docs/export.md "Serving input
  names") on its table of cases, written out by hand, and its collision suffixes.
- Headers: an empty header (pandas' unnamed index column) and a name two unread columns share are
  left out of what ExampleGen writes, from CSV and from Parquet alike; a configured column named
  twice is refused naming the file and the column.
- A serving module whose raw columns are no valid names: its JSON signature's inputs are named by
  the rule, recorded, map back to their columns, and score as `serving_default` does.
- (slow) The whole pipeline on a tiny CSV whose every header is awkward: pushed, parity passed,
  the signature's names are the rule's and the recorded mapping's, `serve_features` scores as
  `serving_default`, and the same config compiles for Kubeflow.
Config-load refusals of unsafe names and empty columns are in tests/test_config.py's table.
"""
import csv
import glob
import json
import os
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from components.contracts.serving_inputs import ServingInput
from components.rules.names import serving_input_names, serving_name
from tests.stages import NO_GATE

# (column, its serving input name): written out by hand from the rule in docs/export.md.
NAME_CASES = [
    ("C1", "C1"),  # a valid name is its own: existing models keep their signatures
    ("x_", "x_"),
    ("Class Name", "Class_Name"),  # space
    ("item.id", "item_id"),  # dot
    ("price/unit", "price_unit"),  # slash
    ("size (cm)", "size_cm"),  # parentheses: a run of them is one _, trailing _ stripped
    ("a--b", "a_b"),
    ("  spaced  ", "spaced"),
    ("1st order", "c_1st_order"),  # leading digit
    ("9", "c_9"),
    ("_id", "id"),  # TensorFlow renames an input starting with _ (arg__id): stripped
    ("naïve café", "naive_cafe"),  # NFKD: the accents drop off their letters
    ("Größe", "Groe"),  # ß has no ASCII decomposition: dropped
    ("ﬁle", "file"),  # NFKD's compatibility forms: the ligature becomes f, i
    ("x²", "x2"),
    ("日本", "column"),  # nothing left in ASCII
    ("", "column"),
    ("__", "column"),
]


@pytest.mark.parametrize("column, name", NAME_CASES, ids=[repr(c) for c, _ in NAME_CASES])
def test_serving_name_rule(column, name):
    assert serving_name(column) == name


def test_columns_that_collide_take_suffixes_in_raw_column_order():
    """The later column (in the model's raw column order) takes the first of _2, _3, ... not yet
    taken, even a column whose own name is valid; a suffixed name never takes another's."""
    assert serving_input_names(["a b", "a.b", "a-b"]) == {"a b": "a_b", "a.b": "a_b_2", "a-b": "a_b_3"}
    assert serving_input_names(["a.b", "a_b"]) == {"a.b": "a_b", "a_b": "a_b_2"}
    assert serving_input_names(["a b", "a.b", "a_b_2"]) == {"a b": "a_b", "a.b": "a_b_2", "a_b_2": "a_b_2_2"}
    assert serving_input_names(["日本", "中国", ""]) == {"日本": "column", "中国": "column_2", "": "column_3"}
    assert serving_input_names(["C1", "I1"]) == {"C1": "C1", "I1": "I1"}


def test_manifest_records_each_serving_input():
    """One entry per raw column in raw column order (dense, categorical, weights): its input, its
    dtype in serve_features and serve_typed_features, and the features that read it."""
    from components.contracts.manifest import CategoricalFeatureEntry, DenseFeatureEntry, VocabularyManifest

    m = VocabularyManifest(
        "unused", "Recommended IND", {"a.b": "float", "a b": "bytes", "1st": "int64", "w t": "float"},
        (DenseFeatureEntry("ab_dense", "a.b", 0.0),),
        (CategoricalFeatureEntry("ab", "a b", "ab", None, None, weight_column="w t"),
         CategoricalFeatureEntry("first", "1st", "first", "|", 2),
         CategoricalFeatureEntry("first_again", "1st", "first", None, None)),
        {},
    )
    assert m.serving_inputs(["1st"]) == [
        ServingInput("a_b", "a.b", "float32", None, ("ab_dense",)),
        ServingInput("a_b_2", "a b", "string", None, ("ab",)),
        ServingInput("c_1st", "1st", "string", "int64", ("first", "first_again")),
        ServingInput("w_t", "w t", "float32", None, ("ab",)),
    ]


# ---- headers: CSV and Parquet ----------------------------------------------------------------------

def _header_config(**over):
    from tests.stages import example_gen_config

    return example_gen_config(**dict({
        "label": "Recommended IND",
        "dense_features": [{"name": "price", "column": "price/unit"}],
        "categorical_features": [{"name": "Class_Name", "column": "Class Name"}, {"name": "groesse", "column": "Größe"}],
    }, **over))


HEADER = ["", "Class Name", "price/unit", "Größe", "x", "x", "Recommended IND"]
CELLS = [["0", "Dresses", "1.5", "M", "a", "b", "1"], ["1", "Tops", "", "L", "c", "d", "0"]]
TYPED = [  # what ExampleGen writes: no unnamed or repeated column
    {"Class Name": [b"Dresses"], "price/unit": [1.5], "Größe": [b"M"], "Recommended IND": [1]},
    {"Class Name": [b"Tops"], "price/unit": None, "Größe": [b"L"], "Recommended IND": [0]},
]


def test_csv_unnamed_and_repeated_unread_columns_are_left_out(tmp_path):
    from components.example_gen.header import check_csv_headers, read_csv_header
    from components.example_gen.records import type_rows

    path = tmp_path / "data.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([HEADER] + CELLS)
    cfg = _header_config()
    assert check_csv_headers(cfg, [str(path)]) == [str(path)]
    assert read_csv_header(str(path)) == HEADER
    rb = pa.RecordBatch.from_arrays([pa.array([r[i].encode() for r in CELLS], pa.binary()) for i in range(len(HEADER))],
                                    HEADER)
    typed, counts = type_rows(cfg, rb)
    assert typed.to_pylist() == TYPED
    assert counts["cells/missing/price/unit"] == 1 and counts["rows/written"] == 2


def test_parquet_unnamed_and_repeated_unread_columns_are_left_out(tmp_path):
    """The same table as Parquet (an unnamed index column, two columns named x) types to the rows
    the CSV gives."""
    import apache_beam  # noqa: F401  (parquet_input opens files through Beam's FileSystems)

    from components.example_gen import parquet_input
    from components.example_gen.records import type_rows

    values = [pa.array([0, 1]), pa.array(["Dresses", "Tops"]), pa.array([1.5, None]), pa.array(["M", "L"]),
              pa.array(["a", "c"]), pa.array([1, 2]), pa.array([1, 0])]
    path = str(tmp_path / "data.parquet")
    pq.write_table(pa.table(values, names=HEADER), path)
    cfg = _header_config(input={"path": path, "format": "parquet"})
    rows, counts = [], Counter()
    for u in parquet_input.plan_units(cfg, [(path, os.path.getsize(path))], 1 << 30):
        for rb in parquet_input.read_unit(u, cfg, counts, {}):
            typed, c = type_rows(cfg, rb)
            counts.update(c)
            rows += typed.to_pylist()
    assert rows == TYPED


def test_the_preprocessing_cli_leaves_out_the_same_columns(tmp_path):
    """The standalone preprocessing CLI reads CSV itself (csv_input): the same columns left out."""
    from components.embedding_preprocess import csv_input
    from components.example_gen import ranges

    path = str(tmp_path / "data.csv")
    with open(path, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([HEADER] + CELLS)
    cfg = _header_config()
    read = csv_input.ReadCsvRecordBatches(path, csv_input.read_header(path), cfg)
    assert read._columns == ["Class Name", "price/unit", "Größe", "Recommended IND"]
    fn = csv_input._ParseCsvRange(read._columns, cfg.to_json(), 2)
    fn.setup()
    rs = csv_input.csv_ranges(path)
    before = ranges.before_each_range([ranges.count_quotes(r) for r in rs])
    [batch] = [b for r in rs for b in fn.process(r, before) if isinstance(b, pa.RecordBatch)]
    assert batch.to_pydict() == {"Class Name": [b"Dresses", b"Tops"], "price/unit": [1.5, None], "Größe": [b"M", b"L"],
                                 "Recommended IND": [1.0, 0.0]}


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_a_configured_column_named_twice_is_refused_naming_file_and_column(tmp_path, fmt):
    from components.reporting.errors import InputError

    import apache_beam  # noqa: F401
    from components.example_gen import parquet_input
    from components.example_gen.header import check_csv_headers

    header = ["Class Name", "price/unit", "Class Name", "Größe", "Recommended IND"]
    path = str(tmp_path / f"twice.{fmt}")
    if fmt == "csv":
        with open(path, "w", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerows([header, ["a", "1", "b", "M", "1"]])
        cfg = _header_config()
        refuse = lambda: check_csv_headers(cfg, [path])  # noqa: E731
    else:
        pq.write_table(pa.table([pa.array(["a"]), pa.array([1.0]), pa.array(["b"]), pa.array(["M"]), pa.array([1])],
                                names=header), path)
        cfg = _header_config(input={"path": path, "format": "parquet"})
        refuse = lambda: parquet_input.plan_units(cfg, [(path, os.path.getsize(path))], 1 << 30)  # noqa: E731
    with pytest.raises(InputError) as e:
        refuse()
    assert str(e.value).startswith(f"{path}: the ")
    assert "names column(s) the config reads more than once ('Class Name' at columns 1, 3)" in str(e.value)


# ---- the serving module: inputs named by the rule, mapped back to their columns ------------------

# Raw columns a model reads, in its raw column order (dense first), each with its serving name.
SERVED = {"price/unit": "price_unit", "a.b": "a_b", "1st order": "c_1st_order", "a b": "a_b_2"}


def test_serving_inputs_are_named_by_the_rule_and_score_as_serving_default(tmp_path):
    """The module's traced signatures (saving and loading them is the end-to-end test's): inputs
    named by the rule, in raw column order, recorded as such, and mapped back to their columns."""
    tf = pytest.importorskip("tensorflow")
    from components.config.loading import parse_config
    from components.contracts import artifacts
    from components.contracts.serving_inputs import serving_inputs_record
    from components.embedding_exporter.export import write_serving_inputs
    from components.embedding_exporter.serving import RawFeatureTransform, ServingModule
    from components.embedding_preprocess import vocabulary
    from components.embedding_preprocess.run import build_manifest

    cfg = parse_config({
        "input": {"path": "unused.csv"}, "label": "Recommended IND",
        "dense_features": [{"name": "price", "column": "price/unit"}, {"name": "ab_dense", "column": "a.b"}],
        "categorical_features": [{"name": "first_order", "column": "1st order", "separator": "|"},
                                 {"name": "ab", "column": "a b"}],
    })
    vocab_dir = str(tmp_path / "vocab")
    for t in cfg.tables:
        vocabulary.write_vocabulary(vocab_dir, t.name, [(b"u", 2), (b"v", 1)])
    kinds = {"price/unit": "float", "a.b": "float", "1st order": "bytes", "a b": "bytes"}
    manifest = build_manifest(cfg, {f"kind/{c}/{k}": 1 for c, k in kinds.items()}, vocab_dir)
    assert manifest.raw_columns() == list(SERVED)

    class Probe(tf.Module):
        """A model that scores what it is given: each dense value and each feature's IDs, weighed apart."""

        def __call__(self, inputs):
            parts = []
            for i, (name, x) in enumerate(sorted(inputs.items())):
                if isinstance(x, tf.SparseTensor):
                    x = tf.sparse.reduce_sum(tf.sparse.map_values(tf.add, x, 1), axis=1, keepdims=True)
                parts.append(tf.cast(x, tf.float32) * (10.0 ** i))
            return tf.add_n(parts)

    module = ServingModule(Probe(), RawFeatureTransform(manifest, vocab_dir))
    spec = module.signatures()["serve_features"].input_signature[0]
    assert {k: s.name for k, s in spec.items()} == {n: n for n in SERVED.values()}
    assert [(i.column, i.input) for i in module.serving_inputs()] == list(SERVED.items())
    written = write_serving_inputs(str(tmp_path / "serving"), serving_inputs_record(module.serving_inputs()))
    assert written == os.path.join(str(tmp_path / "serving"), artifacts.SERVING_INPUTS_FILE)
    record = json.load(open(written, encoding="utf-8"))
    assert {e["column"]: e["input"] for e in record["serving_inputs"]} == SERVED == record["renamed"]

    rows = [{"price/unit": [2.5], "a.b": [1.0], "1st order": [b"u|v|w"], "a b": [b"v"]}, {"a.b": [3.0], "a b": [b"u"]}]
    examples = []
    for row in rows:
        feature = {c: tf.train.Feature(float_list=tf.train.FloatList(value=v)) if kinds[c] == "float"
                   else tf.train.Feature(bytes_list=tf.train.BytesList(value=v)) for c, v in row.items()}
        examples.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    by_example = module.serve_examples(tf.constant(examples))["probabilities"].numpy()
    columns = {SERVED[c]: tf.constant([(r.get(c) or [float("nan")])[0] for r in rows], tf.float32) if kinds[c] == "float"
               else tf.constant([(r.get(c) or [b""])[0] for r in rows]) for c in SERVED}
    by_name = module.serve_features(columns)["probabilities"].numpy()
    assert len(set(by_example[:, 0].tolist())) == 2  # the rows score apart: the check can fail
    assert by_name.tolist() == by_example.tolist()


# ---- the whole pipeline on a tiny CSV with every kind of header ----------------------------------

E2E_HEADER = ["", "Class Name", "item.id", "price/unit", "size (cm)", "Größe", "1st order", "a b", "a.b",
              "Recommended IND"]
# The model's raw columns in its order (dense features' columns first) and their serving names.
E2E_SERVED = {"price/unit": "price_unit", "size (cm)": "size_cm", "a.b": "a_b", "Class Name": "Class_Name",
              "item.id": "item_id", "Größe": "Groe", "1st order": "c_1st_order", "a b": "a_b_2"}
E2E_ROWS = 400


def _write_awkward_csv(path):
    """E2E_ROWS rows whose label follows Class Name and price/unit, under E2E_HEADER (written by
    the csv module: quoted where a cell holds a comma), the first column an unnamed index."""
    import random

    rng = random.Random(7)
    classes = ["Dresses", "Tops", "Knits", "Jeans, slim"]
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(E2E_HEADER)
        for i in range(E2E_ROWS):
            cls = rng.randrange(len(classes))
            price = round(rng.uniform(5, 100), 2)
            orders = "|".join(rng.sample(["a", "b", "c", "d"], rng.randrange(0, 4)))
            p = 0.2 + 0.5 * (cls % 2) + (0.2 if price > 50 else 0.0)
            w.writerow([i, classes[cls], f"i{rng.randrange(30)}", price, round(rng.uniform(1, 9), 1),
                        rng.choice(["S", "M", "L", ""]), orders, rng.choice(["x", "y"]), rng.choice(["1.5", "2", ""]),
                        int(rng.random() < min(p, 0.95))])


def _awkward_config(data):
    return {
        "name": "awkward-headers",
        "input": {"path": str(data), "format": "csv"},
        "label": "Recommended IND",
        "dense_features": [{"name": "price", "column": "price/unit"}, {"name": "size_cm", "column": "size (cm)"},
                           {"name": "ab_dense", "column": "a.b", "fill_value": -1.0}],
        "categorical_features": [
            {"name": "Class_Name", "column": "Class Name"}, {"name": "item_id", "column": "item.id"},
            {"name": "groesse", "column": "Größe"},
            {"name": "first_order", "column": "1st order", "separator": "|", "max_length": 3},
            {"name": "ab", "column": "a b"},
        ],
        "categorical_defaults": {"dim": 4},
        # the smallest run: a few steps, no held-out selection, a small model
        "training": {"batch_size": 32, "train_steps": 4, "checkpoint_every_steps": 2, "eval_steps": 2,
                     "bottom_mlp": [8], "top_mlp": [8], "early_stopping": {"enabled": False},
                     "dense_buckets": {"buckets": 4, "dim": 4}},
        "export": {"compare_compression": False, "auc_sample_size": 100, "parity_sample_size": 64},
        "validation": dict(NO_GATE),
        "beam": {"direct_running_mode": "in_memory", "direct_num_workers": 1},
    }


@pytest.mark.slow(reason="runs the local pipeline on 400 rows and compiles it for Kubeflow")
def test_every_kind_of_header_runs_end_to_end_and_compiles(tmp_path):
    import numpy as np
    import tensorflow as tf

    from components.config.loading import load_config
    from components.contracts import artifacts
    from components.data_io.examples_io import serialized_examples
    from pipelines.__main__ import main
    from pipelines.runner import run
    from pipelines.summary import EXIT_PUSHED, exit_status

    data = tmp_path / "data" / "reviews.csv"
    data.parent.mkdir()
    _write_awkward_csv(data)
    cfg_path = tmp_path / "awkward.yaml"
    cfg_path.write_text(yaml.safe_dump(_awkward_config(data), allow_unicode=True), encoding="utf-8")
    out = tmp_path / "out"
    summary = run(load_config(str(cfg_path)), str(out)).summary
    assert exit_status(summary) == EXIT_PUSHED, summary
    assert summary["pushed_by_this_run"] and summary["export_parity"]["passed"]
    assert summary["rows_read"]["train"] + summary["rows_read"]["eval"] == E2E_ROWS

    # ExampleGen wrote every configured column under its own name, and not the unnamed index
    eval_files = str(out / "pipeline_root" / "EmbeddingExampleGen" / "examples" / "*" / "Split-eval" / "*")
    written = set(pq.read_schema(sorted(glob.glob(eval_files))[0]).names)
    assert written == set(E2E_HEADER) - {""}

    pushed = summary["serving_model"]
    record = json.load(open(os.path.join(pushed, artifacts.SERVING_INPUTS_FILE), encoding="utf-8"))
    assert [(e["column"], e["input"]) for e in record["serving_inputs"]] == list(E2E_SERVED.items())
    assert serving_input_names(list(E2E_SERVED)) == E2E_SERVED
    [report] = glob.glob(str(out / "pipeline_root" / "EmbeddingExporter" / "serving_model" / "*" / "export_report.json"))
    assert json.load(open(report, encoding="utf-8"))["serving_inputs_renamed"] == E2E_SERVED == summary["serving_inputs_renamed"]
    model = tf.saved_model.load(pushed)
    fn = model.signatures["serve_features"]
    specs = fn.structured_input_signature[1]
    assert set(specs) == set(E2E_SERVED.values())
    dense = {"price/unit", "size (cm)", "a.b"}
    assert {n: s.dtype for n, s in specs.items()} == {E2E_SERVED[c]: tf.float32 if c in dense else tf.string for c in E2E_SERVED}

    # serve_features on the serving names scores the raw eval rows as serving_default does
    records = serialized_examples(eval_files, 64)
    by_example = model.signatures["serving_default"](examples=tf.constant(records))["probabilities"].numpy()
    parsed = [tf.train.Example.FromString(r).features.feature for r in records]
    columns = {}
    for column, name in E2E_SERVED.items():
        if column in dense:
            columns[name] = tf.constant([(list(f[column].float_list.value) or [float("nan")])[0] for f in parsed], tf.float32)
        else:
            columns[name] = tf.constant([(list(f[column].bytes_list.value) or [b""])[0] for f in parsed])
    by_name = fn(**columns)["probabilities"].numpy()
    np.testing.assert_allclose(by_name, by_example, atol=1e-6, rtol=0)
    assert len(Counter(np.round(by_example[:, 0], 6))) > 1

    # and the same config compiles for Kubeflow
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(["compile", "--config", str(cfg_path), "--image", "REGISTRY/tpu-embedding-tfx:TAG",
                     "--pipeline-root", "gs://b/root", "--output", "p.yaml"]) == 0
    finally:
        os.chdir(old)
    assert (tmp_path / "p.yaml").exists()
