"""TFX's stock BulkInferrer in the pipeline: offline scoring of ExampleGen splits with the exporter's
serving model, and the `bulk_inference` section's checks (registered with config resolution when
pipelines/ loads).

BulkInferrer (tfx_bsl's RunInference) feeds the model raw serialized records, so it reads a
tf.Example copy of the named splits, as the Evaluator does (pipelines/evaluation.py says why the
Parquet examples carry none and why the copy is a step of its own). Its own copy, not the
Evaluator's: each copy's execution properties name only its own splits, so switching one of the
two on or off, or changing `bulk_inference.splits`, leaves the other's cache key as it was; the
cost with both on and `eval` scored is a second Beam pass over the eval split.

The BulkInferrer scores the copy with the exporter's serving model (`serving_default`: serialized
tf.Examples in, `probabilities` out) and its blessing: an unblessed model is not scored (TFX's
executor writes an empty `inference_result`). Nothing waits for it: the Pusher does not read it.
"""
from __future__ import annotations

from typing import List

from components.config.schema import ConfigError, PipelineConfig
from components.reporting.progress import FILE_SCORING
from components.config.validation import register_check
from components.tfx_wiring.component_keys import TF_EXAMPLES_KEY

SIGNATURE = "serving_default"  # the exporter's serving signature: serialized tf.Examples in
# The splits EmbeddingExampleGen writes (pipelines.pipeline._example_gen's SplitConfig).
EXAMPLE_SPLITS = ("train", "eval")
COPY_ID = "BulkInferrerExampleCopy"  # its tf.Example copy (the Evaluator's is `TFExampleCopy`)
INFERRER_ID = "BulkInferrer"


def check_bulk_inference_config(cfg: PipelineConfig) -> None:
    """Checks the `bulk_inference` section: splits ExampleGen writes, each named once.

    Args:
      cfg: the configuration being resolved.

    Raises:
      ConfigError: `splits` is empty, names a split ExampleGen does not write, or names one twice.
    """
    splits = cfg.bulk_inference.splits
    known = ", ".join(EXAMPLE_SPLITS)
    path = cfg.bulk_inference.path
    if path is not None and not path.lower().endswith((".csv", ".parquet", ".pq")):
        raise ConfigError(f"bulk_inference.path: {path!r} is not a .csv or .parquet file; name the file to score")
    if cfg.bulk_inference.carry and path is None:
        raise ConfigError("bulk_inference.carry: set bulk_inference.path, the file whose columns it copies")
    if not splits and path is None:
        raise ConfigError(f"bulk_inference.splits: empty; name the splits to score, some of {known}, or a file "
                          "(bulk_inference.path)")
    for i, s in enumerate(splits):
        if s not in EXAMPLE_SPLITS:
            raise ConfigError(f"bulk_inference.splits[{i}]: {s!r} is not a split ExampleGen writes; one of {known}")
    dupes = sorted({s for s in splits if splits.count(s) > 1})
    if dupes:
        raise ConfigError(f"bulk_inference.splits: {', '.join(dupes)} named twice; name each split once")


register_check("bulk_inference", check_bulk_inference_config)


def bulk_inferrer_components(cfg: PipelineConfig, examples, serving_model, blessing) -> List:
    """Builds the components that run TFX's BulkInferrer, for `create_pipeline` or a user's
    `extra_components` function.

    Args:
      cfg: the resolved configuration (`bulk_inference.splits`).
      examples: ExampleGen's Parquet `Examples` channel.
      serving_model: the exporter's serving `Model` channel.
      blessing: the exporter's `ModelBlessing` channel: an unblessed model is not scored.

    Returns:
      [TFExampleCopy of the splits (id `BulkInferrerExampleCopy`), BulkInferrer] when splits are
      named (the BulkInferrer's output is `inference_result`: gzipped TFRecords of PredictionLog),
      and [FileScoring] when `bulk_inference.path` names a file (its output `scores`).
    """
    # lazy: TFX's components load TensorFlow; the bulk_inference section's checks run on the config path
    from tfx.components.bulk_inferrer.component import BulkInferrer
    from tfx.dsl.components.base import executor_spec
    from tfx.proto import bulk_inferrer_pb2
    from components.embedding_exporter.scoring_step import FileScoring
    from components.tf_example_copy.component import TFExampleCopy
    from pipelines.bulk_inferrer_executor import BulkInferrerExecutor

    b = cfg.bulk_inference
    steps = []
    if b.splits:
        copy = TFExampleCopy(examples=examples, splits=list(b.splits)).with_id(COPY_ID)
        inferrer = BulkInferrer(
            examples=copy.outputs[TF_EXAMPLES_KEY], model=serving_model, model_blessing=blessing,
            data_spec=bulk_inferrer_pb2.DataSpec(example_splits=list(b.splits)),
            model_spec=bulk_inferrer_pb2.ModelSpec(model_signature_name=[SIGNATURE]),
        ).with_id(INFERRER_ID)
        inferrer.executor_spec = executor_spec.BeamExecutorSpec(BulkInferrerExecutor)  # progress and a record
        steps += [copy, inferrer]
    if b.path:  # the file the config names, as `python -m pipelines score` scores it
        steps.append(FileScoring(model=serving_model, model_blessing=blessing, input_path=b.path,
                                 carry=b.carry).with_id(FILE_SCORING))
    return steps
