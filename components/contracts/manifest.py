"""The vocabulary manifest: what preprocessing built, for the trainer and the exporter.

Written by preprocessing as `manifest.json` in the EmbeddingVocabulary artifact (and as
`embedding_manifest.json` beside the transformed examples); read by the trainer (input parsing,
model features, plan rows) and the exporter (serving transform, vocabulary assets).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Dict, List, Mapping, Optional, Set, Tuple

from components.config.choices import FORMAT_EXAMPLES, Combiner, VocabularyKind
from components.contracts._json import StoredContract, pick
from components.contracts.serving_inputs import ServingInput
from components.rules.names import serving_input_names
from components.rules.names import by_name

MANIFEST_VERSION = 1


@dataclass(frozen=True)
class VocabularyEntry:
    """One table's vocabulary: its files (in `vocabulary_dir`), size, OOV buckets and rows."""

    file: str
    counts_file: str
    size: int
    distinct_before_pruning: int
    num_oov_buckets: int
    rows: int  # size + num_oov_buckets (planning.sizing.table_rows)
    dim: Optional[int]
    combiner: Combiner
    features: Tuple[str, ...]
    # rulebook V1-V4: counted / list / file (the vocabulary file's lines), hashed (size 0,
    # num_oov_buckets = num_buckets), identity (size = num_buckets IDs, no file lines, no OOV rows)
    kind: VocabularyKind = VocabularyKind.COUNTED
    default_value: Optional[int] = None  # identity: the row of tokens that are no IDs; None: dropped
    # SHA-256 of the vocabulary file's bytes as preprocessing wrote it (None: no file, or a manifest
    # from before it was recorded): a warm start compares it before carrying rows by line
    sha256: Optional[str] = None


@dataclass(frozen=True)
class DenseFeatureEntry:
    """A dense feature as preprocessing read it."""

    name: str
    column: str  # the raw column it is read from
    fill_value: float


WEIGHTS_SUFFIX = "__weights"  # a weighted feature's ID weights in the transformed examples: <feature>__weights


def weights_key(feature: str) -> str:
    """Where a weighted feature's ID weights travel (transformed examples, model inputs).

    Args:
      feature: the categorical feature's name.

    Returns:
      `<feature>__weights`.
    """
    return feature + WEIGHTS_SUFFIX


ROW_LENGTHS_SUFFIX = "__row_lengths"
# Files of transformed examples: <TRANSFORMED_PREFIX>-*; with blocks, every block of those holds
# exactly `block_rows` rows, and the shorter last block of a batch goes to <TAIL_PREFIX>-* files
# (a training batch is then a whole number of blocks, parsed in one call; tail rows are re-cut).
TRANSFORMED_PREFIX = "transformed_examples"
TAIL_PREFIX = "transformed_tail"


def row_lengths_key(feature: str) -> str:
    """Where a categorical feature's IDs per row travel in a block of transformed rows.

    Args:
      feature: the categorical feature's name.

    Returns:
      `<feature>__row_lengths`.
    """
    return feature + ROW_LENGTHS_SUFFIX


@dataclass(frozen=True)
class CategoricalFeatureEntry:
    """A categorical feature as preprocessing read it: its column, table and multi-hot rules."""

    name: str
    column: str
    table: str
    separator: Optional[str]
    max_length: Optional[int]
    weight_column: Optional[str] = None  # W1: the numeric column weighing each row's IDs


def feature_entries(cfg) -> Tuple[Tuple[DenseFeatureEntry, ...], Tuple[CategoricalFeatureEntry, ...]]:
    """How preprocessing reads `cfg`'s features, as its manifest records them.

    Args:
      cfg: a PipelineConfig.

    Returns:
      (dense entries, categorical entries), in the config's order: what build_manifest writes, and
      what a training stage's config must equal (resolved_input.check_features_match).
    """
    dense = tuple(DenseFeatureEntry(d.name, d.source, d.fill_value) for d in cfg.dense_features)
    categorical = tuple(CategoricalFeatureEntry(f.name, f.source, cfg.feature_table(f).name, f.separator, f.max_length,
                                                f.weight_column) for f in cfg.categorical_features)
    return dense, categorical


@dataclass(frozen=True)
class VocabularyManifest(StoredContract):
    """Features, their raw kinds (as ExampleGen stored them) and every table's vocabulary."""

    CONTRACT = "vocabulary manifest"
    VERSION = MANIFEST_VERSION
    REWRITE = "rerun preprocessing with this version of the pipeline"

    vocabulary_dir: str
    label: str
    raw_feature_kinds: Mapping[str, str]  # column -> rulebook kind (bytes / int64 / float)
    dense_features: Tuple[DenseFeatureEntry, ...]
    categorical_features: Tuple[CategoricalFeatureEntry, ...]
    vocabularies: Mapping[str, VocabularyEntry]
    version: int = MANIFEST_VERSION
    # FORMAT_BLOCKS or FORMAT_EXAMPLES; a manifest without the field describes rows
    transformed_format: str = FORMAT_EXAMPLES
    block_rows: int = 0  # rows per block with FORMAT_BLOCKS (the last block of a batch may hold fewer)

    def vocabulary(self, table: str) -> VocabularyEntry:
        """One table's vocabulary entry.

        Args:
          table: the table's name.

        Returns:
          Its `VocabularyEntry`.

        Raises:
          KeyError: the manifest has no vocabulary for `table`.
        """
        return by_name(self.vocabularies, table, "has no vocabulary in the manifest")

    @property
    def dense_names(self) -> List[str]:
        """The dense features' names, in manifest order."""
        return [d.name for d in self.dense_features]

    @property
    def categorical_names(self) -> List[str]:
        """The categorical features' names, in manifest order."""
        return [f.name for f in self.categorical_features]

    @property
    def weighted_names(self) -> List[str]:
        """Categorical features whose IDs carry weights (`weights_key(name)` beside their IDs)."""
        return [f.name for f in self.categorical_features if f.weight_column]

    def raw_columns(self) -> List[str]:
        """Every raw column the model reads.

        Returns:
          Dense columns first, then categorical, then ID weights; each once.
        """
        cols = [d.column for d in self.dense_features] + [f.column for f in self.categorical_features]
        cols += [f.weight_column for f in self.categorical_features if f.weight_column]
        return list(dict.fromkeys(cols))

    def numeric_columns(self) -> Set[str]:
        """The raw columns the model reads as numbers: dense features' and ID weights'.

        Returns:
          Their names (float32 inputs of the JSON signatures).
        """
        return {d.column for d in self.dense_features} | {
            f.weight_column for f in self.categorical_features if f.weight_column}

    def serving_input_names(self) -> Dict[str, str]:
        """Each raw column's input name in the serving model's JSON signatures.

        Returns:
          {column: input name} in `raw_columns` order, by the one rule of
          `components.rules.names.serving_input_names`.
        """
        return serving_input_names(self.raw_columns())

    def serving_inputs(self, typed_columns: Collection[str] = ()) -> List[ServingInput]:
        """The serving model's JSON inputs, as the exporter records them with the model.

        Args:
          typed_columns: the columns `serve_typed_features` takes as int64 numbers (the serving
            transform's `integer_columns`); empty when the model has no such signature.

        Returns:
          One `ServingInput` per raw column, in `raw_columns` order: its input name, dtype and the
          features that read it.
        """
        numeric = self.numeric_columns()
        readers: Dict[str, List[str]] = {}
        for d in self.dense_features:
            readers.setdefault(d.column, []).append(d.name)
        for f in self.categorical_features:
            readers.setdefault(f.column, []).append(f.name)
            if f.weight_column:
                readers.setdefault(f.weight_column, []).append(f.name)
        return [
            ServingInput(input=name, column=c, dtype="float32" if c in numeric else "string",
                         typed_dtype="int64" if c in typed_columns else None, features=tuple(dict.fromkeys(readers[c])))
            for c, name in self.serving_input_names().items()
        ]

    def kind_mismatches(self, found: Mapping[str, str]) -> List[str]:
        """The raw columns the model reads that the examples hold as another kind than preprocessing read.

        The serving model's `serving_default` parses each column as its `raw_feature_kinds` entry, and
        `tf.io.parse_example` fails on any other type.

        Args:
          found: column -> kind of the columns that hold values in the examples (a column without a
            value fits any parse spec).

        Returns:
          One line per mismatch, e.g. "I3 (int64 in the examples, parsed as float)".
        """
        return [
            f"{c} ({found[c]} in the examples, parsed as {self.raw_feature_kinds[c]})"
            for c in self.raw_columns()
            if c in found and c in self.raw_feature_kinds and found[c] != self.raw_feature_kinds[c]
        ]

    @classmethod
    def _from_fields(cls, data: Dict[str, Any], source: str) -> "VocabularyManifest":
        """The manifest of its stored fields: each vocabulary, dense and categorical feature typed."""
        vocabularies = {
            name: pick(VocabularyEntry, v, f"{source}: vocabularies.{name}", features=tuple(v.get("features", ())))
            for name, v in data.get("vocabularies", {}).items()
        }
        return pick(
            cls, data, source,
            raw_feature_kinds=dict(data.get("raw_feature_kinds", {})),
            dense_features=tuple(pick(DenseFeatureEntry, d, f"{source}: dense_features") for d in data.get("dense_features", ())),
            categorical_features=tuple(
                pick(CategoricalFeatureEntry, f, f"{source}: categorical_features") for f in data.get("categorical_features", ())
            ),
            vocabularies=vocabularies,
        )
