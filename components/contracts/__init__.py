"""What the stages hand each other, typed and TensorFlow-free.

Preprocessing writes the vocabulary manifest (`manifest.VocabularyManifest`) and the embedding-ID
statistics (`statistics.EmbeddingStatistics`); the trainer derives the embedding plan
(`plan.EmbeddingPlan`) from them and the config; the exporter reads the plan and the manifest. Each
is a frozen dataclass with `to_json`/`from_json` and a version, so a stage reads what another wrote
through one definition instead of string keys. `artifacts` names every file they are stored in;
`sizing` holds the row and memory rules every stage uses; `names` which configured names are safe
and the serving input name of every raw column.

Nothing here imports TensorFlow or Beam: the contracts load in a second and can be checked without
a pipeline. Rendering the plan into TensorFlow objects stays in the trainer
(`components.embedding_model.tf_objects`; the run's length: `components.embedding_trainer.run_plan`).
"""
