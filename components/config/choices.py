"""The closed sets of values the configuration and the contracts allow, as `str` enums.

Each set is a `Choice`: a `str` enum in the manner of torchrec's `PoolingType`, whose members
compare equal to their values (`Combiner.MEAN == "mean"`), hash as them (so they key the same dict
entries) and print, format, repr and serialize (JSON and YAML) as the plain value. The config loader
converts each field's string to its member once, so a typo fails at load time naming the field,
and every later comparison is against a member rather than a string literal.
"""
from __future__ import annotations

import enum
from typing import Tuple

import yaml


class Choice(str, enum.Enum):
    """A closed set of string values; a member behaves as its value wherever a string is expected."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __repr__(self) -> str:
        # Messages quote a field's value with !r; a member reads there as the string the user wrote.
        return repr(self.value)

    @classmethod
    def values(cls) -> Tuple[str, ...]:
        """The plain string values, in declaration order.

        Returns:
          One string per member (what messages list and argparse `choices` take).
        """
        return tuple(member.value for member in cls)


def _represent_choice(dumper: yaml.BaseDumper, member: Choice) -> yaml.Node:
    return dumper.represent_str(member.value)


# yaml's dumpers choose a representer by exact type; without these a member would not dump (safe)
# or dump as a Python object tag.
for _dumper in (yaml.SafeDumper, yaml.Dumper):
    _dumper.add_multi_representer(Choice, _represent_choice)


class Combiner(Choice):
    """How a table pools a feature's IDs (the seeds' `combiner`)."""

    MEAN = "mean"
    SUM = "sum"
    SQRTN = "sqrtn"


class VocabularyKind(Choice):
    """How a table's values become rows (rulebook V1-V4)."""

    COUNTED = "counted"
    LIST = "list"
    FILE = "file"
    HASHED = "hashed"
    IDENTITY = "identity"


class InitializerKind(Choice):
    """How a table's rows start."""

    TRUNCATED_NORMAL = "truncated_normal"
    RANDOM_NORMAL = "random_normal"
    RANDOM_UNIFORM = "random_uniform"
    ZEROS = "zeros"


class InputFormat(Choice):
    """The file format of the input examples (`input.format`)."""

    CSV = "csv"
    TFRECORD = "tfrecord"
    PARQUET = "parquet"


class LabelRuleOp(Choice):
    """The comparison that derives the label from another column (`label_rule.op`)."""

    GE = ">="
    GT = ">"
    LE = "<="
    LT = "<"
    EQ = "=="
    NE = "!="


class ModelType(Choice):
    """The deep model's interaction (`training.model`)."""

    DLRM = "dlrm"
    DCN_V2 = "dcn_v2"


class Precision(Choice):
    """The dense network's numeric precision (`training.precision`): float32 throughout, or Keras'
    mixed_bfloat16 policy (float32 variables, bfloat16 computation); auto picks per hardware."""

    FLOAT32 = "float32"
    MIXED_BFLOAT16 = "mixed_bfloat16"
    AUTO = "auto"


class BucketEncoding(Choice):
    """How a dense feature's quantile bucket enters the model (`training.dense_buckets.encoding`)."""

    EMBEDDING = "embedding"
    PIECEWISE_LINEAR = "piecewise_linear"


class BucketsInto(Choice):
    """Where the dense features' bucket vectors enter the model (`training.dense_buckets.into`)."""

    INTERACTION = "interaction"  # beside the categorical features' vectors (cross layers / interaction)
    BOTTOM_MLP = "bottom_mlp"  # beside the dense values, as the bottom MLP's input


class DropoutMask(Choice):
    """How the input dropout's stateless mask is drawn (`training.input_dropout_mask`)."""

    FLOAT = "float"  # one random float an entry
    BYTE = "byte"  # one random byte an entry (four from each 32-bit draw)


class OptimizerName(Choice):
    """The optimizers the embedding and dense parts can use (TPU embedding and Keras alike)."""

    SGD = "sgd"
    ADAGRAD = "adagrad"
    ADAM = "adam"
    FTRL = "ftrl"


class ScheduleName(Choice):
    """The learning-rate (or gradient-multiplier) schedule's shape."""

    CONSTANT = "constant"
    EXPONENTIAL = "exponential"
    COSINE = "cosine"


class DimRule(Choice):
    """How a table's dim is chosen (`training.embedding.dim_rule`)."""

    CONFIG = "config"
    FOURTH_ROOT = "fourth_root"


class TableDtype(Choice):
    """How the serving model stores its tables (`export.table_dtype`)."""

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    INT8 = "int8"


class LayoutKind(Choice):
    """How a training checkpoint holds its tables (docs/export.md): A one variable per table, B
    SparseCore stacked and sharded, C partitioned slices; `auto` detects it per table."""

    AUTO = "auto"
    A = "A"
    B = "B"
    C = "C"


class PartitionStrategy(Choice):
    """How training partitioned a layout-C table's rows over its slices."""

    DIV = "div"
    MOD = "mod"


class Compression(Choice):
    """The compression of the transformed examples (`transformed_examples.compression`)."""

    NONE = "none"
    GZIP = "gzip"


class DirectRunningMode(Choice):
    """Beam DirectRunner's running mode of a local run (`beam.direct_running_mode`)."""

    IN_MEMORY = "in_memory"
    MULTI_THREADING = "multi_threading"
    MULTI_PROCESSING = "multi_processing"


class SequencePooling(Choice):
    """How a sequence feature's positions are pooled (`sequence.pooling`)."""

    MEAN = "mean"
    ATTENTION = "attention"


class SequencePercentile(Choice):
    """The train split's percentile of IDs per example that sets an unset sequence length."""

    P50 = "p50"
    P90 = "p90"
    P99 = "p99"
    MAX = "max"


class Placement(Choice):
    """Where a table lives: sharded in TPU embedding, or a Keras embedding replicated on the TensorCore."""

    TPU_EMBEDDING = "tpu_embedding"
    TENSOR_CORE = "tensor_core"


class TuningAlgorithm(Choice):
    """How the Tuner (`tuning.algorithm`) picks each trial's values: KerasTuner's RandomSearch or
    BayesianOptimization oracle."""

    RANDOM = "random"
    BAYESIAN = "bayesian"


# How preprocessing writes the transformed examples (`transformed_examples.format`):
# - `examples`: one tf.Example per row (what TFX's own components read);
# - `blocks`: one tf.Example per block of consecutive rows. Each dense value and the label are a
#   list of one value per row, each categorical feature the block's IDs in row order plus
#   `row_lengths_key(feature)`, the number of IDs of each row (a weighted feature's weights share
#   those lengths). The trainer parses a block with one parse call instead of one per row.
FORMAT_EXAMPLES = "examples"
FORMAT_BLOCKS = "blocks"
TRANSFORMED_FORMATS = (FORMAT_BLOCKS, FORMAT_EXAMPLES)
