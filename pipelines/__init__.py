"""The TFX pipeline: ExampleGen -> EmbeddingPreprocess -> Trainer -> EmbeddingExporter -> Pusher."""
import components  # noqa: F401  (selects legacy Keras before anything imports TensorFlow)
