"""`create_pipeline(config, ...)`: the whole product as one TFX pipeline.

TFX is imported narrowly, inside the functions that build or run the pipeline: `from tfx import v1`
loads every standard component, and `input_location` is on the command line's config path.
"""
from __future__ import annotations

import fnmatch
import glob
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

from components.data_io.beam_runtime import WORKER_PLUGIN, skip_tfx_sdist_for_local_runners
from components.config.schema import SPAN_SPEC, ConfigError, PipelineConfig
from components.config.stages import stage_json
from components.reporting.progress import LAST_BLESSED, PUSHER, SERVING_CHECK  # node ids the pipeline names
from pipelines.evaluation import evaluator_components
from pipelines.bulk_inference import bulk_inferrer_components
from components.tfx_wiring.component_keys import (BLESSING_KEY, CONFIG_KEY, EXAMPLES_KEY, MODEL_KEY, SERVING_MODEL_KEY,
                                                 TRANSFORMED_EXAMPLES_KEY)

TRAINER_RUN_FN = "components.embedding_trainer.trainer_module.run_fn"
TUNER_FN = "components.embedding_trainer.tuner.tuner_fn"
PIPELINE_ROOT = "pipeline_root"
METADATA_FILE = "metadata.sqlite"
SERVING_DIR = "serving"
# Steps whose outcome depends on state outside ML Metadata (the registry at the push destination):
# never taken from the cache, so a cached run still reads what is served now and pushes anew.
NEVER_CACHED = (LAST_BLESSED, PUSHER)
# KFP and Vertex substitute these when a parameter's constant is exactly the placeholder (the run
# that made a pushed model, in its registry entry).
KFP_RUN_ID = "{{$.pipeline_job_uuid}}"
KFP_RUN_NAME = "{{$.pipeline_job_name}}"




def input_location(cfg: PipelineConfig) -> Tuple[str, str]:
    """Splits `input.path` into ExampleGen's input base and file pattern, checking that files match.

    A path with TFX's span specs (`{SPAN}`, `{SPAN:n}`, `{YYYY}{MM}{DD}`, `{VERSION}`) is a span
    input: ExampleGen's driver picks the latest span (docs/continuous.md); the base is
    the directory above the first part with a spec. A pattern naming directories reads their
    `*.csv` files (csv) or every file (tfrecord).

    Args:
      cfg: the resolved configuration.

    Returns:
      (input_base directory, file pattern relative to it).

    Raises:
      ConfigError: a local path matches no file.
    """
    path = cfg.input.path
    remote = "://" in path
    files = cfg.input.directory_files()
    if SPAN_SPEC.search(path):
        parts = path.rstrip("/").split("/")
        first = next(i for i, p in enumerate(parts) if SPAN_SPEC.search(p))
        base, pattern = "/".join(parts[:first]) or "/", "/".join(parts[first:])
    elif not remote and os.path.isdir(path):
        base, pattern = path, files
    else:
        base, pattern = os.path.dirname(path), os.path.basename(path)
    if not remote:
        as_glob = os.path.join(base, SPAN_SPEC.sub("*", pattern))
        if SPAN_SPEC.search(pattern) and any(os.path.isdir(m) for m in glob.glob(as_glob)):
            pattern, as_glob = pattern + "/" + files, os.path.join(as_glob, files)
        matches = [m for m in glob.glob(as_glob) if os.path.isfile(m)]
        if not matches:
            # glob leaves names starting with '.' out, as ExampleGen does (example_gen/input_folder.py): say so
            hidden = sorted(n for n in (os.listdir(base) if os.path.isdir(base) else [])
                            if n.startswith(".") and fnmatch.fnmatch(n, os.path.basename(as_glob)))
            seen = f" (hidden files are not read: {', '.join(hidden[:3])})" if hidden else ""
            raise ConfigError(
                f"{cfg.resolved.source_file}: input.path: {path!r} matches no file{seen}; generate the data "
                "(python -m components.example_gen.synthetic_data) or point input.path at a CSV/TFRecord file, "
                "directory, glob or span pattern ({SPAN})"
            )
    return base, pattern


def vertex_training_config(cfg: PipelineConfig, image: str) -> dict:
    """The custom_config keys of TFX's Vertex AI Trainer for `kubeflow.vertex_training`.

    One worker pool runs `image` on the configured machine (TFX sets the container's command to
    its own run_executor).

    Args:
      cfg: a configuration whose `kubeflow.vertex_training` is set.
      image: the container image with the project installed.

    Returns:
      The keys to merge into the Trainer's custom_config.
    """
    # lazy: only a Vertex route needs TFX's Google Cloud extension and its client libraries
    from tfx.extensions.google_cloud_ai_platform.trainer import executor as vertex_executor

    return _vertex_job_config(cfg, image, vertex_executor.TRAINING_ARGS_KEY, replicas=1)


def vertex_tuning_config(cfg: PipelineConfig, image: str) -> dict:
    """The custom_config keys of TFX's Vertex AI Tuner for `kubeflow.vertex_training` with a
    `tuning` section: `tuning.parallel_trials` replicas of the Trainer's machine, each training
    trials (the primary also runs KerasTuner's chief oracle; TFX's tuner executor).

    Args:
      cfg: a configuration whose `kubeflow.vertex_training` and `tuning` are set.
      image: the container image with the project installed.

    Returns:
      The keys to merge into the Tuner's custom_config.
    """
    # lazy: only a Vertex route needs TFX's Google Cloud extension and its client libraries
    from tfx.extensions.google_cloud_ai_platform.tuner import executor as vertex_executor

    return _vertex_job_config(cfg, image, vertex_executor.TUNING_ARGS_KEY, replicas=cfg.tuning.parallel_trials)


def _vertex_job_config(cfg: PipelineConfig, image: str, args_key: str, replicas: int) -> dict:
    """A Vertex AI custom job of `replicas` machines of `kubeflow.vertex_training` running `image`:
    the primary replica (worker pool 0) and `replicas - 1` workers (pool 1), as TFX's extension reads
    them from custom_config[`args_key`]."""
    # lazy: only a Vertex route needs TFX's Google Cloud extension and its client libraries
    from tfx.extensions.google_cloud_ai_platform import constants

    vt = cfg.kubeflow.vertex_training
    machine = {"machine_type": vt.machine_type}
    if vt.accelerator_type:
        machine.update(accelerator_type=vt.accelerator_type, accelerator_count=vt.accelerator_count)
    pools = [{"machine_spec": machine, "replica_count": 1, "container_spec": {"image_uri": image}}]
    if replicas > 1:
        pools.append({"machine_spec": dict(machine), "replica_count": replicas - 1,
                      "container_spec": {"image_uri": image}})
    return {
        constants.ENABLE_VERTEX_KEY: True,
        constants.VERTEX_REGION_KEY: vt.region,
        args_key: {"project": vt.project, "job_spec": {"worker_pool_specs": pools}},
    }


def stock_data_components(ours: Dict[str, Any]) -> List[Any]:
    """TFX's stock StatisticsGen, SchemaGen and ExampleValidator on `EmbeddingExampleGen`'s examples.

    An `extra_components` function for `create_pipeline` (`python -m pipelines run
    --with-data-validation`; docs/tfx.md). They read its Parquet payload through tfx_bsl.

    Args:
      ours: {component id: our component}.

    Returns:
      [StatisticsGen, SchemaGen, ExampleValidator].
    """
    # lazy: TFX's components load TensorFlow; this module is on the CLI's config path
    from tfx.components.example_validator.component import ExampleValidator
    from tfx.components.schema_gen.component import SchemaGen
    from tfx.components.statistics_gen.component import StatisticsGen

    stats = StatisticsGen(examples=ours["EmbeddingExampleGen"].outputs[EXAMPLES_KEY])
    schema = SchemaGen(statistics=stats.outputs["statistics"])
    return [stats, schema, ExampleValidator(statistics=stats.outputs["statistics"], schema=schema.outputs["schema"])]


def create_pipeline(
    cfg: PipelineConfig,
    pipeline_root: str,
    metadata_path: Optional[str],
    serving_dir: str,
    beam_pipeline_args: Optional[List[str]] = None,
    image: Optional[str] = None,
    span: Optional[int] = None,
    kubeflow: bool = False,
    enable_cache: bool = True,
    extra_components: Optional[Callable[[Dict[str, Any]], List[Any]]] = None,
):
    """Builds the pipeline: LastBlessedModel -> EmbeddingExampleGen -> EmbeddingPreprocess [-> Tuner]
    -> Trainer -> EmbeddingExporter [-> TFExampleCopy, Evaluator] -> Pusher.

    Args:
      cfg: the resolved configuration.
      pipeline_root: where the components write their artifacts.
      metadata_path: the local run's SQLite ML Metadata file; None on Kubeflow (the platform's).
      serving_dir: the push destination, where the model registry lives.
      beam_pipeline_args: Beam's options; default the config's (`cfg.beam_pipeline_args()`).
      image: (Kubeflow only) the container image, needed when the config sends training (and
        tuning's trials) to a Vertex AI custom job (`kubeflow.vertex_training`).
      span: with a span input, read this span (TFX's RangeConfig static range) instead of the latest.
      kubeflow: the registry steps record KFP's run placeholders (locally: LocalDagRunner's run id).
      enable_cache: a component whose execution properties (its share of the config,
        components/config/stages.py) and inputs are unchanged reuses its last outputs, except the
        NEVER_CACHED steps.
      extra_components: given {component id: our component}, the stock components to add around
        ours (e.g. StatisticsGen on `EmbeddingExampleGen`'s `examples`; docs/tfx.md).

    Returns:
      The `tfx.orchestration.pipeline.Pipeline`.

    Raises:
      ConfigError: `input.path` matches no file.
    """
    # lazy: TFX loads TensorFlow and Beam; this module is on the CLI's config path
    from tfx.orchestration import metadata, pipeline

    ours = _our_components(cfg, serving_dir, image, span, kubeflow)
    added = list(extra_components({c.id: c for c in ours})) if extra_components else []
    return pipeline.Pipeline(
        pipeline_name=cfg.name,
        pipeline_root=pipeline_root,
        components=ours + added,
        enable_cache=enable_cache,
        metadata_connection_config=metadata.sqlite_metadata_connection_config(metadata_path) if metadata_path else None,
        beam_pipeline_args=beam_pipeline_args if beam_pipeline_args is not None else local_beam_args(cfg),
    )


def _our_components(cfg: PipelineConfig, serving_dir: str, image: Optional[str], span: Optional[int],
                    kubeflow: bool) -> List[Any]:
    """The product's components in their order, wired (create_pipeline's docstring; its arguments)."""
    # lazy: our components load TensorFlow and Beam; this module is on the CLI's config path
    from components.embedding_exporter.component import EmbeddingExporter
    from components.embedding_preprocess.component import EmbeddingPreprocess

    example_gen = _example_gen(cfg, span)
    preprocess = EmbeddingPreprocess(examples=example_gen.outputs[EXAMPLES_KEY], config=cfg)
    last_blessed = _last_blessed(serving_dir, kubeflow)
    # First: a registry that cannot say what is served stops the run before any data is read.
    example_gen.add_upstream_node(last_blessed)
    # With a `tuning` section: TFX's stock Tuner before the Trainer, which applies its best values.
    tuning = [_tuner(cfg, preprocess.outputs[TRANSFORMED_EXAMPLES_KEY], image)] if cfg.tuning is not None else []
    trainer = _trainer(cfg, preprocess.outputs[TRANSFORMED_EXAMPLES_KEY], last_blessed.outputs[MODEL_KEY], image,
                       tuning[0].outputs["best_hyperparameters"] if tuning else None)
    exporter = EmbeddingExporter(
        model=trainer.outputs[MODEL_KEY], examples=example_gen.outputs[EXAMPLES_KEY], config=cfg,
        last_blessed_model=last_blessed.outputs[MODEL_KEY],
    )
    pushing = _push_steps(cfg, example_gen.outputs[EXAMPLES_KEY], exporter, serving_dir, kubeflow)
    # With bulk_inference.enabled: [BulkInferrerExampleCopy, BulkInferrer] on the exporter's
    # serving model and blessing (pipelines/bulk_inference.py); the Pusher does not wait for them.
    scoring = bulk_inferrer_components(cfg, example_gen.outputs[EXAMPLES_KEY], exporter.outputs[SERVING_MODEL_KEY],
                                       exporter.outputs[BLESSING_KEY]) if cfg.bulk_inference.enabled else []
    return [last_blessed, example_gen, preprocess, *tuning, trainer, exporter, *pushing, *scoring]


def _last_blessed(serving_dir: str, kubeflow: bool):
    """The step that reads the last blessed model, the one served at the push destination, from the
    model registry the Pusher keeps there (components/model_registry).

    The Trainer warm-starts from it and measures drift against it (continuous); the exporter's
    validation gate compares with it. A container step rather than TFX's Resolver (an ML Metadata
    query that open-source KFP cannot run): the same decision on LocalDagRunner, open-source KFP and
    Vertex.
    """
    # lazy: TFX and our components load TensorFlow and Beam; this module is on the CLI's config path
    from components.model_registry.component import LastBlessedModel

    return LastBlessedModel(serving_dir=serving_dir, run_id=KFP_RUN_ID if kubeflow else None).with_id(LAST_BLESSED)


def _example_gen(cfg: PipelineConfig, span: Optional[int]):
    """EmbeddingExampleGen over the configured input: one input split, hashed into train and eval
    by the configured buckets; with `span`, that span only."""
    # lazy: TFX and our components load TensorFlow and Beam; this module is on the CLI's config path
    from tfx.proto import example_gen_pb2, range_config_pb2
    from components.example_gen.component import EmbeddingExampleGen

    base, pattern = input_location(cfg)
    input_config = example_gen_pb2.Input(splits=[example_gen_pb2.Input.Split(name="single_split", pattern=pattern)])
    output_config = example_gen_pb2.Output(
        split_config=example_gen_pb2.SplitConfig(
            splits=[
                example_gen_pb2.SplitConfig.Split(name="train", hash_buckets=cfg.input.train_buckets),
                example_gen_pb2.SplitConfig.Split(name="eval", hash_buckets=cfg.input.eval_buckets),
            ]
        )
    )
    range_config = None
    if span is not None:
        range_config = range_config_pb2.RangeConfig(
            static_range=range_config_pb2.StaticRange(start_span_number=span, end_span_number=span))
    return EmbeddingExampleGen(cfg, input_base=base, input_config=input_config, output_config=output_config,
                               range_config=range_config)


def _tuner(cfg: PipelineConfig, examples, image: Optional[str] = None):
    """TFX's stock Tuner running our tuner_fn (components/embedding_trainer/tuner.py: KerasTuner
    over `tuning.space`, each trial `tuning.steps_per_trial` steps scored on the held-out slice) on
    the Trainer's examples, with its share of the config (components/config/stages.py) in its
    custom_config; its `best_hyperparameters` go to the Trainer. On Kubeflow with
    `kubeflow.vertex_training`, TFX's Vertex AI Tuner instead: the trials train where the Trainer
    does, `tuning.parallel_trials` at once (`vertex_tuning_config`)."""
    # lazy: TFX and our components load TensorFlow and Beam; this module is on the CLI's config path
    from tfx.proto import trainer_pb2, tuner_pb2
    from components.embedding_trainer.component import Tuner

    tuner_cls, custom_config, tune_args = Tuner, {CONFIG_KEY: stage_json(cfg, "tuner")}, None
    if image and cfg.kubeflow.vertex_training is not None:
        # lazy: only a Vertex route needs TFX's Google Cloud extension and its client libraries
        from components.embedding_trainer.vertex import Tuner as VertexTuner

        tuner_cls, tune_args = VertexTuner, tuner_pb2.TuneArgs(num_parallel_trials=cfg.tuning.parallel_trials)
        custom_config.update(vertex_tuning_config(cfg, image))
    return tuner_cls(
        tuner_fn=TUNER_FN,
        examples=examples,
        train_args=trainer_pb2.TrainArgs(num_steps=cfg.tuning.steps_per_trial),
        eval_args=trainer_pb2.EvalArgs(num_steps=0),  # scored on the train split's held-out slice, not eval
        tune_args=tune_args,
        custom_config=custom_config,
    )


def _trainer(cfg: PipelineConfig, examples, base_model, image: Optional[str], hyperparameters=None):
    """TFX's standard Trainer running our run_fn with the config in its custom_config, or, on
    Kubeflow with `kubeflow.vertex_training`, TFX's Vertex AI Trainer running `image`; with
    `hyperparameters` (the Tuner's best), run_fn applies them over the config."""
    # lazy: TFX and our components load TensorFlow and Beam; this module is on the CLI's config path
    from tfx.proto import trainer_pb2
    from components.embedding_trainer.component import Trainer

    trainer_cls, custom_config = Trainer, {CONFIG_KEY: cfg.to_json()}
    if image and cfg.kubeflow.vertex_training is not None:
        # lazy: only a Vertex route needs TFX's Google Cloud extension and its client libraries
        from components.embedding_trainer.vertex import Trainer as VertexTrainer

        trainer_cls = VertexTrainer
        custom_config.update(vertex_training_config(cfg, image))
    return trainer_cls(
        run_fn=TRAINER_RUN_FN,
        examples=examples,
        base_model=base_model,
        hyperparameters=hyperparameters,
        # Unset train_steps: the run_fn derives the length from training.epochs and the row count.
        train_args=trainer_pb2.TrainArgs(num_steps=cfg.training.train_steps or 0),
        eval_args=trainer_pb2.EvalArgs(num_steps=cfg.training.eval_steps),
        custom_config=custom_config,
    )


def _push_steps(cfg: PipelineConfig, examples, exporter, serving_dir: str, kubeflow: bool) -> List[Any]:
    """The registering Pusher of the exporter's serving model, after [TFExampleCopy, Evaluator] with
    `evaluator.enabled`: TFX's stock Evaluator on the serving model, reading a tf.Example copy of
    the eval split (pipelines/evaluation.py says why); and after [ServingCheck] with
    `serving_check.enabled`: the model loaded and answered as TF Serving would. The Pusher then needs
    their blessings too."""
    # lazy: TFX and our components load TensorFlow and Beam; this module is on the CLI's config path
    from components.embedding_exporter.serving_check_step import ServingCheck
    from components.model_registry.component import RegistryPusher

    evaluation = evaluator_components(cfg, examples, exporter.outputs[SERVING_MODEL_KEY]) if cfg.evaluator.enabled else []
    check = ([ServingCheck(model=exporter.outputs[SERVING_MODEL_KEY], model_blessing=exporter.outputs[BLESSING_KEY])
              .with_id(SERVING_CHECK)] if cfg.serving_check.enabled else [])
    return [*evaluation, *check, RegistryPusher(
        model=exporter.outputs[SERVING_MODEL_KEY], model_blessing=exporter.outputs[BLESSING_KEY],
        serving_dir=serving_dir, pipeline_name=cfg.name,
        run_id=KFP_RUN_ID if kubeflow else None, run_name=KFP_RUN_NAME if kubeflow else None,
        evaluator_blessing=evaluation[-1].outputs["blessing"] if evaluation else None,
        evaluation=evaluation[-1].outputs["evaluation"] if evaluation else None,
        infra_blessing=check[0].outputs[BLESSING_KEY] if check else None,
    ).with_id(PUSHER)]


def without_cache_for(ir, node_ids=NEVER_CACHED):
    """Turns caching off for `node_ids` in a compiled pipeline.

    TFX's compiler gives every node the pipeline's flag (tfx/dsl/compiler/compiler.py); the launcher
    honours each node's own (tfx/orchestration/portable/launcher.py).

    Args:
      ir: the compiled pipeline (`pipeline_pb2.Pipeline`), changed in place.
      node_ids: the nodes never taken from the cache.

    Returns:
      `ir`.
    """
    for node in ir.nodes:
        if node.pipeline_node.node_info.id in node_ids:
            node.pipeline_node.execution_options.caching_options.enable_cache = False
    return ir


def local_beam_args(cfg: PipelineConfig) -> List[str]:
    """A local run's Beam options: the config's, and every SDK worker process of every Beam
    component (stock ones too) importing `beam_runtime.WORKER_PLUGIN`, so that a bundle that fails
    while the log's disk is full still reports its failure instead of hanging the run.

    Args:
      cfg: the configuration.

    Returns:
      The options.
    """
    args = cfg.beam_pipeline_args()
    return args if any(a.startswith("--beam_plugins") for a in args) else args + [f"--beam_plugins={WORKER_PLUGIN}"]


def run_locally(p) -> None:
    """Runs the pipeline with TFX's LocalDagRunner, the NEVER_CACHED steps always executed.

    Args:
      p: the pipeline (`create_pipeline`).

    Raises:
      Exception: whatever a component raised; TFX has marked its execution FAILED in ML Metadata.
    """
    # lazy: TFX's runner loads TensorFlow; this module is on the CLI's config path
    from tfx.orchestration.local.local_dag_runner import LocalDagRunner
    from tfx.orchestration.portable import tfx_runner

    skip_tfx_sdist_for_local_runners()
    LocalDagRunner().run_with_ir(without_cache_for(tfx_runner._make_pipeline_proto(p)))  # pylint: disable=protected-access
