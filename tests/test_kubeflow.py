"""Kubeflow Pipelines: compiling, the task entrypoint, and the compiled spec run like KFP runs it.

- The compiled spec of `configs/kubeflow.yaml` equals a golden copy (normalised for versions and
  the embedded config), parses strictly into KFP's PipelineSpec / PlatformSpec / PipelineJob protos,
  and compiling writes nothing but the output file.
- The whole pipeline, compiled with a local pipeline root, runs task by task through
  `pipelines.kfp_local` (ExecutorInput JSON per task, the container command in a subprocess) with
  inputs typed as Vertex passes them and untyped as open-source KFP passes them; both end with a
  serving model that scores raw examples exactly as the local (LocalDagRunner) run's does.
- With `evaluator.enabled`, TFX's stock Evaluator (and, locally, stock StatisticsGen, SchemaGen and
  ExampleValidator) runs on our artifacts, and its blessing reaches our Pusher and registry, on
  every orchestrator.
"""
import copy
import glob
import json
import os

import numpy as np
import pytest
import yaml

from tests.stages import with_few_features

import components  # noqa: F401
from components.config.loading import config_from_json, load_config, parse_config
from components.config.schema import ConfigError
from components.config.stages import stage_config
from components.rules.chips import CHIPS, SPARSE_CORE
from components.tfx_wiring.component_keys import CONFIG_KEY
from pipelines.pipeline import KFP_RUN_ID, KFP_RUN_NAME, LAST_BLESSED, stock_data_components
from pipelines import kfp_entrypoint
from pipelines.fork_server import ForkServer
from pipelines.kfp_local import (FORK_PRELOAD, HarnessError, LocalKfpRun, _substitute, harness_env, oss_backend_refusal,
                                 parse_pipeline_spec, task_order)
from pipelines.kubeflow import load_compiled
from pipelines.kubeflow_config import VERTEX_TPU_CHIPS, route_chips

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(REPO, "tests", "golden", "kubeflow_pipeline.yaml")
IMAGE = "REGISTRY/tpu-embedding-tfx:TAG"
TPU_IMAGE = "REGISTRY/tpu-embedding-tfx-tpu:TAG"  # configs/kubeflow.yaml trains on a GKE TPU node pool
CONFIG_PARAMS = ("config_json", "custom_config")


def _compile(argv, cwd):
    from pipelines.__main__ import main

    old = os.getcwd()
    os.chdir(cwd)
    try:
        return main(["compile"] + argv)
    finally:
        os.chdir(old)


def normalise(spec):
    """The compiled spec without what changes with versions or the config's contents: the TFX
    version, and the pipeline config JSON each task carries (checked separately)."""
    spec = copy.deepcopy(spec)
    spec["sdkVersion"] = "tfx-<version>"
    for task in spec["root"]["dag"]["tasks"].values():
        for name, binding in task.get("inputs", {}).get("parameters", {}).items():
            if name in CONFIG_PARAMS:
                binding["runtimeValue"]["constant"] = "<pipeline config JSON>"
    return spec


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    d = tmp_path_factory.mktemp("compile")
    before = set(os.listdir(d))
    assert _compile(["--config", os.path.join(REPO, "configs", "kubeflow.yaml"), "--image", IMAGE,
                     "--tpu-image", TPU_IMAGE, "--output", "pipeline.yaml"], d) == 0
    assert set(os.listdir(d)) - before == {"pipeline.yaml"}  # nothing else written (no wheel, no metadata)
    assert _compile(["--config", os.path.join(REPO, "configs", "kubeflow.yaml"), "--image", IMAGE,
                     "--tpu-image", TPU_IMAGE, "--output", "pipeline.json"], d) == 0
    assert set(os.listdir(d)) - before == {"pipeline.yaml", "pipeline.json"}
    return load_compiled(str(d / "pipeline.yaml")), load_compiled(str(d / "pipeline.json")), d


def test_compiled_spec_matches_golden(compiled):
    spec = compiled[0]
    docs = [normalise(spec["pipeline_spec"]), spec["platform_spec"]]
    text = yaml.safe_dump_all(docs, sort_keys=True)
    if os.environ.get("UPDATE_GOLDEN"):
        os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
        with open(GOLDEN, "w", encoding="utf-8") as fh:
            fh.write("# Normalised output of: python -m pipelines compile --config configs/kubeflow.yaml "
                     f"--image {IMAGE} --tpu-image {TPU_IMAGE} --output pipeline.yaml\n# Regenerate: UPDATE_GOLDEN=1 pytest tests/test_kubeflow.py -k golden\n")
            fh.write(text)
    with open(GOLDEN, encoding="utf-8") as fh:
        golden = [d for d in yaml.safe_load_all(fh) if d is not None]
    assert docs == golden, "compiled spec differs from tests/golden/kubeflow_pipeline.yaml (UPDATE_GOLDEN=1 to accept)"


def test_compiled_spec_parses_strictly_and_carries_the_config(compiled):
    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2

    spec_yaml, job_json, _ = compiled
    proto = parse_pipeline_spec(spec_yaml["pipeline_spec"])
    assert proto.schema_version == "2.1.0"
    assert proto.default_pipeline_root == "gs://YOUR_BUCKET/tpu-embedding/root"
    json_format.ParseDict(spec_yaml["platform_spec"], pipeline_spec_pb2.PlatformSpec(), ignore_unknown_fields=False)
    job = pipeline_spec_pb2.PipelineJob()
    with open(compiled[2] / "pipeline.json", encoding="utf-8") as fh:
        json_format.Parse(fh.read(), job, ignore_unknown_fields=False)
    assert job.runtime_config.gcs_output_directory == "gs://YOUR_BUCKET/tpu-embedding/root"
    # The same DAG for both backends, but for ExampleGen's cache: open-source KFP checks its cache
    # before the task runs the ExampleGen driver (the input fingerprint), Vertex after.
    vertex_root, oss_root = copy.deepcopy(job_json["pipeline_spec"]["root"]), copy.deepcopy(spec_yaml["pipeline_spec"]["root"])
    assert vertex_root["dag"]["tasks"]["EmbeddingExampleGen"].pop("cachingOptions") == {"enableCache": True}
    assert oss_root["dag"]["tasks"]["EmbeddingExampleGen"].pop("cachingOptions") == {"enableCache": False}
    assert vertex_root == oss_root

    cfg = load_config(os.path.join(REPO, "configs", "kubeflow.yaml"))
    spec = spec_yaml["pipeline_spec"]
    tasks = spec["root"]["dag"]["tasks"]
    assert task_order(spec) == [
        "LastBlessedModel", "EmbeddingExampleGen", "EmbeddingPreprocess", "Trainer", "EmbeddingExporter", "Pusher"]
    assert tasks["EmbeddingExampleGen"]["dependentTasks"] == [LAST_BLESSED]  # a broken registry stops the run first
    # The last blessed model: a container step that reads the registry at the push destination,
    # feeding the Trainer's warm start and the exporter's gate (no resolver, no ML Metadata query).
    serving_dir = "gs://YOUR_BUCKET/tpu-embedding/serving"
    assert tasks[LAST_BLESSED]["inputs"]["parameters"]["serving_dir"]["runtimeValue"]["constant"] == serving_dir
    for task, key in (("Trainer", "base_model"), ("EmbeddingExporter", "last_blessed_model")):
        src = tasks[task]["inputs"]["artifacts"][key]["taskOutputArtifact"]
        assert src == {"producerTask": LAST_BLESSED, "outputArtifactKey": "model"}, task
    # The Pusher records the run with the placeholders KFP's driver and Vertex substitute.
    # no two runs share its cache key, even with caching turned on at submission
    assert tasks[LAST_BLESSED]["inputs"]["parameters"]["run_id"]["runtimeValue"]["constant"] == KFP_RUN_ID
    params = tasks["Pusher"]["inputs"]["parameters"]
    assert params["run_id"]["runtimeValue"]["constant"] == KFP_RUN_ID == "{{$.pipeline_job_uuid}}"
    assert params["run_name"]["runtimeValue"]["constant"] == KFP_RUN_NAME == "{{$.pipeline_job_name}}"
    assert params["pipeline_name"]["runtimeValue"]["constant"] == cfg.name
    shipped = tasks["EmbeddingPreprocess"]["inputs"]["parameters"]["config_json"]["runtimeValue"]["constant"]
    assert config_from_json(shipped).to_dict() == stage_config(cfg, "preprocess").to_dict()  # its share only
    trainer_cc = json.loads(tasks["Trainer"]["inputs"]["parameters"]["custom_config"]["runtimeValue"]["constant"])
    assert config_from_json(trainer_cc[CONFIG_KEY]).to_dict() == cfg.to_dict()

    executors = spec["deploymentSpec"]["executors"]
    for label, ex in executors.items():
        c = ex["container"]
        assert c["image"] == (TPU_IMAGE if label == "Trainer_executor" else IMAGE), label
        assert c["command"] == ["python", "-m", "pipelines.kfp_entrypoint"], label
        assert "--json_serialized_inputs_spec_args" in c["args"], label
    beam = [a for a in executors["EmbeddingPreprocess_executor"]["container"]["args"] if a.startswith("--") and "=" in a]
    assert beam[0] == "--runner=DataflowRunner" and f"--sdk_container_image={IMAGE}" in beam
    assert "--project=YOUR_PROJECT" in beam and "--region=us-central1" in beam
    assert executors["EmbeddingExampleGen_executor"]["container"]["args"][-len(beam):] == beam
    # The Trainer and the exporter are not Beam components: no Beam flags on their command lines.
    for label in ("Trainer_executor", "EmbeddingExporter_executor", "Pusher_executor"):
        assert not any(a.startswith("--runner") for a in executors[label]["container"]["args"]), label
    res = executors["Trainer_executor"]["container"]["resources"]
    assert res["cpuLimit"] == 24.0 and res["memoryLimit"] == 96.0
    assert res["accelerator"] == {"type": "google.com/tpu", "count": "4"}
    k8s = spec_yaml["platform_spec"]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert set(k8s) == {"Trainer_executor"}
    labels = k8s["Trainer_executor"]["nodeSelector"]["labels"]
    assert labels == {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice", "cloud.google.com/gke-tpu-topology": "2x2"}
    # the node pool's chip trains TPU-embedding tables (SparseCore), and the plan is sized for its 4 chips
    assert [chip for _, chip in route_chips(cfg)] == [cfg.training.embedding.topology.chip] == ["v6e"]
    assert CHIPS["v6e"].embedding_api == SPARSE_CORE and cfg.training.embedding.size_threshold is not None
    assert cfg.training.embedding.topology.num_chips == int(res["accelerator"]["count"]) == 4
    pusher = json.loads(tasks["Pusher"]["inputs"]["parameters"]["push_destination"]["runtimeValue"]["constant"])
    assert pusher["filesystem"]["base_directory"] == "gs://YOUR_BUCKET/tpu-embedding/serving"


def _executor_kinds(spec):
    return {label: sorted(ex) for label, ex in spec["deploymentSpec"]["executors"].items()}


def _holds_only_what_open_source_kfp_runs(spec):
    """Only container (or importer) executors, and nothing else open-source KFP's backend refuses."""
    kinds = _executor_kinds(spec)
    assert set(kinds) == {f"{t}_executor" for t in spec["root"]["dag"]["tasks"]}
    assert all(k in (["container"], ["importer"]) for k in kinds.values()), kinds
    assert oss_backend_refusal(spec) is None


def test_the_kubeflow_configs_spec_holds_only_what_open_source_kfp_runs(compiled):
    """The module's compile of the Kubeflow config (the same command line this test compiled on its
    own before: --image, --tpu-image, .yaml)."""
    _holds_only_what_open_source_kfp_runs(compiled[0]["pipeline_spec"])


def test_the_demo_configs_spec_holds_only_what_open_source_kfp_runs(tmp_path):
    """The demo config's spec, its input at a small CSV (compiling checks that a local input exists)."""
    from components.example_gen.synthetic_data import GeneratorSpec, write_csv

    d = yaml.safe_load(open(os.path.join(REPO, "configs", "demo.yaml"), encoding="utf-8"))
    d["input"]["path"] = str(tmp_path / "data.csv")
    write_csv(GeneratorSpec(rows=10, seed=1), d["input"]["path"])
    path = str(tmp_path / "demo.yaml")
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(d, fh)
    assert _compile(["--config", path, "--image", IMAGE, "--output", "p.yaml", "--pipeline-root", "gs://b/root"],
                    tmp_path) == 0
    _holds_only_what_open_source_kfp_runs(load_compiled(str(tmp_path / "p.yaml"))["pipeline_spec"])


def _with_executor(spec, label, executor):
    spec = copy.deepcopy(spec)
    spec["deploymentSpec"]["executors"][label] = executor
    return spec


# The resolver TFX 1.16 compiles from Resolver(LatestBlessedModelStrategy): an ML Metadata query.
RESOLVER_EXECUTOR = {"resolver": {"outputArtifactQueries": {"model": {"filter": (
    'schema_title="tfx.Model" AND state=LIVE AND name="{{$.inputs.artifacts[\'input\'].metadata[\'current_model_id\']}}"')}}}}


def test_harness_refuses_what_open_source_kfp_refuses(compiled, tmp_path):
    """kubeflow/pipelines backend/src/v2/compiler: the spec is refused at submission, with the
    backend's words, before any task runs; Vertex runs resolvers (vertex mode keeps them)."""
    spec = compiled[0]["pipeline_spec"]
    label = "LastBlessedModel_executor"
    component = f'error processing component name="{LAST_BLESSED}": executor(label="{label}"): '
    cases = [
        (_with_executor(spec, label, RESOLVER_EXECUTOR), component + "non-container and non-importer executor not implemented"),
        (_with_executor(spec, label, {"customJob": {"customJob": {}}}),
         component + "non-container and non-importer executor not implemented"),
    ]
    iterated = copy.deepcopy(spec)
    iterated["root"]["dag"]["tasks"]["Pusher"]["artifactIterator"] = {"itemInput": "x", "items": {"inputArtifact": "y"}}
    cases.append((iterated, 'compiling DAG "root": artifact iterator not implemented yet'))
    both = copy.deepcopy(iterated)
    both["root"]["dag"]["tasks"]["Pusher"]["parameterIterator"] = {"itemInput": "x", "items": {"raw": "[1]"}}
    cases.append((both, 'compiling DAG "root": invalid task "Pusher": parameterIterator and artifactIterator cannot '
                        'be specified at the same time'))
    imported = _with_executor(spec, label, {"importer": {"artifactUri": {"constant": "gs://b/m"},
                                                         "typeSchema": {"schemaTitle": "tfx.Model"}}})
    imported["root"]["dag"]["tasks"][LAST_BLESSED]["triggerPolicy"] = {"condition": "true"}
    cases.append((imported, f'compiling DAG "root": compiling task "{LAST_BLESSED}": triggerPolicy.condition on '
                            "importer task is not supported"))
    missing = copy.deepcopy(spec)
    del missing["deploymentSpec"]["executors"][label]
    cases.append((missing, component.split(": executor")[0] + f': executor(label="{label}") not found in deployment config'))
    unnamed = copy.deepcopy(spec)
    unnamed["pipelineInfo"]["name"] = ""
    cases.append((unnamed, "pipelineInfo.name is empty"))
    orphan = copy.deepcopy(spec)
    orphan["root"]["dag"]["tasks"]["Pusher"]["inputs"]["artifacts"]["model"]["taskOutputArtifact"]["producerTask"] = "Gone"
    cases.append((orphan, 'compiling DAG "root": failed to add implicit deps: unknown producer task "Gone" in DAG'))
    looped = copy.deepcopy(imported)  # a conditional importer inside a ParallelFor: refused in its iteration item
    looped["root"]["dag"]["tasks"][LAST_BLESSED]["parameterIterator"] = {"itemInput": "x", "items": {"raw": "[1]"}}
    cases.append((looped, f'compiling DAG "root": compiling task "{LAST_BLESSED}": iterator task: iterationItem task: '
                          'compiling task "iteration-item": triggerPolicy.condition on importer task is not supported'))
    for bad, message in cases:
        assert oss_backend_refusal(bad) == f"Failed to compile job: {message}"
    # an importer without a condition is taken, as the backend takes it
    assert oss_backend_refusal(_with_executor(spec, label, imported["deploymentSpec"]["executors"][label])) is None
    # an executor that is a container and a resolver at once: the deployment config does not parse
    both_kinds = dict(spec["deploymentSpec"]["executors"][label], **RESOLVER_EXECUTOR)
    assert "Failed to compile job: " in oss_backend_refusal(_with_executor(spec, label, both_kinds))
    # the API server's check of the run's parameter values
    from pipelines.kfp_local import oss_parameters_refusal

    assert oss_parameters_refusal(spec, {"epochs": 3}) == "parameter(s) provided are not required by pipeline: epochs"
    assert oss_parameters_refusal(spec, {}) is None

    # The harness: the resolver spec refused in oss mode before anything runs; taken in vertex mode.
    path = tmp_path / "resolver.json"
    bad = _with_executor(spec, label, RESOLVER_EXECUTOR)
    path.write_text(json.dumps({"pipelineSpec": bad, "runtimeConfig": {"gcsOutputDirectory": str(tmp_path / "root")}}))
    with pytest.raises(HarnessError, match="open-source KFP refuses .*resolver.json: Failed to compile job: error "
                                           "processing component .*non-container and non-importer executor"):
        LocalKfpRun(str(path), str(tmp_path / "work"), mode="oss")
    assert not (tmp_path / "work").exists() and not (tmp_path / "root").exists()
    LocalKfpRun(str(path), str(tmp_path / "work"), mode="vertex")


def test_harness_substitutes_run_placeholders_as_the_driver_does(compiled, tmp_path):
    spec = copy.deepcopy(compiled[0]["pipeline_spec"])
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"pipelineSpec": spec, "runtimeConfig": {"gcsOutputDirectory": str(tmp_path / "root")}}))
    run = LocalKfpRun(str(path), str(tmp_path / "work"), mode="oss")
    run.outputs["EmbeddingExporter"] = {"serving_model": [], "blessing": []}  # as if it had run
    params = run.executor_input("Pusher", "u1")["inputs"]["parameterValues"]
    assert params["run_id"] == run.run_uuid and params["run_name"] == run.run_name == run.job_id
    # only a constant that is exactly a placeholder is substituted (backend/src/v2/driver/resolve.go)
    binding = spec["root"]["dag"]["tasks"]["Pusher"]["inputs"]["parameters"]
    binding["run_id"]["runtimeValue"]["constant"] = "run {{$.pipeline_job_uuid}}"
    path.write_text(json.dumps({"pipelineSpec": spec, "runtimeConfig": {"gcsOutputDirectory": str(tmp_path / "root")}}))
    run = LocalKfpRun(str(path), str(tmp_path / "work"), mode="oss")
    run.outputs["EmbeddingExporter"] = {"serving_model": [], "blessing": []}
    with pytest.raises(HarnessError, match="placeholder in 'run .*not emulated"):
        run.executor_input("Pusher", "u1")


def test_the_harness_closes_its_own_fork_server_and_leaves_a_shared_one_serving(compiled, tmp_path, monkeypatch):
    """`fork_server=True`: the run's own server, closed when the run ends; a ForkServer passed in:
    the caller's, still serving the next run (the Kubeflow runs below share one)."""
    from pipelines import kfp_local

    path = tmp_path / "p.json"
    path.write_text(json.dumps({"pipelineSpec": compiled[0]["pipeline_spec"],
                                "runtimeConfig": {"gcsOutputDirectory": str(tmp_path / "root")}}))
    monkeypatch.setattr(kfp_local, "FORK_PRELOAD", ["json.tool"])  # a light server: what a run does with it is under test
    monkeypatch.setattr(kfp_local, "task_order", lambda spec: [])  # and no task
    shared = ForkServer(["json.tool"], harness_env())
    try:
        runs = {name: LocalKfpRun(str(path), str(tmp_path / name), mode="oss", fork_server=server)
                for name, server in (("own", True), ("shared", shared))}
        for name, run in runs.items():
            (tmp_path / name).mkdir()
            assert run.run(log=lambda *_: None) == []
        assert runs["own"].fork_server.proc.wait(timeout=30) == 0  # closed when its run ended
        assert runs["shared"].fork_server is shared and shared.proc.poll() is None  # still serving
    finally:
        shared.close()
    assert shared.proc.poll() == 0


def _kubeflow_raw():
    with open(os.path.join(REPO, "configs", "kubeflow.yaml"), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["kubeflow"]["beam"]["args"].pop(0), "kubeflow.beam.args: the dataflow runner needs --project"),
    (lambda d: d["kubeflow"]["beam"]["args"].append("--runner=DirectRunner"), "set the runner with kubeflow.beam.runner"),
    (lambda d: d["kubeflow"]["beam"].update(runner="prism"), "kubeflow.beam.runner: 'prism' is not one of"),
    (lambda d: d["kubeflow"]["components"].update(Transform={"cpu": 1}), "kubeflow.components.Transform: no component"),
    (lambda d: d["kubeflow"]["components"]["Trainer"].update(cpu=-2), "kubeflow.components.Trainer.cpu: must be positive"),
    (lambda d: d["kubeflow"]["components"]["Trainer"].update(memory="96G"), "kubeflow.components.Trainer.memory: unknown field"),
    (lambda d: d["kubeflow"]["components"]["Trainer"].update(cpu_request=32), "cpu_request: 32.0 is more than the limit"),
    (lambda d: d["kubeflow"]["components"]["Trainer"]["tolerations"][0].update(value="x"), "operator Exists takes no value"),
    (lambda d: d["kubeflow"]["components"]["Trainer"]["node_selector"].update(pool=3), "node_selector.pool: expected a string"),
    (lambda d: d["kubeflow"].update(tpu_trainer_image=" "), "kubeflow.tpu_trainer_image: empty"),
    (lambda d: d["training"]["embedding"]["topology"].update(chip="v5p"),
     "training.embedding.topology.chip: v5p, but kubeflow.components.Trainer.node_selector."
     "cloud.google.com/gke-tpu-accelerator: tpu-v6e-slice is a TPU v6e"),
    (lambda d: d["kubeflow"]["components"]["Trainer"]["node_selector"].update(
        {"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice"}),
     "training.embedding.topology.chip: v6e, but kubeflow.components.Trainer.node_selector."
     "cloud.google.com/gke-tpu-accelerator: tpu-v5-lite-podslice is a TPU v5e"),
])
def test_bad_kubeflow_config_names_the_field(mutate, message):
    d = _kubeflow_raw()
    mutate(d)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.").replace("+", r"\+")):
        parse_config(d, "kubeflow.yaml")


def test_compile_refusals_write_nothing(tmp_path, capsys):
    cfg = str(tmp_path / "k.yaml")
    d = _kubeflow_raw()
    d["kubeflow"].pop("pipeline_root")
    with open(cfg, "w") as fh:
        yaml.safe_dump(d, fh)
    assert _compile(["--config", cfg, "--image", IMAGE, "--output", "p.yaml"], tmp_path) == 2
    assert "kubeflow.pipeline_root: not set" in capsys.readouterr().err
    assert _compile(["--config", cfg, "--image", IMAGE, "--output", "p.txt", "--pipeline-root", "gs://b/r"], tmp_path) == 2
    assert "must end in .yaml" in capsys.readouterr().err
    assert _compile(["--config", cfg, "--image", " ", "--output", "p.yaml", "--pipeline-root", "gs://b/r"], tmp_path) == 2
    assert "--image: empty" in capsys.readouterr().err
    # the Trainer asks for google.com/tpu: without a TPU image it would get the plain-tensorflow image
    assert _compile(["--config", cfg, "--image", IMAGE, "--output", "p.yaml", "--pipeline-root", "gs://b/r"], tmp_path) == 2
    err = capsys.readouterr().err
    assert "kubeflow.tpu_trainer_image: not set" in err and "--tpu-image" in err and "docker/Dockerfile.tpu" in err
    assert "kubeflow.components.Trainer.accelerator_type: google.com/tpu" in err
    assert _compile(["--config", cfg, "--image", IMAGE, "--tpu-image", "", "--output", "p.yaml",
                     "--pipeline-root", "gs://b/r"], tmp_path) == 2
    assert "--tpu-image: empty" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["k.yaml"]


def _artifact(type_schema, uri="gs://b/x"):
    a = {"uri": uri, "metadata": {"span": 0.0}}
    if type_schema is not None:
        a["type"] = type_schema
    return {"artifacts": [a]}


def test_entrypoint_restores_untyped_inputs_only():
    spec = {"artifacts": {
        "examples": {"artifactType": {"instanceSchema": "title: tfx.Examples\ntype: object\n"}},
        "model": {"artifactType": {"instanceSchema": "title: tfx.Model\ntype: object\n"}},
        "vocab": {"artifactType": {"instanceSchema": "title: components.EmbeddingVocabulary\ntype: object\n"}},
        "stats": {"artifactType": {"instanceSchema": "title: components.EmbeddingStatistics\ntype: object\n"}},
    }}
    typed = {"schemaTitle": "tfx.Model"}
    ei = {"inputs": {"artifacts": {
        "examples": _artifact({"instanceSchema": ""}),  # open-source KFP v2 (tensorflow/tfx#7768)
        "model": _artifact(typed),                      # Vertex: left alone
        "vocab": _artifact(None),                       # no type at all
        "stats": _artifact({"schemaTitle": "system.Artifact"}),  # KFP's generic type
    }}}
    assert kfp_entrypoint.restore_input_types(ei, spec) == ["examples", "vocab", "stats"]
    got = {k: kfp_entrypoint.artifact_type_title(v["artifacts"][0]["type"]) for k, v in ei["inputs"]["artifacts"].items()}
    assert got == {"examples": "tfx.Examples", "model": "tfx.Model", "vocab": "components.EmbeddingVocabulary",
                   "stats": "components.EmbeddingStatistics"}
    assert ei["inputs"]["artifacts"]["examples"]["artifacts"][0]["metadata"] == {"span": 0.0}  # nothing else touched

    # TFX's own parser now takes them (it imports the class named by the type).
    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2
    from tfx.orchestration.kubeflow.v2.container import kubeflow_v2_entrypoint_utils as utils

    pb = json_format.ParseDict(ei, pipeline_spec_pb2.ExecutorInput())
    parsed = utils.parse_raw_artifact_dict(pb.inputs.artifacts)
    assert type(parsed["vocab"][0]).__name__ == "EmbeddingVocabulary"
    assert parsed["examples"][0].type_name == "Examples"

    with pytest.raises(ValueError, match="input artifact 'extra'.*has no type"):
        kfp_entrypoint.restore_input_types({"inputs": {"artifacts": {"extra": _artifact({"instanceSchema": ""})}}}, spec)


def test_stock_tfx_entrypoint_fails_on_untyped_inputs():
    """What the entrypoint is for: TFX 1.16's own parser on an input as open-source KFP passes it."""
    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2
    from tfx.orchestration.kubeflow.v2.container import kubeflow_v2_entrypoint_utils as utils

    pb = json_format.ParseDict({"inputs": {"artifacts": {"examples": _artifact({"instanceSchema": ""})}}},
                               pipeline_spec_pb2.ExecutorInput())
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'get'"):
        utils.parse_raw_artifact_dict(pb.inputs.artifacts)


def test_harness_refuses_placeholders_it_does_not_emulate():
    assert _substitute(["--a", "{{$}}"], '{"x": 1}', "t") == ["--a", '{"x": 1}']
    with pytest.raises(HarnessError, match="not emulated"):
        _substitute(["{{$.inputs.parameters['n']}}"], "{}", "t")


# ------------------------------------------------------------------------------------------------
# The compiled pipeline, run task by task as KFP runs it, twice on one pipeline root and one push
# destination: first in Vertex's mode (typed artifacts, the ExampleGen driver's hook), then in
# open-source KFP's, the stricter one (untyped artifacts the entrypoint restores), which finds the
# first run's model; against two LocalDagRunner runs on the same data (the first runs match, and the
# second runs, each warm-started from its first run's model, match). Each mode's inputs:
# test_kfp_runs_pass_inputs_as_each_backend_does.

ROWS = 4000
# The gate on, with a margin wide enough that two 20-step models on the same data always pass: the
# decisions compared here are about what each run finds and compares with (the gate's rule has its
# own table: tests/test_validation_gate.py). No baseline: a 20-step model is not held to it.
GATE = {"baseline": {"enabled": False}, "baseline_margin": None, "regression_margin": 0.5}
# TFX's stock Evaluator on the second local run and on both Kubeflow runs: its blessing's path to
# the Pusher is under test, not the 20-step model, so any AUC above 0.01 blesses. Sliced by C20
# (4 values): a slice config reaches it; by C1 (1,460 values, hundreds in the eval split) its
# metrics per slice took 11.6 s of each Kubeflow run's 28 s.
EVALUATOR = {"enabled": True, "min_auc": 0.01, "slice_features": ["C20"]}
KFP_MODES = ("vertex", "oss")  # the first Kubeflow run's mode, the second's
EVALUATED = {"local": [False, True], "kubeflow": [True, True]}
# The AUC the Evaluator computes (TFMA, 10,000 thresholds) and the exporter's exact one on the same rows.
AUC_TOLERANCE = 0.002


def _json(path):
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _local_run(cfg, out, stock=False):
    """One LocalDagRunner run into `out` (shared by both runs: one push destination, one MLMD)
    and the artifacts it made; `stock`: with stock StatisticsGen, SchemaGen and ExampleValidator."""
    from pipelines.runner import run

    summary = run(cfg, str(out), extra_components=stock_data_components if stock else None).summary
    model = summary["artifacts"]["Trainer.model"]
    return {"summary": summary, "examples": summary["artifacts"]["EmbeddingExampleGen.examples"],
            "trainer_model": model, "continuous": _json(os.path.join(model, "continuous.json")),
            "report": _json(os.path.join(summary["serving_model_this_run"], "export_report.json")),
            "pushed": summary["serving_model"] if summary["pushed_by_this_run"] else None}


def _harness_run(spec, work, mode, server):
    """One run of the compiled spec through the harness, its commands forked from `server`, and
    the artifacts it made."""
    harness = LocalKfpRun(str(spec), str(work), mode=mode, fork_server=server)
    forked = server.commands
    records = harness.run(log=lambda *_: None)
    assert server.commands > forked and server.proc.poll() is None  # it ran the tasks and is not closed
    out = {r["task"]: r["outputs"] for r in records}
    model = out["Trainer"]["model"][0]["uri"]
    pushed = out["Pusher"]["pushed_model"][0]["metadata"]
    return {"records": records, "run_uuid": harness.run_uuid, "run_name": harness.run_name, "examples": out["EmbeddingExampleGen"]["examples"][0]["uri"],
            "trainer_model": model, "continuous": _json(os.path.join(model, "continuous.json")),
            "report": _json(os.path.join(out["EmbeddingExporter"]["serving_model"][0]["uri"], "export_report.json")),
            "pushed": pushed["pushed_destination"] if pushed.get("pushed") == 1.0 else None}


@pytest.fixture(scope="module")
def kfp_runs(tmp_path_factory):
    from components.example_gen.synthetic_data import GeneratorSpec, ensure_dataset
    from pipelines.kubeflow import compile_pipeline

    root = tmp_path_factory.mktemp("kfp")
    data = root / "data" / "criteo_like.csv"
    ensure_dataset(str(data), GeneratorSpec(rows=ROWS, seed=7))
    with open(os.path.join(REPO, "configs", "demo.yaml"), encoding="utf-8") as fh:
        raw = yaml.safe_load(fh)
    raw["name"] = "kfp-local-test"
    raw["input"]["path"] = str(data)
    with_few_features(raw)  # orchestration is under test here, not the model: a few features of each kind
    raw["training"].update(train_steps=20, eval_steps=5, batch_size=64, checkpoint_every_steps=10)
    raw["training"]["dense_optimizer"]["schedule"]["decay_steps"] = 20
    # auc_sample_size above the eval split: the exporter's AUC is on the rows the Evaluator scores.
    raw["export"].update(compare_compression=False, auc_sample_size=4000, parity_sample_size=128)
    raw["beam"].update(direct_running_mode="in_memory", direct_num_workers=1)
    raw["validation"] = dict(GATE)
    raw["kubeflow"] = {
        "beam": {"runner": "direct", "args": ["--direct_running_mode=in_memory", "--direct_num_workers=1"]},
        "components": {"Trainer": {"cpu": 2, "memory_gb": 4}},
    }
    configs = {}
    for evaluated in (False, True):
        raw["evaluator"] = dict(EVALUATOR, enabled=evaluated)
        cfg_path = root / f"kfp{'-evaluator' if evaluated else ''}.yaml"
        cfg_path.write_text(yaml.safe_dump(raw))
        configs[evaluated] = load_config(str(cfg_path))
    cfg = configs[False]

    runs = {"local": [_local_run(configs[e], root / "local", stock=e) for e in EVALUATED["local"]]}
    assert len(set(EVALUATED["kubeflow"])) == 1  # one compiled spec, run twice
    spec = root / "kubeflow.yaml"
    compile_pipeline(configs[EVALUATED["kubeflow"][0]], "local/tpu-embedding-tfx:test", str(spec),
                     pipeline_root=str(root / "kubeflow" / "root"))
    assert not (root / "kubeflow").exists()  # compiling wrote nothing under the pipeline root
    server = ForkServer(FORK_PRELOAD, harness_env())  # both runs' (its imports once: about 4 s)
    try:
        runs["kubeflow"] = [_harness_run(spec, root / "kubeflow" / f"run-{i}", mode, server)
                            for i, mode in enumerate(KFP_MODES, 1)]
    finally:
        server.close()
    return cfg, root, runs


def _score(model_dir, records):
    import tensorflow as tf

    model = tf.saved_model.load(model_dir)
    return model.signatures["serving_default"](examples=tf.constant(records))["probabilities"].numpy().ravel()


def _train_order(examples_dir):
    """ExampleGen's train split as a sequence of record contents (features parsed and sorted: the
    bytes of a tf.Example are not canonical)."""
    import hashlib

    import tensorflow as tf

    from components.data_io.examples_io import serialized_examples

    pattern = os.path.join(examples_dir, "Split-train", "*")
    assert glob.glob(pattern), examples_dir
    out = []
    for r in serialized_examples(pattern, 1 << 40):
        feats = tf.train.Example.FromString(r).features.feature
        out.append(hashlib.md5(repr(sorted((k, str(v)) for k, v in feats.items())).encode()).hexdigest())
    return out


@pytest.mark.slow(reason="the compiled Kubeflow pipeline run in Vertex's mode, then in open-source KFP's, and twice locally")
def test_kfp_runs_in_both_modes_serve_like_the_local_run(kfp_runs):
    """Same data, same config, same code: each Kubeflow run wrote the same rows in the same order as
    the local run it matches (ExampleGen writes each range's rows in input order, split by a content
    hash), and their serving models score identically: Vertex's first run as the first local run,
    open-source KFP's second run (warm-started from Vertex's model) as the second local run
    (warm-started from the first local run's)."""
    cfg, root, runs = kfp_runs
    from components.data_io.examples_io import serialized_examples

    records = serialized_examples(os.path.join(runs["local"][0]["examples"], "Split-eval", "*"), 1 << 40)
    assert len(records) > 500
    local_scores = [_score(r["pushed"], records) for r in runs["local"]]
    assert not np.allclose(local_scores[0], local_scores[1], atol=1e-6, rtol=0)  # the second run trained on
    local_order = _train_order(runs["local"][0]["examples"])
    for i, (mode, run) in enumerate(zip(KFP_MODES, runs["kubeflow"])):
        assert _train_order(run["examples"]) == local_order, f"{mode}: ExampleGen wrote other train rows or another order"
        np.testing.assert_allclose(_score(run["pushed"], records), local_scores[i], atol=1e-6, rtol=0, err_msg=mode)


def _decisions(run):
    """What a run found, started from and decided: the part that must not depend on the orchestrator."""
    v, c = run["report"]["validation"], run["continuous"]
    return {
        "found_last_blessed": v["last_blessed"]["found"],
        "compared_with_it": v["last_blessed"]["reference_auc"] is not None,
        "warm_started": c["warm_start"] is not None,
        "checks": [(k["name"], k["passed"], bool(k.get("skipped"))) for k in v["checks"]],
        "blessed": v["blessed"],
        "pushed": run["pushed"] is not None,
    }


@pytest.mark.slow(reason="the compiled Kubeflow pipeline run in Vertex's mode, then in open-source KFP's, and twice locally")
def test_second_run_finds_the_first_runs_model_on_every_orchestrator(kfp_runs):
    """Continuous training on Kubeflow: the second run of one compiled spec (same pipeline root and
    push destination; open-source KFP's mode, after Vertex's) warm-starts from the first run's model
    and its gate compares against it, with the decisions of two LocalDagRunner runs on the same data."""
    _, _, runs = kfp_runs
    decisions = {name: [_decisions(r) for r in pair] for name, pair in runs.items()}
    assert decisions["local"] == [
        {"found_last_blessed": False, "compared_with_it": False, "warm_started": False,
         "checks": [("last_blessed", True, True)], "blessed": True, "pushed": True},
        {"found_last_blessed": True, "compared_with_it": True, "warm_started": True,
         "checks": [("last_blessed", True, False)], "blessed": True, "pushed": True},
    ]
    assert decisions["kubeflow"] == decisions["local"]
    for name in ("local", "kubeflow"):
        first, second = runs[name]
        last = second["report"]["validation"]["last_blessed"]
        # the gate compared with the first run's pushed model, scored on the second run's eval rows
        assert last["served_model"] == first["pushed"] and last["trainer_model"] == first["trainer_model"], name
        check = next(c for c in second["report"]["validation"]["checks"] if c["name"] == "last_blessed")
        assert last["reference_auc"] == check["reference_auc"] and 0.5 < last["reference_auc"] < 1, name
        assert check["reference_model"] == first["pushed"], name
        # what the registry recorded when the first run pushed: its AUC on its own eval rows
        assert last["registered_eval_auc"] == first["report"]["eval_auc"]["serving"], name
        # the Trainer warm-started from the first run's Trainer model: every row carried (same data)
        c = second["continuous"]
        assert c["base_model"] == first["trainer_model"] and c["registry"]["served_model"] == first["pushed"], name
        assert c["warm_start"]["rows_carried"] == c["warm_start"]["rows"] > 0, name
        assert second["pushed"] != first["pushed"], name
    # the run that made each pushed model: KFP's run (the harness's {{$.pipeline_job_uuid}} and
    # {{$.pipeline_job_name}}), or LocalDagRunner's run id
    first, second = runs["kubeflow"]
    assert second["report"]["validation"]["last_blessed"]["run"] == {
        "id": first["run_uuid"], "name": first["run_name"], "orchestrator": "kubeflow"}
    local_run = runs["local"][1]["report"]["validation"]["last_blessed"]["run"]
    assert local_run["orchestrator"] == "local" and local_run["id"]


@pytest.mark.slow(reason="the compiled Kubeflow pipeline run in Vertex's mode, then in open-source KFP's, and twice locally")
def test_second_local_run_takes_the_data_stages_from_the_cache(kfp_runs):
    """Same data, same config: the second LocalDagRunner run reuses ExampleGen's and preprocessing's
    outputs (TFX's cache, keyed by each one's share of the config), reads the registry again
    (never cached) and trains again from the first run's model."""
    _, root, runs = kfp_runs
    first, second = runs["local"][:2]
    pipeline_root = root / "local" / "pipeline_root"
    assert first["examples"] == second["examples"]
    assert len(glob.glob(str(pipeline_root / "EmbeddingExampleGen" / "examples" / "*"))) == 1
    assert len(glob.glob(str(pipeline_root / "EmbeddingPreprocess" / "transformed_examples" / "*"))) == 1
    assert len(glob.glob(str(pipeline_root / "LastBlessedModel" / "model" / "*"))) == 2
    assert first["trainer_model"] != second["trainer_model"]


@pytest.mark.slow(reason="the compiled Kubeflow pipeline run in Vertex's mode, then in open-source KFP's, and twice locally")
def test_kfp_runs_pass_inputs_as_each_backend_does(kfp_runs):
    _, root, runs = kfp_runs
    for i, mode in enumerate(KFP_MODES):
        records = runs["kubeflow"][i]["records"]
        by_task = {r["task"]: r for r in records}
        evaluated = ["TFExampleCopy", "Evaluator"] if EVALUATED["kubeflow"][i] else ["", ""]
        assert list(by_task) == [t for t in ["LastBlessedModel", "EmbeddingExampleGen", "EmbeddingPreprocess",
                                             evaluated[0], "Trainer", "EmbeddingExporter", evaluated[1], "Pusher"] if t]
        assert not any("resolver" in r for r in records)
        # LastBlessedModel's pointer reaches the Trainer (base_model) and the exporter
        pointer = by_task["LastBlessedModel"]["outputs"]["model"][0]
        assert pointer["metadata"]["found"] == float(i)  # the first run: nothing pushed yet; the second: the first's
        exporter_inputs = by_task["EmbeddingExporter"]["executor_input"]["inputs"]["artifacts"]
        assert exporter_inputs["last_blessed_model"]["artifacts"][0]["uri"] == pointer["uri"]
        assert by_task["Trainer"]["executor_input"]["inputs"]["artifacts"]["base_model"]["artifacts"][0]["uri"] == pointer["uri"]
        titles = {k: kfp_entrypoint.artifact_type_title(v["artifacts"][0]["type"])
                  for k, v in exporter_inputs.items() if v["artifacts"]}
        if mode == "vertex":
            assert titles == {"examples": "tfx.Examples", "model": "tfx.Model", "last_blessed_model": "tfx.Model"}
            assert "pre_cache_check" in by_task["EmbeddingExampleGen"]["seconds"]  # the ExampleGen driver hook ran
        else:
            assert titles == {"examples": "", "model": "", "last_blessed_model": ""}
            assert "pre_cache_check" not in by_task["EmbeddingExampleGen"]["seconds"]
            logs = {t: open(r["log"], encoding="utf-8", errors="replace").read() for t, r in by_task.items()}
            assert "ExampleGen driver has not run" in logs["EmbeddingExampleGen"]
            assert "input artifact types restored" in logs["EmbeddingExporter"]
        # the upstream executors' reported properties reach the downstream tasks
        tx = by_task["EmbeddingPreprocess"]["outputs"]["transformed_examples"][0]
        assert json.loads(tx["metadata"]["split_names"]) == ["train", "eval"]
        blessing = by_task["EmbeddingExporter"]["outputs"]["blessing"][0]["metadata"]
        assert blessing["blessed"] == 1.0 and blessing["parity_max_abs_diff"] <= 1e-5
        assert all(r["resources"] == {} for t, r in by_task.items() if t != "Trainer")
        assert by_task["Trainer"]["resources"] == {"cpuLimit": 2.0, "memoryLimit": 4.0}


def _registry_entry(name, run):
    """The registry entry of the model a run pushed."""
    from components.model_registry import registry

    assert run["pushed"], f"{name}: the run pushed nothing"
    return registry.read_entry(os.path.dirname(run["pushed"]), int(os.path.basename(run["pushed"])))


@pytest.mark.slow(reason="the compiled Kubeflow pipeline run in Vertex's mode, then in open-source KFP's, and twice locally")
def test_stock_evaluator_blessing_reaches_our_pusher_on_every_orchestrator(kfp_runs):
    """TFX's stock Evaluator on our artifacts (the serving model, a tf.Example copy of
    EmbeddingExampleGen's eval split): its blessing is a Pusher input, its check and metrics are in
    the registry entry, and its AUC is the exporter's on the same rows. Locally with stock
    StatisticsGen, SchemaGen and ExampleValidator on our examples (no anomalies)."""
    from tensorflow_metadata.proto.v0 import anomalies_pb2, schema_pb2

    cfg, root, runs = kfp_runs
    evaluated = {f"local-{i}": r for i, (r, e) in enumerate(zip(runs["local"], EVALUATED["local"])) if e}
    evaluated.update({mode: r for mode, r, e in zip(KFP_MODES, runs["kubeflow"], EVALUATED["kubeflow"]) if e})
    assert sorted(evaluated) == ["local-1", "oss", "vertex"]
    for name, run in evaluated.items():
        entry = _registry_entry(name, run)
        check = entry["evaluator"]
        assert check["name"] == "evaluator" and check["passed"], (name, check)
        assert ("evaluator", True) in [(c["name"], c["passed"]) for c in entry["gate"]], name
        exporter = run["report"]["eval_auc"]
        # the same rows: every eval row, scored by both
        assert check["examples"] == exporter["examples"] > 500, name
        assert abs(check["model_auc"] - exporter["serving"]) <= AUC_TOLERANCE, (name, check["model_auc"], exporter["serving"])
        assert check["slices"] > 1 and 0 < check["calibration"], name  # overall + one per C20 value
        assert os.path.isdir(check["evaluation"]), name
    for name in KFP_MODES:
        by_task = {r["task"]: r for r in evaluated[name]["records"]}
        pusher_inputs = by_task["Pusher"]["executor_input"]["inputs"]["artifacts"]
        blessing = by_task["Evaluator"]["outputs"]["blessing"][0]
        assert pusher_inputs["evaluator_blessing"]["artifacts"][0]["uri"] == blessing["uri"], name
        assert blessing["metadata"]["blessed"] == 1.0, name
        assert os.path.exists(os.path.join(blessing["uri"], "BLESSED")), name
        copy = by_task["TFExampleCopy"]["outputs"]["tf_examples"][0]["metadata"]
        assert copy["eval_rows"] == evaluated[name]["report"]["eval_auc"]["examples"], name
    # locally: the stock data components ran on our examples
    pipeline_root = root / "local" / "pipeline_root"
    anomalies = glob.glob(str(pipeline_root / "ExampleValidator" / "anomalies" / "*" / "Split-*" / "SchemaDiff.pb"))
    assert len(anomalies) == 2
    for path in anomalies:
        with open(path, "rb") as fh:
            assert not anomalies_pb2.Anomalies.FromString(fh.read()).anomaly_info, path
    (schema_file,) = glob.glob(str(pipeline_root / "SchemaGen" / "schema" / "*" / "schema.pbtxt"))
    from google.protobuf import text_format

    with open(schema_file, encoding="utf-8") as fh:
        schema = text_format.Parse(fh.read(), schema_pb2.Schema())
    types = {f.name: schema_pb2.FeatureType.Name(f.type) for f in schema.feature}
    assert types[cfg.label] == "INT" and types[cfg.dense_features[0].source] == "FLOAT", types
    assert all(types[c] == "BYTES" for c in cfg.categorical_columns()), types


def test_vertex_training_compiles_to_tfx_vertex_trainer(tmp_path):
    from google.cloud.aiplatform_v1.types.accelerator_type import AcceleratorType
    from google.cloud.aiplatform_v1.types.custom_job import CustomJobSpec

    # the TPU accelerator types the config accepts are those of the Vertex client TFX submits with
    assert set(VERTEX_TPU_CHIPS) == {n for n in AcceleratorType.__members__ if n.startswith("TPU")}
    d = _kubeflow_raw()
    d["kubeflow"]["components"]["Trainer"] = {"cpu": 1, "memory_gb": 2}  # the task only submits and waits
    # TPU v3-8 (8 cores, 4 chips): a Vertex TPU with an embedding engine (TPUEmbedding)
    d["kubeflow"]["vertex_training"] = {"project": "p", "region": "us-central1", "machine_type": "cloud-tpu",
                                       "accelerator_type": "TPU_V3", "accelerator_count": 8}
    d["training"]["embedding"]["topology"] = {"chip": "v3", "num_chips": 4}
    cfg_path = tmp_path / "v.yaml"
    cfg_path.write_text(yaml.safe_dump(d))
    assert _compile(["--config", str(cfg_path), "--image", IMAGE, "--output", "v.json"], tmp_path) == 2  # no TPU image
    assert _compile(["--config", str(cfg_path), "--image", IMAGE, "--tpu-image", TPU_IMAGE, "--output", "v.json"],
                    tmp_path) == 0
    spec = load_compiled(str(tmp_path / "v.json"))["pipeline_spec"]
    # the Trainer task only submits the job and waits (no TPU in its pod): the main image, like every task
    assert {ex["container"]["image"] for ex in spec["deploymentSpec"]["executors"].values() if "container" in ex} == {IMAGE}
    args = spec["deploymentSpec"]["executors"]["Trainer_executor"]["container"]["args"]
    assert args[1] == "components.embedding_trainer.vertex.VertexTrainerExecutor"
    cc = json.loads(spec["root"]["dag"]["tasks"]["Trainer"]["inputs"]["parameters"]["custom_config"]["runtimeValue"]["constant"])
    assert cc["ai_platform_enable_vertex"] is True and cc["ai_platform_vertex_region"] == "us-central1"
    pool = cc["ai_platform_training_args"]["job_spec"]["worker_pool_specs"][0]
    assert pool == {"machine_spec": {"machine_type": "cloud-tpu", "accelerator_type": "TPU_V3", "accelerator_count": 8},
                    "replica_count": 1, "container_spec": {"image_uri": TPU_IMAGE}}
    # Vertex's client takes the job spec as TFX passes it (an accelerator type it lacks is a KeyError there)
    assert CustomJobSpec(cc["ai_platform_training_args"]["job_spec"]).worker_pool_specs[0].machine_spec.accelerator_type \
        == AcceleratorType.TPU_V3
    assert config_from_json(cc[CONFIG_KEY]).training.tpu == "local"

    with pytest.raises(ConfigError, match=r"^v\.yaml: training\.embedding\.topology\.chip: v6e, but kubeflow\.vertex_training"
                                          r"\.accelerator_type: TPU_V3 is a TPU v3"):
        parse_config({**d, "training": {**d["training"], "embedding": {**d["training"]["embedding"], "topology": {"chip": "v6e"}}}},
                     "v.yaml")
    d["kubeflow"]["vertex_training"]["accelerator_type"] = "TPU_V6E"
    with pytest.raises(ConfigError, match=r"^v\.yaml: kubeflow\.vertex_training\.accelerator_type: 'TPU_V6E' is not one of Vertex AI's "
                                          r"TPU accelerator types \(TPU_V2, TPU_V3, TPU_V4_POD, TPU_V5_LITEPOD\)"):
        parse_config(d, "v.yaml")
    d["kubeflow"]["vertex_training"]["accelerator_type"] = "TPU_V3"
    d["training"].pop("tpu")
    with pytest.raises(ConfigError, match="training.tpu is not set"):
        parse_config(d, "v.yaml")


def _compile_raw(d, tmp_path, *argv):
    """Compiles config data `d` to .yaml; returns the exit status and {executor label: image}."""
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(d))
    out = tmp_path / "c_out.yaml"
    if out.exists():
        out.unlink()
    rc = _compile(["--config", str(cfg_path), "--image", IMAGE, "--output", str(out), *argv], tmp_path)
    if rc:
        return rc, None
    executors = load_compiled(str(out))["pipeline_spec"]["deploymentSpec"]["executors"]
    return rc, {label: ex["container"]["image"] for label, ex in executors.items() if "container" in ex}


def test_tpu_trainer_route_trains_in_the_tpu_image(tmp_path):
    d = _kubeflow_raw()  # the Trainer asks for google.com/tpu on a GKE TPU node pool
    d["kubeflow"]["tpu_trainer_image"] = TPU_IMAGE
    rc, images = _compile_raw(d, tmp_path)
    assert rc == 0
    assert images.pop("Trainer_executor") == TPU_IMAGE
    assert set(images) == {"LastBlessedModel_executor", "EmbeddingExampleGen_executor", "EmbeddingPreprocess_executor",
                           "EmbeddingExporter_executor", "Pusher_executor"}
    assert set(images.values()) == {IMAGE}  # the other tasks keep the main image
    # --tpu-image overrides the config field
    assert _compile_raw(d, tmp_path, "--tpu-image", "other/tpu:1")[1]["Trainer_executor"] == "other/tpu:1"

    # Dataflow's workers run the project's transforms: the main image, not the TPU one
    spec = load_compiled(str(tmp_path / "c_out.yaml"))["pipeline_spec"]
    args = spec["deploymentSpec"]["executors"]["EmbeddingPreprocess_executor"]["container"]["args"]
    assert f"--sdk_container_image={IMAGE}" in args

    # no TPU: the TPU image is not used, even when configured
    d["kubeflow"]["components"]["Trainer"]["accelerator_type"] = "nvidia.com/gpu"
    rc, images = _compile_raw(d, tmp_path, "--tpu-image", TPU_IMAGE)
    assert rc == 0 and set(images.values()) == {IMAGE}


def test_the_tuners_trials_train_on_the_trainers_tpu_task(tmp_path, capsys):
    """On the GKE TPU route the Tuner's trials train as the Trainer does (training.tpu: local): its
    task gets the Trainer's chips, node pool and TPU image unless kubeflow.components.Tuner says
    otherwise, and one that asks for no TPU is refused."""
    d = _kubeflow_raw()
    d["kubeflow"]["tpu_trainer_image"] = TPU_IMAGE
    d["tuning"] = {"trials": 2, "space": {"training.dropout": [0.1, 0.3]}}
    rc, images = _compile_raw(d, tmp_path)
    assert rc == 0 and images["Tuner_executor"] == images["Trainer_executor"] == TPU_IMAGE
    text = (tmp_path / "c_out.yaml").read_text()
    spec, platform = list(yaml.safe_load_all(text))
    executors = spec["deploymentSpec"]["executors"]
    assert executors["Tuner_executor"]["container"]["resources"] == executors["Trainer_executor"]["container"]["resources"]
    assert executors["Tuner_executor"]["container"]["resources"]["accelerator"]["type"] == "google.com/tpu"
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert k8s["Tuner_executor"] == k8s["Trainer_executor"] and "nodeSelector" in k8s["Tuner_executor"]
    # set explicitly, it is the config's; without a TPU it is refused, naming the field
    d["kubeflow"]["components"]["Tuner"] = {"cpu": 4, "memory_gb": 8}
    capsys.readouterr()
    assert _compile_raw(d, tmp_path)[0] == 2
    err = capsys.readouterr().err
    assert "kubeflow.components.Tuner: asks for other chips than the Trainer (None x1 on any node)" in err, err
    d["kubeflow"]["components"]["Tuner"] = dict(d["kubeflow"]["components"]["Trainer"], accelerator_count=8)
    assert _compile_raw(d, tmp_path)[0] == 2
    assert "kubeflow.components.Tuner: asks for other chips than the Trainer (google.com/tpu x8" in capsys.readouterr().err
    d["kubeflow"]["components"]["Tuner"] = dict(d["kubeflow"]["components"]["Trainer"], cpu=8)  # the same chips
    assert _compile_raw(d, tmp_path)[0] == 0
    # an entry for a task the pipeline does not have is refused, naming it
    tuning = d.pop("tuning")
    assert _compile_raw(d, tmp_path)[0] == 2
    assert "kubeflow.components.Tuner: this pipeline has no Tuner" in capsys.readouterr().err
    d["tuning"] = tuning
    # off a TPU route the Tuner simply follows the Trainer's resources
    d["kubeflow"]["components"].pop("Tuner")
    d["kubeflow"]["components"]["Trainer"].update(accelerator_type="nvidia.com/gpu", node_selector={}, tolerations=[])
    rc, images = _compile_raw(d, tmp_path)
    spec = yaml.safe_load_all((tmp_path / "c_out.yaml").read_text()).__next__()
    tuner_res = spec["deploymentSpec"]["executors"]["Tuner_executor"]["container"]["resources"]
    assert rc == 0 and images["Tuner_executor"] == IMAGE and tuner_res["accelerator"]["type"] == "nvidia.com/gpu"


# The libtpu release TensorFlow 2.16's tensorflow-tpu wheels pin. Source: the tensorflow-tpu 2.16.2
# wheel's METADATA (`Requires-Dist: libtpu ==2.16.0rc0`; 2.16.1 pins the same), written by
# TensorFlow's tensorflow/tools/pip_package/v2/setup.py at 2.16.2 (shipped in the wheel):
# `standard_or_nightly('2.16.0rc0', ...)` for tensorflow-tpu releases.
LIBTPU_FOR_TF_2_16 = "2.16.0rc0"
LIBTPU_FIND_LINKS_RE = r"LIBTPU_FIND_LINKS\s*:?=\s*(\S+)"


def _read(*path):
    with open(os.path.join(REPO, *path), encoding="utf-8") as fh:
        return fh.read()


def _lock_tools():
    """docker/check_installed.py (what the TPU image runs on its lock), imported by path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_installed", os.path.join(REPO, "docker", "check_installed.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("dockerfile, lock, hashed_install", [
    ("Dockerfile", "requirements.lock", "--require-hashes -r requirements.lock"),
    ("Dockerfile.tpu", "requirements-tpu.lock", "--require-hashes -r /tmp/pypi.lock"),
])
def test_dockerfile_is_consistent_with_the_lock(dockerfile, lock, hashed_install):
    """The image cannot be built here (no Docker engine); what can be checked statically is."""
    import re

    docker, lock_text = _read("docker", dockerfile), _read(lock)
    tfx_version = re.search(r"^tfx==(\S+)", lock_text, re.M).group(1)
    assert re.search(rf"^FROM tensorflow/tfx:{re.escape(tfx_version)}$", docker, re.M), "FROM tag != locked tfx"
    assert re.search(r"^ENV TF_USE_LEGACY_KERAS=1\b", docker, re.M)
    assert hashed_install in docker and "--no-deps" in docker and f"COPY {lock} ." in docker
    for path in re.findall(r"^COPY (\S+?)/? ", docker, re.M):
        assert os.path.exists(os.path.join(REPO, path)), path
    # the module every compiled task runs is in a package the image installs
    from pipelines.kubeflow import ENTRYPOINT

    module = ENTRYPOINT[-1]
    assert os.path.isfile(os.path.join(REPO, *module.split(".")) + ".py")
    assert f"COPY {module.split('.')[0]}/" in docker


def test_tpu_dockerfile_installs_one_tensorflow_and_the_locked_libtpu():
    import re
    import subprocess
    import sys

    docker, lock_text = _read("docker", "Dockerfile.tpu"), _read("requirements-tpu.lock")
    run = " ".join(re.findall(r"^RUN (.*(?:\n .*)*)", docker, re.M))
    # the base image's plain tensorflow is removed before the TPU build goes in, and checked gone
    assert run.index("pip uninstall -y tensorflow") < run.index("-r /tmp/pypi.lock")
    assert "check_installed.py requirements-tpu.lock --absent tensorflow" in run
    # libtpu: only from TensorFlow's find-links page (the Makefile's), by the locked version
    url = re.search(r"^ARG LIBTPU_FIND_LINKS=(\S+)$", docker, re.M).group(1)
    assert url == re.search(LIBTPU_FIND_LINKS_RE, _read("Makefile")).group(1)
    assert '--no-deps --no-index --find-links "$LIBTPU_FIND_LINKS" -r /tmp/libtpu.lock' in run
    # the image's own split of the lock: everything but libtpu (each entry hashed), and libtpu alone
    parts = {}
    for program, out in re.findall(r"awk '([^']+)' requirements-tpu\.lock > /tmp/(\w+)\.lock", docker):
        parts[out] = subprocess.run(["awk", program], input=lock_text, capture_output=True, text=True,
                                    check=True).stdout
    assert set(parts) == {"pypi", "libtpu"}
    tools = _lock_tools()
    pins = tools.lock_pins(lock_text)
    assert tools.lock_pins(parts["libtpu"]) == {"libtpu": pins["libtpu"]}
    assert tools.lock_pins(parts["pypi"]) == {n: v for n, v in pins.items() if n != "libtpu"}
    blocks = re.split(r"\n(?=[A-Za-z0-9])", parts["pypi"].split("\n", 2)[2])  # past uv's 2-line header
    unhashed = [b.split()[0] for b in blocks if "==" in b.split()[0] and "--hash=sha256:" not in b]
    assert unhashed == []
    # the installed-versions check the image runs: passes on this environment's own lock, and
    # refuses a lock whose packages are not installed (tensorflow-tpu, libtpu) or a present tensorflow
    py = [sys.executable, os.path.join(REPO, "docker", "check_installed.py")]
    ok = subprocess.run(py + [os.path.join(REPO, "requirements.lock")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run(py + [os.path.join(REPO, "requirements-tpu.lock"), "--absent", "tensorflow"],
                         capture_output=True, text=True)
    assert bad.returncode == 1
    assert "tensorflow-tpu: locked" in bad.stderr and "libtpu: locked" in bad.stderr
    assert "tensorflow: installed" in bad.stderr


def test_tpu_lock_matches_the_main_lock():
    tools = _lock_tools()
    main, tpu = tools.lock_pins(_read("requirements.lock")), tools.lock_pins(_read("requirements-tpu.lock"))
    tf_version = main["tensorflow"]
    assert tf_version.startswith("2.16."), "LIBTPU_FOR_TF_2_16 is TensorFlow 2.16's libtpu: recheck it"
    assert tpu["tensorflow-tpu"] == tf_version
    assert tpu["libtpu"] == LIBTPU_FOR_TF_2_16
    assert "tensorflow" not in tpu  # one TensorFlow in the image: the TPU build
    assert set(main) - set(tpu) == {"tensorflow"} and set(tpu) - set(main) == {"tensorflow-tpu", "libtpu"}
    differ = {n: (main[n], tpu[n]) for n in set(main) & set(tpu) if main[n] != tpu[n]}
    assert differ == {}, differ
    assert tpu["tf-keras"] == main["tf-keras"] and tpu["tensorflow-recommenders"] == main["tensorflow-recommenders"]
    # the .in the lock comes from says the same
    tpu_in = tools.lock_pins(_read("requirements-tpu.in"))
    assert tpu_in == {"tensorflow-tpu": tf_version, "libtpu": LIBTPU_FOR_TF_2_16}
