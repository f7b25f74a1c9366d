"""Compiles the pipeline for Kubeflow Pipelines v2 (open-source KFP and Vertex AI Pipelines).

`compile_pipeline(cfg, image, output)` builds the same TFX pipeline as the local run
(`pipelines.pipeline.create_pipeline`) and compiles it with TFX's `KubeflowV2DagRunner`:

- `.yaml` / `.yml`: the bare PipelineSpec (what the open-source KFP UI and `kfp.Client` upload),
  followed by a Kubernetes platform-spec document when a component has node selectors or
  tolerations (TFX 1.16 cannot express them; KFP's own kfp-kubernetes extension writes the same
  document). `.json`: a Vertex PipelineJob (Vertex ignores Kubernetes settings).
- Pipeline spec schema 2.1, so that every task's args carry `--json_serialized_inputs_spec_args`:
  the project's entrypoint (`pipelines.kfp_entrypoint`, the image's command for every task) uses
  it to restore the input artifact types open-source KFP leaves empty (tensorflow/tfx#7768).
- Per-component CPU / memory / accelerator from `kubeflow.components.<id>` (the Tuner's, when not
  set, the Trainer's: `component_resources`); Beam options from
  `kubeflow.beam`, given to the Beam components (ExampleGen, EmbeddingPreprocess, and with
  `evaluator.enabled` TFExampleCopy and TFX's Evaluator) only.
- The Trainer on a TPU route (TPU resources on `kubeflow.components.Trainer`, or a TPU
  `kubeflow.vertex_training`) trains in the TPU image (docker/Dockerfile.tpu: tensorflow-tpu and
  libtpu; `--tpu-image` or `kubeflow.tpu_trainer_image`), and so do the Tuner's trials; every other
  task and Dataflow's workers in the main image. A TPU route without a TPU image is refused.

Compiling writes the output file and nothing else: no metadata store, nothing under the pipeline
root (the Trainer names its `run_fn` by import path, so TFX builds no wheel), and the output
appears whole (written beside it, then renamed) or not at all.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Dict, List, Optional

import yaml

from components.planning.capacity import check_tpu_floor
from components.config.schema import ConfigError, PipelineConfig
from pipelines.kubeflow_config import kubeflow_beam_args
from pipelines.pipeline import NEVER_CACHED, create_pipeline

ENTRYPOINT = ["python", "-m", "pipelines.kfp_entrypoint"]
OUTPUT_SUFFIXES = (".yaml", ".yml", ".json")


def _resource_spec(c) -> Any:
    # lazy: keeps the KFP SDK off the command line's config path
    from kfp.pipeline_spec import pipeline_spec_pb2

    spec = pipeline_spec_pb2.PipelineDeploymentConfig.PipelineContainerSpec.ResourceSpec()
    if c.cpu:
        spec.cpu_limit = c.cpu
    if c.memory_gb:
        spec.memory_limit = c.memory_gb
    if c.cpu_request:
        spec.cpu_request = c.cpu_request
    if c.memory_request_gb:
        spec.memory_request = c.memory_request_gb
    if c.accelerator_type:
        spec.accelerator.type = c.accelerator_type
        spec.accelerator.count = c.accelerator_count
    return spec


def _has_resources(c) -> bool:
    return any((c.cpu, c.memory_gb, c.cpu_request, c.memory_request_gb, c.accelerator_type))


def is_tpu_accelerator(accelerator_type: Optional[str]) -> bool:
    """Tells whether an accelerator type names a TPU.

    Args:
      accelerator_type: as open-source KFP names it (the Kubernetes resource `google.com/tpu`) or
        as Vertex does (`TPU_V3`, `TPU_V4_POD`, ...: pipelines.kubeflow_config.VERTEX_TPU_CHIPS);
        None for no accelerator.

    Returns:
      True for a TPU.
    """
    t = (accelerator_type or "").strip()
    return t.lower() == "google.com/tpu" or t.upper().startswith("TPU")


def tpu_routes(cfg: PipelineConfig) -> Dict[str, str]:
    """Finds how the Trainer reaches a TPU.

    Args:
      cfg: the resolved configuration.

    Returns:
      {'task': field} when the Trainer's own task asks for TPU chips (GKE node pool),
      {'vertex_job': field} when it submits a Vertex AI custom job on a TPU machine (both can
      be there); each value names the config field. Empty without a TPU route.
    """
    routes = {}
    trainer = cfg.kubeflow.components.get("Trainer")
    if trainer is not None and is_tpu_accelerator(trainer.accelerator_type):
        routes["task"] = f"kubeflow.components.Trainer.accelerator_type: {trainer.accelerator_type}"
    vt = cfg.kubeflow.vertex_training
    if vt is not None and is_tpu_accelerator(vt.accelerator_type):
        routes["vertex_job"] = f"kubeflow.vertex_training.accelerator_type: {vt.accelerator_type}"
    return routes


def trainer_tpu_image(cfg: PipelineConfig, tpu_image: Optional[str]) -> Optional[str]:
    """Chooses the image the Trainer trains in on a TPU route.

    The main image's plain `tensorflow` wheel has no TPU runtime, so a TPU route needs this image.

    Args:
      cfg: the resolved configuration (`kubeflow.tpu_trainer_image`).
      tpu_image: `--tpu-image`, over the config's; None when not given.

    Returns:
      The image, or None without a TPU route.

    Raises:
      ConfigError: `tpu_image` is empty, or a TPU route has no TPU image.
    """
    if tpu_image is not None and not tpu_image.strip():
        raise ConfigError("--tpu-image: empty; give the TPU trainer image (docker/Dockerfile.tpu)")
    routes = tpu_routes(cfg)
    if not routes:
        return None
    image = tpu_image or cfg.kubeflow.tpu_trainer_image
    if not image:
        raise ConfigError(
            f"{cfg.resolved.source_file}: kubeflow.tpu_trainer_image: not set, but the Trainer trains on a TPU "
            f"({'; '.join(routes.values())}); build docker/Dockerfile.tpu (tensorflow-tpu with libtpu: "
            "the main image's tensorflow cannot reach a TPU) and set kubeflow.tpu_trainer_image or pass --tpu-image"
        )
    return image.strip()


def check_parallel_trials(cfg: PipelineConfig) -> None:
    """Trials run in parallel only as a Vertex AI custom job of CPU or GPU machines.

    Args:
      cfg: the resolved configuration.

    Raises:
      ConfigError: `tuning.parallel_trials` above 1 without `kubeflow.vertex_training` (the Tuner is
        then one task), or with a TPU there (several TPU replicas in one Vertex job were never
        run by this project).
    """
    tu, vt = cfg.tuning, cfg.kubeflow.vertex_training
    if tu is None or tu.parallel_trials <= 1:
        return
    where = f"{cfg.resolved.source_file}: tuning.parallel_trials: {tu.parallel_trials}"
    if vt is None:
        raise ConfigError(
            f"{where}, but without kubeflow.vertex_training the Tuner is one Kubeflow task that trains its trials one "
            "at a time; set kubeflow.vertex_training (the trials then run as one Vertex AI custom job of that many "
            "machines) or tuning.parallel_trials: 1")
    if is_tpu_accelerator(vt.accelerator_type):
        raise ConfigError(
            f"{where}, but kubeflow.vertex_training is a TPU ({vt.accelerator_type}): a Vertex AI job of several TPU "
            "machines is not supported here; set tuning.parallel_trials: 1 (the trials then train one at a time on "
            "the TPU machine)")


def _tpu_chips(c) -> tuple:
    """A task's TPU request: (TPU accelerator type or None, count, node selector)."""
    return (c.accelerator_type if is_tpu_accelerator(c.accelerator_type) else None, c.accelerator_count,
            dict(c.node_selector))


def component_resources(cfg: PipelineConfig) -> Dict[str, Any]:
    """What each task asks for: `kubeflow.components`, and with a `tuning` section the Tuner's task
    as the Trainer's when the config does not set it: its trials train as the Trainer does (the same
    `training.tpu`, so the same chips, node pool and image).

    Args:
      cfg: the resolved configuration.

    Returns:
      {component id: KubeflowComponentConfig}.

    Raises:
      ConfigError: the Trainer's task holds TPU chips and `kubeflow.components.Tuner` asks for
        other chips (accelerator, count or node selector).
    """
    comps = dict(cfg.kubeflow.components)
    if cfg.tuning is None or "Trainer" not in comps:
        return comps
    if "Tuner" not in comps:
        comps["Tuner"] = comps["Trainer"]
    elif "task" in tpu_routes(cfg):
        tuner, trainer = comps["Tuner"], comps["Trainer"]
        if _tpu_chips(tuner) != _tpu_chips(trainer):
            raise ConfigError(
                f"{cfg.resolved.source_file}: kubeflow.components.Tuner: asks for other chips than the Trainer "
                f"({tuner.accelerator_type} x{tuner.accelerator_count} on {tuner.node_selector or 'any node'}), but its "
                f"trials train as the Trainer does ({tpu_routes(cfg)['task']}, x{trainer.accelerator_count}, "
                f"{trainer.node_selector}); give it the Trainer's accelerator and node selector, or leave it out "
                "(it then gets the Trainer's)")
    return comps


def kubernetes_platform_spec(cfg: PipelineConfig) -> Optional[Dict[str, Any]]:
    """Builds the KFP PlatformSpec document for components with node selectors or tolerations.

    Args:
      cfg: the resolved configuration (`kubeflow.components`, as `component_resources` reads it).

    Returns:
      The document (kfp-kubernetes' `KubernetesExecutorConfig` per executor), or None when no
      component has node selectors or tolerations.
    """
    executors = {}
    for cid, c in sorted(component_resources(cfg).items()):
        entry: Dict[str, Any] = {}
        if c.node_selector:
            entry["nodeSelector"] = {"labels": dict(sorted(c.node_selector.items()))}
        if c.tolerations:
            entry["tolerations"] = [
                {k: v for k, v in (("key", t.key), ("operator", t.operator), ("value", t.value), ("effect", t.effect)) if v}
                for t in c.tolerations
            ]
        if entry:
            executors[f"{cid}_executor"] = entry  # TFX names every component's executor <id>_executor
    if not executors:
        return None
    return {"platforms": {"kubernetes": {"deploymentSpec": {"executors": executors}}}}


def build_pipeline(cfg: PipelineConfig, image: str, pipeline_root: str, tpu_image: Optional[str] = None):
    """Builds the TFX pipeline with Kubeflow settings applied (no metadata connection: KFP brings its own).

    Args:
      cfg: the resolved configuration.
      image: the main container image (Beam workers, the Vertex training job off a TPU route).
      pipeline_root: the pipeline root; the push destination defaults to `<root>/serving`.
      tpu_image: the image of a Vertex AI training job on a TPU machine (the task that submits
        it stays on `image`). The Trainer task's own image is set by compile_pipeline.

    Returns:
      The TFX pipeline, with Beam options and per-component resources set.
    """
    serving_dir = cfg.kubeflow.serving_dir or pipeline_root.rstrip("/") + "/serving"
    # create_pipeline uses `image` only for the Vertex AI training and tuning jobs' worker pools.
    job_image = tpu_image if tpu_image and "vertex_job" in tpu_routes(cfg) else image
    p = create_pipeline(cfg, pipeline_root=pipeline_root, metadata_path=None, serving_dir=serving_dir,
                        beam_pipeline_args=[], image=job_image, kubeflow=True)
    beam_args = kubeflow_beam_args(cfg, image)
    by_id = {c.id: c for c in p.components}
    for c in p.components:
        if hasattr(c, "with_beam_pipeline_args"):  # BaseBeamComponent: ExampleGen, EmbeddingPreprocess (TFExampleCopy, Evaluator)
            c.with_beam_pipeline_args(beam_args)
    for cid, res in component_resources(cfg).items():
        if cid not in by_id:
            raise ConfigError(f"{cfg.resolved.source_file}: kubeflow.components.{cid}: this pipeline has no {cid} "
                              f"(its tasks: {', '.join(sorted(by_id))}); remove the entry or turn the component on")
        if _has_resources(res):
            by_id[cid].with_platform_config(_resource_spec(res))
    return p


def compile_pipeline(cfg: PipelineConfig, image: str, output: str, pipeline_root: Optional[str] = None,
                     tpu_image: Optional[str] = None) -> Dict[str, Any]:
    """Compiles the pipeline for Kubeflow Pipelines v2 and writes it to `output`.

    Args:
      cfg: the resolved configuration.
      image: the container image with the project installed (docker/Dockerfile).
      output: `.yaml`: the KFP PipelineSpec (and its Kubernetes platform spec); `.json`: a Vertex
        PipelineJob.
      pipeline_root: overrides `kubeflow.pipeline_root`.
      tpu_image: the Trainer's image on a TPU route (else `kubeflow.tpu_trainer_image`).

    Returns:
      The PipelineJob dict TFX built.

    Raises:
      ConfigError: an empty image, an output suffix other than .yaml or .json, no pipeline root,
        a TPU route without a TPU image, parallel trials without Vertex AI, or a missing output
        folder.
    """
    if not image or not image.strip():
        raise ConfigError("--image: empty; give the container image that has the project installed (docker/Dockerfile)")
    if not output.endswith(OUTPUT_SUFFIXES):
        raise ConfigError(f"--output: {output!r} must end in .yaml (KFP PipelineSpec) or .json (Vertex PipelineJob)")
    root = pipeline_root or cfg.kubeflow.pipeline_root
    if not root:
        raise ConfigError(
            f"{cfg.resolved.source_file}: kubeflow.pipeline_root: not set; set it (e.g. gs://BUCKET/tpu-embedding) "
            "or pass --pipeline-root"
        )
    check_tpu_floor(cfg)  # tables the config fixes that no chip could hold: refused before anything runs
    check_parallel_trials(cfg)  # parallel trials need a Vertex AI job; one Kubeflow task trains them in turn
    job = _compiled_job(cfg, image, output, root, tpu_image)
    # TFX puts the pipeline root only into a PipelineJob's runtimeConfig; the bare PipelineSpec that
    # open-source KFP uploads would otherwise run under KFP's default root (minio://), which
    # TensorFlow's file system cannot write. KFP's own compiler sets defaultPipelineRoot the same way.
    job["pipelineSpec"]["defaultPipelineRoot"] = root
    _turn_cache_off(job["pipelineSpec"]["root"]["dag"]["tasks"], vertex=output.endswith(".json"))
    _write_atomically(output, _spec_text(cfg, job, output))
    return job


def _compiled_job(cfg: PipelineConfig, image: str, output: str, root: str, tpu_image: Optional[str]) -> Dict[str, Any]:
    """The PipelineJob dict TFX's KubeflowV2DagRunner builds, each task on its image."""
    # lazy: TFX's Kubeflow runner loads TensorFlow and the KFP SDK; this module is on the CLI's path
    from tfx.orchestration.kubeflow.v2 import kubeflow_v2_dag_runner
    from tfx.orchestration.kubeflow.v2.pipeline_builder import DEFAULT_IMAGE_PATH_KEY

    trainer_image = trainer_tpu_image(cfg, tpu_image)
    p = build_pipeline(cfg, image, root, tpu_image=trainer_image)
    default_image: Any = image
    if trainer_image and "task" in tpu_routes(cfg):  # the Trainer's own pod holds the TPU chips
        default_image = {DEFAULT_IMAGE_PATH_KEY: image, "Trainer": trainer_image}
        if cfg.tuning is not None:  # and the Tuner's, whose trials train as the Trainer does
            default_image["Tuner"] = trainer_image
    runner = kubeflow_v2_dag_runner.KubeflowV2DagRunner(
        config=kubeflow_v2_dag_runner.KubeflowV2DagRunnerConfig(
            default_image=default_image, default_commands=list(ENTRYPOINT), use_pipeline_spec_2_1=True),
        output_filename=os.path.basename(output),
    )
    return runner.run(p, write_out=False)


def _turn_cache_off(tasks: Dict[str, Any], vertex: bool) -> None:
    """Caching: TFX writes the pipeline's flag into every task (step_builder.py); the steps that read
    or write the registry at the push destination must run every time (pipeline.NEVER_CACHED)."""
    never = list(NEVER_CACHED)
    if not vertex:
        # Open-source KFP checks its cache before the task runs, and the ExampleGen driver (span,
        # version, input fingerprint) runs inside the task there (kfp_entrypoint.py): a file
        # rewritten at the same path would be missed. Vertex runs the driver first (preCacheCheck).
        never.append("EmbeddingExampleGen")
    for node_id in never:
        if node_id in tasks:
            tasks[node_id]["cachingOptions"] = {"enableCache": False}


def _spec_text(cfg: PipelineConfig, job: Dict[str, Any], output: str) -> str:
    """The file's text: the PipelineJob as JSON, or KFP's YAML (the spec, then its platform spec)."""
    platform = kubernetes_platform_spec(cfg)
    if output.endswith(".json"):
        return json.dumps(job, sort_keys=True, indent=1) + "\n"
    spec = job["pipelineSpec"]
    header = (
        f"# PIPELINE DEFINITION\n# Name: {spec['pipelineInfo']['name']}\n"
        f"# Compiled by `python -m pipelines compile` ({spec.get('sdkVersion', 'tfx')}, schema {spec['schemaVersion']})\n"
    )
    docs = [spec] + ([platform] if platform else [])
    return header + yaml.safe_dump_all(docs, sort_keys=True)


def _write_atomically(output: str, text: str) -> None:
    """Writes through a temporary file beside `output`: no half-written spec is left."""
    out_dir = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(out_dir):
        raise ConfigError(f"--output: directory {out_dir} does not exist")
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(output) + ".", dir=out_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; the spec is an ordinary file
        os.replace(tmp, output)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def load_compiled(path: str) -> Dict[str, Any]:
    """Reads a compiled file back.

    Args:
      path: a `.json` PipelineJob or a `.yaml` PipelineSpec written by `compile_pipeline`.

    Returns:
      {'pipeline_spec', 'platform_spec' (or None), 'runtime_config', 'pipeline_root'}.
    """
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    if path.endswith(".json"):
        job = json.loads(text)
        rc = job.get("runtimeConfig", {})
        return {"pipeline_spec": job["pipelineSpec"], "platform_spec": None, "runtime_config": rc,
                "pipeline_root": rc.get("gcsOutputDirectory") or job["pipelineSpec"].get("defaultPipelineRoot")}
    docs: List[Any] = [d for d in yaml.safe_load_all(text) if d is not None]
    platform = next((d for d in docs[1:] if "platforms" in d), None)
    return {"pipeline_spec": docs[0], "platform_spec": platform, "runtime_config": {},
            "pipeline_root": docs[0].get("defaultPipelineRoot")}
