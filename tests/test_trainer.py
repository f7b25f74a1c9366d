"""The trainer's run_fn on small generated data: the Model artifact, a fresh-process restore that
predicts identically, resume after a run killed mid-training, DCN-v2, and the TPU-rules check."""
import dataclasses
import glob
import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest

import components  # noqa: F401
import tensorflow as tf

from components.config.loading import parse_config
from components.contracts.plan import Initializer
from components.embedding_model.tf_objects import dense_id_widths
from components.planning.run_plan import derive_plan
from components.embedding_trainer import model_building, resolved_input, trainer_module, training_state
from components.contracts.manifest import VocabularyManifest
from components.embedding_model.input import PAD_ID, make_dataset, to_dense_ids
from components.embedding_model.model import TensorCoreTable
from components.embedding_trainer.tpu_rules import TPURulesError, check_tpu_rules

from tests.stages import (REPO, fn_args as _fn_args, trainer_config as _config, trainer_raw_config as _raw_config,
                          assert_traced_once_with_the_first_steps_values, examples_uri,
                          fits_with_variables_created_before_and_by_the_first_step)
from components.contracts.artifacts import (CHECKPOINT_DIR, EVAL_METRICS_FILE, TABLES_DIR, TABLES_MANIFEST_FILE,
                                            TPU_RULES_FILE, TRAINING_RUN_FILE)
from components.tfx_wiring.component_keys import EXAMPLES_URI_KEY


@pytest.fixture(scope="session")
def data(trainer_data):
    """The session's preprocessed small data (tests/conftest.py); read-only."""
    return trainer_data


def _eval_examples(root, n=200):
    """`n` transformed eval rows as serialized tf.Examples (what the Trainer's signature takes)."""
    from components.data_io.examples_io import transformed_rows

    pattern = str(root / "tx" / "Split-eval" / "*")
    return transformed_rows(pattern, resolved_input.read_manifest(examples_uri([pattern])), n)


@pytest.fixture(scope="module")
def trained(data):
    """The module's Trainer run (run_fn, 40 steps, a checkpoint every 10), read by the artifact,
    restore, resume and TPU-rules tests. Five steps per Keras execution (steps_per_execution):
    its checkpoints, step count and restore are checked under it, at no cost of a run of its own."""
    cfg = _config(data, steps_per_execution=5)
    fn_args = _fn_args(data, cfg, 1)
    trainer_module.run_fn(fn_args)
    return cfg, os.path.dirname(fn_args.serving_model_dir)


@pytest.mark.slow(reason="a Trainer run (run_fn, 40 steps)")
def test_model_artifact_holds_plan_checkpoint_and_reports(trained, data):
    cfg, model_uri = trained
    plan = resolved_input.read_plan(model_uri).to_dict()  # the JSON the artifact holds
    placements = {t["placement"] for t in plan["tables"].values()}
    assert placements == {"tpu_embedding", "tensor_core"}, plan["tables"]
    assert plan["vocabulary_dir"] == str(data / "vocab")
    assert os.path.isfile(os.path.join(plan["vocabulary_dir"], "manifest.json"))
    rules = json.load(open(os.path.join(model_uri, TPU_RULES_FILE)))
    assert rules["passed"] and rules["batches_checked"] == 2 and not rules["violations"]
    metrics = json.load(open(os.path.join(model_uri, EVAL_METRICS_FILE)))
    assert metrics["examples"] == 600 and 0.5 < metrics["auc"] <= 1.0
    run = json.load(open(os.path.join(model_uri, TRAINING_RUN_FILE)))
    assert run["final_step"] == 40 and run["resumed_from_step"] == 0
    assert run["checkpoint_steps"] == [10, 20, 30, 40]
    # The final checkpoint: every table at its planned shape, Adagrad slots for TensorCore tables too
    # (they are trained by the embedding optimizer, not the dense one).
    reader = tf.train.load_checkpoint(os.path.join(model_uri, CHECKPOINT_DIR))
    shapes = reader.get_variable_to_shape_map()
    assert reader.get_tensor("model/dense_optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE") == 40
    for name, t in plan["tables"].items():
        matches = [k for k, s in shapes.items() if s == [t["rows"], t["dim"]] and "OPTIMIZER_SLOT" not in k]
        assert matches, (name, t["rows"], t["dim"])
    tc = [k for k in shapes if k.startswith("model/tensor_core_tables/") and "OPTIMIZER_SLOT" in k]
    assert tc and all("embedding_optimizer" in k for k in tc), tc
    # TensorBoard logs in the ModelRun directory.
    assert glob.glob(str(data / "Trainer" / "model_run" / "1" / "train" / "events.out.tfevents.*"))
    # Nothing of an unfinished run is left behind.
    assert not glob.glob(str(data / "Trainer" / training_state.STATE_DIR / "*" / "checkpoint"))


def _predict_in_fresh_process(model_uri, examples_path, cfg):
    script = textwrap.dedent(f"""
        import json, sys
        import numpy as np
        import components
        import tensorflow as tf
        from components.config.loading import config_from_json
        from components.contracts.manifest import VocabularyManifest
        from components.embedding_trainer import (model_building, resolved_input, trainer_module, training_loop,
                                                  training_state)
        from components.embedding_model.input import parse_batch
        model_uri = {model_uri!r}
        examples = tf.constant(np.load({examples_path!r}, allow_pickle=True))
        cfg = config_from_json(open(sys.argv[1]).read())
        saved = tf.saved_model.load(model_uri + "/Format-Serving")
        p_saved = saved.signatures["serving_default"](examples=examples)["probabilities"].numpy()
        manifest = VocabularyManifest.from_json(open(model_uri + "/embedding_manifest.json").read())
        model = model_building.build_model(resolved_input.read_plan(model_uri), manifest, cfg, for_training=False)
        features, _ = parse_batch(examples, manifest)
        model(features)
        tf.train.Checkpoint(model=model).restore(tf.train.latest_checkpoint(model_uri + "/checkpoints")).expect_partial()
        p_ckpt = model(features).numpy()
        np.save(sys.argv[2], np.stack([p_saved.ravel(), p_ckpt.ravel()]))
    """)
    cfg_path = examples_path + ".cfg.json"
    out = examples_path + ".out.npy"
    with open(cfg_path, "w") as fh:
        fh.write(cfg.to_json())
    proc = subprocess.run([sys.executable, "-c", script, cfg_path, out], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return np.load(out)


@pytest.mark.slow(reason="the module's Trainer run (run_fn, 40 steps), restored in a fresh TensorFlow process")
def test_restore_in_fresh_process_predicts_identically(trained, data, tmp_path):
    """The SavedModel and the checkpoint (a DCN-v2 model, the demo's; trained five steps per
    execution) restored in a fresh process score as the SavedModel scores here."""
    cfg, model_uri = trained
    assert cfg.training.model == "dcn_v2" and cfg.training.steps_per_execution == 5
    examples = _eval_examples(data)
    path = str(tmp_path / "examples.npy")
    np.save(path, np.array(examples, dtype=object), allow_pickle=True)
    p_saved, p_ckpt = _predict_in_fresh_process(model_uri, path, cfg)
    here = tf.saved_model.load(os.path.join(model_uri, "Format-Serving"))
    p_here = here.signatures["serving_default"](examples=tf.constant(examples))["probabilities"].numpy().ravel()
    assert len(p_here) == 200 and p_here.std() > 0  # not a constant model
    np.testing.assert_array_equal(p_saved, p_here)
    np.testing.assert_allclose(p_ckpt, p_here, rtol=0, atol=1e-6)


@pytest.mark.slow(reason="trains in a killed subprocess, then resumes")
def test_killed_run_resumes_and_ends_with_the_same_steps(trained, data, tmp_path):
    """The module's training (`trained`), killed after its step-20 checkpoint and started again,
    ends with the weights of the module's uninterrupted run."""
    cfg, straight_uri = trained
    cfg_path = tmp_path / "cfg.json"
    cfg_path.write_text(cfg.to_json())
    # The first execution is SIGKILLed (no cleanup) right after its step-20 checkpoint.
    script = textwrap.dedent(f"""
        import os, signal, sys
        from types import SimpleNamespace
        import components
        from components.embedding_trainer import trainer_module, training_loop
        from components.tfx_wiring.component_keys import CONFIG_KEY, EXAMPLES_URI_KEY
        original = training_loop.Checkpointer.on_epoch_end
        def kill_after_20(self, epoch, logs=None):
            original(self, epoch, logs)
            if int(self.step.numpy()) == 20:
                os.kill(os.getpid(), signal.SIGKILL)
        training_loop.Checkpointer.on_epoch_end = kill_after_20
        root = {str(data)!r}
        trainer_module.run_fn(SimpleNamespace(
            custom_config={{CONFIG_KEY: open(sys.argv[1]).read(), EXAMPLES_URI_KEY: root + "/tx"}},
            train_files=[root + "/tx/Split-train/*"], eval_files=[root + "/tx/Split-eval/*"],
            serving_model_dir=root + "/Trainer/model/21/Format-Serving",
            model_run_dir=root + "/Trainer/model_run/21", train_steps=None))
    """)
    proc = subprocess.run([sys.executable, "-c", script, str(cfg_path)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr[-3000:]
    states = glob.glob(str(data / "Trainer" / training_state.STATE_DIR / "*"))
    assert len(states) == 1
    assert tf.train.latest_checkpoint(states[0]).endswith("ckpt-20")
    assert not os.path.exists(data / "Trainer" / "model" / "21" / "Format-Serving")

    # Started again (a new execution, as TFX would): resumes at 20 and trains the remaining 20 steps.
    resumed = _fn_args(data, cfg, 22)
    trainer_module.run_fn(resumed)
    resumed_uri = os.path.dirname(resumed.serving_model_dir)
    run = json.load(open(os.path.join(resumed_uri, TRAINING_RUN_FILE)))
    assert run["resumed_from_step"] == 20 and run["final_step"] == 40
    assert run["checkpoint_steps"] == [30, 40]
    assert not os.path.exists(states[0])  # the state of the finished run is removed

    # The uninterrupted run of the same training (the module's) saw the same batches and ended
    # with the same model.
    assert json.load(open(os.path.join(straight_uri, TRAINING_RUN_FILE)))["resumed_from_step"] == 0
    a = tf.train.load_checkpoint(os.path.join(resumed_uri, CHECKPOINT_DIR))
    b = tf.train.load_checkpoint(os.path.join(straight_uri, CHECKPOINT_DIR))
    names = [n for n in a.get_variable_to_shape_map() if n != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    assert names
    for n in names:
        np.testing.assert_allclose(a.get_tensor(n), b.get_tensor(n), rtol=1e-5, atol=1e-6, err_msg=n)


def _check_inputs(data, trained):
    cfg, model_uri = trained
    plan = resolved_input.read_plan(model_uri)
    manifest = VocabularyManifest.from_json(open(os.path.join(model_uri, "embedding_manifest.json")).read())
    model = model_building.build_model(plan, manifest, cfg, for_training=False)
    return plan, manifest, model, [str(data / "tx" / "Split-train" / "*")]


def _tpu_input(files, manifest, plan, training=True, batch_size=32):
    return make_dataset(files, manifest, batch_size, training=training, dense_id_widths=dense_id_widths(plan))


@pytest.mark.slow(reason="reads the Trainer run's artifact (run_fn, 40 steps)")
def test_tpu_rules_pass_on_training_input(data, trained):
    plan, manifest, model, files = _check_inputs(data, trained)
    widths = dense_id_widths(plan)
    on_core = {n for n, f in plan.features.items() if plan.tables[f.table].placement == "tensor_core"}
    assert set(widths) == on_core and 0 < len(on_core) < len(plan.features)
    # Widths: one ID for single-valued features (statistics), at most max_length for multi-hot ones.
    assert all(widths[n] == 1 for n in on_core if n not in ("C3", "C12", "C16", "C24"))
    assert all(1 < widths[n] <= {"C3": 5, "C12": 5, "C16": 4, "C24": 5}[n] for n in on_core & {"C3", "C12", "C16", "C24"})
    report = check_tpu_rules(model, plan, _tpu_input(files, manifest, plan))
    assert report["passed"] and report["batches_checked"] == 2
    # The same features as SparseTensors: each TensorCore-table feature is named.
    report = check_tpu_rules(model, plan, make_dataset(files, manifest, 32, training=True), raise_on_violation=False)
    flagged = {v.split("'")[1] for v in report["violations"] if "is a SparseTensor" in v}
    assert flagged == set(widths), report["violations"]


@pytest.mark.slow(reason="restores the Trainer run's model (run_fn, 40 steps)")
def test_padded_dense_ids_pool_like_sparse_lookup(data, trained):
    """The TPU step's padded dense IDs and the host's SparseTensors give the same vectors, for every
    combiner, empty rows (zeros) included, and the trained model scores both forms alike."""
    ids = tf.sparse.from_dense(tf.constant([[3, 1, 0], [0, 0, 0], [2, 0, 0], [4, 4, 1]], tf.int64))
    ids = tf.SparseTensor(ids.indices, ids.values - 1, ids.dense_shape)  # ID 0 is a real row
    ids = tf.sparse.retain(ids, ids.values >= 0)
    dense = to_dense_ids(ids, 3)
    assert dense.numpy()[1].tolist() == [PAD_ID] * 3
    for combiner in ("mean", "sum", "sqrtn"):
        table = TensorCoreTable(SimpleNamespace(rows=5, dim=4, combiner=combiner,
                                                initializer=Initializer("truncated_normal", 0.0, 1.0)), f"t_{combiner}")
        np.testing.assert_allclose(table(dense).numpy(), table(ids).numpy(), rtol=1e-6, atol=1e-7, err_msg=combiner)
    assert not np.any(table(dense).numpy()[1])
    # Rows longer than the width keep their first IDs.
    assert to_dense_ids(ids, 1).numpy().ravel().tolist() == [2, PAD_ID, 1, 3]

    plan, manifest, _, _ = _check_inputs(data, trained)
    cfg, model_uri = trained
    model = model_building.build_model(plan, manifest, cfg, for_training=False)
    eval_files = [str(data / "tx" / "Split-eval" / "*")]
    sparse_batch, _ = next(iter(make_dataset(eval_files, manifest, 128, training=False)))
    dense_batch, _ = next(iter(_tpu_input(eval_files, manifest, plan, training=False, batch_size=128)))
    np.testing.assert_allclose(model(dense_batch).numpy(), model(sparse_batch).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow(reason="builds and traces the Trainer run's model (run_fn, 40 steps)")
def test_tpu_rules_name_each_violation(data, trained):
    plan, manifest, model, files = _check_inputs(data, trained)
    # IDs beyond a table's rows (examples from another preprocessing run): names feature and table.
    shrunk = dataclasses.replace(plan, tables={**plan.tables, "C2": dataclasses.replace(plan.tables["C2"], rows=3)})
    with pytest.raises(TPURulesError, match=r"feature 'C2': ID \d+ outside table 'C2' bounds \[0, 3\)"):
        check_tpu_rules(model, shrunk, _tpu_input(files, manifest, plan))
    # Eval-style input (no drop_remainder): dynamic batch dimension.
    report = check_tpu_rules(model, plan, _tpu_input(files, manifest, plan, training=False), raise_on_violation=False)
    assert not report["passed"]
    assert any("no static batch dimension" in v and "'C1'" in v for v in report["violations"])
    # A string feature in the input.
    strings = _tpu_input(files, manifest, plan).map(
        lambda f, y: ({**f, "I1": tf.strings.as_string(f["I1"])}, y))
    with pytest.raises(TPURulesError, match="feature 'I1' is a string tensor"):
        check_tpu_rules(model, plan, strings)


@pytest.mark.slow(reason="builds and traces the Trainer run's model (run_fn, 40 steps)")
def test_tpu_rules_find_string_ops_in_the_step(data, trained):
    plan, manifest, _, files = _check_inputs(data, trained)
    cfg, _ = trained

    class LooksUpStrings(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.inner = model_building.build_model(plan, manifest, cfg, for_training=False)

        def call(self, x, training=False):
            x = dict(x)
            c1 = x["C1"]  # a SparseTensor in TPU embedding, padded dense IDs on the TensorCore
            if isinstance(c1, tf.SparseTensor):
                x["C1"] = tf.SparseTensor(c1.indices, tf.strings.to_number(
                    tf.strings.as_string(c1.values), tf.int64), c1.dense_shape)
            else:
                x["C1"] = tf.strings.to_number(tf.strings.as_string(c1), tf.int64)
            return self.inner(x)

    with pytest.raises(TPURulesError, match=r"op .*\((AsString|StringToNumber)\) handles strings in the step"):
        check_tpu_rules(LooksUpStrings(), plan, _tpu_input(files, manifest, plan))


@pytest.mark.slow(reason="a Trainer run for two options")
def test_configured_initializers_and_unsafe_lookups_train_on_cpu(data, tmp_path):
    """Issue 18, item 5: tables with configured initializers (zeros, uniform, normal) in both
    placements start from them in the model the trainer builds, and a short CPU training run with
    `use_safe_embedding_lookup: false` on some features trains and writes its checkpoint."""
    from components.contracts.manifest import VocabularyManifest

    raw = _raw_config(data, train_steps=8, checkpoint_every_steps=8)
    manifest = VocabularyManifest.from_json((data / "vocab" / "manifest.json").read_text())
    placement = {n: t.placement for n, t in derive_plan(parse_config(raw), manifest).tables.items()}
    own = [f["name"] for f in raw["categorical_features"] if "table" not in f]
    tpu = next(n for n in own if placement[n] == "tpu_embedding")  # a table in each placement
    core = next(n for n in own if placement[n] == "tensor_core")
    for f in raw["categorical_features"]:
        if f["name"] == tpu:
            f["initializer"] = {"name": "zeros"}
        if f["name"] == core:
            f["initializer"] = {"name": "random_uniform", "minval": 0.25, "maxval": 0.5}
        if f["name"] in ("C3", core, "C20"):
            f["use_safe_embedding_lookup"] = False
    raw["tables"][0]["initializer"] = {"name": "random_normal", "mean": 2.0, "stddev": 0.01}  # shared_c3_c4
    cfg = parse_config(raw)
    plan = derive_plan(cfg, manifest)
    model = model_building.build_model(plan, manifest, cfg, for_training=True)
    features, _ = next(iter(make_dataset(
        [str(data / "tx" / "Split-train" / "*")], manifest, 64, training=False)))
    model(features)
    def table(name):  # the model's variable holding the table (rows x dim), whatever its placement
        rows = plan.tables[name].rows
        found = [v.numpy() for v in model.variables
                 if name in v.name and v.shape.rank == 2 and v.shape[0] == rows and "slot" not in v.name.lower()
                 and "accumulator" not in v.name.lower()]
        assert found, [v.name for v in model.variables if name in v.name]
        return found[0]

    assert not table(tpu).any()
    assert table(core).min() >= 0.25 and table(core).max() <= 0.5
    assert abs(float(table("shared_c3_c4").mean()) - 2.0) < 0.01
    assert not plan.features["C3"].validate_weights_and_indices and plan.features["C4"].validate_weights_and_indices
    fn_args = _fn_args(tmp_path, cfg, 1)
    fn_args.train_files = [str(data / "tx" / "Split-train" / "*")]
    fn_args.eval_files = [str(data / "tx" / "Split-eval" / "*")]
    fn_args.custom_config[EXAMPLES_URI_KEY] = str(data / "tx")  # the examples' artifact those files are in
    trainer_module.run_fn(fn_args)
    run = json.load(open(os.path.join(os.path.dirname(fn_args.serving_model_dir), TRAINING_RUN_FILE)))
    assert run["final_step"] == 8
    written = resolved_input.read_plan(os.path.dirname(fn_args.serving_model_dir))
    assert written.tables[core].initializer.minval == 0.25 and not written.features["C20"].validate_weights_and_indices


def test_per_table_optimizers_and_gradient_multiplier_update_as_documented(data):
    """Issue 18, item 2, on CPU: one training step of the model the trainer builds. Tables with an
    optimizer of their own (one TensorCore table and one TPU-embedding table sharing an SGD
    override, one TPU-embedding table on Adagrad) move by exactly their optimizer's rule applied
    to the gradient times the embedding gradient multiplier (gradients taken without it, before
    the step); the other tables keep training.embedding_optimizer (FTRL here), slots live under
    their own optimizer, the TPU layer's TableConfigs carry the per-table TPU optimizers, and every
    embedding optimizer counted the step."""
    from components.contracts.manifest import VocabularyManifest

    raw = _raw_config(data, dropout=0.0, input_dropout=0.0, embedding_gradient_multiplier={"value": 0.5})
    manifest = VocabularyManifest.from_json((data / "vocab" / "manifest.json").read_text())
    placement = {n: t.placement for n, t in derive_plan(parse_config(raw), manifest).tables.items()}
    own = [f["name"] for f in raw["categorical_features"] if "table" not in f]
    tpus = [n for n in own if placement[n] == "tpu_embedding"]
    core = next(n for n in own if placement[n] == "tensor_core")
    sgd_tpu, adagrad_tpu = tpus[:2]
    default = next(n for n in own if n not in (core, sgd_tpu, adagrad_tpu))
    overrides = {core: {"name": "sgd", "learning_rate": 0.3}, sgd_tpu: {"name": "sgd", "learning_rate": 0.3},
                 adagrad_tpu: {"name": "adagrad", "learning_rate": 0.2, "initial_accumulator_value": 0.5}}
    for f in raw["categorical_features"]:
        if f["name"] in overrides:
            f["optimizer"] = overrides[f["name"]]
    cfg = parse_config(raw)
    train_files = [str(data / "tx" / "Split-train" / "*")]
    plan = derive_plan(cfg, manifest, resolved_input.read_statistics(examples_uri(train_files)))
    assert plan.tables[core].optimizer["name"] == "sgd" and plan.tables[default].optimizer["name"] == "ftrl"
    assert plan.tables[adagrad_tpu].memory.slots_per_row == 1 and plan.tables[sgd_tpu].memory.slots_per_row == 0
    model = model_building.build_model(plan, manifest, cfg, for_training=True)
    model.compile(optimizer=model.dense_optimizer, loss=tf.keras.losses.BinaryCrossentropy())
    features, labels = next(iter(make_dataset(
        train_files, manifest, 64, training=True, seed=3,
        dense_id_widths=dense_id_widths(plan))))
    model(features)
    mid = model.embedding_layer._tpu_embedding
    var = {n: mid._variables[n]["parameters"] for n in (sgd_tpu, adagrad_tpu, default) if n in mid._variables}
    var[core] = model.tensor_core_tables[core].embeddings
    if default not in var:
        var[default] = model.tensor_core_tables[default].embeddings
    with tf.GradientTape() as tape:  # no multiplier outside training
        loss = model.compiled_loss(labels, model(features, training=False))
    grads = dict(zip(var, (tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, list(var.values())))))
    before = {n: v.numpy().copy() for n, v in var.items()}
    model.train_step((features, labels))
    after = {n: v.numpy() for n, v in var.items()}

    for n in (core, sgd_tpu):
        np.testing.assert_allclose(after[n], before[n] - 0.3 * 0.5 * grads[n], atol=1e-6)
    g = 0.5 * grads[adagrad_tpu]
    accumulator = 0.5 + g * g
    np.testing.assert_allclose(after[adagrad_tpu], before[adagrad_tpu] - 0.2 * g / (np.sqrt(accumulator) + 1e-7), atol=1e-6)
    table_opts = model._table_optimizer
    assert table_opts[core] is table_opts[sgd_tpu] and table_opts[adagrad_tpu] is not table_opts[core]
    np.testing.assert_allclose(table_opts[adagrad_tpu].keras.get_slot(var[adagrad_tpu], "accumulator").numpy(),
                               accumulator, rtol=1e-6)
    assert model.embedding_optimizer.get_slot(var[default], "accumulator") is not None  # FTRL's
    assert not (after[default] == before[default]).all()
    for opt in [model.embedding_optimizer] + list(model.table_embedding_optimizers.values()):
        assert int(opt.iterations.numpy()) == 1
    tables = {f.table.name: f.table for f in model.embedding_layer._feature_config.values()}
    assert tables[sgd_tpu].optimizer is table_opts[sgd_tpu].tpu
    assert isinstance(tables[adagrad_tpu].optimizer, tf.tpu.experimental.embedding.Adagrad)
    assert tables[adagrad_tpu].optimizer.learning_rate == pytest.approx(0.2)
    assert isinstance(tables["shared_c3_c4"].optimizer, tf.tpu.experimental.embedding.FTRL)  # the layer's, as TF fills it in


def _raw_eval_records(data, manifest):
    """The eval CSV as raw tf.Examples (each column a list of the manifest's kind, a missing value an
    empty list): what the exporter's parity check reads."""
    raw = data / "raw_eval.tfrecord"
    if raw.exists():
        return raw
    import pyarrow as pa
    import pyarrow.csv as pacsv
    from tfx_bsl.coders import example_coder

    from components.rules import rulebook

    kinds = dict(manifest.raw_feature_kinds)
    types = {rulebook.KIND_FLOAT: pa.float32(), rulebook.KIND_INT: pa.int64(), rulebook.KIND_BYTES: pa.binary()}

    def as_lists(column, name):  # a value per row -> a list per row (as the manifest's kind), a missing value an empty list
        column = column.cast(types[kinds[name]]) if name in kinds else column
        present = np.asarray(column.is_valid())
        offsets = pa.array(np.concatenate([[0], np.cumsum(present)]).astype(np.int32))
        return pa.ListArray.from_arrays(offsets, column.filter(pa.array(present)))

    with tf.io.TFRecordWriter(str(raw)) as writer:
        for batch in pacsv.read_csv(str(data / "eval.csv")).to_batches():
            names = [n for n in batch.schema.names if n in kinds or n == manifest.label]  # the configured columns
            lists = pa.RecordBatch.from_arrays([as_lists(batch.column(n), n) for n in names], names)
            for record in example_coder.RecordBatchToExamplesEncoder().encode(lists):
                writer.write(record)
    return raw


@pytest.mark.slow(reason="a Trainer run, an int8 export with parity and a training step")
def test_wide_part_is_a_linear_model_added_to_the_logit_and_trained_by_its_optimizer(data):
    """training.wide: the trained model's logit is the deep part's plus exactly a
    logistic regression's, one weight per row of every table (the wide tables, read from the
    checkpoint, pooled per feature as a bag: summed, whatever its deep table's combiner) and one per
    dense feature; the wide tables and the dense term are updated by the wide optimizer (FTRL)
    and moved from their zero start."""
    from components.config.training_schema import WIDE_SUFFIX
    from components.embedding_model.dense_tower import dense_input
    from components.embedding_model.restore import model_from_checkpoint, open_checkpoint_tables
    from components.embedding_exporter.export import latest_checkpoint, read_model_manifest, read_model_plan

    cfg = _config(data, wide={"enabled": True, "optimizer": {"name": "ftrl", "learning_rate": 1.0}}, train_steps=20)
    fn_args = _fn_args(data, cfg, 11)
    trainer_module.run_fn(fn_args)
    model_uri = os.path.dirname(fn_args.serving_model_dir)
    plan, manifest = read_model_plan(model_uri), read_model_manifest(model_uri)
    assert plan.wide_features() == {n + WIDE_SUFFIX: n for n in manifest.categorical_names}
    ckpt = latest_checkpoint(model_uri)
    features, _ = next(iter(make_dataset([str(data / "tx" / "Split-eval" / "*")], manifest, 128, training=False)))
    model = model_from_checkpoint(plan, manifest, cfg, ckpt, features)
    logit = lambda p: np.log(p) - np.log1p(-p)  # noqa: E731
    full = model(features).numpy().astype(np.float64)

    tables = open_checkpoint_tables(ckpt, plan)
    wide = np.zeros([128, 1])
    for w, n in plan.wide_features().items():
        weights = tables.read(plan.features[w].table)
        assert np.abs(weights).max() > 0  # trained away from the zeros it starts at
        wide += tf.nn.safe_embedding_lookup_sparse(
            tf.constant(weights), features[n], combiner=plan.tables[plan.features[w].table].combiner).numpy()
    kernel = model.wide_dense.kernel.numpy()
    assert np.abs(kernel).max() > 0
    wide += dense_input(features, manifest.dense_names).numpy() @ kernel
    assert set(model.bucket_tables) == set(manifest.dense_names)  # the dense features' buckets have weights too
    for n, table in model.bucket_tables.items():
        values = features[n].numpy().reshape(-1).astype(np.float32)
        bucket = np.searchsorted(np.asarray(plan.dense_buckets.boundaries[n], np.float32), values, side="right")
        wide += table.wide.numpy()[bucket]
        table.wide.assign(tf.zeros_like(table.wide))
    for stack in model.serving_stacks.values():  # the deep part alone: the wide weights zeroed
        stack.wide.assign(tf.zeros_like(stack.wide))
    model.wide_dense.kernel.assign(tf.zeros_like(model.wide_dense.kernel))
    deep = model(features).numpy().astype(np.float64)
    np.testing.assert_allclose(logit(full) - logit(deep), wide, atol=2e-4)

    # exported (int8 tables, float16 compared): parity with the trained model on raw rows; the wide
    # weights stay float32 beside the compressed rows, and their files carry their table's vocabulary
    import pyarrow.csv as pacsv
    from tfx_bsl.coders import example_coder
    from components.embedding_exporter.export import export_serving_model

    raw = _raw_eval_records(data, manifest)
    export_cfg = dataclasses.replace(cfg, export=dataclasses.replace(
        cfg.export, table_dtype="int8", compare_compression=True, auc_sample_size=600))
    out = data / "wide_export"
    report = export_serving_model(export_cfg, model_uri, str(raw), str(out))
    assert report["parity"]["passed"] and report["parity"]["max_abs_diff"] <= 1e-5
    wide_tables = {t for t in plan.tables if plan.tables[t].wide_of}
    deep_tables = set(plan.tables) - wide_tables
    assert report["compression"]["int8"]["table_bytes"] == (
        sum(plan.tables[t].rows * (plan.tables[t].dim + 4) for t in deep_tables) + sum(plan.tables[t].rows * 4 for t in wide_tables))
    entries = json.loads((out / TABLES_DIR / TABLES_MANIFEST_FILE).read_text())["tables"]
    for t in wide_tables:
        deep = plan.tables[t].wide_of
        assert entries[t]["dtype"] == "float32" and entries[t]["vocabulary_file"] == entries[deep]["vocabulary_file"]
        np.testing.assert_array_equal(np.load(out / TABLES_DIR / entries[t]["files"]["values"]), tables.read(t))

    # one training step: the wide tables and the dense term move by the wide optimizer's rule
    train_model = model_building.build_model(plan, manifest, cfg, for_training=True)
    train_features, labels = next(iter(make_dataset(
        [str(data / "tx" / "Split-train" / "*")], manifest, 64, training=True, seed=5, dense_id_widths=dense_id_widths(plan))))
    train_model(train_features)
    wide_table = plan.features[manifest.categorical_names[0] + WIDE_SUFFIX].table
    optimizer = train_model._table_optimizer[wide_table]
    assert isinstance(optimizer.keras, tf.keras.optimizers.legacy.Ftrl)
    assert optimizer.keras.learning_rate.numpy() == pytest.approx(cfg.training.wide.optimizer.learning_rate)
    train_model.compile(optimizer=train_model.dense_optimizer, loss=tf.keras.losses.BinaryCrossentropy())
    train_model.train_step((train_features, labels))
    assert optimizer.keras.get_slot(train_model.wide_dense.kernel, "accumulator") is not None
    assert np.abs(train_model.wide_dense.kernel.numpy()).max() > 0
    assert int(optimizer.keras.iterations.numpy()) == 1


@pytest.mark.parametrize("model_type", ["dcn_v2", "dlrm"])
def test_input_dropout_acts_in_training_only_and_adds_no_state(data, model_type, tmp_path):
    """training.input_dropout masks the deep part's input in training (stateless: the same step
    draws the same mask), leaves inference and serving as they were, and adds no variable, so
    checkpoints of a model trained with and without it hold the same keys."""
    from components.contracts.manifest import VocabularyManifest

    manifest = VocabularyManifest.from_json((data / "vocab" / "manifest.json").read_text())
    train_files = [str(data / "tx" / "Split-train" / "*")]
    models = {}
    for rate in (0.0, 0.5):
        cfg = _config(data, model=model_type, dropout=0.0, input_dropout=rate)
        plan = derive_plan(cfg, manifest, resolved_input.read_statistics(examples_uri(train_files)))
        tf.keras.utils.set_random_seed(5)
        models[rate] = model_building.build_model(plan, manifest, cfg, for_training=True)
    features, _ = next(iter(make_dataset(train_files, manifest, 64, training=True, seed=3,
                                         dense_id_widths=dense_id_widths(plan))))
    for m in models.values():
        m(features)
    plain, dropped = models[0.0], models[0.5]
    assert plain.input_dropout is None and dropped.input_dropout.rate == 0.5
    keys = {rate: sorted(name for name, _ in tf.train.list_variables(
        tf.train.Checkpoint(model=m).save(str(tmp_path / f"rate{rate}" / "ckpt")))) for rate, m in models.items()}
    assert keys[0.0] == keys[0.5]
    dropped.set_weights(plain.get_weights())
    np.testing.assert_array_equal(dropped(features, training=False).numpy(), plain(features, training=False).numpy())
    np.testing.assert_array_equal(plain(features, training=True).numpy(), plain(features, training=False).numpy())
    first, again = dropped(features, training=True).numpy(), dropped(features, training=True).numpy()
    np.testing.assert_array_equal(first, again)  # the step's mask, drawn again
    assert np.abs(first - plain(features, training=False).numpy()).max() > 1e-3
    dropped.dense_optimizer.iterations.assign_add(1)
    assert not np.array_equal(dropped(features, training=True).numpy(), first)  # the next step's mask


@pytest.mark.slow(reason="a Trainer run and an export with parity (the encoding's rule cases stay fast: test_rulebook)")
def test_piecewise_linear_buckets_train_export_and_match_the_rule(data):
    """training.dense_buckets.encoding piecewise_linear (with the wide part): each dense feature's
    vectors and wide weight are its B2 encoding (the rulebook's reference) times the trained
    matrices, which moved from their zero start; the export is exact against the trained model."""
    from components.rules import rulebook
    from components.embedding_exporter.export import (export_serving_model, latest_checkpoint, read_model_manifest,
                                                      read_model_plan)
    from components.embedding_model.restore import model_from_checkpoint

    cfg = _config(data, wide={"enabled": True, "optimizer": {"name": "ftrl", "learning_rate": 1.0}}, train_steps=20,
                  dense_buckets={"encoding": "piecewise_linear"})
    fn_args = _fn_args(data, cfg, 11)
    trainer_module.run_fn(fn_args)
    model_uri = os.path.dirname(fn_args.serving_model_dir)
    plan, manifest = read_model_plan(model_uri), read_model_manifest(model_uri)
    assert plan.dense_buckets.encoding == "piecewise_linear"
    features, _ = next(iter(make_dataset([str(data / "tx" / "Split-eval" / "*")], manifest, 128, training=False)))
    model = model_from_checkpoint(plan, manifest, cfg, latest_checkpoint(model_uri), features)
    assert set(model.bucket_tables) == set(manifest.dense_names)
    for n, table in model.bucket_tables.items():
        boundaries = plan.dense_buckets.boundaries[n]
        assert table.embeddings.shape == (len(boundaries) - 1, plan.dense_buckets.dim)
        assert np.abs(table.embeddings.numpy()).max() > 0 and np.abs(table.wide.numpy()).max() > 0
        values = features[n].numpy().reshape(-1).astype(np.float32)
        encoded = np.array([rulebook.dense_piecewise_linear(v, boundaries) for v in values])
        vectors, wide = table(tf.constant(values))
        np.testing.assert_allclose(vectors.numpy(), encoded @ table.embeddings.numpy(), atol=1e-5)
        np.testing.assert_allclose(wide.numpy(), encoded @ table.wide.numpy(), atol=1e-5)
    report = export_serving_model(cfg, model_uri, str(_raw_eval_records(data, manifest)), str(data / "ple_export"))
    assert report["parity"]["passed"] and report["parity"]["max_abs_diff"] <= 1e-5


@pytest.mark.slow(reason="two 3-step fits of the Trainer's model, each traced")
def test_variables_created_before_fit_trace_the_step_once_and_hold_the_first_steps_values(data, tmp_path):
    """model_building.create_variables (called before fit off a TPU) makes Keras trace the training
    step once, and after three steps, dropout and input dropout on, every checkpoint value equals
    that of a fit whose first step created the variables: the run's figures do not move."""
    cfg = _config(data, dropout=0.3, input_dropout=0.2, wide={"enabled": True}, precision="mixed_bfloat16")
    files = [str(data / "tx" / "Split-train" / "*")]
    manifest = resolved_input.read_manifest(examples_uri(files))
    plan = derive_plan(cfg, manifest, resolved_input.read_statistics(examples_uri(files)))
    runs = fits_with_variables_created_before_and_by_the_first_step(cfg, plan, manifest, files, tmp_path)
    assert_traced_once_with_the_first_steps_values(runs, more_than=50)


def test_an_input_create_variables_cannot_stand_in_for_is_left_to_the_first_step():
    """A ragged input, or one of unknown rank: nothing is built (the model is not even called), and
    the first step creates the variables as it did before."""
    label, unbuilt = tf.TensorSpec([4, 1], tf.float32), SimpleNamespace(built=False)  # not callable
    for spec in (tf.RaggedTensorSpec([4, None], tf.int64), tf.TensorSpec(None, tf.float32)):
        assert model_building.create_variables(unbuilt, ({"C1": tf.TensorSpec([4, 1], tf.int64), "x": spec}, label)) is False
