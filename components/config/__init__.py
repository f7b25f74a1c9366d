"""The one typed configuration model that every stage reads.

A YAML file in `configs/` is loaded into `PipelineConfig` (plain dataclasses), checked field by
field, and resolved once: every categorical feature is bound to exactly one table, so the
preprocessing, the trainer and the exporter all see the same tables, vocabularies and dims.

- `choices`: the closed sets of values (`Combiner`, `Placement`, `OptimizerName`, ...) as `str`
  enums; the loader converts each such field to its member.
- `schema`: the dataclasses of every section and the fields they allow (`ConfigError`).
- `loading`: YAML / JSON -> dataclasses with type checks (`load_config`, `parse_config`,
  `config_from_json`); `serialization`: back to a dict or JSON (`PipelineConfig.to_json`).
- `validation`: `resolve`, one check per section, in order; `binding`: features onto tables;
  `checks`: the field checks they share.
- `resolved`: what resolution derives, frozen (`cfg.resolved`: each table's features and whether
  its dim was set, the source file).
- `tuning`: the `tuning` section's search space (which fields a Tuner trial may set) and its
  checks; `loading.apply_values` sets a trial's values over a copy of a config.
- `stages`: each component's share of the configuration (what TFX's caching fingerprints).
  Beam options of a local run are `cfg.beam_pipeline_args()`; Kubeflow's wiring (runners,
  component ids, the `kubeflow` section's checks) is pipelines/kubeflow_config.py's.

Any problem raises `ConfigError`, whose message names the file, the field path (for example
`categorical_features[3].dim`) and what to change. `load_config` never touches TensorFlow, TFX or
Beam, so a bad file is rejected in well under a second, before any work starts.
"""
