"""The dense network in bfloat16 (`training.precision`): Keras' mixed_bfloat16 policy on the dense
layers, the tables, the logit and the loss in float32, and `auto`'s choice per hardware.

- `choose_precision`: a TPU trains mixed_bfloat16; a GPU float32; a CPU float32 unless it has
  bfloat16 units (not capped by ONEDNN_MAX_CPU_ISA) and the defaults were measured fast enough.
- The mixed model computes its cross layers and MLPs in bfloat16 over float32 variables and
  returns float32 probabilities; from the same weights it scores within bfloat16's resolution of
  the float32 model, and not exactly as it (the policy is applied).
"""
import numpy as np
import pytest

import components  # noqa: F401
import tensorflow as tf

from components.embedding_trainer import precision_choice
from components.embedding_trainer.precision_choice import choose_precision

WITH_UNITS = frozenset({"avx512f", "avx512_bf16"})


@pytest.mark.parametrize("setting, platform, flags, cap, expected, words", [
    ("auto", "tpu", frozenset(), None, "mixed_bfloat16", "as TF Model Garden trains"),
    ("auto", "gpu", WITH_UNITS, None, "float32", "on a GPU"),
    ("auto", "cpu", frozenset({"avx2"}), None, "float32", "no bfloat16 units"),
    ("auto", "cpu", WITH_UNITS, "AVX512_CORE", "float32", "ONEDNN_MAX_CPU_ISA=AVX512_CORE caps oneDNN"),
    ("auto", "cpu", WITH_UNITS, None, "float32", "under 1.15x"),
    ("float32", "tpu", frozenset(), None, "float32", "training.precision: float32"),
    ("mixed_bfloat16", "cpu", frozenset(), None, "mixed_bfloat16", "training.precision: mixed_bfloat16"),
])
def test_auto_picks_per_hardware_and_a_set_precision_is_used_as_set(setting, platform, flags, cap, expected, words):
    precision, why = choose_precision(setting, platform, flags, cap or "")
    assert precision == expected and words in why, why


def test_auto_takes_bfloat16_on_a_cpu_only_when_measured_fast_enough(monkeypatch):
    monkeypatch.setattr(precision_choice, "MEASURED_CPU_SPEEDUP", 1.2)
    assert choose_precision("auto", "cpu", WITH_UNITS, "")[0] == "mixed_bfloat16"
    assert choose_precision("auto", "cpu", WITH_UNITS, "AVX2")[0] == "float32"  # the emulated CPU without units


def _models_and_batch(data):
    from components.contracts.manifest import VocabularyManifest
    from components.embedding_model.input import make_dataset
    from components.embedding_model.tf_objects import dense_id_widths, sequence_lengths
    from components.embedding_trainer import model_building, resolved_input
    from components.planning.run_plan import derive_plan
    from tests.stages import examples_uri, trainer_config

    cfg = trainer_config(data, dropout=0.0, input_dropout=0.0)
    manifest = VocabularyManifest.from_json((data / "vocab" / "manifest.json").read_text())
    train_files = [str(data / "tx" / "Split-train" / "*")]
    plan = derive_plan(cfg, manifest, resolved_input.read_statistics(examples_uri(train_files)))
    batch = next(iter(make_dataset(train_files, manifest, 256, training=False, dense_id_widths=dense_id_widths(plan),
                                   sequence_lengths=sequence_lengths(plan))))
    models = {}
    for precision in ("float32", "mixed_bfloat16"):
        tf.keras.utils.set_random_seed(5)
        models[precision] = model_building.build_model(plan, manifest, cfg, for_training=False, precision=precision)
        models[precision](batch[0])
    return models, batch


def test_the_mixed_policy_computes_the_dense_layers_in_bfloat16_and_the_probability_in_float32(trainer_data):
    models, (features, _) = _models_and_batch(trainer_data)
    mixed, full = models["mixed_bfloat16"], models["float32"]
    tower = mixed.dense_tower
    dense_layers = [*tower.bottom_mlp.layers, *tower.cross, *tower.top_mlp.layers[:-1]]
    assert dense_layers and all(layer.compute_dtype == "bfloat16" for layer in dense_layers)
    assert all(v.dtype == tf.float32 for layer in dense_layers for v in layer.variables)  # float32 weights
    assert tower.top_mlp.layers[-1].compute_dtype == "float32"  # the logit
    assert tower.bottom(features)[2].dtype == tf.bfloat16
    # Same weights (the checkpoints are compatible), then each model scores the batch.
    for a, b in zip(full.variables, mixed.variables):
        b.assign(a)
    p_mixed, p_full = mixed(features).numpy(), full(features).numpy()
    assert mixed(features).dtype == tf.float32  # the loss and every metric read float32
    diff = np.abs(p_mixed - p_full)
    assert diff.max() > 0  # computed in bfloat16, not float32
    assert diff.max() < 0.02, diff.max()  # within bfloat16's resolution (8 bits of mantissa)


@pytest.mark.slow(reason="a Trainer run (run_fn, 20 steps) in mixed_bfloat16 and its evaluation twice")
def test_a_bfloat16_run_records_its_precision_and_both_aucs(trainer_data):
    import json
    import os

    from components.contracts.artifacts import EVAL_METRICS_FILE, TRAINING_RUN_FILE
    from components.embedding_trainer import trainer_module
    from tests.stages import fn_args, trainer_config

    cfg = trainer_config(trainer_data, train_steps=20, precision="mixed_bfloat16")
    args = fn_args(trainer_data, cfg, "precision-bf16")
    trainer_module.run_fn(args)
    model_uri = os.path.dirname(args.serving_model_dir)
    with open(os.path.join(model_uri, TRAINING_RUN_FILE)) as fh:
        run = json.load(fh)
    with open(os.path.join(model_uri, EVAL_METRICS_FILE)) as fh:
        metrics = json.load(fh)
    assert run["precision"] == {"setting": "mixed_bfloat16", "used": "mixed_bfloat16",
                                "reason": "training.precision: mixed_bfloat16"}
    trained = metrics["trained_precision"]
    assert trained["precision"] == "mixed_bfloat16" and 0.5 < trained["auc"] < 1
    assert abs(trained["auc"] - metrics["auc"]) < 0.01  # the same weights served in float32


def test_the_summary_names_the_precision_and_both_aucs():
    from components.reporting.report import render
    from pipelines import summary as summary_lib

    s = {"eval_auc": 0.8012, "precision": {"setting": "auto", "used": "mixed_bfloat16", "trained_auc": 0.8009,
                                           "reason": "auto on a TPU: mixed_bfloat16, as TF Model Garden trains DLRM/DCN-v2"}}
    text = " ".join(render(summary_lib.summary_report(s)).split())
    assert ("precision: mixed_bfloat16 (auto on a TPU: mixed_bfloat16, as TF Model Garden trains DLRM/DCN-v2); "
            "eval AUC 0.8009 as trained, 0.8012 served in float32") in text
