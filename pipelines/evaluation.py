"""TFX's stock Evaluator (TFMA) in the pipeline: its EvalConfig from the `evaluator` section, and
that section's checks (registered with config resolution when pipelines/ loads).

Why the Evaluator reads a tf.Example copy of the eval split, not ExampleGen's Parquet examples:
TFMA scores a TensorFlow model by feeding it the raw serialized records beside the decoded
columns, and tfx_bsl's ParquetTFXIO carries none (the Evaluator fails with `AssertionError: Raw
examples not found`). Our serving model's `serving_default` takes serialized tf.Examples of raw
feature values, which is what a TFRecord TFXIO carries. Three ways were open:

- every ExampleGen run also writes tf.Example TFRecords (for all splits, or the eval split): the
  default path would pay a protobuf per row and a second copy of the data even with the
  Evaluator off, which is what the Parquet payload exists to avoid;
- raw records carried as a column beside the Parquet columns: the same per-row cost on the
  default path, and every reader of the examples (StatisticsGen, SchemaGen, preprocessing) would
  see a column that is no feature;
- a separate step, only when `evaluator.enabled`: `TFExampleCopy` (components/tf_example_copy)
  re-encodes the eval split's Parquet rows as tf.Examples with tfx_bsl's encoder (the same encoder
  the exporter uses for its AUC and parity sample, so the Evaluator and the exporter score the same
  records) into a second Examples artifact. Chosen: the default path is unchanged (no cost with the
  Evaluator off), and the cost with it on is one Beam pass over the eval split.

The Evaluator scores the exporter's serving model (`serving_default`, output `probabilities`) on
that copy. Its blessing (AUC at least `evaluator.min_auc`, calibration within
`evaluator.calibration_bounds` when set) is a second blessing the registering Pusher requires
(components/model_registry); the registry entry records it with the Evaluator's metrics.
"""
from __future__ import annotations

from typing import List

from components.config.schema import ConfigError, PipelineConfig
from components.config.validation import register_check
from components.tfx_wiring.component_keys import TF_EXAMPLES_KEY

SIGNATURE = "serving_default"  # the exporter's serving signature: serialized tf.Examples in
PREDICTION_KEY = "probabilities"  # its output
SPLIT = "eval"
METRICS = ("AUC", "Calibration", "ExampleCount", "MeanLabel", "MeanPrediction")
AUC_METRIC = "auc"  # TFMA's names of the AUC and calibration metrics in its results
CALIBRATION_METRIC = "calibration"


def check_evaluator_config(cfg: PipelineConfig) -> None:
    """Checks the `evaluator` section: a threshold TFX's Evaluator can bless by, slices on known columns.

    Args:
      cfg: the configuration being resolved.

    Raises:
      ConfigError: min_auc is not in (0, 1), calibration_bounds is not [lower, upper] with
        0 <= lower < upper, or a slice feature is the label, unknown, or named twice.
    """
    e, prefix = cfg.evaluator, ""  # parse_config names the file
    if isinstance(e.min_auc, bool) or not isinstance(e.min_auc, (int, float)) or not 0 < e.min_auc < 1:
        raise ConfigError(f"{prefix}evaluator.min_auc: {e.min_auc!r} is not an AUC in (0, 1); e.g. 0.5 (better than chance)")
    if e.calibration_bounds is not None:
        b = e.calibration_bounds
        if len(b) != 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in b) or not 0 <= b[0] < b[1]:
            raise ConfigError(f"{prefix}evaluator.calibration_bounds: {b!r} is not [lower, upper] with 0 <= lower < upper; "
                              "e.g. [0.8, 1.2], or null to report calibration without requiring it")
    columns = cfg.numeric_columns() + cfg.categorical_columns()
    for i, name in enumerate(e.slice_features):
        if name == cfg.label or name == cfg.label_source():
            raise ConfigError(f"{prefix}evaluator.slice_features[{i}]: {name!r} is the label; slice by an input feature")
        if name not in columns:
            raise ConfigError(f"{prefix}evaluator.slice_features[{i}]: {name!r} is not a configured column; "
                              f"one of {', '.join(sorted(columns))}")
    dupes = sorted({n for n in e.slice_features if e.slice_features.count(n) > 1})
    if dupes:
        raise ConfigError(f"{prefix}evaluator.slice_features: {', '.join(dupes)} named twice; name each column once")


register_check("evaluator", check_evaluator_config)


def eval_config(cfg: PipelineConfig):
    """Builds the Evaluator's EvalConfig from the `evaluator` section.

    Args:
      cfg: the resolved configuration.

    Returns:
      A `tfma.EvalConfig`: the serving signature and its output, the label, AUC and calibration
      (with the section's thresholds on the overall slice), and one slicing spec per named
      feature besides the overall slice.
    """
    # lazy: TFMA loads TensorFlow and Beam; the evaluator section's checks run on the config path
    import tensorflow_model_analysis as tfma

    e = cfg.evaluator
    thresholds = {AUC_METRIC: tfma.MetricThreshold(value_threshold=tfma.GenericValueThreshold(
        lower_bound={"value": float(e.min_auc)}))}
    if e.calibration_bounds is not None:
        lo, hi = e.calibration_bounds
        thresholds[CALIBRATION_METRIC] = tfma.MetricThreshold(value_threshold=tfma.GenericValueThreshold(
            lower_bound={"value": float(lo)}, upper_bound={"value": float(hi)}))
    # The exact AUC needs every score; TFMA bins them. 10,000 thresholds (TFMA's default) keeps it
    # within about 1e-4 of the exact rank AUC the exporter computes.
    # Thresholds on the overall slice only: a `threshold` would hold every slice to them, and a
    # slice of one class has no AUC.
    overall = [tfma.SlicingSpec()]
    metrics = [tfma.MetricConfig(class_name=m, per_slice_thresholds=(
        [tfma.PerSliceMetricThreshold(slicing_specs=overall, threshold=thresholds[m.lower()])]
        if m.lower() in thresholds else [])) for m in METRICS]
    return tfma.EvalConfig(
        model_specs=[tfma.ModelSpec(signature_name=SIGNATURE, label_key=cfg.label, prediction_key=PREDICTION_KEY)],
        metrics_specs=[tfma.MetricsSpec(metrics=metrics)],
        slicing_specs=overall + [tfma.SlicingSpec(feature_keys=[f]) for f in e.slice_features],
    )


def evaluator_components(cfg: PipelineConfig, examples, serving_model) -> List:
    """Builds the components that run TFX's Evaluator, for `create_pipeline`.

    Args:
      cfg: the resolved configuration.
      examples: ExampleGen's Parquet `Examples` channel.
      serving_model: the exporter's serving `Model` channel.

    Returns:
      [TFExampleCopy of the eval split, Evaluator]; the Evaluator's outputs are `blessing` and
      `evaluation`.
    """
    # lazy: TFX's components load TensorFlow; the evaluator section's checks run on the config path
    from tfx.components.evaluator.component import Evaluator
    from components.tf_example_copy.component import TFExampleCopy

    copy = TFExampleCopy(examples=examples, splits=[SPLIT])
    evaluator = Evaluator(examples=copy.outputs[TF_EXAMPLES_KEY], model=serving_model, eval_config=eval_config(cfg),
                          example_splits=[SPLIT])
    return [copy, evaluator]
