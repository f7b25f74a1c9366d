"""The TFX pipeline: ExampleGen -> EmbeddingPreprocess -> Trainer -> EmbeddingExporter [-> TFExampleCopy,
Evaluator] -> Pusher."""
import components  # noqa: F401  (selects legacy Keras before anything imports TensorFlow)
from pipelines import kubeflow_config  # noqa: F401  (registers the `kubeflow` section's checks with config resolution)
from pipelines import evaluation  # noqa: F401  (registers the `evaluator` section's checks)
from pipelines import bulk_inference  # noqa: F401  (registers the `bulk_inference` section's checks)
