"""TFX executor of EmbeddingExampleGen: TFX's BaseExampleGenExecutor (split by hash buckets, gzipped
TFRecords per split, payload format) around `beam_io.InputToExamples`, plus the ExampleGen ledger."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List

from tfx import types
from tfx.components.example_gen.base_example_gen_executor import BaseExampleGenExecutor
from tfx.proto import example_gen_pb2
from tfx.types import artifact_utils, standard_component_specs
from tfx.utils import proto_utils

from components import ledger as L
from components import row_counts
from components.errors import InputError

CONFIG_KEY = "config_json"
COUNTS_PATH_KEY = "_embedding_example_gen_counts_path"  # where the Beam counts are written (internal)
COUNTS_FILE = "_input_counts.json"


def input_files(exec_properties: Dict[str, Any]) -> List[str]:
    from apache_beam.io.filesystems import FileSystems

    input_config = example_gen_pb2.Input()
    proto_utils.json_to_proto(exec_properties[standard_component_specs.INPUT_CONFIG_KEY], input_config)
    files: List[str] = []
    for split in input_config.splits:
        pattern = os.path.join(exec_properties[standard_component_specs.INPUT_BASE_KEY], split.pattern)
        found = [m.path for m in FileSystems.match([pattern])[0].metadata_list]
        if not found:
            raise InputError(f"EmbeddingExampleGen: input {pattern!r} matches no file; point input.path at a CSV/TFRecord file, directory or glob")
        files += found
    return sorted(files)


def check_csv_headers(cfg, files: List[str]) -> None:
    """Every CSV file's header must hold the configured columns (an empty file holds none: counted)."""
    from components.example_gen.header import check_header, read_csv_header

    wanted = cfg.numeric_columns() + cfg.categorical_columns()
    for path in files:
        header = read_csv_header(path)
        if header is not None:
            check_header(path, header, wanted, cfg.label, cfg.label_rule is not None)


class Executor(BaseExampleGenExecutor):
    def GetInputSourceToExamplePTransform(self):
        from components.example_gen.beam_io import InputToExamples

        return InputToExamples

    def Do(
        self,
        input_dict: Dict[str, List[types.Artifact]],
        output_dict: Dict[str, List[types.Artifact]],
        exec_properties: Dict[str, Any],
    ) -> None:
        from apache_beam.io.filesystems import FileSystems

        from components.beam_runtime import ensure_local_runner_safe
        from components.config import config_from_json
        from components.embedding_preprocess.run import read_json, write_text

        ensure_local_runner_safe(self._beam_pipeline_args)
        cfg = config_from_json(exec_properties[CONFIG_KEY])
        files = input_files(exec_properties)
        if cfg.input.format == "csv":
            check_csv_headers(cfg, files)
        examples = artifact_utils.get_single_instance(output_dict[standard_component_specs.EXAMPLES_KEY])
        counts_path = os.path.join(examples.uri, COUNTS_FILE)
        super().Do(input_dict, output_dict, dict(exec_properties, **{COUNTS_PATH_KEY: counts_path}))
        counts = read_json(counts_path)
        FileSystems.delete([counts_path])
        splits = artifact_utils.decode_split_names(examples.split_names)
        written = {s: row_counts.count_records_in(artifact_utils.get_split_uri([examples], s), L.EXAMPLE_GEN) for s in splits}
        stage = L.example_gen_stage(counts, written)
        # What was read: the files, and the span TFX's driver resolved (span inputs; 0 otherwise).
        stage["files"] = files
        stage["span"] = int(exec_properties.get("span") or 0)
        write_text(os.path.join(examples.uri, L.LEDGER_FILE), L.to_json(L.ledger([stage])))
        examples.set_int_custom_property("input_rows", stage["rows_in"])
        for s, n in written.items():
            examples.set_int_custom_property(f"{s}_rows", n)
        examples.set_string_custom_property("row_ledger", json.dumps({k: stage[k] for k in ("rows_in", "malformed", "dropped", "rows_out", "balanced")}, sort_keys=True))
        L.check_stage(stage)
