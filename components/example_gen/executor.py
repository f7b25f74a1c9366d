"""TFX executor of EmbeddingExampleGen: the input files read in byte ranges (Parquet: units of row
groups, `parquet_input`), typed, split by a hash of each row's content and written as Parquet by
the workers that read them (`beam_io`), plus the ExampleGen ledger. TFX's FileBased driver (spans,
versions, input fingerprint) runs before it.

The output is a standard TFX `Examples` artifact with payload format `FORMAT_PARQUET` (file format
`FILE_FORMAT_PARQUET`), which TFX's `tfxio_utils` reads with tfx_bsl's ParquetTFXIO (StatisticsGen,
SchemaGen, Transform, ...). One file per range and split (`Split-<split>/data_parquet-NNNNN-of-
NNNNN.parquet`); every column is a list column (label int64, numeric columns float32, text binary).
The class is a TFX `BaseExampleGenExecutor`, but its `Do` is not TFX's: TFX's split re-serializes
every row as a protobuf and its writer shuffles all rows through the runner, which held 4 KB per
row in memory."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Tuple

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from tfx import types
from tfx.components.example_gen import utils as example_gen_utils
from tfx.components.util import examples_utils
from tfx.components.example_gen.base_example_gen_executor import BaseExampleGenExecutor
from tfx.proto import example_gen_pb2
from tfx.types import artifact_utils, standard_component_specs
from tfx.utils import proto_utils

from components.data_io.beam_runtime import add_worker_plugin, ensure_local_runner_safe
from components.data_io.out_of_space import out_of_space_named
from components.example_gen import input_folder, parquet_input, ranges
from components.example_gen.input_checks import check_files
from components.example_gen.label_limits import check_labels
from components.example_gen.beam_io import RANGES_DONE, WriteExamples
from components.example_gen.split_hash import bucket_bounds
from components.rows import ledger
from components.data_io.data_identity import input_identity
from components.reporting import progress
from components.rows import row_counts
from components.reporting.errors import InputError
from components.reporting.report import MAX_LISTED, skipped_line
from components.example_gen.header import check_csv_headers
from components.tfx_wiring.executor_base import NoSdistOnLocalRunners, config_of, read_json, write_text
from components.tfx_wiring.component_keys import CONFIG_KEY
from components.config.choices import InputFormat
from components.config.schema import PipelineConfig
COUNTS_FILE = "_input_counts.json"
BLOCKS_FILE = "_input_blocks.json"  # every input file's block digests (the input's identity), removed after
TMP_DIR = "_tmp"  # in the artifact, beside the splits: files being written; removed when done
PAYLOAD_FORMAT = example_gen_pb2.FORMAT_PARQUET
FILE_FORMAT = "FILE_FORMAT_PARQUET"  # tfxio_utils reads it as example_gen_pb2.FILE_FORMAT_PARQUET


def _input_config(exec_properties: Dict[str, Any]) -> example_gen_pb2.Input:
    return proto_utils.json_to_proto(exec_properties[standard_component_specs.INPUT_CONFIG_KEY], example_gen_pb2.Input())


def input_files(exec_properties: Dict[str, Any]) -> Tuple[List[Tuple[str, int]], List[Dict[str, str]]]:
    """(path, size in bytes) of every input file to read of those the input config's split pattern
    matches, and what was skipped or left out of the input folder, with why (input_folder.py)."""
    input_config = _input_config(exec_properties)
    base = exec_properties[standard_component_specs.INPUT_BASE_KEY]
    files: Dict[str, int] = {}
    skipped: List[Dict[str, str]] = []
    for split in input_config.splits:
        pattern = os.path.join(base, split.pattern)
        found = FileSystems.match([pattern])[0].metadata_list
        if not found:
            raise InputError(f"EmbeddingExampleGen: input {pattern!r} matches no file; point input.path at a CSV/TFRecord/Parquet file, directory or glob")
        kept, hidden = input_folder.screen([(m.path, m.size_in_bytes) for m in found], split.pattern)
        files.update(kept)
        skipped += hidden + input_folder.left_out(base, split.pattern, [m.path for m in found])
        if not kept:
            raise InputError(f"EmbeddingExampleGen: input {pattern!r} holds no file to read (names starting with '_' "
                             "or '.' are not read); point input.path at a CSV/TFRecord/Parquet file, directory or glob")
    return sorted(files.items()), skipped


def output_splits(exec_properties: Dict[str, Any]) -> Tuple[List[str], List[int]]:
    """The output split names and their cumulative hash-bucket bounds (one input split, hashed)."""
    input_config = _input_config(exec_properties)
    output_config = example_gen_pb2.Output()
    proto_utils.json_to_proto(exec_properties[standard_component_specs.OUTPUT_CONFIG_KEY], output_config)
    splits = list(output_config.split_config.splits)
    if len(input_config.splits) != 1 or not splits:
        raise InputError(
            "EmbeddingExampleGen: needs one input pattern and output splits by hash buckets "
            f"(got {len(input_config.splits)} input split(s) and {len(splits)} output split(s))"
        )
    names = example_gen_utils.generate_output_split_names(input_config, output_config)
    return names, bucket_bounds([s.hash_buckets for s in splits])


def fill_empty_splits(split_dirs: Dict[str, str]) -> List[str]:
    """A split that got no row gets one empty Parquet file (with the other splits' columns), so
    that its readers find a file and read 0 rows, as with TFX's own writer; returns those splits."""
    files = {s: sorted(m.path for m in FileSystems.match([d.rstrip("/") + "/*.parquet"])[0].metadata_list)
             for s, d in split_dirs.items()}
    schema = pa.schema([])
    for found in files.values():
        if found:
            with FileSystems.open(found[0]) as fh:
                schema = pq.ParquetFile(fh).schema_arrow
            break
    empty = [s for s, found in files.items() if not found]
    for s in empty:
        with FileSystems.create(FileSystems.join(split_dirs[s], "data_parquet-empty.parquet")) as fh:
            pq.write_table(schema.empty_table(), fh)
    return empty


class Executor(NoSdistOnLocalRunners, BaseExampleGenExecutor):
    """A BaseExampleGenExecutor (what TFX and pipelines/kfp_entrypoint.py recognise as a
    file-based ExampleGen, whose driver must run first) whose `Do` is its own."""

    def GetInputSourceToExamplePTransform(self):
        raise NotImplementedError("EmbeddingExampleGen writes its splits itself (beam_io.WriteExamples); see Do")

    @progress.staged(progress.EXAMPLE_GEN)
    def Do(
        self,
        input_dict: Dict[str, List[types.Artifact]],
        output_dict: Dict[str, List[types.Artifact]],
        exec_properties: Dict[str, Any],
    ) -> None:
        self._log_startup(input_dict, output_dict, exec_properties)
        ensure_local_runner_safe(self._beam_pipeline_args)
        cfg = config_of(exec_properties)
        files, skipped = input_files(exec_properties)
        if skipped:
            progress.phase(progress.EXAMPLE_GEN, f"not reading {len(skipped)} entr{'y' if len(skipped) == 1 else 'ies'} "
                                                 f"of the input: {skipped_line(skipped)}")
        range_bytes = max(1, int(cfg.input.range_mb * (1 << 20)))
        # Compressed bytes behind a plain name, or no data row in any file: refused before any work.
        check_files(cfg, files)
        if cfg.input.format == InputFormat.PARQUET:
            # Every footer read and every schema checked here, before the pipeline starts.
            byte_ranges = parquet_input.plan_units(cfg, files, range_bytes)
            unit = "row-group unit(s)"
        else:
            if cfg.input.format == InputFormat.CSV:
                check_csv_headers(cfg, [p for p, _ in files])
            byte_ranges = ranges.plan_ranges(files, range_bytes, splittable=cfg.input.format == InputFormat.CSV)
            unit = "byte range(s)"
        names, bounds = output_splits(exec_properties)
        examples = artifact_utils.get_single_instance(output_dict[standard_component_specs.EXAMPLES_KEY])
        with out_of_space_named(progress.EXAMPLE_GEN, examples.uri):
            self._write(cfg, exec_properties, files, byte_ranges, unit, names, bounds, examples, skipped)

    def _write(self, cfg: PipelineConfig, exec_properties: Dict[str, Any], files: List[Tuple[str, int]],
               byte_ranges: List[Any], unit: str, names: List[str], bounds: List[int], examples: types.Artifact,
               skipped: List[Dict[str, str]]) -> None:
        """Reads the ranges, writes the splits and the ledger into `examples`, and checks the ledger."""
        examples.split_names = artifact_utils.encode_split_names(names)
        split_dirs = {s: artifact_utils.get_split_uri([examples], s) for s in names}
        tmp_dir = os.path.join(examples.uri, TMP_DIR)
        for d in list(split_dirs.values()) + [tmp_dir]:
            FileSystems.mkdirs(d) if not FileSystems.exists(d) else None
        counts_path, blocks_path = os.path.join(examples.uri, COUNTS_FILE), os.path.join(examples.uri, BLOCKS_FILE)
        progress.phase(progress.EXAMPLE_GEN, f"reading {len(files)} file(s), {sum(n for _, n in files) / 1e6:,.1f} MB "
                                             f"in {len(byte_ranges)} {unit}")
        progress.count(progress.EXAMPLE_GEN, RANGES_DONE, 0, total=len(byte_ranges), unit="ranges")
        with self._make_beam_pipeline() as pipeline:
            add_worker_plugin(pipeline.options)  # a worker whose stderr is on the full disk still reports its failure
            _ = pipeline | "WriteExamples" >> WriteExamples(
                exec_properties[CONFIG_KEY], byte_ranges, split_dirs, bounds, tmp_dir, counts_path, blocks_path
            )
        counts = read_json(counts_path)
        blocks = None if cfg.input.format == InputFormat.PARQUET else read_json(blocks_path)  # Parquet: sampled
        FileSystems.delete([counts_path] + [p for p in (blocks_path, tmp_dir) if FileSystems.exists(p)])
        fill_empty_splits(split_dirs)
        written = {s: row_counts.count_parquet_rows(d.rstrip("/") + "/*.parquet") for s, d in split_dirs.items()}
        stage = ledger.example_gen_stage(counts, written)
        # What was read: the files, and the span TFX's driver resolved (span inputs; 0 otherwise).
        stage["files"] = [p for p, _ in files]
        stage["files_skipped"] = skipped[:MAX_LISTED]
        stage["files_skipped_count"] = len(skipped)
        stage["input_identity"] = input_identity(files, FileSystems.open, blocks)  # what a resume compares
        stage["row_group_units" if cfg.input.format == InputFormat.PARQUET else "byte_ranges"] = len(byte_ranges)
        stage["span"] = int(exec_properties.get("span") or 0)
        write_text(os.path.join(examples.uri, ledger.LEDGER_FILE), ledger.to_json(ledger.ledger([stage])))
        examples_utils.set_payload_format(examples, PAYLOAD_FORMAT)
        examples_utils.set_file_format(examples, FILE_FORMAT)
        examples.set_int_custom_property("input_rows", stage["rows_in"])
        for s, n in written.items():
            examples.set_int_custom_property(f"{s}_rows", n)
        examples.set_string_custom_property("row_ledger", json.dumps({k: stage[k] for k in ("rows_in", "malformed", "dropped", "rows_out", "balanced")}, sort_keys=True))
        ledger.check_stage(stage)
        check_labels(cfg, stage)  # after the ledger is written: the summary shows the counts
