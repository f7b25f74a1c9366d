"""What the stages hand each other, typed and TensorFlow-free: the types only, nothing that derives them.

Preprocessing writes the vocabulary manifest (`manifest.VocabularyManifest`) and the embedding-ID
statistics (`statistics.EmbeddingStatistics`); the trainer records the embedding plan
(`plan.EmbeddingPlan`) that components.planning derives from them and the config; the exporter
reads the plan and the manifest and records the serving model's inputs
(`serving_inputs.ServingInput`). Each is a frozen dataclass with `to_json`/`from_json` and a
version, so a stage reads what another wrote through one definition instead of string keys.
`artifacts` names every file they are stored in. The contracts import only the configuration's
closed sets and the rules below them (components.config, components.rules).

Nothing here imports TensorFlow or Beam: the contracts load in a second and can be checked without
a pipeline.
"""
