"""Preprocessing on hand-made tf.Examples: vocabularies against an independent count (of the tokens
the rulebook's plain-Python statement gives), embedding IDs, bad values counted by reason, and the
serving graph's transform agreeing with preprocessing. The rules case by case: tests/test_rulebook.py."""
import json
import os
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import components  # noqa: F401
import tensorflow as tf

from components.rules import rulebook
from components.config.loading import parse_config
from components.contracts.manifest import VocabularyManifest
from components.contracts.statistics import EmbeddingStatistics
from components.embedding_preprocess import vocabulary
from components.embedding_preprocess.run import run_preprocessing

CONFIG = {
    "input": {"path": "unused.csv"},
    "label": "label",
    "dense_features": [{"name": "I1", "fill_value": -1.0}, {"name": "I2"}],
    "tables": [{"name": "shared", "dim": 4, "vocabulary": {"num_oov_buckets": 5}}],
    "categorical_features": [
        {"name": "C1", "table": "shared"},
        {"name": "C2", "separator": "|", "max_length": 2, "dim": 4, "vocabulary": {"min_frequency": 2}},
        {"name": "C3", "dim": 4, "vocabulary": {"top_k": 2}},
        {"name": "C4", "column": "C4raw", "table": "shared"},
    ],
    "transformed_examples": {"compression": "gzip"},  # the e2e test covers the default (plain TFRecords)
    "beam": {"hot_key_fanout": 3},  # the e2e test covers the default (no fan-out)
}

# (label, I1, I2, C1, C2, C3, C4raw); None = feature absent, [] = present but empty
ROWS = [
    (1, [0.5], [3], [b"a"], [b"x|y|z"], [7], [b"b"]),
    (0, [float("nan")], [], [b"a"], [b"x||y"], [7], [b"a"]),
    (0, None, [5], [b"b"], [b"y"], [8], [b""]),
    (1, [2.0, 3.0], [1], [b"bad\xff"], [b"x"], [9], [b"line\nbreak"]),
    (None, [1.0], [1], [b"a"], [b"x|y"], [7], [b"c"]),  # no label: dropped and counted
    (0, [4.0], [2], [], None, [-1], [b"c"]),  # -1: a negative integer ID is invalid
    (1, [1.5], [0], [b"c"], [b"|z|x|y"], [8], [b"a"]),
]
EVAL_ROWS = [
    (0, [1.0], [1], [b"unseen1"], [b"x|q"], [-7, 99], [b"a"]),
    (1, [], [2], [b"b"], [b"y|y|y"], [8], [b"unseen2"]),
]


KINDS = {"label": rulebook.KIND_INT, "I1": rulebook.KIND_FLOAT, "I2": rulebook.KIND_INT, "C1": rulebook.KIND_BYTES, "C2": rulebook.KIND_BYTES,
         "C3": rulebook.KIND_INT, "C4raw": rulebook.KIND_BYTES}


def _feature(values, kind):
    if kind == rulebook.KIND_BYTES:
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
    if kind == rulebook.KIND_FLOAT:
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def _example(row) -> bytes:
    feats = {}
    for (name, kind), v in zip(KINDS.items(), row):
        if name == "label" and v is not None:
            v = [v]
        if v is not None:  # None: the feature is absent; []: present with no value
            feats[name] = _feature(v, kind)
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


def _write_tfrecord_gz(path, records):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path, options="GZIP") as w:
        for r in records:
            w.write(r)


COLUMN = {"C1": 3, "C2": 4, "C3": 5, "C4": 6}
SPEC = {"C1": (None, None), "C2": ("|", 2), "C3": (None, None), "C4": (None, None)}


def expected_tokens(f, row):
    """Feature `f`'s tokens in `row` by the rulebook's plain-Python statement (T1-T7)."""
    return rulebook.row_tokens(list(KINDS.values())[COLUMN[f]], row[COLUMN[f]], *SPEC[f]).tokens


def independent_vocab(table_features, rows, min_frequency=1, top_k=None):
    counts = Counter()
    for row in rows:
        if row[0] is None:  # dropped rows feed no vocabulary
            continue
        for f in table_features:
            counts.update(expected_tokens(f, row))
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ordered = [kv for kv in ordered if kv[1] >= min_frequency]
    return ordered[:top_k] if top_k else ordered


@pytest.fixture(scope="module")
def preprocessed(tmp_path_factory):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    root = tmp_path_factory.mktemp("pre")
    _write_tfrecord_gz(str(root / "raw/Split-train/data.gz"), [_example(r) for r in ROWS])
    _write_tfrecord_gz(str(root / "raw/Split-eval/data.gz"), [_example(r) for r in EVAL_ROWS])
    cfg = parse_config(json.loads(json.dumps(CONFIG)))
    pipeline = beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=in_memory"]))
    stats = run_preprocessing(
        pipeline,
        cfg,
        {s: str(root / f"raw/Split-{s}/*") for s in ("train", "eval")},
        str(root / "vocab"),
        {s: str(root / f"tx/Split-{s}") for s in ("train", "eval")},
        str(root / "stats"),
    )
    assert isinstance(stats, EmbeddingStatistics)
    return cfg, root, stats.to_dict()  # the tests read the JSON form (the same as statistics.json)


def _read_counts(path):
    out = []
    with open(path, "rb") as fh:
        for line in fh.read().split(b"\n")[:-1]:
            count, token = line.split(b" ", 1)
            out.append((token, int(count)))
    return out


def test_vocabularies_equal_independent_count(preprocessed):
    cfg, root, _ = preprocessed
    expected = {
        "shared": independent_vocab(["C1", "C4"], ROWS),
        "C2": independent_vocab(["C2"], ROWS, min_frequency=2),
        "C3": independent_vocab(["C3"], ROWS, top_k=2),
    }
    for name, entries in expected.items():
        assert vocabulary.read_vocabulary(str(root / "vocab"), name) == [t for t, _ in entries], name
        assert _read_counts(str(root / "vocab" / f"{name}.counts.txt")) == entries, name
    assert expected["shared"] == [(b"a", 4), (b"b", 2), (b"c", 2)]  # the unlabelled row does not count
    manifest = json.loads((root / "vocab" / "manifest.json").read_text())
    assert manifest["vocabularies"]["shared"]["features"] == ["C1", "C4"]
    assert manifest["vocabularies"]["shared"]["rows"] == len(expected["shared"]) + 5
    assert manifest["raw_feature_kinds"] == {
        "label": "int64", "I1": "float", "I2": "int64", "C1": "bytes", "C2": "bytes", "C3": "int64", "C4raw": "bytes"
    }
    assert manifest["vocabularies"]["C3"]["distinct_before_pruning"] == 3
    assert not (root / "stats" / "_value_counts").exists()  # the spilled counts are gone


def test_a_failed_run_deletes_the_spilled_counts(tmp_path, monkeypatch):
    import apache_beam as beam

    from components.embedding_preprocess import beam_pipeline

    def failing(p, cfg, splits, vocabulary_dir, transformed_dirs, stats_dir, input_format, spill_dir):
        os.makedirs(spill_dir)
        (tmp_path / "stats" / "_value_counts" / "b0000-x.arrow").write_bytes(b"partial")
        raise RuntimeError("worker lost")

    monkeypatch.setattr(beam_pipeline, "build_pipeline", failing)
    cfg = parse_config(json.loads(json.dumps(CONFIG)))
    with pytest.raises(RuntimeError, match="worker lost"):
        run_preprocessing(beam.Pipeline(), cfg, {"train": "unused"}, str(tmp_path / "vocab"), None, str(tmp_path / "stats"))
    assert not (tmp_path / "stats" / "_value_counts").exists()


def test_text_file_initializer_reads_vocabulary(preprocessed):
    _, root, _ = preprocessed
    init = tf.lookup.TextFileInitializer(
        str(root / "vocab" / "shared.txt"), tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
        tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER,
    )
    table = tf.lookup.StaticHashTable(init, -1)
    tokens = vocabulary.read_vocabulary(str(root / "vocab"), "shared")
    assert table.lookup(tf.constant(tokens)).numpy().tolist() == list(range(len(tokens)))


def _transformed(root, split):
    files = tf.io.gfile.glob(str(root / f"tx/Split-{split}/*"))
    assert files and all(f.endswith(".gz") for f in files), files
    spec = {
        "label": tf.io.FixedLenFeature([1], tf.float32),
        "I1": tf.io.FixedLenFeature([1], tf.float32),
        "I2": tf.io.FixedLenFeature([1], tf.float32),
        **{c: tf.io.VarLenFeature(tf.int64) for c in COLUMN},
    }
    out = []
    for rec in transformed_rows_of(root / "tx", split):
        p = tf.io.parse_single_example(rec, spec)
        out.append({k: (tf.sparse.to_dense(v).numpy().tolist() if isinstance(v, tf.SparseTensor) else
                        float(v.numpy()[0])) for k, v in p.items()})
    return out


def transformed_rows_of(tx_root, split):
    """A split's transformed rows as serialized tf.Examples, one per row, whatever the format."""
    from components.contracts import artifacts
    from components.contracts.manifest import VocabularyManifest
    from components.data_io.examples_io import transformed_rows

    manifest = VocabularyManifest.from_json((tx_root / artifacts.EMBEDDING_MANIFEST_FILE).read_text())
    return transformed_rows(str(tx_root / f"Split-{split}" / "*"), manifest, 1 << 30)


def _expected_ids(cfg, root, rows):
    tables = {t.name: t for t in cfg.tables}
    vocab = {n: vocabulary.read_vocabulary(str(root / "vocab"), n) for n in tables}
    out = []
    for row in rows:
        if row[0] is None:
            continue
        rec = {"label": float(row[0])}
        rec["I1"] = rulebook.dense_value(KINDS["I1"], row[1], -1.0).value  # the rulebook's D1-D5
        rec["I2"] = rulebook.dense_value(KINDS["I2"], row[2], 0.0).value
        for f in COLUMN:  # the rulebook's T1-T7 and V1-V2
            t = cfg.feature_table(next(x for x in cfg.categorical_features if x.name == f))
            rec[f] = [rulebook.embedding_id(tok, vocab[t.name], t.vocabulary.num_oov_buckets) for tok in expected_tokens(f, row)]
        out.append(rec)
    return out


def _canon(records):
    return sorted(json.dumps(r, sort_keys=True) for r in records)


@pytest.mark.parametrize("split, rows", [("train", ROWS), ("eval", EVAL_ROWS)])
def test_transformed_examples_hold_expected_ids(preprocessed, split, rows):
    cfg, root, _ = preprocessed
    assert _canon(_transformed(root, split)) == _canon(_expected_ids(cfg, root, rows))


def test_statistics_count_bad_values_by_reason(preprocessed):
    _, root, stats = preprocessed
    assert stats == json.loads((root / "stats" / "statistics.json").read_text())
    train = stats["splits"]["train"]
    assert train["examples_read"] == 7 and train["examples_dropped"] == {"missing_label": 1, "invalid_label": 0}
    assert train["examples_written"] == 6
    c1 = stats["features"]["C1"]["splits"]["train"]
    assert c1["invalid_values"] == {"not_utf8": 1}
    assert stats["features"]["C4"]["splits"]["train"]["invalid_values"] == {"line_break": 1}
    assert stats["features"]["C3"]["splits"]["train"]["invalid_values"] == {"negative_int": 1}
    assert stats["features"]["C3"]["splits"]["eval"]["invalid_values"] == {"negative_int": 1}
    c2 = stats["features"]["C2"]["splits"]["train"]
    assert c2["truncated_ids"] == 2  # "x|y|z" and "|z|x|y" each lose one token to max_length 2
    assert c2["ids_per_example"]["max"] == 2
    # per-example ID counts of the 6 labelled rows: 2, 2, 1, 1, 0 (absent), 2
    assert c2["ids_per_example"]["histogram"] == [1, 2, 3]
    # smallest value with at least q of the examples at or below it
    assert c2["ids_per_example"]["p50"] == 1 and c2["ids_per_example"]["p90"] == 2
    assert c2["ids_per_example"]["mean"] == pytest.approx(8 / 6)
    assert stats["dense_features"]["I1"]["train"]["invalid_values"] == {"multi_valued_dense": 1, "nan": 1}
    assert stats["dense_features"]["I1"]["train"]["missing"] == 2  # absent + NaN
    ev = stats["features"]["C1"]["splits"]["eval"]
    assert ev["oov_ids"] == 1 and ev["ids"] == 2


def test_serving_transform_matches_preprocessing(preprocessed):
    """The serving graph's raw-feature transform gives the same IDs and dense values."""
    from components.embedding_exporter.serving import RawFeatureTransform

    cfg, root, _ = preprocessed
    manifest = VocabularyManifest.from_json((root / "vocab" / "manifest.json").read_text())
    transform = RawFeatureTransform(manifest, str(root / "vocab"))
    rows = [r for r in ROWS + EVAL_ROWS if r[0] is not None]
    inputs = transform.from_examples(tf.constant([_example(r) for r in rows]))
    expected = _expected_ids(cfg, root, ROWS) + _expected_ids(cfg, root, EVAL_ROWS)
    for i, exp in enumerate(expected):
        for f in COLUMN:
            got = tf.sparse.to_dense(tf.sparse.slice(inputs[f], [i, 0], [1, 100])).numpy().ravel().tolist()
            assert got[: len(exp[f])] == exp[f], (i, f)
            assert all(g == 0 for g in got[len(exp[f]):]) and len(inputs[f].values.numpy()[inputs[f].indices.numpy()[:, 0] == i]) == len(exp[f])
        assert float(inputs["I1"][i, 0]) == pytest.approx(exp["I1"]) and float(inputs["I2"][i, 0]) == exp["I2"]


def test_shared_table_features_have_their_own_value_statistics(preprocessed):
    _, _, stats = preprocessed
    for f in ("C1", "C4"):  # the two features of table "shared", each on its own values
        counts = independent_vocab([f], ROWS)
        total = sum(c for _, c in counts)
        values = stats["features"][f]["values"]
        assert values["distinct_values"] == len(counts) and values["occurrences"] == total, f
        assert [(h["value"].encode(), h["count"]) for h in values["hottest_values"]] == counts[:10], f
        assert values["coverage_curve"][0] == {"top": 1, "share": counts[0][1] / total}, f
    # the table adds both up
    assert stats["tables"]["shared"]["vocabulary"]["occurrences"] == sum(
        stats["features"][f]["values"]["occurrences"] for f in ("C1", "C4")
    )
    # a feature with a table of its own shows the table's distribution
    own = stats["tables"]["C3"]["vocabulary"]
    assert stats["features"]["C3"]["values"] == {k: own[k] for k in stats["features"]["C3"]["values"]}
    assert stats["features"]["C3"]["values"]["distinct_values"] == 3


def test_table_statistics_are_consistent(preprocessed):
    cfg, root, stats = preprocessed
    shared = stats["tables"]["shared"]
    ids = sum(stats["features"][f]["splits"]["train"]["ids"] for f in ("C1", "C4"))
    for n, per in shared["shards"].items():
        for strategy in ("div", "mod"):
            assert sum(per[strategy]["load_per_shard"]) == ids  # every train ID lands on one shard
            assert len(per[strategy]["load_per_shard"]) == int(n)
    assert shared["vocabulary"]["distinct_values"] == 3 and shared["vocabulary"]["occurrences"] == ids
    assert shared["memory"]["total_bytes"] == shared["rows"] * 4 * 4 * 2  # dim 4, adagrad: 1 slot
    # 7 rows with the default batch size of 256: no full batch, so no per-batch maxima are claimed
    assert shared["batches"]["full_batches"] == 0 and shared["batches"]["ids_per_batch_max"] is None


def test_html_report_renders_every_table_and_feature(preprocessed):
    from html.parser import HTMLParser

    cfg, root, stats = preprocessed
    text = (root / "stats" / "statistics.html").read_text()

    class Collect(HTMLParser):
        def __init__(self):
            super().__init__()
            self.tags = []

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)

    parser = Collect()
    parser.feed(text)
    assert parser.tags.count("svg") >= len(stats["tables"]) * (1 + len(stats["shard_counts"]))
    for name in list(stats["tables"]) + list(stats["features"]):
        assert f"{name}" in text
    assert "not_utf8: 1" in text and "line_break: 1" in text


# The weighted and the given (list) vocabularies: one preprocessing run that the two tests below
# read (one Beam run, not one each). CONFIG with the shared table weighted by I1, and a feature
# `color` with a list vocabulary that no train row holds, only the eval split's.
WEIGHTED_ROWS = [(1, [2.0], [0], [b"a"], [b"x"], [1], [b"a"]), (0, [0.5], [0], [b"b"], [b"x"], [1], [b"b"]),
                 (1, [0.5], [0], [b"b"], [b"y"], [1], [b"c"]), (1, None, [0], [b"c"], [b"y"], [1], [b"c"])]
COLOR_EVAL_ROWS = [  # (row, its color)
    ((0, [1.0], [0], [b"a"], [b"x"], [1], [b"a"]), b"blue"),
    ((1, [1.0], [0], [b"b"], [b"y"], [1], [b"b"]), b"red"),
    ((0, [1.0], [0], [b"c"], [b"x"], [1], [b"c"]), b"teal"),
]


def _with_color(row, color):
    example = tf.train.Example.FromString(_example(row))
    example.features.feature["color"].bytes_list.value.append(color)
    return example.SerializeToString()


@pytest.fixture(scope="module")
def vocabulary_kinds(tmp_path_factory):
    """The run's root (vocab/, tx/); read-only."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    root = tmp_path_factory.mktemp("kinds")
    _write_tfrecord_gz(str(root / "raw/Split-train/d.gz"), [_example(r) for r in WEIGHTED_ROWS])
    _write_tfrecord_gz(str(root / "raw/Split-eval/d.gz"), [_with_color(r, c) for r, c in COLOR_EVAL_ROWS])
    config = json.loads(json.dumps(CONFIG))
    config["tables"][0]["vocabulary"] = {"weight_column": "I1", "min_frequency": 1}
    config["input"]["allow_invalid"] = ["color"]  # no train row holds it
    config["categorical_features"].append(
        {"name": "color", "vocabulary": {"kind": "list", "values": ["red", "green", "blue"], "num_oov_buckets": 1}})
    run_preprocessing(
        beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=in_memory"])),
        parse_config(config),
        {s: str(root / f"raw/Split-{s}/*") for s in ("train", "eval")}, str(root / "vocab"),
        {s: str(root / f"tx/Split-{s}") for s in ("train", "eval")}, str(root / "stats"),
    )
    return root


def test_weighted_vocabulary(vocabulary_kinds):
    """`weight_column`: a value counts by its rows' weights (tf.Transform's `weights`)."""
    vocab = vocabulary_kinds / "vocab"
    # weights by row: 2.0, 0.5, 0.5, missing -> 0. C1 and C4 share the weighted table:
    # a: 2.0 + 2.0 = 4.0; b: 0.5 + 0.5 (row 1) + 0.5 (C1 of row 2) = 1.5;
    # c: 0.5 (C4 of row 2) + 0 + 0 (row 3 has no weight) = 0.5 -> below min_frequency 1
    assert _read_counts_float(str(vocab / "shared.counts.txt")) == [(b"a", 4.0), (b"b", 1.5)]
    assert vocabulary.read_vocabulary(str(vocab), "C2") == [b"x", b"y"]  # unweighted: 2 each, x first by bytes


def test_given_vocabulary_of_a_feature_the_train_split_never_feeds(vocabulary_kinds):
    """Issue 18, item 4: a list vocabulary is the table's rows even when no train example holds
    the feature: the eval split's values get their given rows (not OOV rows), and the vocabulary
    artifact holds the given lines, which later readers (transform pass, exporter) use."""
    assert (vocabulary_kinds / "vocab" / "color.txt").read_bytes() == b"red\ngreen\nblue\n"

    ids = [tf.train.Example.FromString(r).features.feature["color"].int64_list.value[:]
           for r in transformed_rows_of(vocabulary_kinds / "tx", "eval")]
    assert sorted(ids) == [[0], [2], [3]]  # red, blue, and teal in the OOV row after the three


def _read_counts_float(path):
    with open(path, "rb") as fh:
        return [(line.split(b" ", 1)[1], float(line.split(b" ", 1)[0])) for line in fh.read().split(b"\n") if line]


# The dense-value, label, OOV-hash and JSON integer cases are the rulebook's table
# (components/rules/rulebook.py), run through preprocessing and serving by tests/test_rulebook.py.


def test_ledger_and_health_in_statistics(preprocessed):
    _, _, stats = preprocessed
    led = stats["ledger"]
    assert led["balanced"] and [s["stage"] for s in led["stages"]] == ["EmbeddingPreprocess"]
    stage = led["stages"][0]
    assert stage["rows_in"] == {"train": 7, "eval": 2} and stage["rows_out"] == {"train": 6, "eval": 2}
    assert stage["dropped"]["train"] == {"missing_label": 1, "invalid_label": 0}
    health = stats["feature_health"]
    assert health["rows"] == 6 and health["features"]["C1"]["unusable_rows"] == 2  # [] and b"bad\xff"


def _length_hash(values):
    """A deliberately weak hash (the token's length) to force hash collisions."""
    return np.asarray(pc.binary_length(values), dtype=np.uint64)


def test_vocabulary_lookup_is_exact_when_hashes_collide(monkeypatch):
    from components.example_gen import split_hash

    monkeypatch.setattr(split_hash, "binary_value_hashes", _length_hash)
    # vocabulary hashes unique (lengths 1, 2, 3): tokens that hit an entry with other bytes are OOV
    lookup = vocabulary.VocabularyLookup([b"a", b"bb", b"ccc"], 1)
    assert lookup._by_hash
    ids, oov = lookup.lookup(pa.array([b"bb", b"zz", b"a", b"q", b"dddd", b"ccc"], pa.binary()))
    assert ids.tolist() == [1, 3, 0, 3, 3, 2] and oov == 3
    # two entries share a hash: the lookup falls back to the tokens themselves, still exact
    lookup = vocabulary.VocabularyLookup([b"a", b"b", b"cc"], 2)
    assert not lookup._by_hash
    ids, oov = lookup.lookup(pa.array([b"b", b"a", b"cc", b"x"], pa.binary()).slice(0, 4))
    assert ids.tolist()[:3] == [1, 0, 2] and ids[3] == 3 + vocabulary.oov_bucket(b"x", 2) and oov == 1


def test_vocabulary_lookup_of_a_sliced_batch_and_of_bytes():
    lookup = vocabulary.VocabularyLookup([b"x", b"y"], 1)
    arr = pa.array([b"q", b"y", b"x", b"y"], pa.binary()).slice(1, 3)  # a slice: offset into the buffers
    assert lookup.lookup(arr)[0].tolist() == [1, 0, 1]
    assert lookup.lookup([b"x", b"nope"])[0].tolist() == [0, 2]
    assert lookup.lookup(pa.array([], pa.binary()))[0].tolist() == []


@pytest.mark.parametrize("data", [
    b"", b"a\n", b"a\nbb\n\nccc\n", b"a\nb", b"\n\n", b"x\r\n\xff\x00\n", b"only",
])
def test_vocabulary_tokens_are_the_files_complete_lines(tmp_path, data):
    """read_vocabulary_tokens (an Arrow array from the file's bytes) holds exactly the lines
    `data.split(b"\\n")[:-1]` gives: a last line without its line break is not a token, a CR stays."""
    (tmp_path / "t.txt").write_bytes(data)
    tokens = vocabulary.read_vocabulary_tokens(str(tmp_path), "t")
    tokens.validate(full=True)
    assert tokens.type == pa.binary()
    assert tokens.to_pylist() == (data.split(b"\n")[:-1] if data else [])
    assert vocabulary.read_vocabulary(str(tmp_path), "t") == tokens.to_pylist()


def test_a_file_the_run_did_not_write_stops_the_ledger(tmp_path):
    """The written rows are counted inside the pipeline, file by file, from the final names the
    writes report; a file in the output directory that the run did not write is refused."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from components.reporting.errors import LedgerError

    _write_tfrecord_gz(str(tmp_path / "raw/Split-train/data.gz"), [_example(r) for r in ROWS])
    stale = tmp_path / "tx/Split-train/transformed_examples-99999-of-99999"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"")  # an empty TFRecord file: no rows, but not this run's
    cfg = parse_config(json.loads(json.dumps(CONFIG)))
    pipeline = beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=in_memory"]))
    with pytest.raises(LedgerError, match="Split-train holds 3 files, but the pipeline wrote and counted 2"):
        run_preprocessing(pipeline, cfg, {"train": str(tmp_path / "raw/Split-train/*")}, str(tmp_path / "vocab"),
                          {"train": str(tmp_path / "tx/Split-train")}, str(tmp_path / "stats"))
