"""TFX components for recommendation models trained with TPU embeddings.

Importing this package is the one place that selects legacy Keras: tensorflow-recommenders 0.7.7
refuses Keras 3, and TF 2.16 picks the Keras version when TensorFlow is first imported, so every
entry point (CLI, tests, TFX executors, the container) imports `components` before TensorFlow.

Custom artifact types are reachable as `components.<Class>`, which is how TFX's Kubeflow V2
entrypoint imports them from their TYPE_NAME. They are loaded lazily so that the configuration
and the data generator stay importable without TFX.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

_ARTIFACT_TYPES = ("EmbeddingVocabulary", "EmbeddingStatistics")


def __getattr__(name: str):
    if name in _ARTIFACT_TYPES:
        # lazy: the artifact types load TFX; `import components` stays light for the config path
        from components.tfx_wiring import artifact_types

        return getattr(artifact_types, name)
    raise AttributeError(f"module 'components' has no attribute {name!r}")
