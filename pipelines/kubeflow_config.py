"""The `kubeflow` section as the compiled pipeline needs it: its checks and the Beam options of tasks.

Which runners a Beam task can use, which options each needs, and which component ids the pipeline
has are the pipeline's knowledge, so they live here, beside pipelines/kubeflow.py; the section's
fields are `components.config.KubeflowConfig`. Loading pipelines/ registers `check_kubeflow_config`
with the configuration's resolution, so `load_config` / `parse_config` refuse a bad `kubeflow`
section (naming the field) before anything is compiled. Imports nothing heavy (no TFX, no KFP).
"""
from __future__ import annotations

from typing import List, Tuple

from components.config.checks import check_choice, check_positive
from components.config.schema import ConfigError, KubeflowComponentConfig, KubeflowConfig, PipelineConfig
from components.config.validation import register_check

KFP_RUNNERS = {"direct": "DirectRunner", "dataflow": "DataflowRunner", "flink": "FlinkRunner", "spark": "SparkRunner"}
# Beam options each runner cannot start without (checked at compile time, not when the task runs).
KFP_RUNNER_REQUIRED = {
    "dataflow": ("project", "region", "temp_location"),
    "flink": ("flink_master",),
    "spark": ("spark_master_url",),
}
TOLERATION_OPERATORS = ("Equal", "Exists")
TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
# The pipeline's component ids, in order (pipelines.pipeline.create_pipeline; the names tasks have on Kubeflow;
# Tuner: with a `tuning` section).
COMPONENT_IDS = ("LastBlessedModel", "EmbeddingExampleGen", "EmbeddingPreprocess", "Tuner", "Trainer", "EmbeddingExporter",
                 "TFExampleCopy", "Evaluator", "Pusher",  # TFExampleCopy, Evaluator: with evaluator.enabled
                 "BulkInferrerExampleCopy", "BulkInferrer")  # with bulk_inference.enabled
# The TPU chip (training.embedding.topology.chip) behind each name a TPU route gives it.
# GKE's node label (cloud.google.com/gke-tpu-accelerator) of a TPU slice node pool:
GKE_TPU_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
GKE_TPU_CHIPS = {"tpu-v4-podslice": "v4", "tpu-v5-lite-podslice": "v5e", "tpu-v5p-slice": "v5p", "tpu-v6e-slice": "v6e"}
# Vertex AI's TPU values of MachineSpec.acceleratorType (google.cloud.aiplatform.v1.AcceleratorType; the
# tests compare them with the installed client's enum). It has none for v5p or v6e.
VERTEX_TPU_CHIPS = {"TPU_V2": "v2", "TPU_V3": "v3", "TPU_V4_POD": "v4", "TPU_V5_LITEPOD": "v5e"}


def kubeflow_beam_args(cfg: PipelineConfig, image: str) -> List[str]:
    """Builds the Beam options of the Beam components on Kubeflow from `kubeflow.beam`.

    Args:
      cfg: the resolved configuration.
      image: the project's container image, given to Dataflow's workers unless
        `--sdk_container_image` is set.

    Returns:
      `--runner=...`, the runner's defaults, then `kubeflow.beam.args`.
    """
    kb = cfg.kubeflow.beam
    args = [f"--runner={KFP_RUNNERS[kb.runner]}"]
    if kb.runner == "direct":
        args += ["--direct_running_mode=multi_processing", "--direct_num_workers=0"]
    if kb.runner == "dataflow" and not any(a.startswith("--sdk_container_image") for a in kb.args):
        # Dataflow workers run the project's transforms, so they need the project's image.
        args.append(f"--sdk_container_image={image}")
    return args + list(kb.args)


def check_kubeflow_config(cfg: PipelineConfig) -> None:
    """Checks the `kubeflow` section; the configuration's resolution runs it once registered.

    Args:
      cfg: the configuration being resolved.

    Raises:
      ConfigError: a field is wrong (the message names it and the fix).
    """
    kf = cfg.kubeflow
    _check_locations(kf)
    _check_beam(kf)
    _check_vertex_training(cfg)
    for cid, c in kf.components.items():
        _check_component(cid, c)
    _check_route_chip(cfg)


def _check_locations(kf: KubeflowConfig) -> None:
    for name in ("pipeline_root", "serving_dir"):
        value = getattr(kf, name)
        if value is not None and not value.strip():
            raise ConfigError(f"kubeflow.{name}: empty; set a gs:// path or remove the field")
    if kf.tpu_trainer_image is not None and not kf.tpu_trainer_image.strip():
        raise ConfigError("kubeflow.tpu_trainer_image: empty; name an image built from docker/Dockerfile.tpu or remove the field")


def _check_beam(kf: KubeflowConfig) -> None:
    check_choice(kf.beam.runner, tuple(KFP_RUNNERS), "kubeflow.beam.runner")
    for j, a in enumerate(kf.beam.args):
        if not a.startswith("--"):
            raise ConfigError(f"kubeflow.beam.args[{j}]: {a!r} is not a Beam option; write it as --name=value")
        if a.startswith("--runner"):
            raise ConfigError(
                f"kubeflow.beam.args[{j}]: set the runner with kubeflow.beam.runner "
                f"({', '.join(KFP_RUNNERS)}), not {a!r}"
            )
    given = {a[2:].split("=", 1)[0] for a in kf.beam.args}
    missing = [o for o in KFP_RUNNER_REQUIRED.get(kf.beam.runner, ()) if o not in given]
    if missing:
        raise ConfigError(
            f"kubeflow.beam.args: the {kf.beam.runner} runner needs "
            + ", ".join(f"--{o}=..." for o in missing)
        )


def _check_vertex_training(cfg: PipelineConfig) -> None:
    vt = cfg.kubeflow.vertex_training
    if vt is None:
        return
    for name in ("project", "region", "machine_type"):
        if not getattr(vt, name).strip():
            raise ConfigError(f"kubeflow.vertex_training.{name}: missing; the Vertex AI custom job needs it")
    check_positive(vt.accelerator_count, "kubeflow.vertex_training.accelerator_count", "chips or GPUs per replica")
    if vt.accelerator_type is not None and vt.accelerator_type.startswith("TPU") and vt.accelerator_type not in VERTEX_TPU_CHIPS:
        raise ConfigError(
            f"kubeflow.vertex_training.accelerator_type: {vt.accelerator_type!r} is not one of Vertex AI's TPU "
            f"accelerator types ({', '.join(VERTEX_TPU_CHIPS)}); Vertex has none for v5p or v6e: train on those "
            "through a GKE TPU node pool (kubeflow.components.Trainer, docs/kubeflow.md)"
        )
    if vt.accelerator_type is not None and vt.accelerator_type.startswith("TPU") and not cfg.training.tpu:
        raise ConfigError(
            "kubeflow.vertex_training.accelerator_type: a TPU machine, but training.tpu is not set; set "
            "training.tpu: local (TPU VM) so the trainer uses TPUStrategy"
        )


def _check_component(cid: str, c: KubeflowComponentConfig) -> None:
    path = f"kubeflow.components.{cid}"
    if cid not in COMPONENT_IDS:
        raise ConfigError(f"{path}: no component has this id; the pipeline's components are {', '.join(COMPONENT_IDS)}")
    for name in ("cpu", "memory_gb", "cpu_request", "memory_request_gb", "accelerator_count"):
        check_positive(getattr(c, name), f"{path}.{name}", "a positive amount, or leave it unset")
    if c.cpu_request and c.cpu and c.cpu_request > c.cpu:
        raise ConfigError(f"{path}.cpu_request: {c.cpu_request} is more than the limit cpu: {c.cpu}")
    if c.memory_request_gb and c.memory_gb and c.memory_request_gb > c.memory_gb:
        raise ConfigError(f"{path}.memory_request_gb: {c.memory_request_gb} is more than memory_gb: {c.memory_gb}")
    if c.accelerator_type is not None and not c.accelerator_type.strip():
        raise ConfigError(f"{path}.accelerator_type: empty; name the accelerator or remove the field")
    for k, v in c.node_selector.items():
        if not k or not isinstance(v, str):
            raise ConfigError(f"{path}.node_selector.{k}: labels are non-empty keys with string values (quote numbers)")
    for j, t in enumerate(c.tolerations):
        tp = f"{path}.tolerations[{j}]"
        check_choice(t.operator, TOLERATION_OPERATORS, f"{tp}.operator")
        check_choice(t.effect, TOLERATION_EFFECTS, f"{tp}.effect")
        if t.operator == "Exists" and t.value is not None:
            raise ConfigError(f"{tp}.value: operator Exists takes no value; remove it or use Equal")
        if t.operator == "Equal" and not t.key:
            raise ConfigError(f"{tp}.key: operator Equal needs a key")


def route_chips(cfg: PipelineConfig) -> List[Tuple[str, str]]:
    """Finds the TPU chip each TPU route names.

    Args:
      cfg: the configuration.

    Returns:
      [(field, chip)], one per route whose accelerator names a known chip: the Trainer's GKE node
      pool label, the Vertex AI accelerator type.
    """
    found = []
    trainer = cfg.kubeflow.components.get("Trainer")
    label = (trainer.node_selector.get(GKE_TPU_ACCELERATOR_LABEL) if trainer is not None else None) or ""
    if label in GKE_TPU_CHIPS:
        found.append((f"kubeflow.components.Trainer.node_selector.{GKE_TPU_ACCELERATOR_LABEL}: {label}", GKE_TPU_CHIPS[label]))
    vt = cfg.kubeflow.vertex_training
    if vt is not None and vt.accelerator_type in VERTEX_TPU_CHIPS:
        found.append((f"kubeflow.vertex_training.accelerator_type: {vt.accelerator_type}", VERTEX_TPU_CHIPS[vt.accelerator_type]))
    return found


def _check_route_chip(cfg: PipelineConfig) -> None:
    # The plan is sized for topology.chip; a route to another chip would be refused by the trainer
    # (another embedding API) or run on a plan sized for the wrong memory.
    chip = cfg.training.embedding.topology.chip
    for field, route_chip in route_chips(cfg):
        if chip is not None and chip != route_chip:
            raise ConfigError(
                f"training.embedding.topology.chip: {chip}, but {field} is a TPU {route_chip}; name the chip the "
                "Trainer trains on"
            )


register_check("kubeflow", check_kubeflow_config)
