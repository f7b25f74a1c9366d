"""Custom TFX artifact types of the product.

Kubeflow rules (see shared notes): TYPE_NAME is `<top-level module>.<Class>` so the V2 entrypoint
can import the class inside the container, matches KFP's schema-title pattern, and declares no
PROPERTIES (custom types compile with an empty property schema); use custom properties instead.
"""
from tfx.types import artifact


class EmbeddingVocabulary(artifact.Artifact):
    """Vocabulary files (one token per line, frequency order) plus `manifest.json`.

    The manifest says, per vocabulary, its size, OOV buckets, the features that use it and the
    raw feature types ExampleGen stored, so the trainer and the exporter need nothing else.
    """

    TYPE_NAME = "components.EmbeddingVocabulary"


class EmbeddingStatistics(artifact.Artifact):
    """Embedding-ID statistics (`statistics.json`) computed by preprocessing."""

    TYPE_NAME = "components.EmbeddingStatistics"


class ScoredFile(artifact.Artifact):
    """A file scored by the serving model (`bulk_inference.path`): `scores.parquet` (row, score, the
    carried columns) and `scoring_record.json` (embedding_exporter/scoring_step.py)."""

    TYPE_NAME = "components.ScoredFile"
