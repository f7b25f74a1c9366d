"""Continuous training (components/embedding_trainer/warm_start.py): rows carried by token across a
hand-made vocabulary change, the drift figures and the limits that stop a run."""
import dataclasses
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from components.config.loading import parse_config
from components.config.schema import ConfigError
from components.config.schema import ContinuousConfig, DriftLimits
from components.contracts.manifest import VocabularyEntry, VocabularyManifest
from components.data_io.checksums import file_sha256
from components.embedding_model import checkpoint_keys as model_lib
from components.embedding_model.tf_objects import dense_id_widths, sequence_lengths
from components.planning.run_plan import derive_plan
from components.embedding_trainer import base_model, warm_start
from components.embedding_model.input import make_dataset
from components.embedding_trainer.model_building import build_model
from tests.stages import NO_GATE, demo_raw_config, with_few_features


def entry(kind="counted", size=4, oov=1, **kw):
    return VocabularyEntry(file="t.txt", counts_file="t.counts.txt", size=size, distinct_before_pruning=size,
                           num_oov_buckets=oov, rows=size + oov, dim=4, combiner="mean", features=("f",), kind=kind, **kw)


# ---- row maps: one table of hand-made vocabulary changes --------------------------------------------
ROW_MAP_CASES = [
    # (old entry, old tokens, new entry, new tokens, expected {new row: old row})
    ("reordered, one dropped, one new, OOV carried",
     entry(size=3, oov=2), [b"a", b"b", b"c"], entry(size=3, oov=2), [b"c", b"x", b"a"],
     {0: 2, 2: 0, 3: 3, 4: 4}),
    ("OOV bucket count changed: buckets fresh",
     entry(size=2, oov=1), [b"a", b"b"], entry(size=3, oov=2), [b"b", b"a", b"z"], {0: 1, 1: 0}),
    ("grown vocabulary: OOV rows move with the size",
     entry(size=1, oov=2), [b"a"], entry(size=3, oov=2), [b"n", b"a", b"m"], {1: 0, 3: 1, 4: 2}),
    ("identity: the IDs both hold", entry("identity", size=3, oov=0), None, entry("identity", size=5, oov=0), None,
     {0: 0, 1: 1, 2: 2}),
    ("hashed, same buckets: every row", entry("hashed", size=0, oov=3), None, entry("hashed", size=0, oov=3), None,
     {0: 0, 1: 1, 2: 2}),
    ("hashed, other buckets: nothing", entry("hashed", size=0, oov=3), None, entry("hashed", size=0, oov=4), None, {}),
    ("counted became hashed: nothing", entry(size=2, oov=1), [b"a", b"b"], entry("hashed", size=0, oov=1), None, {}),
]


@pytest.mark.parametrize("case", ROW_MAP_CASES, ids=[c[0] for c in ROW_MAP_CASES])
def test_row_map(case):
    _, old, old_tokens, new, new_tokens, expected = case
    m = warm_start.row_map(old, old_tokens, new, new_tokens)
    assert dict(zip(m.new.tolist(), m.old.tolist())) == expected
    assert m.report["rows_carried"] == len(expected)


def test_row_map_reports_dropped_tokens_most_frequent_first():
    m = warm_start.row_map(entry(size=3), [b"a", b"b", b"c"], entry(size=2), [b"c", b"d"])
    assert (m.report["tokens_carried"], m.report["tokens_new"], m.report["tokens_dropped"]) == (1, 1, 2)
    assert m.report["dropped_examples"] == ["a", "b"]


# ---- the warm-start checkpoint on a real trained model ----------------------------------------------


def _changed_manifest(prev: warm_start.PreviousModel, directory) -> VocabularyManifest:
    """The previous manifest with two tables' vocabularies changed by hand: C1 (its own table)
    reversed, its first token dropped and two new tokens; shared_c3_c4 (C3 and C4) with every
    other token dropped and one new token first. Other tables unchanged."""
    directory = str(directory)
    shutil.copytree(prev.manifest.vocabulary_dir, directory)
    vocabularies = dict(prev.manifest.vocabularies)
    edits = {
        "C1": lambda toks: [b"new-one"] + list(reversed(toks[1:])) + [b"new-two"],
        "shared_c3_c4": lambda toks: [b"new-shared"] + toks[::2],
    }
    for table, edit in edits.items():
        e = vocabularies[table]
        toks = edit(warm_start.table_tokens(prev.manifest, table))
        with open(os.path.join(directory, e.file), "wb") as fh:
            fh.write(b"".join(t + b"\n" for t in toks))
        with open(os.path.join(directory, e.counts_file), "wb") as fh:
            fh.write(b"".join(b"5 " + t + b"\n" for t in toks))
        # the file's checksum, as preprocessing records it for the files it writes
        vocabularies[table] = dataclasses.replace(e, size=len(toks), rows=len(toks) + e.num_oov_buckets,
                                                  sha256=file_sha256(os.path.join(directory, e.file)))
    return dataclasses.replace(prev.manifest, vocabulary_dir=directory, vocabularies=vocabularies)


@pytest.fixture(scope="module")
def warm(chain, tmp_path_factory):
    cfg, a, _ = chain
    prev = warm_start.previous_model(a["model"].uri)
    root = tmp_path_factory.mktemp("warm")
    manifest = _changed_manifest(prev, root / "vocabulary")
    plan = derive_plan(cfg, manifest, prev.statistics)
    twin = build_model(plan, manifest, cfg, for_training=True)
    train_files = tf.io.gfile.glob(os.path.join(a["transformed"].uri, "Split-train", "*"))
    sample, _ = next(iter(make_dataset(train_files, prev.manifest, 8, training=False,
                                       dense_id_widths=dense_id_widths(plan), sequence_lengths=sequence_lengths(plan))))
    sample = _ids_within(sample, manifest, plan)  # the previous IDs, folded into the smaller tables
    twin(sample)
    twin.create_optimizer_slots()
    fresh_reader = tf.train.load_checkpoint(tf.train.Checkpoint(model=twin).write(str(root / "fresh" / "ckpt")))
    fresh = {k: fresh_reader.get_tensor(k) for k in fresh_reader.get_variable_to_shape_map()}
    prefix = str(root / "warm" / "ckpt")
    report = warm_start.warm_start_checkpoint(prev, cfg, plan, manifest, twin, prefix)
    warm.prefix, warm.sample, warm.twin, warm.root = prefix, sample, twin, root
    return prev, manifest, plan, fresh, tf.train.load_checkpoint(prefix), report


def _ids_within(sample, manifest, plan):
    out = dict(sample)
    for f in manifest.categorical_features:
        rows = plan.tables[f.table].rows
        x = out[f.name]
        if isinstance(x, tf.SparseTensor):
            out[f.name] = tf.SparseTensor(x.indices, x.values % rows, x.dense_shape)
        else:
            out[f.name] = tf.where(x >= 0, x % rows, x)
    return out


def _rows_by_token(manifest, table):
    return {t: i for i, t in enumerate(warm_start.table_tokens(manifest, table))}


@pytest.mark.slow(reason="reads the executors' chain (a Trainer run) and builds its warm start")
@pytest.mark.parametrize("table", ["C1", "shared_c3_c4", "C2"])
def test_warm_start_carries_rows_and_slots_by_token(warm, table):
    prev, manifest, plan, fresh, out, report = warm
    old_reader = tf.train.load_checkpoint(prev.checkpoint)
    placement = plan.tables[table].placement
    key = model_lib.table_checkpoint_key(table, placement)
    old_key = model_lib.table_checkpoint_key(table, prev.plan.tables[table].placement)
    old_rows, new_rows = _rows_by_token(prev.manifest, table), _rows_by_token(manifest, table)
    e_old, e_new = prev.manifest.vocabulary(table), manifest.vocabulary(table)
    slot_keys = [k for k in fresh if k.startswith(key[: -len(model_lib.VARIABLE_VALUE)] + model_lib.SLOT_MARK)]
    assert slot_keys, "the demo's FTRL has two slots per table"
    for k in [key] + slot_keys:
        old = old_reader.get_tensor(old_key[: -len(model_lib.VARIABLE_VALUE)] + k[len(key) - len(model_lib.VARIABLE_VALUE):])
        got = out.get_tensor(k)
        assert got.shape == (e_new.rows, plan.tables[table].dim)
        for token, i in new_rows.items():
            want = old[old_rows[token]] if token in old_rows else fresh[k][i]
            np.testing.assert_array_equal(got[i], want, err_msg=f"{k} row of {token!r}")
        for b in range(e_new.num_oov_buckets):  # same bucket count: each bucket's row carried
            np.testing.assert_array_equal(got[e_new.size + b], old[e_old.size + b])
    r = report["tables"][table]
    assert r["tokens_carried"] == len(set(old_rows) & set(new_rows))
    assert r["tokens_dropped"] == len(set(old_rows) - set(new_rows))
    assert r["slots_fresh"] == [] and len(r["slots_carried"]) == len(slot_keys)


@pytest.mark.slow(reason="reads the executors' chain and its warm start")
def test_warm_start_carries_the_dense_network_and_leaves_optimizer_counters_fresh(warm):
    prev, _, _, fresh, out, report = warm
    old = tf.train.load_checkpoint(prev.checkpoint)
    dense = [k for k in fresh if k.startswith("model/bottom_mlp/") or k.startswith("model/cross/")]
    assert dense
    for k in dense:  # weights and their Adam slots: same names and shapes
        np.testing.assert_array_equal(out.get_tensor(k), old.get_tensor(k))
    assert report["dense"]["weights_fresh"] == []
    assert int(out.get_tensor("model/dense_optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE")) == 0
    assert int(old.get_tensor("model/dense_optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE")) > 0


@pytest.mark.slow(reason="reads the executors' chain and its warm start")
def test_carry_slots_false_carries_weights_and_leaves_every_slot_fresh(warm, chain):
    cfg, _, _ = chain
    prev, manifest, plan, fresh, carried, _ = warm
    fix = globals()["warm"]
    prefix = str(fix.root / "noslots" / "ckpt")
    report = warm_start.warm_start_checkpoint(prev, dataclasses.replace(cfg, continuous=ContinuousConfig(carry_slots=False)),
                                     plan, manifest, fix.twin, prefix)
    out = tf.train.load_checkpoint(prefix)
    slots = [k for k in fresh if model_lib.SLOT_MARK in k]
    weights = [k for k in fresh if model_lib.SLOT_MARK not in k and k.startswith(("model/tensor_core_tables/", "model/bottom_mlp/"))]
    assert slots and weights
    for k in slots:
        np.testing.assert_array_equal(out.get_tensor(k), fresh[k], err_msg=k)
    for k in weights:  # the same weights as with slots carried
        np.testing.assert_array_equal(out.get_tensor(k), carried.get_tensor(k), err_msg=k)
    assert report["dense"]["slots_carried"] == 0 and report["dense"]["slots_fresh"] > 0
    assert all(t.get("slots_carried") == [] for t in report["tables"].values())


@pytest.fixture
def elsewhere(tmp_path):
    """A temporary directory on another filesystem than `tmp_path` where there is one (/dev/shm, a
    tmpfs, as /tmp is on many machines), else one that does not exist: either breaks what is built
    under it and moved next to the output."""
    import tempfile

    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK) and os.stat(shm).st_dev != os.stat(tmp_path).st_dev:
        path = tempfile.mkdtemp(dir=shm)
        yield path
        shutil.rmtree(path, ignore_errors=True)
    else:
        yield str(tmp_path / "no-such-dir")


@pytest.mark.slow(reason="reads the executors' chain and its warm start")
def test_warm_start_is_written_beside_its_checkpoint_and_leaves_nothing_behind(warm, chain, tmp_path, monkeypatch,
                                                                             elsewhere):
    """Not under $TMPDIR: with the temporary directory on another filesystem the final merge of the
    shards failed ("Invalid cross-device link"), and every failure left a warm_start_* directory
    there. Now it works whatever $TMPDIR is, and neither a success nor a failure leaves its work
    directory beside the checkpoint or anything in $TMPDIR."""
    import tempfile

    cfg, _, _ = chain
    prev, manifest, plan, _, carried, _ = warm
    fix = globals()["warm"]
    monkeypatch.setattr(tempfile, "tempdir", elsewhere)
    before = sorted(os.listdir(elsewhere)) if os.path.isdir(elsewhere) else None
    out = tmp_path / "state"
    report = warm_start.warm_start_checkpoint(prev, cfg, plan, manifest, fix.twin, str(out / "ckpt"))
    assert report["rows"] == warm[5]["rows"]
    reader = tf.train.load_checkpoint(str(out / "ckpt"))
    for key in carried.get_variable_to_shape_map():
        np.testing.assert_array_equal(reader.get_tensor(key), carried.get_tensor(key), err_msg=key)
    left = sorted(os.listdir(out))
    assert "ckpt.index" in left and all(n.startswith("ckpt.") for n in left), left  # no work directory

    def broken(*args, **kwargs):
        raise warm_start.WarmStartError("the last blessed model's checkpoint is damaged")

    monkeypatch.setattr(warm_start, "_carry_table", broken)
    failed = tmp_path / "failed"
    with pytest.raises(warm_start.WarmStartError):
        warm_start.warm_start_checkpoint(prev, cfg, plan, manifest, fix.twin, str(failed / "ckpt"))
    assert os.listdir(failed) == []
    assert (sorted(os.listdir(elsewhere)) if os.path.isdir(elsewhere) else None) == before


@pytest.mark.slow(reason="reads the executors' chain and its warm start")
def test_warm_start_checkpoint_restores_into_a_new_training_model(warm, chain):
    """The checkpoint is this run's model's own: a fresh training model (slots created as its
    first step would) consumes every value, and its tables hold the carried rows."""
    cfg, _, _ = chain
    _, manifest, plan, _, out, _ = warm
    model = build_model(plan, manifest, cfg, for_training=True)
    model(globals()["warm"].sample)
    model.create_optimizer_slots()
    # Every object of the model (slots included) bound; `write` saves no save_counter (the root's own).
    tf.train.Checkpoint(model=model).restore(globals()["warm"].prefix).assert_existing_objects_matched()
    np.testing.assert_array_equal(model.tensor_core_tables["C1"].embeddings.numpy(),
                                  out.get_tensor(model_lib.table_checkpoint_key("C1", "tensor_core")))
    assert int(model.dense_optimizer.iterations.numpy()) == 0


# ---- drift -------------------------------------------------------------------------------------------


@pytest.mark.slow(reason="reads the executors' chain and its warm start")
def test_drift_figures_and_the_limits_that_stop_a_run(warm, chain):
    cfg, _, _ = chain
    prev, manifest, _, _, _, _ = warm
    figures = base_model.drift(prev, manifest, prev.statistics)
    c1 = figures["tables"]["C1"]
    n_old = prev.manifest.vocabulary("C1").size
    assert c1["vocabulary_overlap"] == pytest.approx((n_old - 1) / (n_old + 1))
    assert c1["new_token_share"] == pytest.approx(2 / (n_old + 1))  # the hand-made counts are all 5
    assert figures["tables"]["C2"] == {"vocabulary_overlap": 1.0, "new_token_share": 0.0}
    assert all(f["change"] == 0.0 for f in figures["features"].values())
    assert base_model.drift_violations(figures, cfg) == []
    strict = dataclasses.replace(cfg, continuous=ContinuousConfig(drift=DriftLimits(max_new_token_share=0.001)))
    with pytest.raises(base_model.DriftStop, match=r"table 'C1': 0\.0\d+ of occurrences on tokens new .*max_new_token_share 0\.001"):
        base_model.check_drift(figures, strict, prev.uri)


def test_drift_of_dense_features_and_ids_per_example():
    figures = {"tables": {}, "features": {"f": {"ids_per_example": 3.0, "previous": 1.0, "change": 2.0}},
               "dense_features": {"d": {"mean": 2.0, "previous": 0.5, "shift_in_std": 5.0}}}
    cfg = parse_config({"name": "t", "input": {"path": "x.csv"}, "dense_features": [{"name": "d"}],
                        "categorical_features": [{"name": "f"}]})
    v = base_model.drift_violations(figures, cfg)
    assert len(v) == 2 and "feature 'f'" in v[0] and "max_ids_per_example_change 1.0" in v[0]
    assert "dense feature 'd'" in v[1] and "max_dense_mean_shift 3.0" in v[1]
    off = parse_config({"name": "t", "input": {"path": "x.csv"}, "dense_features": [{"name": "d"}],
                        "categorical_features": [{"name": "f"}],
                        "continuous": {"drift": {"max_ids_per_example_change": None, "max_dense_mean_shift": None}}})
    assert base_model.drift_violations(figures, off) == []


@pytest.mark.parametrize("bad", [{"max_new_token_share": 1.5}, {"min_vocabulary_overlap": -0.1},
                                 {"max_dense_mean_shift": "high"}, {"max_ids_per_example_change": True}])
def test_drift_limits_are_checked(bad):
    with pytest.raises(ConfigError, match=f"continuous.drift.{list(bad)[0]}"):
        parse_config({"name": "t", "input": {"path": "x.csv"}, "categorical_features": [{"name": "f"}],
                      "continuous": {"drift": bad}})


def test_a_model_without_its_files_cannot_start_a_run(tmp_path):
    with pytest.raises(warm_start.WarmStartError, match="continuous.warm_start: false"):
        warm_start.previous_model(str(tmp_path / "Format-Serving"))


def test_span_input_paths(tmp_path):
    """`input.path` with TFX's span spec: ExampleGen's base and pattern; a folder per span reads its
    CSV files; nothing matching is the usual config error."""
    from pipelines.pipeline import input_location

    def cfg(path):
        return parse_config({"name": "t", "input": {"path": path}, "categorical_features": [{"name": "f"}]})

    with pytest.raises(ConfigError, match=r"matches no file.*\{SPAN\}"):
        input_location(cfg(str(tmp_path / "days" / "span-{SPAN}")))
    for day in (1, 2):
        (tmp_path / "days" / f"span-{day}").mkdir(parents=True)
        (tmp_path / "days" / f"span-{day}" / "data.csv").write_text("label,f\n1,a\n")
    assert input_location(cfg(str(tmp_path / "days" / "span-{SPAN}"))) == (str(tmp_path / "days"), "span-{SPAN}/*.csv")
    assert input_location(cfg(str(tmp_path / "days" / "span-{SPAN}" / "*.csv"))) == (str(tmp_path / "days"), "span-{SPAN}/*.csv")


# ---- the three-span demo, end to end (slow tier) -----------------------------------------------------


@pytest.fixture(scope="module")
def daily_spans(tmp_path_factory):
    """`python -m pipelines continuous` on small spans, into one output directory: span 1 from
    scratch, spans 2-3 warm-started from the last blessed model with drift measured and the gate
    comparing with it. Day 4's span (its IDs jumped: a broken upstream job) is written beside them
    from the start: each day's run reads its own span all the same (pinned). Returns (the spans'
    config, its overrides, output dir, data dir, the three runs' summaries)."""
    from pipelines.continuous import run_spans, span_config, write_span

    root = tmp_path_factory.mktemp("spans")
    out, data = str(root / "out"), str(root / "data")
    small = {
        # Fixed-length runs: the held-out selection has its own tests (test_early_stopping.py).
        "training": {"train_steps": 120, "checkpoint_every_steps": 60, "batch_size": 128,
                     "early_stopping": {"enabled": False}},
        "export": {"compare_compression": False, "auc_sample_size": 1500, "parity_sample_size": 64},
        # Beam in this process: the spans' warm start, drift and gate are under test, not Beam's workers.
        "beam": {"direct_running_mode": "in_memory", "direct_num_workers": 1},
        # 120 steps make no model worth holding to the baseline (not fitted); the regression check
        # against the last blessed model, which the spans are about, stays on.
        "validation": dict(NO_GATE, regression_margin=0.05),
    }
    # Warm start, drift and the gate across days are under test, not the model: a few features of each kind.
    few = with_few_features(demo_raw_config())
    small.update(categorical_features=few["categorical_features"], dense_features=few["dense_features"])
    cfg = span_config(os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "demo.yaml"), data, out, small)
    write_span(data, 4, 5000, id_shift=400, seed=7, max_cardinality=5000)
    spans = run_spans(cfg, data, out, spans=3, rows=5000, id_shift=20, max_cardinality=5000)
    return cfg, small, out, data, spans


@pytest.mark.slow(reason="three local pipeline runs (the module's)")
def test_three_daily_spans_warm_start_from_the_last_blessed_model_and_the_gate_compares_with_it(daily_spans):
    _, _, _, _, spans = daily_spans
    assert spans[0]["continuous"]["base_model"] is None
    for day, s in enumerate(spans, start=1):
        assert s["input"]["span"] == day  # pinned: later spans exist when a day is rerun
        assert all(stage["balanced"] for stage in s["ledger"]["stages"])
        assert s["validation"]["blessed"], s["validation"]
    blessed_trainer_models = []
    for day, s in enumerate(spans[1:], start=2):
        c = s["continuous"]
        assert "/Trainer/model/" in c["base_model"]
        assert c["base_model"] not in blessed_trainer_models  # the latest blessed, a new one each day
        blessed_trainer_models.append(c["base_model"])
        w = c["warm_start"]
        assert 0 < w["rows_carried"] < w["rows"]
        assert w["tokens_new"] > 0 and w["tokens_dropped"] > 0  # the shifted IDs
        assert w["tables_with_slots"] == w["tables"] and w["dense_weights_fresh"] == 0
        assert 0 < c["drift"]["new_token_share"]["value"] < 0.5
        gate = {g["name"]: g for g in s["validation"]["checks"]}
        assert gate["last_blessed"]["reference_auc"] is not None
    with open(os.path.join(blessed_trainer_models[-1], "continuous.json")) as fh:
        assert json.load(fh)["warm_start"]["from_model"] == blessed_trainer_models[0]
    with open(os.path.join(spans[-1]["serving_model_this_run"], "export_report.json")) as fh:
        assert json.load(fh)["continuous"]["base_model"] == blessed_trainer_models[-1]  # the report has it too


@pytest.mark.slow(reason="the module's three runs, then a fourth that stops at the Trainer")
def test_a_day_whose_ids_jumped_stops_at_the_trainer_under_a_strict_limit_and_pushes_nothing(daily_spans):
    """Day 4 (the latest span, read by an unpinned run) under a strict drift limit."""
    from pipelines.continuous import span_config
    from pipelines.runner import RunFailed, run

    _, small, out, data, _ = daily_spans
    pushed_before = sorted(os.listdir(os.path.join(out, "serving")))
    strict = span_config(os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "demo.yaml"), data, out,
                         dict(small, continuous={"drift": {"max_new_token_share": 0.05}}))
    with pytest.raises(RunFailed, match=r"Trainer failed: DriftStop: .*max_new_token_share 0\.05"):
        run(strict, out, quiet=True)
    assert sorted(os.listdir(os.path.join(out, "serving"))) == pushed_before


@pytest.mark.slow(reason="the module's three runs, then the first day again")
def test_a_rerun_of_an_earlier_day_is_described_by_its_own_artifacts_not_the_newest_on_disk(daily_spans):
    """Day 1 again into the same output directory: its ExampleGen and preprocessing executions
    come from the cache, whose artifact directories are older (lower ids) than later days'. Its
    summary, ledger and report must describe day 1, as ML Metadata records it."""
    from pipelines.continuous import span_config
    from pipelines.runner import run

    _, small, out, data, spans = daily_spans
    first, later = spans[0], spans[1:]
    # Day 1's IDs against day 3's model drift past the default limit: lifted for this run, as the
    # DriftStop's message says to when the change is real (the data stages' settings are the same).
    cfg = span_config(os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "demo.yaml"), data, out,
                      dict(small, continuous={"drift": {"max_new_token_share": None}}))
    again = run(cfg, out, quiet=True, span=1).summary
    assert again["input"]["span"] == 1
    assert again["rows_read"] == first["rows_read"] and again["vocabulary_sizes"] == first["vocabulary_sizes"]
    assert again["ledger"] == first["ledger"] and again["ledger"]["balanced"]
    for step in ("EmbeddingExampleGen.examples", "EmbeddingPreprocess.statistics", "EmbeddingPreprocess.transformed_examples"):
        assert again["artifacts"][step] == first["artifacts"][step], step
        assert all(s["artifacts"][step] != first["artifacts"][step] for s in later), step
    # the Trainer ran again (warm-started from the last blessed model), on day 1's transformed examples
    assert again["artifacts"]["Trainer.model"] not in {s["artifacts"]["Trainer.model"] for s in spans}
    report = open(os.path.join(out, "run_report.html"), encoding="utf-8").read()
    assert os.path.relpath(first["artifacts"]["EmbeddingPreprocess.statistics"], out) in report
    for s in later:
        assert os.path.relpath(s["artifacts"]["EmbeddingPreprocess.statistics"], out) not in report
    saved = json.load(open(os.path.join(out, "summary.json"), encoding="utf-8"))
    assert saved["artifacts"] == again["artifacts"]


@pytest.mark.slow(reason="reads the executors' chain and its warm start")
def test_drift_without_the_previous_vocabulary_says_which_tables_are_unknown(warm, tmp_path):
    prev, manifest, _, _, _, _ = warm
    gone = dataclasses.replace(prev, manifest=dataclasses.replace(prev.manifest, vocabulary_dir=str(tmp_path / "gone")))
    figures = base_model.drift(gone, manifest, prev.statistics)
    assert figures["tables"] == {} and "C1" in figures["unknown_tables"]
    assert "vocabulary of table 'C1' is gone" in figures["unknown_tables"]["C1"]
