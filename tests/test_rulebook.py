"""The rulebook's table of cases (`components/rules/rulebook.py`) run through every implementation of it:

- the rulebook's own plain-Python statement of each rule;
- preprocessing's pyarrow code (`features.extract_tokens` + `vocabulary.VocabularyLookup`,
  `features.extract_dense`, `features.extract_label`) and ExampleGen's label check
  (`records.derive_label`);
- the serving graph's `RawFeatureTransform` (`from_examples` on serialized tf.Examples,
  `from_feature_tensors` on the JSON form) and a saved serving model's signatures
  (`serving_default`, `serve_features`, and `serve_typed_features` for the int64 columns sent as
  numbers) around a probe model that returns the IDs it is given;
- the OOV hash: farmhash in Python against `tf.strings.to_hash_bucket_fast`.
One case, one parametrized test per implementation: a case that fails names the rule and the path."""
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

import components  # noqa: F401
from components.rules import rulebook, rulebook_cases
from components.embedding_preprocess import features
from components.contracts.manifest import weights_key
from components.embedding_preprocess import vocabulary as vocabulary_lib

TOKEN_CASES = {c.name: c for c in rulebook_cases.TOKEN_CASES}
DENSE_CASES = {c.name: c for c in rulebook_cases.DENSE_CASES}
INT_TEXT = "j"  # the int64 column the INT_TEXT_CASES are sent in, as JSON strings
INT_TEXT_OOV_BUCKETS = 5  # its vocabulary is rulebook_cases.VOCABULARY
WIDTH = 8  # the probe model's IDs per row; no case has more
TF_PATHS = ("from_examples", "from_feature_tensors", "serving_default", "serve_features")
JSON_PATHS = ("from_feature_tensors", "serve_features")


def _arrow(kind, rows, float_type=pa.float32()):
    """A column as tfx_bsl decodes tf.Examples: a list array, null where the feature is absent."""
    if kind == rulebook.KIND_NONE:
        return None
    value_type = {rulebook.KIND_BYTES: pa.binary(), rulebook.KIND_INT: pa.int64(), rulebook.KIND_FLOAT: float_type}[kind]
    return pa.array([None if r is None else list(r) for r in rows], pa.list_(value_type))


def _per_row(rows, values, num_rows):
    out = [[] for _ in range(num_rows)]
    for r, v in zip(rows, values):
        out[r].append(v)
    return tuple(tuple(x) for x in out)


# ---- tokens and IDs ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TOKEN_CASES)
def test_token_case_reference(name):
    case = TOKEN_CASES[name]
    rows = [rulebook.row_tokens(case.kind, r, case.separator, case.max_length) for r in case.rows]
    assert tuple(r.tokens for r in rows) == case.tokens
    assert rulebook.tokens_by_reason(rows) == (dict(case.invalid), case.truncated)
    ids = tuple(tuple(rulebook.embedding_id(t, case.vocabulary, case.num_oov_buckets) for t in r) for r in case.tokens)
    assert ids == case.ids  # V1-V2, farmhash in Python
    json = case.json_rows()
    if json is not None:
        assert tuple(rulebook.json_row_tokens(case.kind, t, case.separator, case.max_length).tokens for t in json) == case.tokens


@pytest.mark.parametrize("name", TOKEN_CASES)
def test_token_case_arrow(name):
    case = TOKEN_CASES[name]
    toks = features.extract_tokens(_arrow(case.kind, case.rows), len(case.rows), case.separator, case.max_length)
    assert _per_row(toks.row.tolist(), toks.values.to_pylist(), len(case.rows)) == case.tokens
    assert toks.invalid == dict(case.invalid) and toks.truncated == case.truncated
    ids, oov = vocabulary_lib.VocabularyLookup(case.vocabulary, case.num_oov_buckets).lookup(toks.values)
    assert _per_row(toks.row.tolist(), ids.tolist(), len(case.rows)) == case.ids
    assert oov == sum(t not in case.vocabulary for row in case.tokens for t in row)


def _token_params():
    for name, case in TOKEN_CASES.items():
        for path in TF_PATHS:
            if path in JSON_PATHS and case.json_rows() is None:
                continue  # several values without a separator: no JSON form
            yield pytest.param(name, path, id=f"{name}-{path}")


@pytest.mark.parametrize("name, path", _token_params())
def test_token_case_serving(served, name, path):
    case = TOKEN_CASES[name]
    assert served.ids(path, name, len(case.rows)) == case.ids


@pytest.mark.parametrize("case", rulebook_cases.INT_TEXT_CASES, ids=lambda c: repr(c.text))
def test_int_text_case_reference(case):
    value, reason = rulebook.int_text_value(case.text)
    assert (None if value is None else str(value).encode(), reason) == (case.token, case.reason)
    tokens = rulebook.json_row_tokens(rulebook.KIND_INT, case.text)
    assert tokens.tokens == ((case.token,) if case.token else ())
    assert dict(tokens.invalid) == ({case.reason: 1} if case.reason else {})


@pytest.mark.parametrize("case", [c for c in rulebook_cases.INT_TEXT_CASES if c.token is not None], ids=lambda c: repr(c.text))
def test_int_text_stands_for_its_int64_value_in_preprocessing(case):
    """J2: the JSON string gives the token preprocessing makes of the int64 value it stands for."""
    toks = features.extract_tokens(pa.array([[int(case.token)]], pa.list_(pa.int64())), 1, None, None)
    assert toks.values.to_pylist() == [case.token]


@pytest.mark.parametrize("path", JSON_PATHS)
def test_int_text_cases_serving(served, path):
    expected = tuple(
        (rulebook.embedding_id(c.token, rulebook_cases.VOCABULARY, INT_TEXT_OOV_BUCKETS),) if c.token else () for c in rulebook_cases.INT_TEXT_CASES
    )
    assert served.ids(path, INT_TEXT, len(rulebook_cases.INT_TEXT_CASES)) == expected


def test_int_columns_as_numbers_serving(served):
    """`serve_typed_features` (int64 ID columns sent as JSON numbers): each int64 column's rows give
    the IDs of the value its J2 text stands for (a text that stands for none: the row sends none),
    the identity column its V4 IDs (T2 first: a negative number is none), the int64 token cases
    their rows' IDs (a row of several values cannot be sent: none); every other column,
    sent as in `serve_features`, gives what `serve_features` gives."""
    path = "serve_typed_features"
    expected = tuple(
        (rulebook.embedding_id(c.token, rulebook_cases.VOCABULARY, INT_TEXT_OOV_BUCKETS),) if c.token else () for c in rulebook_cases.INT_TEXT_CASES
    )
    assert served.ids(path, INT_TEXT, len(rulebook_cases.INT_TEXT_CASES)) == expected
    assert served.ids(path, "identity_int", len(INT_IDENTITY)) == _kind_expected("identity_int")
    int_cases = {_feature_name("t", i): c for i, c in enumerate(TOKEN_CASES.values()) if c.kind == rulebook.KIND_INT}
    assert int_cases
    for name, case in int_cases.items():  # one value per row: its IDs; several: none sent
        expected = tuple(ids if v and len(v) == 1 else () for v, ids in zip(case.rows, case.ids))
        assert served.ids(path, case.name, len(case.rows)) == expected, case.name
    typed, json = served.outputs[path].copy(), served.outputs["serve_features"].copy()
    for name in (INT_TEXT, "identity_int", *int_cases):
        start, width = served.layout[name]
        typed[:, start:start + width] = json[:, start:start + width] = 0
    np.testing.assert_array_equal(typed, json)


# ---- column kinds: hashed (V3) and identity (V4) --------------------------------------------------

HASH_BUCKETS = 1000
IDENTITY = {d: [c for c in rulebook_cases.IDENTITY_CASES if c.default_value == d] for d in (None, 3)}
INT_IDENTITY = (0, 7, 9, 10, -1, 12345678901234)  # an int64 column: T2 first (-1: negative_int), then V4
# column -> (raw kind, vocabulary options, one value per row)
KIND_COLUMNS = {
    "hashed": (rulebook.KIND_BYTES, {"kind": "hashed", "num_buckets": HASH_BUCKETS}, sorted({c.token for c in rulebook_cases.OOV_CASES})),
    "identity": (rulebook.KIND_BYTES, {"kind": "identity", "num_buckets": 10}, [c.token for c in IDENTITY[None]]),
    "identity_default": (rulebook.KIND_BYTES, {"kind": "identity", "num_buckets": 10, "default_value": 3},
                         [c.token for c in IDENTITY[3]]),
    "identity_int": (rulebook.KIND_INT, {"kind": "identity", "num_buckets": 10}, list(INT_IDENTITY)),
    # multi-hot, max_length 2: tokens that are no IDs are dropped before T7 takes the first two
    "identity_multi": (rulebook.KIND_BYTES, {"kind": "identity", "num_buckets": 10},
                       [b"12|3|abc|4|5", b"x|y|8", b"1|2|3", b"|07|", b"9"]),
}
MULTI = {"identity_multi": ("|", 2)}  # column -> (separator, max_length)
# W1 in serving: a weighted feature ("weighted": tokens a|x, vocabulary rulebook_cases.VOCABULARY) weighed by a
# float column ("w") holding the float weight cases (a tf.Example column has one kind).
WEIGHTED, WEIGHT_COLUMN = "weighted", "w"
FLOAT_WEIGHTS = [(values, weight) for kind, values, weight in rulebook_cases.WEIGHT_CASES if kind == rulebook.KIND_FLOAT]


def _weighted_expected():
    """(IDs per row, weight per row) by the rulebook: a|x -> (0, 1) when the row is weighed."""
    ids = tuple(() if w is None else (0, 1) for _, w in FLOAT_WEIGHTS)
    return ids, [w for _, w in FLOAT_WEIGHTS]


def _kind_expected(name):
    """Each row's IDs by the rulebook's plain Python (V3: oov_bucket; V4: identity_id after T2)."""
    kind, options, rows = KIND_COLUMNS[name]
    out = []
    separator, max_length = MULTI.get(name, (None, None))
    for value in rows:
        tokens = rulebook.row_tokens(kind, [value], separator).tokens
        if options["kind"] == "hashed":
            out.append(tuple(rulebook.oov_bucket(t, options["num_buckets"]) for t in tokens))
        else:
            ids = [rulebook.identity_id(t, options["num_buckets"], options.get("default_value"))[0] for t in tokens]
            out.append(tuple(i for i in ids if i is not None)[:max_length])  # V4 drops take no place in T7
    return tuple(out)


@pytest.mark.parametrize("default", [None, 3])
def test_identity_case_reference(default):
    for c in IDENTITY[default]:
        assert rulebook.identity_id(c.token, c.num_buckets, c.default_value) == (c.row, c.reason), c


@pytest.mark.parametrize("name", KIND_COLUMNS)
def test_column_kind_arrow(name):
    """Preprocessing's Arrow path (extract_tokens with the table's id_filter, the table's lookup)
    gives the rulebook's IDs and counts the rulebook's reasons."""
    from components.config.schema import VocabularyOptions
    from components.embedding_preprocess.transform import make_lookups

    kind, options, rows = KIND_COLUMNS[name]
    cfg = SimpleNamespace(tables=[SimpleNamespace(name=name, vocabulary=VocabularyOptions(**options))])
    lookup = make_lookups(cfg, {})[name]
    separator, max_length = MULTI.get(name, (None, None))
    toks = features.extract_tokens(_arrow(kind, [[v] for v in rows]), len(rows), separator, max_length,
                            getattr(lookup, "id_filter", None))
    ids, oov = lookup.lookup(toks.values)
    assert _per_row(toks.row.tolist(), ids.tolist(), len(rows)) == _kind_expected(name)
    expected = Counter()
    for v in rows:
        for t in rulebook.row_tokens(kind, [v], separator).tokens:
            if options["kind"] == "identity":
                _, reason = rulebook.identity_id(t, options["num_buckets"], options.get("default_value"))
                expected[reason] += reason is not None
    for v in rows:  # T2's reasons (negative_int) come first
        expected.update(dict(rulebook.row_tokens(kind, [v]).invalid))
    assert toks.invalid == {k: c for k, c in expected.items() if c}
    if options["kind"] == "identity" and options.get("default_value") is not None:
        assert oov == sum(c.row == 3 and c.token != b"3" for c in IDENTITY[3])


@pytest.mark.parametrize("name", KIND_COLUMNS)
@pytest.mark.parametrize("path", TF_PATHS)
def test_column_kind_serving(served, name, path):
    assert served.ids(path, name, len(KIND_COLUMNS[name][2])) == _kind_expected(name)


@pytest.mark.parametrize("kind, values, weight", rulebook_cases.WEIGHT_CASES, ids=lambda v: repr(v))
def test_weight_case_arrow(kind, values, weight):
    """W1 in preprocessing: the row's weight, or its tokens dropped and counted."""
    t = {rulebook.KIND_FLOAT: pa.float32(), rulebook.KIND_INT: pa.int64(), rulebook.KIND_BYTES: pa.binary()}[kind]
    w = features.extract_weights(pa.array([None if values is None else list(values)], pa.list_(t)), 1)
    assert rulebook.row_weight(kind, values) == weight and (np.isnan(w[0]) if weight is None else w[0] == weight)
    toks = features.extract_tokens(_arrow(rulebook.KIND_BYTES, [[b"a|x"]]), 1, "|", None, row_weights=w)
    assert toks.values.to_pylist() == ([] if weight is None else [b"a", b"x"])
    assert toks.invalid == ({} if weight is not None else {rulebook.INVALID_WEIGHT: 2})


@pytest.mark.parametrize("path", TF_PATHS)
def test_weighted_ids_serving(served, path):
    ids, weights = _weighted_expected()
    assert served.ids(path, WEIGHTED, len(ids)) == ids
    start, width = served.layout[weights_key(WEIGHTED)]
    got = served.outputs[path][: len(ids), start : start + width]
    for row, (i, w) in enumerate(zip(ids, weights)):
        if w is not None:
            assert got[row, :2].tolist() == [np.float32(w)] * 2, (row, got[row])


# ---- the OOV hash --------------------------------------------------------------------------------


@pytest.mark.parametrize("case", rulebook_cases.OOV_CASES, ids=lambda c: f"{c.token[:10]!r}-{c.num_oov_buckets}")
def test_oov_case(case):
    import tensorflow as tf

    assert rulebook.oov_bucket(case.token, case.num_oov_buckets) == case.bucket
    assert vocabulary_lib.oov_bucket is rulebook.oov_bucket  # the name vocabulary code uses
    assert tf.strings.to_hash_bucket_fast([case.token], case.num_oov_buckets).numpy().tolist() == [case.bucket]


def test_oov_hash_matches_tensorflow():
    """Every OOV token of the table, for every bucket count, hashed by Python and by TensorFlow."""
    import tensorflow as tf

    tokens = sorted({c.token for c in rulebook_cases.OOV_CASES})
    for buckets in sorted({c.num_oov_buckets for c in rulebook_cases.OOV_CASES}):
        ours = [rulebook.oov_bucket(t, buckets) for t in tokens]
        assert ours == tf.strings.to_hash_bucket_fast(tokens, buckets).numpy().tolist()


# ---- dense values --------------------------------------------------------------------------------


def test_serving_default_parses_each_column_as_the_examples_hold_it(served):
    """R1: the parse spec takes each column's type from the kinds preprocessing recorded (int64
    where a stock ExampleGen wrote int64, float where it wrote float, bytes for text; a column
    without a value: its feature's natural kind), so every case above reaches the rules unconverted."""
    import tensorflow as tf

    dtype = {rulebook.KIND_BYTES: tf.string, rulebook.KIND_INT: tf.int64, rulebook.KIND_FLOAT: tf.float32}
    expected = {_feature_name("t", i): dtype.get(c.kind, tf.string) for i, c in enumerate(TOKEN_CASES.values())}
    expected.update({_feature_name("d", i): dtype[c.kind] for i, c in enumerate(DENSE_CASES.values())})
    expected.update({INT_TEXT: tf.int64, WEIGHTED: tf.string, WEIGHT_COLUMN: tf.float32})
    expected.update({name: dtype[kind] for name, (kind, _, _) in KIND_COLUMNS.items()})
    assert {c: f.dtype for c, f in served.example_spec.items()} == expected


@pytest.mark.parametrize("name", DENSE_CASES)
def test_dense_case_reference(name):
    case = DENSE_CASES[name]
    rows = [rulebook.dense_value(case.kind, r, case.fill_value) for r in case.rows]
    np.testing.assert_array_equal(np.float32([r.value for r in rows]), np.float32(case.values))
    invalid = Counter()
    for r in rows:
        invalid.update(r.invalid)
    assert sum(r.missing for r in rows) == case.missing and dict(invalid) == dict(case.invalid)


@pytest.mark.parametrize("float_type", [pa.float32(), pa.float64()], ids=["float32", "float64"])
@pytest.mark.parametrize("name", DENSE_CASES)
def test_dense_case_arrow(name, float_type):
    case = DENSE_CASES[name]
    dense = features.extract_dense(_arrow(case.kind, case.rows, float_type), len(case.rows), case.fill_value)
    np.testing.assert_array_equal(dense.values, np.float32(case.values))
    assert dense.missing == case.missing and dense.invalid == dict(case.invalid)


def _dense_params():
    for name, case in DENSE_CASES.items():
        for path in TF_PATHS:
            if path in JSON_PATHS and case.json_rows() is None:
                continue  # a text column: JSON dense columns are numbers
            yield pytest.param(name, path, id=f"{name}-{path}")


@pytest.mark.parametrize("name, path", _dense_params())
def test_dense_case_serving(served, name, path):
    case = DENSE_CASES[name]
    np.testing.assert_array_equal(served.dense(path, name, len(case.rows)), np.float32(case.values))


# ---- labels --------------------------------------------------------------------------------------

LABEL_KINDS = sorted({c.kind for c in rulebook_cases.LABEL_CASES})


def _label_cases(kind):
    return [c for c in rulebook_cases.LABEL_CASES if c.kind == kind]


def _check_labels(cases, label, missing, invalid):
    assert missing.tolist() == [c.reason == rulebook.DROP_MISSING_LABEL for c in cases]
    assert invalid.tolist() == [c.reason == rulebook.DROP_INVALID_LABEL for c in cases]
    keep = ~missing & ~invalid
    assert [float(v) for v, k in zip(label, keep) if k] == [c.label for c in cases if c.label is not None]


@pytest.mark.parametrize("kind", LABEL_KINDS)
def test_label_cases_preprocessing(kind):
    """All cases of one raw kind in one batch through `features.extract_label`."""
    cases = _label_cases(kind)
    labels = features.extract_label(_arrow(kind, [c.values for c in cases]), len(cases))
    _check_labels(cases, labels.values, labels.missing, labels.invalid)
    assert labels.keep.tolist() == [c.label is not None for c in cases]


@pytest.mark.parametrize("kind", LABEL_KINDS)
def test_label_cases_example_gen(kind):
    """The same cases through ExampleGen's check (no `label_rule`), which writes int64 labels."""
    from components.example_gen.records import derive_label

    cases = _label_cases(kind)
    label, missing, invalid = derive_label(
        SimpleNamespace(label_rule=None), _arrow(kind, [c.values for c in cases]), len(cases)
    )
    assert label.dtype == np.int64
    _check_labels(cases, label, missing, invalid)


# ---- the serving graph: one transform and one saved model for every case --------------------------


def _feature_name(prefix, i):
    return f"{prefix}{i}"


class _Served:
    """Every case's column through the four TensorFlow paths, decoded per case."""

    def __init__(self, outputs, layout, example_spec):
        self.outputs = outputs  # path -> float64 [rows, columns] from the probe model
        self.layout = layout  # feature name -> (first column, width)
        self.example_spec = example_spec  # raw column -> what serving_default parses it as

    def _block(self, path, feature, num_rows):
        start, width = self.layout[feature]
        return self.outputs[path][:num_rows, start : start + width]

    def ids(self, path, case_name, num_rows):
        feature = case_name if case_name in (INT_TEXT, WEIGHTED) or case_name in KIND_COLUMNS else _feature_name(
            "t", list(TOKEN_CASES).index(case_name))
        return tuple(tuple(int(i) for i in row if i >= 0) for row in self._block(path, feature, num_rows))

    def dense(self, path, case_name, num_rows):
        feature = _feature_name("d", list(DENSE_CASES).index(case_name))
        return self._block(path, feature, num_rows)[:, 0].astype(np.float32)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import tensorflow as tf

    from components.config.loading import parse_config
    from components.embedding_exporter.serving import RawFeatureTransform, ServingModule
    from components.embedding_model.saving import save_serving_model
    from components.embedding_preprocess.run import build_manifest

    root = tmp_path_factory.mktemp("rulebook")
    token_cases = list(TOKEN_CASES.values())
    dense_cases = list(DENSE_CASES.values())
    categorical, vocabularies, kinds = [], {}, {}
    for i, case in enumerate(token_cases):
        name = _feature_name("t", i)
        feature = {"name": name, "vocabulary": {"num_oov_buckets": case.num_oov_buckets}}
        feature.update({k: v for k, v in (("separator", case.separator), ("max_length", case.max_length)) if v})
        categorical.append(feature)
        vocabularies[name] = case.vocabulary
        kinds[name] = case.kind
    categorical.append({"name": INT_TEXT, "vocabulary": {"num_oov_buckets": INT_TEXT_OOV_BUCKETS}})
    vocabularies[INT_TEXT] = rulebook_cases.VOCABULARY
    kinds[INT_TEXT] = rulebook.KIND_INT
    for name, (kind, vocabulary, _) in KIND_COLUMNS.items():
        separator, max_length = MULTI.get(name, (None, None))
        categorical.append({"name": name, "vocabulary": vocabulary, "separator": separator, "max_length": max_length})
        vocabularies[name] = ()
        kinds[name] = kind
    categorical.append({"name": WEIGHTED, "weight_column": WEIGHT_COLUMN, "separator": "|",
                        "vocabulary": {"num_oov_buckets": 1}})
    vocabularies[WEIGHTED] = rulebook_cases.VOCABULARY
    kinds[WEIGHTED], kinds[WEIGHT_COLUMN] = rulebook.KIND_BYTES, rulebook.KIND_FLOAT
    dense = [{"name": _feature_name("d", i), "fill_value": c.fill_value} for i, c in enumerate(dense_cases)]
    kinds.update({_feature_name("d", i): c.kind for i, c in enumerate(dense_cases)})
    cfg = parse_config({"input": {"path": "unused.csv"}, "label": "label", "dense_features": dense,
                        "categorical_features": categorical})
    vocab_dir = str(root / "vocab")
    for name, tokens in vocabularies.items():
        vocabulary_lib.write_vocabulary(vocab_dir, name, [(t, 1) for t in tokens])
    # the raw kinds as preprocessing records them (an all-missing column gets the default: bytes)
    manifest = build_manifest(cfg, {f"kind/{c}/{k}": 1 for c, k in kinds.items() if k != rulebook.KIND_NONE}, vocab_dir)
    transform = RawFeatureTransform(manifest, vocab_dir)

    num_rows = max([len(c.rows) for c in token_cases + dense_cases] + [len(rulebook_cases.INT_TEXT_CASES)]
                   + [len(rows) for _, _, rows in KIND_COLUMNS.values()] + [len(FLOAT_WEIGHTS)])

    def rows_of(case):
        return list(case.rows) + [None] * (num_rows - len(case.rows))

    def feature(kind, values):
        if kind == rulebook.KIND_BYTES:
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
        if kind == rulebook.KIND_INT:
            return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))

    examples = []
    for r in range(num_rows):
        feats = {}
        for prefix, cases in (("t", token_cases), ("d", dense_cases)):
            for i, case in enumerate(cases):
                values = rows_of(case)[r]
                if values is not None:  # None: the feature is absent; (): present with no value
                    feats[_feature_name(prefix, i)] = feature(case.kind, list(values))
        for name, (kind, _, rows) in KIND_COLUMNS.items():
            if r < len(rows):
                feats[name] = feature(kind, [rows[r]])
        if r < len(FLOAT_WEIGHTS):
            feats[WEIGHTED] = feature(rulebook.KIND_BYTES, [b"a|x"])
            if FLOAT_WEIGHTS[r][0] is not None:
                feats[WEIGHT_COLUMN] = feature(rulebook.KIND_FLOAT, list(FLOAT_WEIGHTS[r][0]))
        examples.append(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())
    examples = tf.constant(examples)

    columns = {}
    for i, case in enumerate(token_cases):
        json = case.json_rows() or ()
        columns[_feature_name("t", i)] = tf.constant(list(json) + [b""] * (num_rows - len(json)), tf.string)
    texts = [c.text for c in rulebook_cases.INT_TEXT_CASES]
    columns[INT_TEXT] = tf.constant(texts + [b""] * (num_rows - len(texts)), tf.string)
    pad = num_rows - len(FLOAT_WEIGHTS)
    columns[WEIGHTED] = tf.constant([b"a|x"] * len(FLOAT_WEIGHTS) + [b""] * pad, tf.string)
    columns[WEIGHT_COLUMN] = tf.constant([v[0] if v else float("nan") for v, _ in FLOAT_WEIGHTS] + [float("nan")] * pad,
                                         tf.float32)
    for name, (kind, _, rows) in KIND_COLUMNS.items():  # JSON: one string per row (J1, J2)
        texts = [str(v).encode() if kind == rulebook.KIND_INT else v for v in rows]
        columns[name] = tf.constant(texts + [b""] * (num_rows - len(texts)), tf.string)
    for i, case in enumerate(dense_cases):
        json = case.json_rows() or ()
        columns[_feature_name("d", i)] = tf.constant(list(json) + [float("nan")] * (num_rows - len(json)), tf.float32)

    names = [c["name"] for c in categorical] + [d["name"] for d in dense]
    layout, start = {}, 0
    for c in categorical:
        layout[c["name"]] = (start, WIDTH)
        start += WIDTH
    for d in dense:
        layout[d["name"]] = (start, 1)
        start += 1
    names.append(weights_key(WEIGHTED))
    layout[weights_key(WEIGHTED)] = (start, WIDTH)
    start += WIDTH

    class Probe(tf.Module):
        """A model that returns what it is given: IDs per row (-1 padded) and dense values."""

        def __call__(self, inputs):
            parts = []
            for name in names:
                x = inputs[name]
                if isinstance(x, tf.SparseTensor):
                    x = tf.RaggedTensor.from_sparse(x).to_tensor(default_value=-1, shape=[None, WIDTH])
                parts.append(tf.cast(x, tf.float64))
            return tf.concat(parts, axis=1)

    probe = Probe()
    outputs = {
        "from_examples": probe(transform.from_examples(examples)).numpy(),
        "from_feature_tensors": probe(transform.from_feature_tensors(columns)).numpy(),
    }
    path = str(root / "serving")
    save_serving_model(ServingModule(probe, transform), path)
    loaded = tf.saved_model.load(path)
    outputs["serving_default"] = loaded.signatures["serving_default"](examples=examples)["probabilities"].numpy()
    outputs["serve_features"] = loaded.signatures["serve_features"](**columns)["probabilities"].numpy()
    # serve_typed_features: the int64 ID columns as JSON numbers, one per row (-1: none); a text
    # that stands for no int64 value cannot be sent as a number, so its row sends none.
    int_cases = {_feature_name("t", i): case for i, case in enumerate(token_cases) if case.kind == rulebook.KIND_INT}
    assert sorted(transform.integer_columns()) == sorted([INT_TEXT, "identity_int", *int_cases])
    typed = dict(columns)
    for name, case in int_cases.items():  # a row of several values has no such form: it sends none
        one = [v[0] if v and len(v) == 1 else -1 for v in case.rows]
        typed[name] = tf.constant(one + [-1] * (num_rows - len(one)), tf.int64)
    typed[INT_TEXT] = tf.constant([int(c.token) if c.token else -1 for c in rulebook_cases.INT_TEXT_CASES]
                                  + [-1] * (num_rows - len(rulebook_cases.INT_TEXT_CASES)), tf.int64)
    typed["identity_int"] = tf.constant(list(INT_IDENTITY) + [-1] * (num_rows - len(INT_IDENTITY)), tf.int64)
    outputs["serve_typed_features"] = loaded.signatures["serve_typed_features"](**typed)["probabilities"].numpy()
    return _Served(outputs, layout, transform.example_spec())


# ---- dense buckets (B1) ---------------------------------------------------------------------------

BUCKET_CASES = {c.name: c for c in rulebook_cases.BUCKET_CASES}


@pytest.mark.parametrize("float_type", [pa.float32(), pa.float64()], ids=["float32", "float64"])
@pytest.mark.parametrize("name", BUCKET_CASES)
def test_bucket_case_reference_and_arrow_values(name, float_type):
    """B1 by the rule, and on the values preprocessing's Arrow path gives the rows (D1-D4), bucketed
    as float32 (what the plan's boundaries and the model compare)."""
    case = BUCKET_CASES[name]
    assert tuple(rulebook.dense_bucket(v, case.boundaries) for v in case.case.values) == case.buckets
    dense = features.extract_dense(_arrow(case.case.kind, case.case.rows, float_type), len(case.case.rows), case.case.fill_value)
    got = np.searchsorted(np.float32(case.boundaries), dense.values.astype(np.float32), side="right")
    assert tuple(int(b) for b in got) == case.buckets


def _bucket_params():
    for name, case in BUCKET_CASES.items():
        for path in TF_PATHS:
            if path in JSON_PATHS and case.case.json_rows() is None:
                continue
            yield pytest.param(name, path, id=f"{name}-{path}")


@pytest.mark.parametrize("name,path", _bucket_params())
def test_bucket_case_serving(served, name, path):
    """B1 in the serving graph: the raw rows through every TensorFlow path, then the model's
    Bucketize (model.bucket_ids, the op the training step runs too)."""
    from components.embedding_model.dense_tower import bucket_ids

    case = BUCKET_CASES[name]
    values = served.dense(path, case.case.name, len(case.case.rows))
    assert tuple(int(b) for b in bucket_ids(values, case.boundaries).numpy()) == case.buckets


def _piecewise_params():
    for name, case in BUCKET_CASES.items():
        if len(case.boundaries) >= 2:  # one boundary has no bin
            for path in TF_PATHS:
                if path in JSON_PATHS and case.case.json_rows() is None:
                    continue
                yield pytest.param(name, path, id=f"{name}-{path}")


def test_piecewise_linear_reference_by_hand_and_against_the_buckets():
    """B2 worked by hand on boundaries with a repeat, and its tie to B1 on every case: beside bucket
    k >= 1 exactly k - 1 bins are 1, and at most one bin holds a fraction."""
    b = (0.0, 1.0, 1.0, 3.0)
    assert [rulebook.dense_piecewise_linear(v, b) for v in (-1.0, 0.0, 0.5, 1.0, 2.0, 3.0, 5.0)] == [
        (0.0, 0.0, 0.0), (0.0, 0.0, 0.0), (0.5, 0.0, 0.0), (1.0, 1.0, 0.0), (1.0, 1.0, 0.5),
        (1.0, 1.0, 1.0), (1.0, 1.0, 1.0)]
    for case in BUCKET_CASES.values():
        for v, k in zip(case.case.values, case.buckets):
            enc = rulebook.dense_piecewise_linear(v, case.boundaries)
            assert len(enc) == max(len(case.boundaries) - 1, 0)
            assert sum(1 for e in enc if 0.0 < e < 1.0) <= 1
            if k >= 1:
                assert sum(1 for e in enc if e == 1.0) == k - 1, (case.name, v)


@pytest.mark.parametrize("name,path", _piecewise_params())
def test_piecewise_linear_case_serving(served, name, path):
    """B2 in the serving graph: the raw rows through every TensorFlow path, then the model's
    encoding (model.piecewise_linear, which the training step runs too)."""
    from components.embedding_model.dense_tower import piecewise_linear

    case = BUCKET_CASES[name]
    values = served.dense(path, case.case.name, len(case.case.rows))
    expected = [rulebook.dense_piecewise_linear(v, case.boundaries) for v in case.case.values]
    np.testing.assert_allclose(piecewise_linear(values, case.boundaries).numpy(), np.array(expected), atol=1e-6)


def test_plan_boundaries_are_float32_quantiles_with_repeats_kept():
    from components.planning.derivation import bucket_boundaries

    quantiles = tuple(float(v) for v in np.linspace(0.0, 100.0, 101))
    assert bucket_boundaries(quantiles, 4) == (25.0, 50.0, 75.0)
    assert bucket_boundaries(quantiles, 100) == tuple(float(v) for v in range(1, 100))
    mostly_zero = (0.0,) * 80 + tuple(float(v) for v in range(1, 22))  # a value many rows hold: repeated
    assert bucket_boundaries(mostly_zero, 10) == (0.0,) * 7 + (1.0, 11.0)
    assert rulebook.dense_bucket(0.0, bucket_boundaries(mostly_zero, 10)) == 7  # buckets 1-6 stay empty
    b = bucket_boundaries((0.1,) * 101, 5)
    assert b == (float(np.float32(0.1)),) * 4 and rulebook.dense_bucket(0.1, b) == 4
