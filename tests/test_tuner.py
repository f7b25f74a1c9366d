"""The Tuner (issue 64): the `tuning` section's checks (an unknown field, an empty space, a field that
would change the plan's tables or the data stages, values that do not fit), best hyperparameters
applied over a config, the stage shares TFX caches by, the pipeline's wiring and its Kubeflow
compilation, KerasTuner's search with our training on the smallest data (2 trials), a search whose
trials all fail, and a local pipeline run with tuning on whose rerun takes the Tuner from the cache."""
import json
import os

import pytest
import yaml

from tests.stages import demo_raw_config, examples_uri

from components.config.loading import apply_values, config_from_json, parse_config
from components.config.schema import ConfigError
from components.config.tuning import TUNABLE, parse_space, values_of

IMAGE = "REGISTRY/tpu-embedding-tfx:TAG"
SPACE = {  # the issue's example
    "training.dropout": [0.1, 0.3],
    "training.embedding_optimizer.learning_rate": {"log": [0.01, 1.0]},
    "training.cross_layers": [1, 2, 3],
}


def _raw(csv_path="/nonexistent/data.csv", **tuning):
    raw = demo_raw_config()
    raw["input"]["path"] = str(csv_path)
    raw["tuning"] = dict({"trials": 8, "space": dict(SPACE)}, **tuning)
    return raw


def _config(**tuning):
    return parse_config(_raw(**tuning), "t.yaml")  # never read: parsing only


# ---- the section's checks ----------------------------------------------------------------------

def test_the_issues_space_loads():
    tu = _config().tuning
    assert tu.trials == 8 and tu.algorithm == "random" and tu.space == SPACE
    assert parse_space(tu.space)["training.embedding_optimizer.learning_rate"] == {
        "kind": "range", "type": "float", "min": 0.01, "max": 1.0, "log": True}
    assert parse_space(tu.space)["training.cross_layers"] == {"kind": "choice", "type": "int", "values": [1, 2, 3]}
    assert parse_config(demo_raw_config() | {"input": {"path": "/x.csv"}}).tuning is None  # no section: off


def test_an_unknown_field_is_refused_naming_it_and_the_tunable_ones():
    with pytest.raises(ConfigError) as e:
        _config(space={"training.dropuot": [0.1]})
    msg = str(e.value)
    assert "t.yaml: tuning.space.training.dropuot: unknown field" in msg
    assert "tunable fields: training.dropout, training.input_dropout" in msg


def test_an_empty_space_is_refused():
    with pytest.raises(ConfigError, match=r"tuning.space: empty; name at least one field"):
        _config(space={})


@pytest.mark.parametrize("field, why", [
    ("tables[0].dim", "sets the plan's tables"),
    ("categorical_defaults.dim", "sets the plan's tables"),
    ("categorical_features.dim", "sets the plan's tables"),
    ("training.embedding.size_threshold", "sets the plan's tables"),  # placement
    ("training.dense_buckets.dim", "sets the plan's tables"),
    ("training.wide.enabled", "sets the plan's tables"),
    ("training.embedding_optimizer.name", "slots size the tables' memory"),
    ("training.batch_size", "the data stages read it"),
    ("input.train_buckets", "only training fields that change the model"),
    ("training.train_steps", "not the model or its optimizers"),
])
def test_a_field_that_would_change_the_tables_or_the_data_is_refused_naming_it(field, why):
    with pytest.raises(ConfigError) as e:
        _config(space={field: [8, 16]})
    assert f"tuning.space.{field}: not tunable: " in str(e.value) and why in str(e.value)


@pytest.mark.parametrize("entry, message", [
    ([0.1, 1.5], r"training.dropout\[1\]: 1.5 is not a rate in \[0, 1\)"),
    (["0.1"], r"training.dropout\[0\]: '0.1' is not a number"),
    ([], r"training.dropout: an empty list"),
    ({"min": 0.3, "max": 0.1}, r"the lowest value 0.3 is not below the highest 0.1"),
    ({"log": [0.0, 0.3]}, r"training.dropout.log: 0.0 is not positive"),
    ({"log": 0.3}, r"training.dropout.log: expected \[lowest, highest\]"),
    ({"between": [0, 1]}, r"expected a list of values, \{min: a, max: b\} or \{log: \[lo, hi\]\}"),
])
def test_values_that_do_not_fit_the_field_are_refused(entry, message):
    with pytest.raises(ConfigError, match=message):
        _config(space={"training.dropout": entry})


def test_parallel_trials_are_positive_and_no_more_than_the_trials():
    assert _config(parallel_trials=8).tuning.parallel_trials == 8 and _config().tuning.parallel_trials == 1
    with pytest.raises(ConfigError, match=r"tuning.parallel_trials: must be positive, got 0"):
        _config(parallel_trials=0)
    with pytest.raises(ConfigError, match=r"tuning.parallel_trials: 9 machines for 8 trials would leave 1 idle; "
                                          r"set it to 8 or fewer"):
        _config(parallel_trials=9)


def test_integer_fields_take_integers_and_counts_are_positive():
    with pytest.raises(ConfigError, match=r"training.cross_layers\[0\]: 1.5 is not an integer"):
        _config(space={"training.cross_layers": [1.5]})
    with pytest.raises(ConfigError, match="tuning.trials: must be positive"):
        _config(trials=0)
    with pytest.raises(ConfigError, match="tuning.steps_per_trial: must be positive"):
        _config(steps_per_trial=0)
    with pytest.raises(ConfigError, match="tuning.algorithm"):
        _config(algorithm="grid")


def test_layer_widths_are_tuned_as_whole_lists():
    """KerasTuner's Choice takes scalars: a list field's choices are held as their JSON text, and
    read back as lists wherever values are applied (a trial, the Trainer, the exporter)."""
    from components.embedding_trainer.tuner import search_space

    space = {"training.bottom_mlp": [[64, 16], [128, 32], [64, 16]], "training.top_mlp": [[], [32]]}
    assert parse_space(space)["training.bottom_mlp"] == {"kind": "choice", "type": "list",
                                                         "values": [[64, 16], [128, 32]]}
    hp = search_space(space)
    assert hp.get("training.bottom_mlp") in ("[64, 16]", "[128, 32]")
    tuned = apply_values(_config(), {"training.bottom_mlp": "[128, 32]", "training.top_mlp": []})
    assert (tuned.training.bottom_mlp, tuned.training.top_mlp) == ([128, 32], [])
    for entry, message in (([64, 16], r"bottom_mlp\[0\]: 64 is not a list of layer widths .*\[\[64, 16\], \[128, 32\]\]"),
                           ({"min": 16, "max": 64}, r"expected a list of layer-width lists"),
                           ([[64, 0]], r"\[64, 0\]: layer widths are positive"),
                           ([[]], r"bottom_mlp\[0\]: empty; the bottom MLP needs at least one layer"),
                           ([[16.5]], r"is not a list of layer widths \(integers\)")):
        with pytest.raises(ConfigError, match=message):
            _config(space={"training.bottom_mlp": entry})


def test_every_tunable_field_exists_and_is_a_training_field():
    from components.config.tuning import _field_type

    for path, (tp, _) in TUNABLE.items():
        assert path.startswith("training.") and _field_type(path) is not None, path


# ---- best hyperparameters over a config ----------------------------------------------------------

def test_best_hyperparameters_apply_over_a_copy_of_the_config():
    cfg = _config()
    # TFX's best_hyperparameters: KerasTuner's HyperParameters config, as the Trainer's fn_args get it
    best = {"space": [], "values": {"training.dropout": 0.1, "training.cross_layers": 1,
                                    "training.embedding_optimizer.learning_rate": 0.2}}
    tuned = apply_values(cfg, values_of(best))
    assert (tuned.training.dropout, tuned.training.cross_layers, tuned.training.embedding_optimizer.learning_rate) == (0.1, 1, 0.2)
    assert (cfg.training.dropout, cfg.training.cross_layers) == (0.3, 3)  # the original is untouched
    assert tuned.resolved.tables == cfg.resolved.tables
    assert apply_values(cfg, values_of(None)) is cfg
    with pytest.raises(ConfigError, match="tuning.space.categorical_defaults.dim: not tunable"):
        apply_values(cfg, {"categorical_defaults.dim": 32})


def test_run_fn_takes_the_trainers_hyperparameters_input_over_its_config():
    from types import SimpleNamespace

    from components.embedding_trainer import resolved_input

    cfg = _config()
    tuned, values = resolved_input.tuned_config(cfg, SimpleNamespace(hyperparameters={"space": [], "values": {
        "training.dropout": 0.1, "training.top_mlp": "[48, 8]"}}))
    # recorded (training_run.json `tuned`, which the exporter applies) with the layer widths as a list
    assert values == {"training.dropout": 0.1, "training.top_mlp": [48, 8]}
    assert tuned.training.dropout == 0.1 and tuned.training.top_mlp == [48, 8]
    assert resolved_input.tuned_config(cfg, SimpleNamespace(hyperparameters=None)) == (cfg, {})  # no Tuner: as configured
    assert resolved_input.tuned_config(cfg, SimpleNamespace()) == (cfg, {})  # FnArgs built without the field


def test_the_exporter_reads_the_tuned_values_from_the_trainers_run_report(tmp_path):
    from components.contracts.artifacts import TRAINING_RUN_FILE
    from components.embedding_exporter.executor import tuned_values

    assert tuned_values(str(tmp_path)) == {}
    (tmp_path / TRAINING_RUN_FILE).write_text(json.dumps({"final_step": 4, "tuned": {"training.cross_layers": 3}}))
    assert tuned_values(str(tmp_path)) == {"training.cross_layers": 3}


# ---- caching: the shares TFX fingerprints -------------------------------------------------------

def test_the_tuning_section_is_the_tuners_and_the_trainers_share_only():
    from components.config.stages import stage_json

    on, off = _config(), parse_config({k: v for k, v in _raw().items() if k != "tuning"}, "t.yaml")
    other = _config(trials=3)
    for stage in ("example_gen", "preprocess", "exporter"):
        assert stage_json(on, stage) == stage_json(off, stage), stage
    for stage in ("tuner", "trainer"):
        assert stage_json(on, stage) != stage_json(other, stage), stage
    tuner = json.loads(stage_json(on, "tuner"))
    assert tuner["tuning"]["space"] == SPACE and tuner["training"]["dropout"] == 0.3
    # what no trial reads leaves the Tuner's key as it was
    edited = _config()
    edited.export.parity_sample_size, edited.validation.regression_margin = 7, 0.25
    assert stage_json(edited, "tuner") == stage_json(on, "tuner")


# ---- the pipeline's wiring and its Kubeflow compilation -----------------------------------------

def _small_input(tmp_path):
    from components.example_gen.synthetic_data import GeneratorSpec, write_csv

    path = tmp_path / "data.csv"
    write_csv(GeneratorSpec(rows=10, seed=1), str(path))
    return path


def test_create_pipeline_puts_the_stock_tuner_before_the_trainer(tmp_path):
    from pipelines.pipeline import TUNER_FN, create_pipeline

    cfg = parse_config(_raw(_small_input(tmp_path), trials=2, steps_per_trial=20), "t.yaml")
    p = create_pipeline(cfg, str(tmp_path / "root"), str(tmp_path / "m.sqlite"), str(tmp_path / "serving"))
    by_id = {c.id: c for c in p.components}
    tuner, trainer = by_id["Tuner"], by_id["Trainer"]
    from tfx.components.tuner.component import Tuner as StockTuner

    assert isinstance(tuner, StockTuner) and tuner.executor_spec.executor_class.__name__ == "TunerExecutor"
    assert tuner.exec_properties["tuner_fn"] == TUNER_FN
    assert (tuner.inputs["examples"].producer_component_id, tuner.inputs["examples"].output_key) == \
        (trainer.inputs["examples"].producer_component_id, trainer.inputs["examples"].output_key)
    hp = trainer.inputs["hyperparameters"]
    assert (hp.producer_component_id, hp.output_key) == ("Tuner", "best_hyperparameters")
    assert json.loads(tuner.exec_properties["train_args"])["num_steps"] == 20
    off = parse_config({k: v for k, v in _raw(_small_input(tmp_path)).items() if k != "tuning"}, "t.yaml")
    p_off = create_pipeline(off, str(tmp_path / "root"), str(tmp_path / "m.sqlite"), str(tmp_path / "serving"))
    assert "Tuner" not in {c.id for c in p_off.components}
    assert "hyperparameters" not in {c.id: c for c in p_off.components}["Trainer"].inputs


@pytest.mark.parametrize("output", ["p.yaml", "p.json"])
def test_compiles_for_kubeflow_in_both_modes_with_the_tuner_as_one_task(tmp_path, output):
    from pipelines.__main__ import main
    from pipelines.kfp_local import oss_backend_refusal
    from pipelines.kubeflow import load_compiled

    path = tmp_path / "tuned.yaml"
    path.write_text(yaml.safe_dump(_raw(_small_input(tmp_path), trials=2)))
    assert main(["compile", "--config", str(path), "--image", IMAGE, "--output", str(tmp_path / output),
                 "--pipeline-root", "gs://b/root"]) == 0
    loaded = load_compiled(str(tmp_path / output))
    spec = loaded["pipeline_spec"] if "pipeline_spec" in loaded else loaded["pipelineSpec"]
    tasks = spec["root"]["dag"]["tasks"]
    assert tasks["Tuner"]["inputs"]["artifacts"]["examples"]["taskOutputArtifact"]["producerTask"] == "EmbeddingPreprocess"
    hp = tasks["Trainer"]["inputs"]["artifacts"]["hyperparameters"]["taskOutputArtifact"]
    assert hp == {"producerTask": "Tuner", "outputArtifactKey": "best_hyperparameters"}
    executors = spec["deploymentSpec"]["executors"]
    assert executors["Tuner_executor"]["container"]["image"] == IMAGE
    if output.endswith(".yaml"):
        assert oss_backend_refusal(spec) is None


def _vertex_raw(tmp_path, **tuning):
    raw = _raw(_small_input(tmp_path), **tuning)
    raw["kubeflow"] = {"vertex_training": {"project": "p", "region": "us-central1", "machine_type": "n1-standard-8"}}
    return raw


def test_vertex_runs_the_trials_in_parallel_as_one_custom_job(tmp_path):
    """With `kubeflow.vertex_training`, the Tuner is TFX's Vertex AI Tuner: one custom job of
    `parallel_trials` replicas of the Trainer's machine, in the project's image."""
    from google.cloud.aiplatform_v1.types.custom_job import CustomJobSpec

    from pipelines.__main__ import main
    from pipelines.kubeflow import load_compiled

    path = tmp_path / "vertex.yaml"
    path.write_text(yaml.safe_dump(_vertex_raw(tmp_path, trials=6, parallel_trials=3)))
    assert main(["compile", "--config", str(path), "--image", IMAGE, "--output", str(tmp_path / "v.json"),
                 "--pipeline-root", "gs://b/root"]) == 0
    spec = load_compiled(str(tmp_path / "v.json"))["pipeline_spec"]
    args = spec["deploymentSpec"]["executors"]["Tuner_executor"]["container"]["args"]
    assert args[1] == "components.embedding_trainer.vertex.VertexTunerExecutor"
    params = spec["root"]["dag"]["tasks"]["Tuner"]["inputs"]["parameters"]
    assert json.loads(params["tune_args"]["runtimeValue"]["constant"]) == {"num_parallel_trials": 3}
    cc = json.loads(params["custom_config"]["runtimeValue"]["constant"])
    assert cc["ai_platform_enable_vertex"] is True and cc["ai_platform_vertex_region"] == "us-central1"
    job = cc["ai_platform_tuning_args"]
    machine = {"machine_type": "n1-standard-8"}
    assert job["project"] == "p" and job["job_spec"]["worker_pool_specs"] == [
        {"machine_spec": machine, "replica_count": 1, "container_spec": {"image_uri": IMAGE}},
        {"machine_spec": machine, "replica_count": 2, "container_spec": {"image_uri": IMAGE}}]
    assert [p.replica_count for p in CustomJobSpec(job["job_spec"]).worker_pool_specs] == [1, 2]  # Vertex's client reads it
    # the Trainer's job is the same machine, one replica
    trainer_cc = json.loads(spec["root"]["dag"]["tasks"]["Trainer"]["inputs"]["parameters"]["custom_config"]
                            ["runtimeValue"]["constant"])
    assert trainer_cc["ai_platform_training_args"]["job_spec"]["worker_pool_specs"] == job["job_spec"]["worker_pool_specs"][:1]


def test_parallel_trials_without_vertex_are_refused_at_compile(tmp_path, capsys):
    """Open-source KFP runs the Tuner as one task: parallel trials there would silently run in turn."""
    from pipelines.__main__ import main

    path = tmp_path / "oss.yaml"
    path.write_text(yaml.safe_dump(_raw(_small_input(tmp_path), trials=4, parallel_trials=2)))
    assert main(["compile", "--config", str(path), "--image", IMAGE, "--output", str(tmp_path / "p.yaml"),
                 "--pipeline-root", "gs://b/root"]) == 2
    err = capsys.readouterr().err
    assert "tuning.parallel_trials: 2, but without kubeflow.vertex_training the Tuner is one Kubeflow task" in err, err
    assert not (tmp_path / "p.yaml").exists()
    # several TPU machines in one Vertex job were never run here: refused too
    raw = _vertex_raw(tmp_path, trials=4, parallel_trials=2)
    raw["kubeflow"]["vertex_training"].update(machine_type="cloud-tpu", accelerator_type="TPU_V3", accelerator_count=8)
    raw["training"]["tpu"] = "local"
    raw["training"]["embedding"]["topology"] = {"chip": "v3", "num_chips": 4}
    path.write_text(yaml.safe_dump(raw))
    assert main(["compile", "--config", str(path), "--image", IMAGE, "--tpu-image", IMAGE + "-tpu", "--output",
                 str(tmp_path / "p.json"), "--pipeline-root", "gs://b/root"]) == 2
    assert "but kubeflow.vertex_training is a TPU (TPU_V3)" in capsys.readouterr().err


# ---- the search on the smallest data -------------------------------------------------------------

def _tuning_config(root, precision="auto", **tuning):
    from tests.stages import trainer_raw_config

    raw = trainer_raw_config(root, precision=precision)
    raw["tuning"] = dict({"trials": 2, "steps_per_trial": 4, "space": {"training.dropout": [0.0, 0.5],
                                                                        "training.cross_layers": [1, 3],
                                                                        "training.top_mlp": [[16], [32, 16]]}},
                         **tuning)
    return parse_config(raw)


def _tuner_fn_args(root, cfg, working_dir):
    from types import SimpleNamespace

    from components.config.stages import stage_json
    from components.tfx_wiring.component_keys import CONFIG_KEY, EXAMPLES_URI_KEY

    return SimpleNamespace(custom_config={CONFIG_KEY: stage_json(cfg, "tuner"), EXAMPLES_URI_KEY: str(root / "tx")},
                           train_files=[str(root / "tx" / "Split-train" / "*")],
                           eval_files=[str(root / "tx" / "Split-eval" / "*")], working_dir=str(working_dir))


@pytest.mark.slow(reason="two 4-step trainings with the held-out selection (KerasTuner's search)")
def test_the_search_trains_each_trial_and_writes_tfxs_best_hyperparameters(trainer_data, tmp_path, monkeypatch):
    """Each trial trains in the run's precision (here the dense network in bfloat16)."""
    from tfx.components.tuner import executor as tuner_executor
    from tfx.types import standard_artifacts

    from components.embedding_trainer import model_building
    from components.embedding_trainer.tuner import tuner_fn
    from tests.stages import artifact

    built, build = [], model_building.build_model
    monkeypatch.setattr(model_building, "build_model", lambda *a, **kw: built.append(kw.get("precision")) or build(*a, **kw))
    cfg = _tuning_config(trainer_data, precision="mixed_bfloat16")
    result = tuner_fn(_tuner_fn_args(trainer_data, cfg, tmp_path / "work"))
    result.tuner.search(**result.fit_kwargs)
    done = result.tuner.results
    assert len(done) == 2 and all(0.0 <= r["auc"] <= 1.0 and r["steps"] == 4 for r in done)
    assert built and set(built) == {"mixed_bfloat16"}, built  # every trial's model
    assert len({tuple(sorted(r["values"].items())) for r in done}) == 2  # two different trials
    out = {"best_hyperparameters": [artifact(standard_artifacts.HyperParameters, tmp_path / "best")],
           "tuner_results": [artifact(standard_artifacts.TunerResults, tmp_path / "results")]}
    tuner_executor.write_best_hyperparameters(result.tuner, out)
    best = json.loads((tmp_path / "best" / "best_hyperparameters.txt").read_text())
    top = max(done, key=lambda r: r["auc"])
    assert best["values"] == top["values"]
    # each trial's training directory is gone; the oracle's trial records stay
    names = os.listdir(tmp_path / "work" / "embedding_tuning")
    assert not [n for n in names if n.startswith("training_")] and {"trial_0", "trial_1"} <= set(names), names


def test_a_search_whose_trials_all_fail_says_so_with_their_errors(trainer_data, tmp_path, monkeypatch):
    from components.embedding_trainer import tuner
    from components.embedding_trainer.tuner import NoTrialCompleted, tuner_fn

    def failing(cfg, *args, **kwargs):
        raise ValueError(f"diverged at dropout {cfg.training.dropout}")

    monkeypatch.setattr(tuner, "train", failing)
    result = tuner_fn(_tuner_fn_args(trainer_data, _tuning_config(trainer_data), tmp_path / "work"))
    with pytest.raises(NoTrialCompleted, match=r"none of the 2 trials completed .*ValueError: diverged at dropout"):
        result.tuner.search(**result.fit_kwargs)


def test_a_trial_that_would_change_the_tables_is_stopped_before_training(trainer_data):
    from components.embedding_trainer import resolved_input
    from components.planning.run_plan import derive_plan
    from components.contracts.plan import PlanError

    cfg = _tuning_config(trainer_data)
    manifest, stats = resolved_input.read_manifest(examples_uri([str(trainer_data / "tx" / "Split-train" / "*")])), None
    raw = json.loads(cfg.to_json())
    raw["categorical_defaults"]["dim"] = 32
    bigger = config_from_json(json.dumps(raw))
    with pytest.raises(PlanError, match=r"changed the plan's tables .*a trial may not change them"):
        resolved_input.check_tables_unchanged(derive_plan(cfg, manifest, stats), derive_plan(bigger, manifest, stats),
                                  {"categorical_defaults.dim": 32})
    resolved_input.check_tables_unchanged(derive_plan(cfg, manifest, stats),
                              derive_plan(apply_values(cfg, {"training.cross_layers": 3}), manifest, stats), {})


# ---- parallel trials: the Vertex AI job TFX submits, its replicas run here ------------------------

def _vertex_tuning_job(trainer_data, tmp_path, monkeypatch, parallel_trials):
    """The Vertex AI CustomJob that our Vertex tuner executor (TFX's, passing the examples' URI) submits for our pipeline's Tuner
    (its submission to Vertex stubbed: nothing leaves the machine), on the trainer_data examples,
    with 3 trials of 2 steps."""
    from google.protobuf.message import Message
    from tfx.extensions.google_cloud_ai_platform import runner, training_clients
    from components.embedding_trainer.vertex import VertexTunerExecutor
    from tfx.types import standard_artifacts
    from tfx.utils import proto_utils

    from pipelines.pipeline import create_pipeline
    from tests.stages import artifact

    raw = json.loads(_tuning_config(trainer_data, trials=3, steps_per_trial=2, parallel_trials=parallel_trials).to_json())
    raw["kubeflow"]["vertex_training"] = {"project": "p", "region": "us-central1", "machine_type": "n1-standard-8"}
    cfg = config_from_json(json.dumps(raw))
    p = create_pipeline(cfg, str(tmp_path / "root"), None, str(tmp_path / "serving"), image=IMAGE, kubeflow=True)
    tuner = {c.id: c for c in p.components}["Tuner"]
    props = {k: proto_utils.proto_to_json(v) if isinstance(v, Message) else v
             for k, v in tuner.exec_properties.items() if v is not None}  # as the launcher passes them
    submitted = []
    monkeypatch.setattr(training_clients.VertexJobClient, "create_client", lambda self: None)
    monkeypatch.setattr(runner, "_launch_cloud_training", lambda **kw: submitted.append(kw))
    inputs = {"examples": [artifact(standard_artifacts.Examples, trainer_data / "tx", ["train", "eval"])]}
    outputs = {"best_hyperparameters": [artifact(standard_artifacts.HyperParameters, tmp_path / "best")],
               "tuner_results": [artifact(standard_artifacts.TunerResults, tmp_path / "results")]}
    VertexTunerExecutor().Do(inputs, outputs, props)
    assert len(submitted) == 1 and submitted[0]["project"] == "p" and submitted[0]["vertex_region"] == "us-central1"
    return submitted[0]["training_job"]


def test_tfx_submits_one_vertex_job_of_parallel_trials_replicas_in_our_image(trainer_data, tmp_path, monkeypatch):
    from google.cloud.aiplatform_v1.types.custom_job import CustomJob

    job = _vertex_tuning_job(trainer_data, tmp_path, monkeypatch, parallel_trials=2)
    pools = job["job_spec"]["worker_pool_specs"]
    assert [p["replica_count"] for p in pools] == [1, 1]
    assert {p["container_spec"]["image_uri"] for p in pools} == {IMAGE}
    command = pools[0]["container_spec"]["command"]
    assert command[command.index("--executor_class_path") + 1] == \
        "tfx.extensions.google_cloud_ai_platform.tuner.executor._WorkerExecutor"
    assert pools[1]["container_spec"]["command"] == command
    assert [p.replica_count for p in CustomJob(job).job_spec.worker_pool_specs] == [1, 1]  # Vertex's client reads it


def _chief_oracle(status):
    os._exit(status)


@pytest.mark.parametrize("status", [0, 1])
def test_the_primary_replica_fails_when_its_chief_oracle_failed(status):
    """TFX starts the chief as a child of the primary's worker process and never waits for it: the
    worker waits for it and fails with it, so the job fails instead of leaving no best values."""
    import multiprocessing

    from components.embedding_trainer.tuner import NoTrialCompleted, wait_for_chief_oracle

    chief = multiprocessing.Process(target=_chief_oracle, args=(status,))  # as TFX starts it
    chief.start()
    if status:
        with pytest.raises(NoTrialCompleted, match=rf"the chief oracle \(pid {chief.pid}\) failed with status 1"):
            wait_for_chief_oracle()
    else:
        wait_for_chief_oracle()
    assert chief.exitcode == status and not multiprocessing.active_children()


# Runs each replica's container command, as Vertex would, but with TFX's hard-coded /tmp working
# directory moved under the test's own, and KerasTuner's chief polling faster. Both replicas are
# forks of one process that imported the command's modules once (pipelines/fork_server.py's `fork`,
# as the Kubeflow harness's tasks are): each child has its own CLUSTER_SPEC and log and runs the
# command's module as `python -m` would. Nothing but imports happens before the forks.
# argv: the working directory, then one JSON list of fork_server requests; prints the replicas'
# exit statuses as a JSON list, in that order.
REPLICAS = """
import json, os, sys, time
from keras_tuner.src.distribute import oracle_chief
from tfx.extensions.google_cloud_ai_platform.tuner import executor
import tfx.scripts.run_executor  # the command's module and what it imports, once for both replicas
from pipelines.fork_server import fork
executor._WORKING_DIRECTORY = sys.argv[1]
# KerasTuner's chief polls its workers every 20 s once the search is over: every second here
oracle_chief.time = type("Clock", (), {"sleep": staticmethod(lambda s: time.sleep(min(s, 1)))})
pids = [fork(request) for request in json.loads(sys.argv[2])]
print(json.dumps([os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]))
"""


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow(reason="the Vertex job's two replicas as two processes sharing 3 two-step trials")
def test_the_vertex_jobs_two_replicas_share_the_trials_through_the_chief_oracle(trainer_data, tmp_path, monkeypatch):
    """Each replica of the job TFX submits runs its container command here with the CLUSTER_SPEC
    Vertex gives it. The primary starts KerasTuner's chief oracle and trains as a worker beside it;
    the other replica trains; each trial is trained by exactly one of them and the chief writes the
    best of all of them. (A job whose trials all fail: test_the_primary_replica_fails_when_its_chief_oracle_failed.)"""
    import re
    import subprocess
    import sys

    job = _vertex_tuning_job(trainer_data, tmp_path, monkeypatch, parallel_trials=2)
    addresses = {"workerpool0": f"localhost:{_free_port()}", "workerpool1": f"localhost:{_free_port()}"}
    cluster = {pool: [address] for pool, address in addresses.items()}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    replicas = []
    for pool, spec in zip(addresses, job["job_spec"]["worker_pool_specs"]):
        command = spec["container_spec"]["command"]
        assert command[:3] == ["python", "-m", "tfx.scripts.run_executor"], command[:3]
        cluster_spec = json.dumps({"cluster": cluster, "task": {"type": pool, "index": 0}})
        replicas.append({"module": command[2], "args": command[3:], "cwd": root, "log": str(tmp_path / f"{pool}.log"),
                         "env": {**os.environ, "CLUSTER_SPEC": cluster_spec}})
    r = subprocess.run([sys.executable, "-c", REPLICAS, str(tmp_path / "work"), json.dumps(replicas)],
                       cwd=root, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    statuses = json.loads(r.stdout.strip().splitlines()[-1])
    trained = {}
    for pool, status in zip(addresses, statuses):
        text = (tmp_path / f"{pool}.log").read_text()
        assert status == 0, text[-3000:]
        trained[pool] = re.findall(r"tuning trial (\d+) \{[^}]*\}: held-out AUC", text)
    # each trial trained once, and each replica trained trials of its own (3 trials: a replica that
    # starts a trial late still gets one)
    assert sorted(trained["workerpool0"] + trained["workerpool1"]) == ["0", "1", "2"], trained
    assert trained["workerpool0"] and trained["workerpool1"], trained
    results = json.loads((tmp_path / "results" / "tuner_results.json").read_text())
    best = json.loads((tmp_path / "best" / "best_hyperparameters.txt").read_text())["values"]
    assert sorted(r["trial_id"] for r in results) == ["0", "1", "2"]
    top = max(results, key=lambda r: r["score"])
    assert best == {k: v for k, v in top.items() if k not in ("trial_id", "score")}


# ---- a local pipeline run with tuning on, and its cached rerun (slow tier) -----------------------

@pytest.mark.slow(reason="two local pipeline runs (the second from the cache) with a 2-trial Tuner")
def test_a_local_run_tunes_applies_the_best_values_and_a_rerun_takes_the_tuner_from_the_cache(tmp_path):
    """Issue 64's stock components in LocalDagRunner runs: the first run tunes and scores the eval
    split with BulkInferrer; the second, with bulk_inference off (a config changed between runs),
    takes the Tuner from the cache."""
    import dataclasses
    import glob

    import tensorflow as tf

    from tests.stages import read_prediction_logs

    from components.example_gen.synthetic_data import GeneratorSpec, write_csv
    from components.reporting.report import render
    from pipelines.runner import run
    from pipelines.summary import summary_report
    from tests.stages import NO_GATE, small_cardinalities, with_few_features

    write_csv(GeneratorSpec(rows=2000, seed=3, cardinalities=small_cardinalities(500)), str(tmp_path / "data.csv"))
    raw = with_few_features(demo_raw_config())
    raw["input"]["path"] = str(tmp_path / "data.csv")
    # The Trainer's run fixed-length (its held-out selection has its own tests); the trials still
    # score on their held-out slice
    raw["training"].update({"train_steps": 20, "checkpoint_every_steps": 10, "batch_size": 64,
                            "early_stopping": {"enabled": False}})
    raw["export"].update(compare_compression=False, auc_sample_size=300, parity_sample_size=32)
    raw["validation"] = dict(NO_GATE)
    raw["beam"].update(direct_running_mode="in_memory", direct_num_workers=1)  # Beam's workers are not under test
    raw["tuning"] = {"trials": 2, "steps_per_trial": 6, "space": {"training.dropout": [0.0, 0.5],
                                                                    "training.cross_layers": [1, 2]}}
    cfg = parse_config(raw, "tuned.yaml")
    out = tmp_path / "out"
    scored = run(dataclasses.replace(cfg, bulk_inference=dataclasses.replace(cfg.bulk_inference, enabled=True)),
                 str(out), quiet=True).summary
    # BulkInferrer through LocalDagRunner: one PredictionLog per eval row of the copy, scored by the
    # pushed serving model's signature
    (result,) = glob.glob(str(out / "**" / "BulkInferrer" / "inference_result" / "*"), recursive=True)
    (copy,) = glob.glob(str(out / "**" / "BulkInferrerExampleCopy" / "tf_examples" / "*"), recursive=True)
    logs = read_prediction_logs(result)
    copied = [r.numpy() for r in tf.data.TFRecordDataset(glob.glob(os.path.join(copy, "Split-eval", "*")),
                                                          compression_type="GZIP")]
    assert scored["pushed_by_this_run"] and len(copied) > 100 and len(logs) == len(copied), (len(logs), len(copied))
    assert {log.predict_log.request.model_spec.signature_name for log in logs} == {"serving_default"}
    assert all(0.0 <= tf.make_ndarray(log.predict_log.response.outputs["probabilities"]).ravel()[0] <= 1.0
               for log in logs)
    best_files = glob.glob(str(out / "**" / "Tuner" / "best_hyperparameters" / "*" / "best_hyperparameters.txt"),
                           recursive=True)
    assert len(best_files) == 1, best_files
    best = json.loads(open(best_files[0]).read())["values"]
    assert set(best) == {"training.dropout", "training.cross_layers"}
    runs = glob.glob(str(out / "**" / "Trainer" / "model" / "*" / "training_run.json"), recursive=True)
    assert len(runs) == 1
    assert json.load(open(runs[0]))["tuned"] == best  # the Trainer says which values came from the search
    trained = json.load(open(os.path.join(os.path.dirname(runs[0]), "pipeline_config.json")))["training"]
    assert (trained["dropout"], trained["cross_layers"]) == (best["training.dropout"], best["training.cross_layers"])
    # Where users look: the summary (and summary.json, the report) names the search, each trial and
    # the best values, and that the Trainer trained with them; the Tuner has its own progress lines.
    tuning = scored["tuning"]
    assert (tuning["algorithm"], tuning["max_trials"], tuning["failed"], len(tuning["trials"])) == ("random", 2, 0, 2)
    assert tuning["best"]["values"] == best and tuning["trainer_used_best"]
    assert all(0 < t["score"] <= 1 for t in tuning["trials"])
    text = " ".join(render(summary_report(scored)).split())
    assert "tuning: random search, 2 trial(s) of at most 2 (0 failed), 6 steps each" in text
    assert "the Trainer trained with them" in text
    html = (out / "run_report.html").read_text()  # the report's tuning table: each trial's held-out AUC
    assert "held-out AUC" in html and all(f"{t['score']:.4f}" in html for t in tuning["trials"])
    events = [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()]
    tuner = [e["event"] for e in events if e["stage"] == "Tuner"]
    assert tuner[0] == "start" and tuner[-1] == "done" and "step" in tuner  # the trials' steps, under the Tuner
    # Batch scoring: the rows scored per split and where, in the summary; the copy and the scoring
    # have their own progress lines.
    assert scored["bulk_inference"] == {"scored": True, "rows": {"eval": len(copied)}, "output": result, "why_not": None}
    assert f"batch scoring: eval {len(copied):,} rows scored: {result}" in text
    for stage in ("BulkInferrerExampleCopy", "BulkInferrer"):
        assert [e["event"] for e in events if e["stage"] == stage][::len(events)] == ["start"], stage
        assert [e["event"] for e in events if e["stage"] == stage][-1] == "done", stage
    # The same data and space: the Tuner comes from the cache (no second search). The Trainer runs
    # again (its base_model, the model pushed by the first run, is new) with the same best values.
    run(cfg, str(out), quiet=True)
    assert glob.glob(str(out / "**" / "Tuner" / "best_hyperparameters" / "*"), recursive=True) == [
        os.path.dirname(best_files[0])]
    runs = glob.glob(str(out / "**" / "Trainer" / "model" / "*" / "training_run.json"), recursive=True)
    assert len(runs) == 2 and all(json.load(open(r))["tuned"] == best for r in runs)
