"""TFX executor of TFExampleCopy: each chosen split's Parquet rows re-encoded as tf.Examples.

Reading, encoding and writing are library code: Beam's parquetio reads the files in record batches,
tfx_bsl's `RecordBatchToExamplesEncoder` encodes each batch (the encoder the exporter uses for its
AUC and parity sample, so the Evaluator scores the records the exporter scores), Beam's TFRecord
sink writes them gzipped (`data_tfrecord-NNNNN-of-NNNNN.gz`, TFX's own ExampleGen layout). The
output is a standard `Examples` artifact (payload FORMAT_TF_EXAMPLE) holding only those splits.
Every row is copied: the rows written are counted and must equal the rows in the input files'
footers, else the step fails naming the split and both counts.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from tfx import types
from tfx.components.util import examples_utils
from tfx.dsl.components.base import base_beam_executor
from tfx.proto import example_gen_pb2
from tfx.types import artifact_utils
from tfx_bsl.coders import example_coder

from components.reporting import progress
from components.rows import row_counts
from components.tfx_wiring.executor_base import NoSdistOnLocalRunners
from components.tfx_wiring.component_keys import EXAMPLES_KEY, SPLITS_KEY, TF_EXAMPLES_KEY

OUTPUT_PREFIX = "data_tfrecord"
COUNTER_NAMESPACE = "TFExampleCopy"


def encode_split(pcoll_root, pattern: str, output_prefix: str, split: str):
    """Adds Beam steps that re-encode Parquet files as gzipped TFRecords of tf.Examples.

    Args:
      pcoll_root: the Beam pipeline (or a PBegin) to add the steps to.
      pattern: the split's Parquet files.
      output_prefix: the output files' path prefix (`.gz` suffix added).
      split: the split's name, for the step labels and the counter `rows_<split>` (rows written).

    Returns:
      The PCollection of written file names.
    """
    class _Encode(beam.DoFn):
        def setup(self):
            self._encoder = example_coder.RecordBatchToExamplesEncoder()
            self._rows = beam.metrics.Metrics.counter(COUNTER_NAMESPACE, f"rows_{split}")

        def process(self, table):
            for batch in table.to_batches():
                records = self._encoder.encode(batch)
                self._rows.inc(len(records))
                yield from records

    return (pcoll_root
            | f"Read[{split}]" >> beam.io.ReadFromParquetBatched(pattern)
            | f"Encode[{split}]" >> beam.ParDo(_Encode())
            | f"Write[{split}]" >> beam.io.WriteToTFRecord(output_prefix, file_name_suffix=".gz"))


class Executor(NoSdistOnLocalRunners, base_beam_executor.BaseBeamExecutor):
    """Copies the splits named in `splits` of `examples` (Parquet) into `tf_examples` as tf.Example TFRecords."""

    def Do(self, input_dict: Dict[str, List[types.Artifact]], output_dict: Dict[str, List[types.Artifact]],
           exec_properties: Dict[str, Any]) -> None:
        """`copy` under live progress lines named after the step's node (TFExampleCopy for the
        Evaluator's copy, BulkInferrerExampleCopy for the BulkInferrer's)."""
        node = getattr(getattr(self._context, "pipeline_node", None), "node_info", None)
        with progress.stage(node.id if node is not None and node.id else "TFExampleCopy"):
            self.copy(input_dict, output_dict, exec_properties)

    def copy(self, input_dict: Dict[str, List[types.Artifact]], output_dict: Dict[str, List[types.Artifact]],
             exec_properties: Dict[str, Any]) -> None:
        """Copies each chosen split, checks the rows written against the input's footers.

        Args:
          input_dict: `examples`: one Parquet Examples artifact.
          output_dict: `tf_examples`: one Examples artifact, given the splits, payload
            FORMAT_TF_EXAMPLE, the source's span and version, and `<split>_rows` properties.
          exec_properties: `splits`: a JSON list of split names.

        Raises:
          ValueError: a split is missing from the input, or the input is not Parquet.
          RuntimeError: the rows written differ from the rows in the input files.
        """
        source = artifact_utils.get_single_instance(input_dict[EXAMPLES_KEY])
        out = artifact_utils.get_single_instance(output_dict[TF_EXAMPLES_KEY])
        splits = json.loads(exec_properties[SPLITS_KEY])
        have = artifact_utils.decode_split_names(source.split_names)
        missing = [s for s in splits if s not in have]
        if missing:
            raise ValueError(f"TFExampleCopy: {source.uri} has no split {', '.join(missing)} (it has {', '.join(have)}); "
                             "name splits the Examples artifact holds")
        fmt = examples_utils.get_payload_format(source)
        if fmt != example_gen_pb2.FORMAT_PARQUET:
            raise ValueError(f"TFExampleCopy: {source.uri} has payload format "
                             f"{example_gen_pb2.PayloadFormat.Name(fmt)}, not FORMAT_PARQUET; a tf.Example artifact "
                             "needs no copy: give it to the Evaluator directly")
        out.split_names = artifact_utils.encode_split_names(splits)
        patterns = {s: os.path.join(artifact_utils.get_split_uri([source], s), "*.parquet") for s in splits}
        expected = {s: row_counts.count_parquet_rows(p) for s, p in patterns.items()}
        pipeline = self._make_beam_pipeline()
        for s, pattern in patterns.items():
            if expected[s] == 0:
                continue  # nothing to read (an empty split's file has no row group); an empty file is written below
            split_dir = artifact_utils.get_split_uri([out], s)
            encode_split(pipeline, pattern, os.path.join(split_dir, OUTPUT_PREFIX), s)
        written: Dict[str, int] = {}
        if any(expected.values()):  # Beam refuses to run a pipeline without a transform
            result = pipeline.run()
            result.wait_until_finish()
            written = rows_written(result, splits)
        for s in splits:
            split_dir = artifact_utils.get_split_uri([out], s)
            if expected[s] == 0:  # readers find one file and read no record, as from TFX's own ExampleGen
                FileSystems.mkdirs(split_dir) if not FileSystems.exists(split_dir) else None
                FileSystems.create(os.path.join(split_dir, f"{OUTPUT_PREFIX}-empty.gz")).close()
            elif written.get(s) != expected[s]:
                raise RuntimeError(f"TFExampleCopy: split {s!r}: {written.get(s)} tf.Examples written, but "
                                   f"{patterns[s]} holds {expected[s]} rows; rerun the step")
            out.set_int_custom_property(f"{s}_rows", expected[s])
        examples_utils.set_payload_format(out, example_gen_pb2.FORMAT_TF_EXAMPLE)
        examples_utils.set_file_format(out, "tfrecords_gzip")
        for key in ("span", "version"):  # the copy stands for the same data
            if source.has_property(key):
                setattr(out, key, getattr(source, key))
        out.set_string_custom_property("copied_from", source.uri)


def rows_written(result, splits: List[str]) -> Dict[str, int]:
    """Reads the rows encoded per split from a finished pipeline's counters.

    Args:
      result: the Beam PipelineResult.
      splits: the splits copied.

    Returns:
      {split: rows}, committed counts where the runner has them, else attempted; a split without
      a counter is absent.
    """
    out = {}
    for s in splits:
        found = result.metrics().query(MetricsFilter().with_namespace(COUNTER_NAMESPACE).with_name(f"rows_{s}"))
        counters = found["counters"]
        if counters:
            out[s] = int(sum((c.committed if c.committed is not None else c.attempted) for c in counters))
    return out
