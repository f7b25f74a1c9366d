"""The one typed configuration model that every stage reads.

A YAML file in `configs/` is loaded into `PipelineConfig` (plain dataclasses), checked field by
field, and resolved once: every categorical feature is bound to exactly one table, so the
preprocessing, the trainer and the exporter all see the same tables, vocabularies and dims.

- `schema`: the dataclasses of every section and the values each field allows (`ConfigError`).
- `loading`: YAML / JSON -> dataclasses with type checks (`load_config`, `parse_config`,
  `config_from_json`) and back (`PipelineConfig.to_json`).
- `validation`: `resolve`, one check per section, in order; `binding`: features onto tables.
- `resolved`: what resolution derives, frozen (`cfg.resolved`: each table's features and whether
  its dim was set, the source file).
- `beam_args`: Beam options of a local run (`cfg.beam_pipeline_args()`). Kubeflow's wiring (runners,
  component ids, the `kubeflow` section's checks) is pipelines/kubeflow_config.py's.

Any problem raises `ConfigError`, whose message names the file, the field path (for example
`categorical_features[3].dim`) and what to change. `load_config` never touches TensorFlow, TFX or
Beam, so a bad file is rejected in well under a second, before any work starts.
"""
from components.config.binding import table_optimizer
from components.config.checks import check_choice, check_positive
from components.config.loading import config_from_json, load_config, parse_config
from components.config.resolved import ResolvedConfig, ResolvedTable
from components.config.schema import (
    COMBINERS,
    COMPRESSIONS,
    DIM_RULES,
    DIRECT_RUNNING_MODES,
    INPUT_FORMATS,
    LABEL_RULE_OPS,
    LAYOUT_KINDS,
    MODEL_TYPES,
    OPTIMIZERS,
    PARTITION_STRATEGIES,
    SCHEDULES,
    TABLE_DTYPES,
    BeamConfig,
    CategoricalDefaults,
    CategoricalFeature,
    ConfigError,
    DenseFeature,
    EarlyStoppingConfig,
    WIDE_SUFFIX,
    WideConfig,
    DenseBucketsConfig,
    EmbeddingConfig,
    ExportConfig,
    ExportLayoutConfig,
    GradientMultiplierConfig,
    InputConfig,
    KubeflowBeamConfig,
    KubeflowComponentConfig,
    KubeflowConfig,
    LabelRule,
    OptimizerConfig,
    OptimizerOverride,
    PipelineConfig,
    ScheduleConfig,
    StatisticsConfig,
    TableConfig,
    TolerationConfig,
    TopologyConfig,
    TrainingConfig,
    TransformedExamplesConfig,
    VertexTrainingConfig,
    VocabularyOptions,
    InitializerOptions,
)
from components.config.validation import check_export_config, register_check, resolve

__all__ = [
    "COMBINERS", "COMPRESSIONS", "DIM_RULES", "DIRECT_RUNNING_MODES", "INPUT_FORMATS", "LABEL_RULE_OPS",
    "LAYOUT_KINDS", "MODEL_TYPES", "OPTIMIZERS", "PARTITION_STRATEGIES", "SCHEDULES", "TABLE_DTYPES",
    "BeamConfig", "CategoricalDefaults", "CategoricalFeature", "ConfigError", "DenseFeature", "EarlyStoppingConfig", "EmbeddingConfig", "WideConfig", "WIDE_SUFFIX", "DenseBucketsConfig",
    "ExportConfig", "ExportLayoutConfig", "GradientMultiplierConfig", "InputConfig", "KubeflowBeamConfig", "KubeflowComponentConfig",
    "KubeflowConfig", "LabelRule", "OptimizerConfig", "OptimizerOverride", "PipelineConfig", "ResolvedConfig", "ResolvedTable",
    "ScheduleConfig", "StatisticsConfig", "TableConfig", "TolerationConfig", "TopologyConfig", "TrainingConfig",
    "TransformedExamplesConfig", "VertexTrainingConfig", "VocabularyOptions", "InitializerOptions",
    "check_choice", "check_export_config", "check_positive", "config_from_json", "load_config", "parse_config",
    "register_check", "resolve", "table_optimizer",
]
