"""Faults on the training and export side (issue 63): a training state from other data is not resumed,
a warm start refuses a vocabulary file that does not meet its checkpoint's rows, a checkpoint or
SavedModel cut short stops the run in one line naming it, `training.checkpoint_dir` inside the push
destination is refused, and a serving batch of tf.Examples without any known feature says so."""
import dataclasses
import glob
import os
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

import components  # noqa: F401
import tensorflow as tf

from components.config.schema import ConfigError
from components.contracts.plan import CheckpointLayout
from components.embedding_model import sparsecore_state
from components.embedding_model.checkpoint_index import BundleIndex
from components.embedding_model.restore import ExportRefused
from components.embedding_model.unreadable import UnreadableFile, reading
from components.embedding_trainer import resolved_input, trainer_module, training_loop, training_state
from tests.stages import examples_uri
from components.embedding_trainer import warm_start
from components.model_registry.registry import Lookup
from components.planning.fitting import with_run

LAYOUT_A = CheckpointLayout(kind="A", embedding_api="TPUEmbeddingForServing (CPU/GPU variables)")


def _records(n, seed):
    rng = np.random.default_rng(seed)
    return [tf.train.Example(features=tf.train.Features(feature={
        "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=rng.integers(0, 50, 4).tolist()))}))
        .SerializeToString() for _ in range(n)]


def _write_split(root, records_per_file):
    split = root / "Split-train"
    split.mkdir(parents=True)
    for i, records in enumerate(records_per_file):
        with tf.io.TFRecordWriter(str(split / f"transformed_examples-{i:05d}-of-{len(records_per_file):05d}")) as w:
            for r in records:
                w.write(r)
    return [str(split / "*")]


def _truncate(path, keep=0.5):
    with open(path, "r+b") as fh:
        fh.truncate(int(os.path.getsize(path) * keep))


# ---- (3) a state trained on other data is not resumed ------------------------------------------------


def test_a_state_from_other_data_of_the_same_shape_is_refused_and_the_same_data_resumes_anywhere(tmp_path):
    rows = [_records(40, 1), _records(40, 2)]
    data_a = training_state.data_signature(_write_split(tmp_path / "a", rows))
    # Other data of the same shape: the same records in another order (same files, sizes and row count).
    data_b = training_state.data_signature(_write_split(tmp_path / "b", [r[::-1] for r in rows]))
    assert (data_b["files"], data_b["bytes"]) == (data_a["files"], data_a["bytes"])
    # The same examples elsewhere (a copy, a cached rerun) are the same data.
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    assert training_state.data_signature([str(tmp_path / "copy" / "Split-train" / "*")])["fingerprint"] == data_a["fingerprint"]

    state, signature = str(tmp_path / "state"), {"tables": {"t": {"rows": 50}}}
    sparsecore_state.write_layout(state, LAYOUT_A, signature, data_a)
    sparsecore_state.check_resumable(state, state + "/ckpt-60", LAYOUT_A, signature, data_a)  # kill -9 and rerun
    with pytest.raises(sparsecore_state.DataMismatch) as e:
        sparsecore_state.check_resumable(state, state + "/ckpt-60", LAYOUT_A, signature, data_b)
    message = str(e.value)
    assert len(message.splitlines()) == 1
    assert str(tmp_path / "a") in message and str(tmp_path / "b") in message  # both data named
    assert "ckpt-60" in message and "step 60" in message
    assert "continuous.warm_start" in message and "training.checkpoint_dir at a fresh directory" in message


@pytest.mark.slow(reason="four short Trainer trainings (training_loop.train, 10-20 steps) on the session's trainer data")
def test_train_refuses_a_checkpoint_dir_from_other_data_resumes_its_own_and_names_a_cut_checkpoint(trainer_data, tmp_path,
                                                                                                   monkeypatch):
    from tests.stages import Killed, kill_after, trainer_config

    from components.planning.run_plan import derive_plan

    data = trainer_data
    state = str(tmp_path / "state")

    def files(root):
        return [str(root / "tx" / "Split-train" / "*")], [str(data / "tx" / "Split-eval" / "*")]

    def plan_manifest(cfg, train_files):
        manifest = resolved_input.read_manifest(examples_uri(train_files))
        plan = derive_plan(cfg, manifest, resolved_input.read_statistics(examples_uri(train_files)))
        return with_run(plan, vocabulary_dir=manifest.vocabulary_dir), manifest

    # A run of 20 steps killed right after its checkpoint at step 10: an unfinished state.
    cfg = trainer_config(data, train_steps=20, checkpoint_every_steps=10, checkpoint_dir=state)
    kill_after(monkeypatch, 10)
    with pytest.raises(Killed):
        training_loop.train(cfg, *plan_manifest(cfg, files(data)[0]), *files(data), state)
    monkeypatch.undo()

    # Data B: the same preprocessed rows, each train file's records in reverse order (tables, sizes,
    # rows and statistics all equal).
    other = tmp_path / "other"
    shutil.copytree(data / "tx", other / "tx")
    for path in glob.glob(str(other / "tx" / "Split-train" / "*")):
        options = "GZIP" if path.endswith(".gz") else None
        records = list(tf.data.TFRecordDataset(path, compression_type=options or "").as_numpy_iterator())
        with tf.io.TFRecordWriter(path, options) as w:
            for r in records[::-1]:
                w.write(r)
    b_train, b_eval = files(other)

    def rules_check(*_args, **_kwargs):
        raise AssertionError("the TPU-rules check ran: a refused resume should stop at the state's record")

    with monkeypatch.context() as patched, pytest.raises(sparsecore_state.LayoutMismatch, match=r"trained on other data") as e:
        patched.setattr(training_loop, "check_tpu_rules", rules_check)  # refused before it builds a model or reads input
        training_loop.train(cfg, *plan_manifest(cfg, b_train), b_train, b_eval, state)
    assert type(e.value).__name__ == "DataMismatch"
    assert str(data / "tx") in str(e.value) and str(other / "tx") in str(e.value)

    # The same data resumes the unfinished state under a learning rate and dropout that steer the
    # rest of its training, and says so in its record.
    steered = trainer_config(data, train_steps=20, checkpoint_every_steps=10, checkpoint_dir=state, dropout=0.5,
                             dense_optimizer={"name": "adam", "learning_rate": 0.05})
    _, _, run = training_loop.train(steered, *plan_manifest(steered, files(data)[0]), *files(data), state)
    assert run["resumed_from_step"] == 10 and run["final_step"] == 20
    changes = run["resumed_with_changes"]
    assert any(c.startswith("dense_optimizer.learning_rate ") for c in changes) and any(c.startswith("dropout ") for c in changes)

    # Finished, it is resumed under no change at all: a higher learning rate would train nothing and
    # push the old model. One line naming the field and both ways out, before any step.
    faster = trainer_config(data, train_steps=20, checkpoint_every_steps=10, checkpoint_dir=state, dropout=0.5,
                            dense_optimizer={"name": "adam", "learning_rate": 0.5})
    with pytest.raises(sparsecore_state.LayoutMismatch) as e:
        training_loop.train(faster, *plan_manifest(faster, files(data)[0]), *files(data), state)
    message = str(e.value)
    assert type(e.value).__name__ == "ConfigMismatch" and len(message.splitlines()) == 1
    assert "dense_optimizer.learning_rate 0.05 -> 0.5" in message and "finished" in message
    assert "training.checkpoint_dir at a fresh directory" in message and "continuous.warm_start" in message

    # The state's last checkpoint cut short: the same config resumes it, and one line names it.
    latest = tf.train.latest_checkpoint(state)
    _truncate(glob.glob(latest + ".data-*")[0])
    with pytest.raises(UnreadableFile) as e:
        training_loop.train(steered, *plan_manifest(steered, files(data)[0]), *files(data), state)
    assert latest in str(e.value) and f"remove {state}" in str(e.value) and len(str(e.value).splitlines()) == 1


def test_a_state_resumes_only_under_changes_that_steer_the_rest_of_its_training():
    """resume_rule: an unfinished state goes on under new learning rates, schedules and dropout
    (returned, to be recorded), not under another seed, batch or optimizer hyperparameter; a
    finished one under no change; a state without the record is not checked."""
    from components.embedding_trainer.resume_rule import ConfigMismatch, check_config, is_steering

    assert all(is_steering(p) for p in ("dropout", "dense_optimizer.learning_rate", "dense_optimizer.schedule.decay_steps",
                                         "table_optimizers.C1.learning_rate", "train_steps", "early_stopping.patience"))
    assert not any(is_steering(p) for p in ("seed", "batch_size", "dense_optimizer.beta_1", "embedding_optimizer.name",
                                            "shuffle_buffer_rows", "table_optimizers.C1.initial_accumulator_value"))
    saved = {"seed": 42, "batch_size": 64, "dropout": 0.0, "dense_optimizer.learning_rate": 0.001,
             "dense_optimizer.beta_1": 0.9}
    record = {"training": saved, "steps": 40, "finished": False}
    steered = dict(saved, dropout=0.5, **{"dense_optimizer.learning_rate": 0.05})
    assert check_config("S", "S/ckpt-20", record, steered, 20) == [
        "dense_optimizer.learning_rate 0.001 -> 0.05", "dropout 0.0 -> 0.5"]
    assert check_config("S", "S/ckpt-20", record, dict(saved), 20) == []
    assert check_config("S", "S/ckpt-20", None, steered, 20) == [] and check_config("S", "S/ckpt-20", {}, steered, 20) == []
    for wanted, step, fields in ((dict(saved, seed=7), 20, "seed 42 -> 7"),
                                 (dict(saved, **{"dense_optimizer.beta_1": 0.8}), 20, "dense_optimizer.beta_1 0.9 -> 0.8"),
                                 (steered, 40, "dense_optimizer.learning_rate 0.001 -> 0.05; dropout 0.0 -> 0.5")):
        with pytest.raises(ConfigMismatch, match="S/ckpt-") as e:
            check_config("S", f"S/ckpt-{step}", record, wanted, step)
        assert fields in str(e.value) and "remove S" in str(e.value) and len(str(e.value).splitlines()) == 1
    # a run that early stopping ended is finished below its planned steps
    with pytest.raises(ConfigMismatch, match="Its training finished"):
        check_config("S", "S/ckpt-30", dict(record, finished=True), steered, 30)
    # The precision a run trains in steers the rest of its training (float32 variables either way:
    # a state a TPU wrote in bfloat16 goes on in float32 on a CPU), recorded as such; a finished state
    # is refused it as any change. A state recorded before the setting existed trained float32.
    with_precision = dict(saved, precision="auto", precision_used="float32")
    assert check_config("S", "S/ckpt-20", record, with_precision, 20) == []
    on_tpu = {"training": dict(with_precision, precision_used="mixed_bfloat16"), "steps": 40}
    assert check_config("S", "S/ckpt-20", on_tpu, with_precision, 20) == [
        'precision_used "mixed_bfloat16" -> "float32"']
    with pytest.raises(ConfigMismatch, match=r'precision_used "mixed_bfloat16" -> "float32"'):
        check_config("S", "S/ckpt-40", dict(on_tpu, finished=True), with_precision, 40)


# ---- (6) a warm start checks each vocabulary file against its checkpoint's rows ------------------------


def _manifest(tmp_path, tokens, oov=2):
    from components.config.loading import parse_config
    from components.embedding_preprocess import vocabulary
    from components.embedding_preprocess.run import build_manifest

    cfg = parse_config({"input": {"path": "unused.csv"}, "label": "label", "dense_features": [{"name": "d"}],
                        "categorical_features": [{"name": "c", "vocabulary": {"num_oov_buckets": oov}}]})
    vocab_dir = str(tmp_path / "vocab")
    vocabulary.write_vocabulary(vocab_dir, "c", [(t, 1) for t in tokens])
    return build_manifest(cfg, {"kind/c/bytes": 1, "kind/d/float": 1}, vocab_dir)


def test_a_vocabulary_file_a_line_short_of_its_checkpoint_rows_is_refused(tmp_path):
    manifest = _manifest(tmp_path, [b"a", b"b", b"c"])  # 3 tokens + 2 OOV buckets = 5 rows
    path = os.path.join(manifest.vocabulary_dir, manifest.vocabulary("c").file)
    warm_start.check_vocabulary_rows(manifest, "c", warm_start.table_tokens(manifest, "c"), 5, "the last blessed model's",
                                     "its checkpoint /m/ckpt-9")
    with open(path, "wb") as fh:  # half-copied: a line short
        fh.write(b"a\nb\n")
    with pytest.raises(warm_start.WarmStartError) as e:
        warm_start.check_vocabulary_rows(manifest, "c", warm_start.table_tokens(manifest, "c"), 5,
                                         "the last blessed model's", "its checkpoint /m/ckpt-9")
    message = str(e.value)
    assert len(message.splitlines()) == 1
    assert path in message and "2 lines" in message and "5 rows" in message and "/m/ckpt-9" in message
    assert "continuous.warm_start: false" in message


def test_a_vocabulary_file_reordered_or_edited_in_place_is_refused(tmp_path):
    """The same lines in another order (`sort -r`) or one token edited meet the rows' count, so a
    check of lengths alone carried every row to another token: the SHA-256 preprocessing recorded
    in the manifest tells. A manifest from before it was recorded is checked by length only."""
    manifest = _manifest(tmp_path, [b"a", b"b", b"c"])
    entry = manifest.vocabulary("c")
    path = os.path.join(manifest.vocabulary_dir, entry.file)
    assert entry.sha256 and len(entry.sha256) == 64
    original = open(path, "rb").read()
    for changed in (b"c\nb\na\n", b"a\nb\nx\n"):
        with open(path, "wb") as fh:
            fh.write(changed)
        with pytest.raises(warm_start.WarmStartError) as e:
            warm_start.check_vocabulary_rows(manifest, "c", warm_start.table_tokens(manifest, "c"), 5,
                                             "the last blessed model's", "its checkpoint /m/ckpt-9")
        message = str(e.value)
        assert len(message.splitlines()) == 1 and path in message and "SHA-256 differs" in message, message
        assert "continuous.warm_start: false" in message
    unrecorded = dataclasses.replace(manifest, vocabularies={"c": dataclasses.replace(entry, sha256=None)})
    warm_start.check_vocabulary_rows(unrecorded, "c", warm_start.table_tokens(unrecorded, "c"), 5,
                                     "the last blessed model's", "its checkpoint /m/ckpt-9")
    with open(path, "wb") as fh:
        fh.write(original)
    warm_start.check_vocabulary_rows(manifest, "c", warm_start.table_tokens(manifest, "c"), 5,
                                     "the last blessed model's", "its checkpoint /m/ckpt-9")


@pytest.mark.slow(reason="reads the executors' chain (a Trainer run) and writes a warm start from it")
def test_warm_start_from_a_model_whose_vocabulary_lost_a_line_stops_naming_the_file(chain, tmp_path):
    from components.planning.run_plan import derive_plan
    from components.embedding_trainer.model_building import build_model

    cfg, a, _ = chain
    prev = warm_start.previous_model(a["model"].uri)
    manifest = prev.manifest
    table = next(t for t, e in sorted(manifest.vocabularies.items()) if e.kind in warm_start.TOKEN_KINDS and e.size > 1)
    # The previous model's vocabularies, copied, one file a line short.
    copy = str(tmp_path / "previous_vocabulary")
    shutil.copytree(prev.manifest.vocabulary_dir, copy)
    short = os.path.join(copy, prev.manifest.vocabulary(table).file)
    lines = open(short, "rb").read().split(b"\n")[:-1]
    with open(short, "wb") as fh:
        fh.write(b"".join(t + b"\n" for t in lines[:-1]))
    prev = dataclasses.replace(prev, manifest=dataclasses.replace(prev.manifest, vocabulary_dir=copy))
    plan = derive_plan(cfg, manifest, prev.statistics)
    twin = build_model(plan, manifest, cfg, for_training=True)
    from components.embedding_model.input import make_dataset
    from components.embedding_model.tf_objects import dense_id_widths, sequence_lengths

    train_files = tf.io.gfile.glob(os.path.join(a["transformed"].uri, "Split-train", "*"))
    sample, _ = next(iter(make_dataset(train_files, manifest, 8, training=False, dense_id_widths=dense_id_widths(plan),
                                       sequence_lengths=sequence_lengths(plan))))
    twin(sample)
    twin.create_optimizer_slots()
    with pytest.raises(warm_start.WarmStartError) as e:
        warm_start.warm_start_checkpoint(prev, cfg, plan, manifest, twin, str(tmp_path / "warm" / "ckpt"))
    assert short in str(e.value) and f"{len(lines) - 1} lines" in str(e.value)


# ---- (10) a checkpoint or SavedModel cut short: one line naming it ------------------------------------


def _small_checkpoint(tmp_path):
    v = tf.Variable(tf.reshape(tf.range(400, dtype=tf.float32), [100, 4]))
    prefix = tf.train.Checkpoint(v=v).write(str(tmp_path / "ckpt" / "ckpt"))
    return prefix, "v/.ATTRIBUTES/VARIABLE_VALUE"


def test_a_checkpoint_data_file_cut_short_names_the_file(tmp_path):
    prefix, key = _small_checkpoint(tmp_path)
    data = glob.glob(prefix + ".data-*")[0]
    _truncate(data)
    # The hand-read index's memory map (the exporter's table reads) ...
    with pytest.raises(UnreadableFile, match=r"data file .* cut short") as e:
        BundleIndex(prefix).rows(key, [100, 4])
    assert data in str(e.value)
    # ... and TensorFlow's readers, which say "Read less bytes than requested" and name nothing.
    for read in (lambda: tf.train.load_checkpoint(prefix).get_tensor(key),
                 lambda: tf.train.Checkpoint(v=tf.Variable(tf.zeros([100, 4]))).restore(prefix)):
        with pytest.raises(ExportRefused) as e:
            with reading(prefix, "training checkpoint", "rerun the Trainer", ExportRefused):
                read()
        assert prefix in str(e.value) and "Read less bytes than requested" in str(e.value)
        assert "rerun the Trainer" in str(e.value) and len(str(e.value).splitlines()) == 1


def test_an_index_cut_short_names_the_checkpoint_and_a_mismatch_passes_through(tmp_path):
    prefix, key = _small_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="shape"):  # not damage: the caller's own check says what differs
        with reading(prefix, "training checkpoint", "rerun the Trainer"):
            tf.train.Checkpoint(v=tf.Variable(tf.zeros([3, 4]))).restore(prefix)
    _truncate(prefix + ".index")
    with pytest.raises(UnreadableFile, match="sstable") as e:
        with reading(prefix, "training checkpoint", "rerun the Trainer"):
            tf.train.load_checkpoint(prefix)
    assert prefix in str(e.value)


def _saved_model(path):
    module = tf.Module()
    module.v = tf.Variable(tf.ones([256, 4]))
    module.serve = tf.function(lambda examples: {"probabilities": tf.fill([tf.shape(examples)[0], 1], 0.5)
                                                 + 0.0 * tf.reduce_sum(module.v)},
                               input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    return path


def test_the_gate_names_a_served_model_whose_variables_are_cut_short(tmp_path):
    from components.config.loading import parse_config
    from components.embedding_exporter import export

    served = _saved_model(str(tmp_path / "serving" / "1"))
    _truncate(glob.glob(os.path.join(served, "variables", "variables.data-*"))[0])
    cfg = parse_config({"input": {"path": "unused.csv"}, "label": "label", "dense_features": [{"name": "d"}],
                        "categorical_features": [{"name": "c"}], "validation": {"regression_margin": 0.01}})
    ctx = SimpleNamespace(cfg=cfg, model_uri=str(tmp_path / "model"),
                          sample=SimpleNamespace(raw=[b"", b""], labels=np.array([0, 1])))
    lookup = Lookup(serving_dir=str(tmp_path / "serving"), found=True, note="", version="1", served_model=served)
    with pytest.raises(ExportRefused) as e:  # was a bare IndexError: Read less bytes than requested
        export.validate(ctx, lookup)
    assert served in str(e.value) and "Read less bytes" in str(e.value)


@pytest.mark.slow(reason="reads the executors' chain (a Trainer model) and exports copies of it")
def test_the_exporter_names_a_trainer_checkpoint_or_savedmodel_cut_short(chain, tmp_path):
    from components.contracts import artifacts
    from components.embedding_exporter.export import export_serving_model

    cfg, a, _ = chain
    raw_eval = os.path.join(a["examples"].uri, "Split-eval", "*")
    model = str(tmp_path / "model")
    shutil.copytree(a["model"].uri, model)
    prefix = tf.train.latest_checkpoint(os.path.join(model, artifacts.CHECKPOINT_DIR))
    _truncate(glob.glob(prefix + ".data-*")[0])
    with pytest.raises(ExportRefused) as e:
        export_serving_model(cfg, model, raw_eval, str(tmp_path / "out"))
    assert prefix in str(e.value) and "--no-cache" in str(e.value)

    model = str(tmp_path / "model2")
    shutil.copytree(a["model"].uri, model)
    serving = os.path.join(model, artifacts.SERVING_DIR)
    _truncate(glob.glob(os.path.join(serving, "variables", "variables.data-*"))[0])
    with pytest.raises(ExportRefused) as e:
        export_serving_model(cfg, model, raw_eval, str(tmp_path / "out2"))
    assert serving in str(e.value) and "Read less bytes" in str(e.value)


# ---- (13c) training.checkpoint_dir inside the push destination -----------------------------------------


def test_checkpoint_dir_inside_the_serving_tree_is_refused(tmp_path):
    from components.config.checks import check_checkpoint_dir

    serving = str(tmp_path / "out" / "serving")
    for inside in (serving, serving + "/", serving + "/ckpts", str(tmp_path / "out" / "x" / ".." / "serving" / "1")):
        with pytest.raises(ConfigError, match="inside the push destination"):
            check_checkpoint_dir(inside, serving)
    for outside in (None, str(tmp_path / "out" / "state"), str(tmp_path / "out" / "serving_state")):
        check_checkpoint_dir(outside, serving)
    with pytest.raises(ConfigError):
        check_checkpoint_dir("gs://b/out/serving/state", "gs://b/out//serving/")
    check_checkpoint_dir("gs://b/out/state", "gs://b/out/serving")


def test_run_fn_refuses_a_checkpoint_dir_inside_the_push_destination_before_reading_data(tmp_path):
    from tests.stages import look_up, trainer_config

    from components.tfx_wiring.component_keys import CONFIG_KEY

    serving = tmp_path / "out" / "serving"
    last_blessed = look_up(tmp_path / "LastBlessedModel" / "model", serving)  # what the pipeline hands the Trainer
    cfg = trainer_config(tmp_path, checkpoint_dir=str(serving / "state"))
    fn_args = SimpleNamespace(
        custom_config={CONFIG_KEY: cfg.to_json()}, base_model=os.path.join(last_blessed.uri, "Format-Serving"),
        train_files=[str(tmp_path / "none" / "Split-train" / "*")], eval_files=[str(tmp_path / "none" / "Split-eval" / "*")],
        serving_model_dir=str(tmp_path / "Trainer" / "model" / "1" / "Format-Serving"),
        model_run_dir=str(tmp_path / "Trainer" / "model_run" / "1"), train_steps=None)
    with pytest.raises(ConfigError, match=r"inside the push destination"):
        trainer_module.run_fn(fn_args)


# ---- (14) serving: tf.Examples without any known feature are logged -------------------------------------


def test_a_batch_of_examples_without_known_features_prints_a_warning_with_stock_ops(tmp_path, capfd):
    from components.embedding_exporter.serving import RawFeatureTransform

    manifest = _manifest(tmp_path, [b"a", b"b"])
    transform = RawFeatureTransform(manifest, manifest.vocabulary_dir)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    def inputs(examples):
        return transform.from_examples(examples)

    def example(**features):
        return tf.train.Example(features=tf.train.Features(feature={
            k: tf.train.Feature(bytes_list=tf.train.BytesList(value=[v])) for k, v in features.items()})).SerializeToString()

    inputs(tf.constant([example(c=b"a"), example(c=b"b")]))
    assert "hold none of the model's features" not in capfd.readouterr().err
    inputs(tf.constant([example(c=b"a"), example(wrong_key=b"a"), example()]))
    err = capfd.readouterr().err
    assert "serving_default: 2 of 3 tf.Examples hold none of the model's features (d, c)" in err
    ops = {op.type for op in inputs.get_concrete_function().graph.get_operations()}
    assert "If" in ops  # the warning's branch: PrintV2 inside, a stock kernel
    branch_ops = {n.op for f in inputs.get_concrete_function().graph.as_graph_def().library.function for n in f.node_def}
    assert "PrintV2" in branch_ops


def test_examples_without_a_row_to_train_or_evaluate_on_are_refused_before_any_step():
    """A 2-row input (train 2, eval 0) failed deep in the Trainer, naming no split."""
    from components.config.loading import parse_config
    from components.embedding_trainer.resolved_input import check_rows_to_train
    from components.reporting.errors import InputError
    from tests.stages import minimal_raw_config

    cfg = parse_config(minimal_raw_config())
    splits = lambda train, evaluated: SimpleNamespace(splits={"train": {"examples_written": train},  # noqa: E731
                                                              "eval": {"examples_written": evaluated}})
    check_rows_to_train(cfg, splits(20, 1), "Trainer")
    check_rows_to_train(cfg, None, "Trainer")  # nothing known: nothing refused
    with pytest.raises(InputError) as e:
        check_rows_to_train(cfg, splits(2, 0), "Trainer")
    assert str(e.value).startswith("Trainer: the train split holds 2 rows and the eval split 0: a run needs rows to "
                                   "train on and rows to evaluate on; give the pipeline more rows")
    with pytest.raises(InputError, match=r"the train split holds 0 rows and the eval split 3"):
        check_rows_to_train(cfg, splits(0, 3), "Trainer")
