"""Row files and their delta (components/embedding_exporter/row_files.py, row_delta.py) on small
hand-made `tables/` directories in the exporter's format (tables.py): a vocabulary table with OOV
buckets, an identity table, a hashed table, an int8 table with its scales.

Every row keyed as serving looks it up (token i -> row i, bucket b -> row vocabulary_size + b, by
the rulebook's own OOV rule); the delta of two exports applied to the first gives the second row for
row, across shard counts; bad vocabularies and missing manifests refused by name.
"""
import json

import numpy as np
import pyarrow as pa
import pytest

import components  # noqa: F401
from components.data_io import row_delta, row_files
from components.rules import rulebook


def _table(tables, name, values, kind="counted", tokens=(), oov=0, scale=None, default=None):
    """Writes one table as tables.py does: <name>.npy, its vocabulary file, its manifest entry."""
    np.save(tables / f"{name}.npy", values)
    files = {"values": f"{name}.npy"}
    if scale is not None:
        np.save(tables / f"{name}.scale.npy", scale)
        files["scale"] = f"{name}.scale.npy"
    (tables / "vocabularies").mkdir(exist_ok=True)
    (tables / "vocabularies" / f"{name}.txt").write_bytes(b"".join(t + b"\n" for t in tokens))
    size = len(tokens) if kind not in ("hashed", "identity") else (len(values) if kind == "identity" else 0)
    return name, {"table": name, "rows": len(values), "dim": values.shape[1], "dtype": str(values.dtype), "files": files,
                  "vocabulary_file": f"vocabularies/{name}.txt", "vocabulary_size": size,
                  "num_oov_buckets": oov if kind != "hashed" else len(values), "combiner": "mean",
                  "features": [name.lower()], "vocabulary_kind": kind, "default_value": default, "wide_of": None}


def _export(root, tokens=(b"a", b"b", b"c", b"d", b"\xc3\xa9t\xc3\xa9"), seed=0, changed=()):
    """A tables/ directory of four tables; `changed`: (table, row) pairs whose vector moves."""
    rng = np.random.default_rng(seed)
    tables = root / "tables"
    tables.mkdir(parents=True)
    vocab = rng.normal(size=(len(tokens) + 3, 4)).astype(np.float32)
    ident = np.arange(6 * 2, dtype=np.float32).reshape(6, 2)
    hashed = np.arange(4 * 3, dtype=np.float32).reshape(4, 3) / 7
    q = rng.integers(-127, 128, size=(len(tokens) + 2, 2)).astype(np.int8)
    for table, row in changed:
        {"V": vocab, "I": ident}[table][row] += 1
    entries = dict([_table(tables, "V", vocab, tokens=tokens, oov=3), _table(tables, "I", ident, kind="identity", default=0),
                    _table(tables, "H", hashed, kind="hashed"),
                    _table(tables, "Q", q, tokens=tokens, oov=2, scale=np.linspace(0.1, 1, len(q)).astype(np.float32))])
    (tables / "tables_manifest.json").write_text(json.dumps({"tables": entries}))
    return tables, {"V": vocab, "I": ident, "H": hashed, "Q": q}


def test_every_row_is_keyed_as_serving_looks_it_up(tmp_path):
    tables, arrays = _export(tmp_path)
    m = row_files.write_row_files(str(tables), str(tmp_path / "rows"), max_file_bytes=100, every=2)
    rows = {n: row_files.read_table_rows(str(tmp_path / "rows"), n) for n in arrays}
    tokens = [b"a", b"b", b"c", b"d", "été".encode()]
    vocab = {(r["key"], r["oov"]): r["vector"] for r in rows["V"].to_pylist()}
    for i, t in enumerate(tokens):  # V1: token i -> row i
        assert np.array_equal(vocab[(t.decode(), False)], arrays["V"][i]), t
    for b in range(3):  # OOV rows keyed by bucket
        assert np.array_equal(vocab[(str(b), True)], arrays["V"][5 + b])
    unknown = b"never seen"  # V2, the rulebook's own rule
    assert np.array_equal(vocab[(str(rulebook.oov_bucket(unknown, 3)), True)],
                          arrays["V"][rulebook.embedding_id(unknown, tokens, 3)])
    ident = {r["key"]: r["vector"] for r in rows["I"].to_pylist()}
    assert rows["I"]["key"].type == pa.int64() and all(np.array_equal(ident[i], arrays["I"][i]) for i in range(6))
    assert rows["H"]["oov"].to_pylist() == [True] * 4 and rows["H"]["key"].to_pylist() == [0, 1, 2, 3]
    q = rows["Q"].to_pylist()
    assert rows["Q"].schema.field("vector").type.value_type == pa.int8()
    assert [r["scale"] for r in q if not r["oov"]] == pytest.approx(
        [np.linspace(0.1, 1, 7)[tokens.index(r["key"].encode())] for r in q if not r["oov"]])
    t = m["tables"]["V"]
    assert t["shards"] > 1 and t["rows"] == 8 and t["oov_rows"] == 3 and sum(f["rows"] for f in t["files"]) == 8
    assert "Fingerprint64(token) % 3" in t["lookup"] and m["tables"]["I"]["default_row"] == 0
    for i, f in enumerate(t["files"]):  # each file holds its shard's keys (SHARD_RULE), sorted
        part = row_files.read_shard(str(tmp_path / "rows"), "V", f["file"])
        assert set(row_files.shard_of(part["key"].combine_chunks(), t["shards"])) <= {i}
        assert part.equals(part.sort_by(row_files.SORT_KEYS))


def test_chunks_of_any_size_write_the_same_files(tmp_path):
    tables, _ = _export(tmp_path)
    small = row_files.write_row_files(str(tables), str(tmp_path / "a"), max_file_bytes=100, every=2)
    large = row_files.write_row_files(str(tables), str(tmp_path / "b"), max_file_bytes=100)
    assert small == large


def test_the_delta_applied_to_the_last_export_gives_this_one(tmp_path):
    old_tables, _ = _export(tmp_path / "old")
    # c dropped, e and f new, d moved to another line (same vector: unchanged), V's row of b changed
    new_tables, _ = _export(tmp_path / "new", tokens=(b"a", b"b", b"d", b"\xc3\xa9t\xc3\xa9", b"e", b"f"),
                            changed=[("V", 1), ("I", 4)])
    row_files.write_row_files(str(old_tables), str(tmp_path / "r0"), max_file_bytes=100)
    row_files.write_row_files(str(new_tables), str(tmp_path / "r1"), max_file_bytes=250)
    d = row_delta.write_delta(str(tmp_path / "r0"), str(tmp_path / "r1"), str(tmp_path / "delta"))
    for name in ("V", "I", "H", "Q"):
        before = row_files.read_table_rows(str(tmp_path / "r0"), name)
        after = row_files.read_table_rows(str(tmp_path / "r1"), name)
        delta = row_delta.read_table_delta(str(tmp_path / "delta"), name)
        assert row_delta.apply(before, delta).equals(after), name
    i = d["tables"]["I"]
    assert (i["changed"], i["new"], i["deleted"], i["unchanged"]) == (1, 0, 0, 5)
    ops = {(r["key"], r["op"]) for r in row_delta.read_table_delta(str(tmp_path / "delta"), "V").to_pylist()}
    assert ("c", "delete") in ops and ("e", "put") in ops and ("f", "put") in ops and ("a", "put") not in ops
    assert d["tables"]["H"]["put"] == 0 and d["bytes"] < d["full_bytes"] * 2


def test_a_missing_tombstone_or_a_shifted_row_is_seen(tmp_path):
    """The check the delta test makes fails on a delta without one delete, or with one vector changed."""
    old_tables, _ = _export(tmp_path / "old")
    new_tables, _ = _export(tmp_path / "new", tokens=(b"a", b"b", b"d", b"\xc3\xa9t\xc3\xa9"))
    row_files.write_row_files(str(old_tables), str(tmp_path / "r0"))
    row_files.write_row_files(str(new_tables), str(tmp_path / "r1"))
    row_delta.write_delta(str(tmp_path / "r0"), str(tmp_path / "r1"), str(tmp_path / "delta"))
    before, after = (row_files.read_table_rows(str(tmp_path / r), "V") for r in ("r0", "r1"))
    delta = row_delta.read_table_delta(str(tmp_path / "delta"), "V")
    no_tombstone = delta.filter(pa.compute.not_equal(delta["op"], "delete"))
    assert len(no_tombstone) < len(delta) and not row_delta.apply(before, no_tombstone).equals(after)
    assert row_delta.apply(before, delta).equals(after)


def test_bad_vocabularies_and_missing_manifests_are_refused_by_name(tmp_path):
    tables, _ = _export(tmp_path / "dup", tokens=(b"a", b"b", b"a"))
    with pytest.raises(row_files.RowFilesError, match="a key appears twice"):
        row_files.write_row_files(str(tables), str(tmp_path / "r"))
    tables, _ = _export(tmp_path / "latin1", tokens=(b"a", b"\xe9t\xe9"))
    with pytest.raises(row_files.RowFilesError, match=r"table Q: a vocabulary line between rows 0 and \d+ is not UTF-8"):
        row_files.write_row_files(str(tables), str(tmp_path / "r2"))
    with pytest.raises(row_files.RowFilesError, match="no tables manifest; export with export.write_tables: true"):
        row_files.write_row_files(str(tmp_path), str(tmp_path / "r3"))
    with pytest.raises(row_files.RowFilesError, match="no rows manifest"):
        row_delta.write_delta(str(tmp_path / "nothing"), str(tmp_path / "r3"), str(tmp_path / "d"))


def test_the_beam_pipeline_writes_the_same_files(tmp_path):
    """row_files_beam on Beam's local runner: chunks keyed and cut on workers, grouped by shard,
    each shard sorted and written by one: the same manifest and files as the local writer."""
    from components.data_io import row_files_beam

    tables, _ = _export(tmp_path)
    local = row_files.write_row_files(str(tables), str(tmp_path / "local"), max_file_bytes=100, every=2)
    beam = row_files_beam.write_row_files_beam(str(tables), str(tmp_path / "beam"), max_file_bytes=100, every=2)
    assert beam == local and local["tables"]["V"]["shards"] > 1
    assert not (tmp_path / "beam" / row_files_beam.ENTRIES_DIR).exists()


def test_the_delta_as_a_beam_job_is_the_same_delta(tmp_path):
    """row_delta.write_delta with row_files_beam.delta_runner: one shard pair per work item on Beam's
    local runner, the same manifest and files as in one process."""
    from components.data_io import row_files_beam

    old_tables, _ = _export(tmp_path / "old")
    new_tables, _ = _export(tmp_path / "new", tokens=(b"a", b"d", b"e"), changed=[("I", 2)])
    row_files.write_row_files(str(old_tables), str(tmp_path / "r0"), max_file_bytes=100)
    row_files.write_row_files(str(new_tables), str(tmp_path / "r1"), max_file_bytes=100)
    here = row_delta.write_delta(str(tmp_path / "r0"), str(tmp_path / "r1"), str(tmp_path / "d0"))
    beam = row_delta.write_delta(str(tmp_path / "r0"), str(tmp_path / "r1"), str(tmp_path / "d1"),
                                 run=row_files_beam.delta_runner())
    assert beam == here and here["tables"]["V"]["deleted"] == 3 and here["tables"]["I"]["changed"] == 1
    assert not (tmp_path / "d1" / row_files_beam.ENTRIES_DIR).exists()


def test_a_store_takes_a_delta_only_against_the_rows_it_holds(tmp_path):
    """SqliteStore: the delta from r0 to r1 applies to a store holding r0, once; applied again, or
    to a store holding other rows, it is refused (the delta manifest's base and target)."""
    from components.embedding_exporter.store_client import SqliteStore

    old_tables, _ = _export(tmp_path / "old")
    new_tables, _ = _export(tmp_path / "new", tokens=(b"a", b"d", b"e"), changed=[("I", 2)])
    for tables, rows in ((old_tables, "r0"), (new_tables, "r1")):
        row_files.write_row_files(str(tables), str(tmp_path / rows))
    row_delta.write_delta(str(tmp_path / "r0"), str(tmp_path / "r1"), str(tmp_path / "d"))
    store = SqliteStore()
    store.load_full(str(tmp_path / "r0"))
    store.apply_delta(str(tmp_path / "d"), str(tmp_path / "r1"))
    assert store.count("V") == 3 + 3
    with pytest.raises(row_files.RowFilesError, match="a delta against other rows than the store holds"):
        store.apply_delta(str(tmp_path / "d"), str(tmp_path / "r1"))
    other = SqliteStore()
    other.load_full(str(tmp_path / "r0"))
    with pytest.raises(row_files.RowFilesError, match="not the delta that leads to"):
        other.apply_delta(str(tmp_path / "d"), str(tmp_path / "r0"))


def test_a_table_whose_key_type_changed_has_no_delta(tmp_path):
    """A hashed table (int64 keys) become a counted vocabulary (string keys): no row-by-row delta."""
    old_tables, _ = _export(tmp_path / "old")
    row_files.write_row_files(str(old_tables), str(tmp_path / "r0"))
    tables = tmp_path / "new" / "tables"
    tables.mkdir(parents=True)
    entries = dict([_table(tables, "H", np.ones((3, 3), np.float32), tokens=(b"x", b"y"), oov=1)])
    (tables / "tables_manifest.json").write_text(json.dumps({"tables": entries}))
    row_files.write_row_files(str(tables), str(tmp_path / "r1"))
    with pytest.raises(row_delta.NoDelta, match="table\\(s\\) H changed key type"):
        row_delta.write_delta(str(tmp_path / "r0"), str(tmp_path / "r1"), str(tmp_path / "d"))


def test_a_float16_table_is_stored_widened_to_float32_exactly(tmp_path):
    tables = tmp_path / "tables"
    tables.mkdir()
    half = (np.arange(5 * 3, dtype=np.float32).reshape(5, 3) / 7).astype(np.float16)  # sevenths, rounded to float16
    entries = dict([_table(tables, "F", half, tokens=(b"a", b"b", b"c", b"d"), oov=1)])
    (tables / "tables_manifest.json").write_text(json.dumps({"tables": entries}))
    m = row_files.write_row_files(str(tables), str(tmp_path / "rows"), max_file_bytes=100)
    rows = row_files.read_table_rows(str(tmp_path / "rows"), "F")
    assert (m["tables"]["F"]["dtype"], m["tables"]["F"]["trained_dtype"]) == ("float32", "float16")
    assert rows.schema.field("vector").type.value_type == pa.float32()
    got = {(r["key"], r["oov"]): np.asarray(r["vector"], np.float32) for r in rows.to_pylist()}
    for i, t in enumerate("abcd"):
        assert np.array_equal(got[(t, False)], half[i].astype(np.float32)), t
    assert np.array_equal(got[("0", True)], half[4].astype(np.float32))
