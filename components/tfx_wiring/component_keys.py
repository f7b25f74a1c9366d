"""The keys of this project's components, in one module as TFX keeps its own
(tfx/types/standard_component_specs.py): each input, output and execution property a component
spec declares, and each custom_config key the stock Trainer and Tuner pass our functions. A key
that two components share (the Examples input, the push destination) is defined once, so they
cannot drift apart. TensorFlow-free: the config path and the pipeline's construction import it.
"""

# The pipeline configuration (JSON): an execution property of our components, and the stock
# Trainer's and Tuner's custom_config key.
CONFIG_KEY = "config_json"

# Inputs and outputs (a component spec's channel names).
EXAMPLES_KEY = "examples"  # Examples: ExampleGen's Parquet splits (preprocessing, the exporter, the copy)
MODEL_KEY = "model"  # Model: the Trainer's artifact (the exporter's input, the registry's)
TRANSFORMED_EXAMPLES_KEY = "transformed_examples"  # preprocessing's output: examples of embedding IDs
VOCABULARY_KEY = "vocabulary"  # preprocessing's output: the vocabularies and their manifest
STATISTICS_KEY = "statistics"  # preprocessing's output: the embedding-ID statistics
SERVING_MODEL_KEY = "serving_model"  # the exporter's output: the CPU serving SavedModel
BLESSING_KEY = "blessing"  # the exporter's output: the validation gate's verdict
LAST_MODEL_KEY = "last_blessed_model"  # optional: LastBlessedModel's pointer to the served model
EVALUATION_KEY = "evaluation"  # optional: TFX Evaluator's ModelEvaluation, for the registry
EVALUATOR_BLESSING_KEY = "evaluator_blessing"  # optional: TFX Evaluator's ModelBlessing, for the registry
TF_EXAMPLES_KEY = "tf_examples"  # the copy's output: the splits as TFRecords of tf.Example
SPLITS_KEY = "splits"  # the copy's execution property: JSON list of split names

# The push destination: the registry's execution property and the Trainer's custom_config key
# (training.checkpoint_dir is refused inside it); without it the Trainer reads it from the
# LastBlessedModel lookup it gets as `base_model`.
SERVING_DIR_KEY = "serving_dir"
# The registry's execution properties: who pushed a model.
PIPELINE_NAME_KEY = "pipeline_name"
RUN_ID_KEY = "run_id"
RUN_NAME_KEY = "run_name"

# The transformed examples' artifact URI in the Trainer's and Tuner's custom_config: TFX 1.16's
# FnArgs carries the split files but not the artifact they belong to, whose root holds the manifest
# and statistics; our Trainer and Tuner executors (embedding_trainer/executors.py) add it.
EXAMPLES_URI_KEY = "transformed_examples_uri"
# The Tuner's `tuner_results` artifact URI in its custom_config (executors.py): where the search
# writes its record (every trial, failed ones too: artifacts.TUNING_TRIALS_FILE) beside TFX's own results.
TUNING_RECORD_URI_KEY = "tuning_record_uri"
