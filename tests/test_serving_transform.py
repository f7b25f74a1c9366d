"""The serving graph's fused raw-feature transform (serving.RawFeatureTransform, issue 17) gives
the model exactly the inputs the feature-by-feature transform it replaced gives
(serving_reference.FeatureByFeatureTransform, kept as the oracle): the same SparseTensors (indices,
values, dense shapes) and the same dense values, bit for bit, so the serving model scores the same.

Checked on one batch holding every rulebook token case (its rows, one feature per case, so all of
them go through the stacked path together) and on seeded messy batches: every raw kind as a
categorical column (bytes, int64, float), separators, `max_length`, a table shared by two
features, three OOV bucket counts, and every kind of bad value preprocessing counts (empty
tokens, invalid UTF-8, encoded surrogates, line breaks, negative integers, floats in a
categorical column, NaN/inf/multi-valued/non-numeric dense values, missing features), through
both signatures' entry points (`from_examples`, `from_feature_tensors`), batch sizes 0 to 300."""
from __future__ import annotations

import random

import numpy as np
import pytest

import components  # noqa: F401
from components.rules import rulebook, rulebook_cases
from components.embedding_preprocess import vocabulary

tf = pytest.importorskip("tensorflow")

VOCAB = [b"a", b"b", b"c", b"7", b"12", b"x y", "é".encode(), b"0"]
# Values a messy column holds: in-vocabulary, unseen, empty, invalid UTF-8 (RE2 accepts the last
# two, UTF-8 validation does not), line breaks, non-ASCII valid, separators in odd places.
BYTES_VALUES = VOCAB + [b"zz", b"unseen", b"", b"\xff", b"a\xc3", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                        b"a\nb", b"a\rb", "日本".encode(), b"\x00", b"|", b"a|b", b"a||c|", b"|zz|\xff|b", b" a ", b"a,b,c", b",a"]
INT_VALUES = [0, 7, 12, -1, -12, 3, 2**63 - 1, -(2**63), 99, 101, 110]
FEATURES = [  # (name, raw kind, separator, max_length, table, OOV buckets)
    ("b_plain", rulebook.KIND_BYTES, None, None, "b_plain", 1),
    ("b_sep", rulebook.KIND_BYTES, "|", None, "shared", 3),
    ("b_sep_max", rulebook.KIND_BYTES, "|", 2, "b_sep_max", 5),
    ("b_comma_max", rulebook.KIND_BYTES, ",", 1, "shared", 3),
    ("i_plain", rulebook.KIND_INT, None, None, "i_plain", 1),
    ("i_sep_max", rulebook.KIND_INT, "|", 2, "i_sep_max", 5),
    ("f_cat", rulebook.KIND_FLOAT, None, None, "f_cat", 1),
    ("i_shared", rulebook.KIND_INT, None, None, "shared", 3),  # int64 column, table shared with strings
    ("i_digit_sep", rulebook.KIND_INT, "1", None, "i_digit_sep", 2),  # a separator that splits decimal texts
]
# Looked up by int64 value; the others by string (i_digit_sep: its separator splits decimal texts;
# the rulebook's int cases: their vocabulary has non-integer lines).
INTEGER_TABLES = {"i_plain", "i_sep_max"}
DENSE = [("d_float", rulebook.KIND_FLOAT, -1.0), ("d_int", rulebook.KIND_INT, -2.0), ("d_bytes", rulebook.KIND_BYTES, 3.0),
         ("d_float2", rulebook.KIND_FLOAT, 0.0)]


@pytest.fixture(scope="module")
def transforms(tmp_path_factory):
    from components.config.loading import parse_config
    from components.embedding_exporter.serving import RawFeatureTransform
    from components.embedding_exporter.serving_reference import FeatureByFeatureTransform
    from components.embedding_preprocess.run import build_manifest

    root = tmp_path_factory.mktemp("serving_transform")
    categorical = []
    for name, _, sep, max_length, table, oov in FEATURES:
        f = {"name": name}
        f.update({k: v for k, v in (("separator", sep), ("max_length", max_length)) if v})
        if table == "shared":
            f["table"] = "shared"
        else:
            f["vocabulary"] = {"num_oov_buckets": oov}
        categorical.append(f)
    # the rulebook's token cases, one feature each, beside the messy columns
    for i, case in enumerate(rulebook_cases.TOKEN_CASES):
        f = {"name": f"case{i}", "vocabulary": {"num_oov_buckets": case.num_oov_buckets}}
        f.update({k: v for k, v in (("separator", case.separator), ("max_length", case.max_length)) if v})
        categorical.append(f)
    cfg = parse_config({
        "input": {"path": "unused.csv"}, "label": "label",
        "dense_features": [{"name": n, "fill_value": fill} for n, _, fill in DENSE],
        "categorical_features": categorical,
        "tables": [{"name": "shared", "vocabulary": {"num_oov_buckets": 3}}],
    })
    vocab_dir = str(root / "vocab")
    for t in cfg.tables:
        case = next((c for i, c in enumerate(rulebook_cases.TOKEN_CASES) if t.name == f"case{i}"), None)
        if case:
            tokens = list(case.vocabulary)
        elif t.name in INTEGER_TABLES:  # what preprocessing writes for int64 columns: decimal texts
            tokens = [b"7", b"0", b"12", b"9223372036854775807", b"10", b"101"]
        else:
            tokens = VOCAB + [b"9223372036854775807", b"10", b"101"]
        vocabulary.write_vocabulary(vocab_dir, t.name, [(tok, 1) for tok in tokens])
    kinds = {name: kind for name, kind, *_ in FEATURES}
    kinds.update({name: kind for name, kind, _ in DENSE})
    kinds.update({f"case{i}": c.kind for i, c in enumerate(rulebook_cases.TOKEN_CASES)})
    manifest = build_manifest(cfg, {f"kind/{c}/{k}": 1 for c, k in kinds.items() if k != rulebook.KIND_NONE}, vocab_dir)
    fused = RawFeatureTransform(manifest, vocab_dir)
    assert fused.integer_tables == INTEGER_TABLES
    return fused, FeatureByFeatureTransform(manifest, vocab_dir), kinds


def _feature(kind, values):
    if kind == rulebook.KIND_BYTES:
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
    if kind == rulebook.KIND_INT:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
    return tf.train.Feature(float_list=tf.train.FloatList(value=values))


def _messy_rows(rng: random.Random, n: int):
    """n rows: column -> list of raw values (absent when the column is left out)."""
    rows = []
    for _ in range(n):
        row = {}
        for name, kind, *_ in FEATURES:
            if rng.random() < 0.15:
                continue  # absent
            k = rng.choice([0, 1, 1, 1, 2, 3, 5])
            if kind == rulebook.KIND_BYTES:
                row[name] = [rng.choice(BYTES_VALUES) for _ in range(k)]
            elif kind == rulebook.KIND_INT:
                row[name] = [rng.choice(INT_VALUES) for _ in range(k)]
            else:
                row[name] = [rng.choice([0.5, -1.0, 7.0]) for _ in range(k)]
        for name, kind, _ in DENSE:
            if rng.random() < 0.2:
                continue
            k = rng.choice([0, 1, 1, 1, 2])
            if kind == rulebook.KIND_FLOAT:
                row[name] = [rng.choice([0.0, 1.5, -3.25, float("nan"), float("inf"), -float("inf"), 3e38]) for _ in range(k)]
            elif kind == rulebook.KIND_INT:
                row[name] = [rng.choice([0, 5, -7, 2**40]) for _ in range(k)]
            else:
                row[name] = [rng.choice([b"1.5", b"x", b""]) for _ in range(k)]
        rows.append(row)
    return rows


def _case_rows():
    """Every rulebook token case's rows, side by side (one feature per case), padded with absent rows."""
    n = max(len(c.rows) for c in rulebook_cases.TOKEN_CASES)
    rows = [dict() for _ in range(n)]
    for i, case in enumerate(rulebook_cases.TOKEN_CASES):
        for r, values in enumerate(case.rows):
            if values is not None:
                rows[r][f"case{i}"] = list(values)
    return rows


def _examples(rows, kinds):
    return tf.constant([
        tf.train.Example(features=tf.train.Features(
            feature={c: _feature(kinds[c], v) for c, v in row.items()})).SerializeToString()
        for row in rows
    ], tf.string)


def _json_columns(rows, transform):
    """The JSON form of rows: one string per categorical cell (values joined by the separator),
    one float per dense cell (the first value; NaN when missing). Cells of several values
    without a separator have no JSON form: only the first value is sent."""
    seps = {f.column: f.separator for f in transform._manifest.categorical_features}
    dense = transform.dense_columns()
    columns = {}
    for c in transform.raw_columns():
        if c in dense:
            columns[c] = tf.constant(
                [float(row[c][0]) if row.get(c) and not isinstance(row[c][0], bytes) else float("nan") for row in rows],
                tf.float32, shape=[len(rows)])
            continue
        cells = []
        for row in rows:
            values = [v if isinstance(v, bytes) else str(v).encode() for v in row.get(c, [])]
            cells.append((seps[c] or "").encode().join(values) if seps[c] else (values[0] if values else b""))
        columns[c] = tf.constant(cells, tf.string, shape=[len(rows)])
    return columns


def _assert_same(got, want, where):
    assert set(got) == set(want)
    for k in want:
        a, b = got[k], want[k]
        if isinstance(b, tf.SparseTensor):
            assert isinstance(a, tf.SparseTensor), (where, k)
            for part in ("indices", "values", "dense_shape"):
                np.testing.assert_array_equal(getattr(a, part).numpy(), getattr(b, part).numpy(), err_msg=f"{where} {k} {part}")
        else:
            assert a.dtype == b.dtype and a.shape == b.shape, (where, k)
            np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=f"{where} {k}")


def _scores(inputs, manifest):
    """A click score from model inputs through the serving model's own pooling (ServingTable, every
    table seeded) and a fixed mix of the pooled vectors and dense values: what the serving model
    would score, without training one."""
    from types import SimpleNamespace

    from components.embedding_model.serving_model import ServingTable

    total = 0.0
    for i, f in enumerate(manifest.categorical_features):
        v = manifest.vocabularies[f.table]
        layer = ServingTable(SimpleNamespace(rows=v.rows, dim=3, combiner=("mean", "sum", "sqrtn")[i % 3]), f.table)
        layer.build()
        layer.embeddings.assign(np.random.default_rng(i).normal(size=(v.rows, 3)).astype(np.float32))
        total += tf.reduce_sum(layer(inputs[f.name]) * (i + 1.0), axis=1)
    for i, d in enumerate(manifest.dense_features):
        total += inputs[d.name][:, 0] * 0.01 * (i + 1)
    return tf.sigmoid(total).numpy()


# Batches: empty, one row (absent and present-but-empty features among its columns), and two
# seeded messy batches that draw every value kind the generator has (the last with the rulebook's
# cases too). A call costs about a second whatever its rows: a second one-row seed or a 3-row batch
# drew from the same generator as the 64- and 300-row batches and checked nothing they do not.
BATCHES = [(0, 0), (1, 1), (64, 4), (300, 5)]


@pytest.mark.parametrize("batch,seed", BATCHES)
def test_fused_transform_gives_the_feature_by_feature_inputs(transforms, batch, seed):
    fused, reference, kinds = transforms
    rows = _messy_rows(random.Random(seed), batch)
    if seed == 5:  # one batch with the rulebook's cases too
        for row, case_row in zip(rows, _case_rows()):
            row.update(case_row)
    examples = _examples(rows, kinds)
    got, want = fused.from_examples(examples), reference.from_examples(examples)
    _assert_same(got, want, f"examples batch {batch}")
    np.testing.assert_array_equal(_scores(got, fused._manifest), _scores(want, fused._manifest))  # so: the same scores
    columns = _json_columns(rows, fused)
    _assert_same(fused.from_feature_tensors(columns), reference.from_feature_tensors(columns), f"json batch {batch}")


def test_rulebook_cases_all_in_one_batch(transforms):
    fused, reference, kinds = transforms
    examples = _examples(_case_rows(), kinds)
    _assert_same(fused.from_examples(examples), reference.from_examples(examples), "rulebook cases")


def test_batches_without_invalid_tokens_take_the_fast_branch_and_agree(transforms):
    """No invalid token in the batch: the graph skips the compaction branch; same inputs."""
    fused, reference, kinds = transforms
    rows = [{"b_plain": [b"a"], "b_sep_max": [b"a|b|c|zz"], "i_sep_max": [7, 12, 3], "d_float": [1.0]}, {}]
    examples = _examples(rows, kinds)
    _assert_same(fused.from_examples(examples), reference.from_examples(examples), "fast branch")


@pytest.mark.parametrize("token", [
    b"", b"a", b"abc", b" ", b"\x00", b"\x7f", b"a\nb", b"\n", b"a\r", b"\t", b"\xff", b"a\xc3", b"\xc0\x80",
    b"\xed\xa0\x80", b"\xed\x9f\xbf", b"\xf4\x90\x80\x80", b"\xf4\x8f\xbf\xbf", b"\xf8\x88\x80\x80\x80",
    "é".encode(), "日本".encode(), "😀".encode(), "\u2028".encode(), b"\xef\xbf\xbf", b"\xef\xbf\xbd",
])
def test_fast_validity_check_agrees_with_the_full_one(token):
    """Rulebook T5-T6: the ASCII shortcut gives what the full check (and Python's UTF-8 decoder)
    gives; encoded surrogates and code points above U+10FFFF, which RE2 alone accepts, are invalid."""
    from components.embedding_exporter.token_checks import valid_tokens, valid_tokens_fast

    try:
        token.decode("utf-8")
        python = bool(token) and b"\n" not in token and b"\r" not in token
    except UnicodeDecodeError:
        python = False
    t = tf.constant([token, b"a", token])
    assert valid_tokens_fast(t).numpy().tolist() == valid_tokens(t).numpy().tolist() == [python, True, python]


@pytest.mark.parametrize("counts", [(1, 1), (7, 7), (1, 8, 5, 1000), (4294967291, 4294967279, 3)])
def test_one_hash_gives_every_tables_oov_bucket(counts):
    """V2 for misses of tables with different OOV bucket counts: one hash by the counts' least
    common multiple, then each token's own count, gives `to_hash_bucket_fast` by that count (the
    rulebook's Fingerprint64 mod n); counts whose multiple is beyond int64 (two primes near 2^32)
    take one hash per count."""
    from types import SimpleNamespace

    from components.embedding_exporter.serving import RawFeatureTransform

    tokens = [b"", b"a", b"b9c", "\u00e9t\u00e9".encode(), b"x" * 300] * len(counts)
    feature = np.repeat(np.arange(len(counts)), 5)
    order = [SimpleNamespace(table=f"t{i}") for i in range(len(counts))]
    owner = SimpleNamespace(_miss_buckets={f"t{i}": c for i, c in enumerate(counts)})
    got = RawFeatureTransform._oov_buckets(owner, tf.constant(tokens), tf.constant(feature, tf.int64), order)
    want = [rulebook.oov_bucket(t, counts[f]) if counts[f] > 1 else 0 for t, f in zip(tokens, feature)]
    assert got.numpy().tolist() == want


def _stacks_and_groups(manifest, storage):
    """The serving model's tables as RankingModel(stack_serving_tables=True) holds them (one
    ServingTables of dim 3, seeded; int8 with scales) and its fusion groups: one per combiner
    (tables take mean, sum, sqrtn in turn), every feature in one."""
    from types import SimpleNamespace

    from components.embedding_model.serving_model import FusedChunk, ServingTables

    combiners = ("mean", "sum", "sqrtn")
    specs = {t: SimpleNamespace(rows=v.rows, dim=3, combiner=combiners[i % 3])
             for i, (t, v) in enumerate(sorted(manifest.vocabularies.items()))}
    stack = ServingTables(specs, "stack", storage)
    for i, (t, spec) in enumerate(specs.items()):
        values = np.random.default_rng(i).normal(size=(spec.rows, 3)).astype(np.float32)
        if storage == "int8":
            scale = np.abs(values).max(axis=1) / 127 + 1e-3
            stack.assign(t, np.round(values / scale[:, None]).astype(np.int8), scale.astype(np.float32))
        else:
            stack.assign(t, values.astype(storage))
    groups = {}
    for f in manifest.categorical_features:
        groups.setdefault(specs[f.table].combiner, []).append(f)
    return stack, [FusedChunk("stack", c, tuple(f.name for f in fs), tuple(stack.offsets[f.table] for f in fs))
                   for c, fs in groups.items()]


# The storage dtype only changes how pooled rows are read (ServingTables._float_rows: a gather,
# dequantized for int8), not the IDs or segments: float32 on every batch, the others on the empty
# batch (no row to read) and the largest (every table, the rulebook's cases).
@pytest.mark.parametrize("batch,seed,storage", [(b, s, "float32") for b, s in BATCHES] + [
    (b, s, storage) for storage in ("float16", "int8") for b, s in (BATCHES[0], BATCHES[-1])])
def test_fused_ids_pool_exactly_as_per_feature_sparse_tensors(transforms, storage, batch, seed):
    """The serving model's fused path (`RawFeatureTransform.fuse`: a chunk's IDs offset into the
    stacked tables, one segment per feature and batch row, T7 applied; `ServingTables.pool_fused`:
    one segment op per chunk) pools every feature bit for bit as the per-feature SparseTensors do
    through `ServingTables.lookup`, on the messy batches and the rulebook cases, both entry points,
    every table dtype: offsets, shared tables, max_length, empty rows and batches included."""
    from components.embedding_exporter.serving import RawFeatureTransform, vocabulary_lines
    from components.embedding_model.dense_tower import BATCH_KEY, DENSE_KEY
    from components.embedding_model.serving_model import fused_key

    per_feature = transforms[0]
    manifest, kinds = per_feature._manifest, transforms[2]
    stack, groups = _stacks_and_groups(manifest, storage)
    fused = RawFeatureTransform(manifest, manifest.vocabulary_dir)
    chunks = fused.fuse(groups)
    assert sorted(n for c in chunks for n in c.features) == sorted(f.name for f in manifest.categorical_features)
    # Fused IDs are looked up as stack rows: one table per (vocabulary, offset) read, none held twice.
    offset = {n: o for c in chunks for n, o in zip(c.features, c.offsets)}
    read = {(f.table, offset[f.name]) for f in manifest.categorical_features if vocabulary_lines(manifest.vocabularies[f.table])}
    assert set(fused.tables) == {t for t, o in read if o == 0}
    assert set(fused.offset_tables) == {f"{t}@{o}" for t, o in read if o}
    rows = _messy_rows(random.Random(seed), batch)
    if seed == 5:
        for row, case_row in zip(rows, _case_rows()):
            row.update(case_row)
    examples = _examples(rows, kinds)
    columns = _json_columns(rows, fused)
    for got, want, where in ((fused.from_examples(examples), per_feature.from_examples(examples), "examples"),
                             (fused.from_feature_tensors(columns), per_feature.from_feature_tensors(columns), "json")):
        assert not any(f.name in got for f in manifest.categorical_features)  # no per-feature SparseTensor left
        assert int(got[BATCH_KEY]) == batch
        for i, chunk in enumerate(chunks):
            pooled, _ = stack.pool_fused(got[fused_key(i, "rows")], got[fused_key(i, "segments")], len(chunk.features),
                                         got[BATCH_KEY], chunk.combiner)
            assert pooled.shape == (len(chunk.features), batch, 3)
            for name, vectors in zip(chunk.features, tf.unstack(pooled, num=len(chunk.features))):
                table = next(f.table for f in manifest.categorical_features if f.name == name)
                np.testing.assert_array_equal(vectors.numpy(), stack.lookup(table, want[name])[0].numpy(),
                                              err_msg=f"{where} {storage} batch {batch} {name}")
        # One matrix when every dense column is numeric (JSON); a text column read as dense (the
        # tf.Example path's d_bytes) keeps the per-feature tensors.
        assert (DENSE_KEY in got) == (where == "json")
        for j, d in enumerate(manifest.dense_features):
            dense = got[DENSE_KEY][:, j:j + 1] if DENSE_KEY in got else got[d.name]
            np.testing.assert_array_equal(dense.numpy(), want[d.name].numpy(), err_msg=f"{where} {d.name}")


@pytest.mark.parametrize("batch,seed", BATCHES)
def test_integer_columns_sent_as_numbers_give_what_their_decimal_texts_give(transforms, batch, seed):
    """`serve_typed_features`' input (issue 17: integer columns may be sent as numbers): an int64
    categorical column as one int64 per row (-1 for none) gives the model inputs that the JSON
    strings of the same values give through J2, and that a tf.Example holding that one value (or
    none) gives; every other column as in `serve_features`."""
    fused, _, kinds = transforms
    integer = fused.integer_columns()
    assert integer and all(kinds[c] == rulebook.KIND_INT for c in integer)
    rows = _messy_rows(random.Random(seed), batch)
    for row in rows:  # one value per integer cell: what a JSON number can hold
        for c in integer:
            if row.get(c):
                row[c] = row[c][:1]
    texts = _json_columns(rows, fused)
    numbers = dict(texts, **{c: tf.constant([row[c][0] if row.get(c) else -1 for row in rows], tf.int64, shape=[batch])
                             for c in integer})
    got, from_texts = fused.from_feature_tensors(numbers), fused.from_feature_tensors(texts)
    # A separator with a digit splits a negative number's JSON text into pieces J2 may keep; the
    # number itself is dropped whole, as in a tf.Example (T2). Every other input is the texts'.
    split_digits = {f.name for f in fused._manifest.categorical_features if any(ch.isdigit() for ch in f.separator or "")}
    assert split_digits == {"i_digit_sep"}
    _assert_same({k: v for k, v in got.items() if k not in split_digits},
                 {k: v for k, v in from_texts.items() if k not in split_digits}, f"numbers vs texts batch {batch}")
    examples = {c: fused.from_examples(_examples(rows, kinds))[c] for c in integer_features(fused, integer)}
    _assert_same({c: got[c] for c in examples}, examples, f"numbers vs tf.Example batch {batch}")


def integer_features(transform, columns):
    """The categorical features reading these columns, whose only input is one int64 value."""
    return [f.name for f in transform._manifest.categorical_features if f.column in columns and not f.weight_column]


def test_the_typed_signature_exists_only_with_integer_columns(transforms, tmp_path):
    """A serving module offers `serve_typed_features` when the model reads int64 ID columns, with
    those inputs int64 and every other input as `serve_features` has it."""
    from types import SimpleNamespace

    from components.embedding_exporter.serving import ServingModule

    fused = transforms[0]
    module = ServingModule(SimpleNamespace(), fused)  # a model that stacks nothing; not called here
    sigs = module.signatures()
    assert set(sigs) == {"serving_default", "serve_features", "serve_typed_features"}
    typed = sigs["serve_typed_features"].input_signature[0]
    plain = sigs["serve_features"].input_signature[0]
    assert {c for c, spec in typed.items() if spec.dtype == tf.int64} == set(fused.integer_columns())
    assert {c: s.dtype for c, s in typed.items() if c not in fused.integer_columns()} == {
        c: s.dtype for c, s in plain.items() if c not in fused.integer_columns()}


@pytest.mark.parametrize("column", [
    [b"a", b"", b"c", b""], [1.5, float("nan"), float("nan"), -2.0], [b""] * 3, [float("nan")], []])
def test_present_rows_equal_the_library_forms(column):
    """ragged_rows.present_rows and keep_values give what TF's own boolean_mask forms give: a
    column's present values as rows, and a ragged tensor's values kept by a mask, in order."""
    import tensorflow as tf

    from components.embedding_exporter.ragged_rows import keep_values, present_rows

    values = tf.constant(column, tf.string if column and isinstance(column[0], bytes) else tf.float32)
    present = tf.strings.length(values) > 0 if values.dtype == tf.string else tf.logical_not(tf.math.is_nan(values))
    want = tf.RaggedTensor.from_row_lengths(tf.boolean_mask(values, present), tf.cast(present, tf.int64))
    assert present_rows(values, present).to_list() == want.to_list()
    rows = tf.RaggedTensor.from_row_lengths(values, [len(column)])
    assert keep_values(rows, present).to_list() == tf.ragged.boolean_mask(rows, rows.with_flat_values(present)).to_list()
