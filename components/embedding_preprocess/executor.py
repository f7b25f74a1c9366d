"""TFX executor of EmbeddingPreprocess: reads artifacts, calls `run_preprocessing`, writes artifacts."""
from __future__ import annotations

import os
from typing import Any, Dict, List

from tfx import types
from tfx.dsl.components.base import base_beam_executor
from tfx.components.util import examples_utils
from tfx.proto import example_gen_pb2
from tfx.types import artifact_utils
from tfx.utils import io_utils

from components.reporting import progress

from components.embedding_preprocess.run import run_preprocessing
from components.tfx_wiring.executor_base import NoSdistOnLocalRunners, config_of, upstream_ledger
from components.tfx_wiring.component_keys import EXAMPLES_KEY, STATISTICS_KEY, TRANSFORMED_EXAMPLES_KEY, VOCABULARY_KEY

SPLITS = ("train", "eval")


def input_format_of(examples: types.Artifact) -> str:
    """`parquet` (this project's ExampleGen) or `tfrecord` (tf.Examples, e.g. TFX's CsvExampleGen)."""
    payload = examples_utils.get_payload_format(examples)
    if payload == example_gen_pb2.FORMAT_PARQUET:
        return "parquet"
    if payload == example_gen_pb2.FORMAT_TF_EXAMPLE:
        return "tfrecord"
    raise ValueError(
        f"input examples at {examples.uri} have payload format "
        f"{example_gen_pb2.PayloadFormat.Name(payload)}; EmbeddingPreprocess reads FORMAT_PARQUET or FORMAT_TF_EXAMPLE"
    )


class Executor(NoSdistOnLocalRunners, base_beam_executor.BaseBeamExecutor):
    @progress.staged(progress.PREPROCESS)
    def Do(
        self,
        input_dict: Dict[str, List[types.Artifact]],
        output_dict: Dict[str, List[types.Artifact]],
        exec_properties: Dict[str, Any],
    ) -> None:
        cfg = config_of(exec_properties)
        examples = artifact_utils.get_single_instance(input_dict[EXAMPLES_KEY])
        available = artifact_utils.decode_split_names(examples.split_names)
        missing = [s for s in SPLITS if s not in available]
        if missing:
            raise ValueError(f"input examples lack split(s) {missing}; ExampleGen must produce {list(SPLITS)}")
        patterns = {
            s: io_utils.all_files_pattern(artifact_utils.get_split_uri([examples], s)) for s in SPLITS
        }
        transformed = artifact_utils.get_single_instance(output_dict[TRANSFORMED_EXAMPLES_KEY])
        transformed.split_names = artifact_utils.encode_split_names(list(SPLITS))
        examples_utils.set_payload_format(transformed, example_gen_pb2.PayloadFormat.FORMAT_TF_EXAMPLE)
        vocabulary = artifact_utils.get_single_instance(output_dict[VOCABULARY_KEY])
        statistics = artifact_utils.get_single_instance(output_dict[STATISTICS_KEY])
        # ExampleGen's row ledger: what this stage must read. Examples from another ExampleGen have none.
        upstream = upstream_ledger(examples.uri)
        stats = run_preprocessing(
            self._make_beam_pipeline(),
            cfg,
            patterns,
            vocabulary_dir=vocabulary.uri,
            transformed_dirs={s: os.path.join(transformed.uri, f"Split-{s}") for s in SPLITS},
            statistics_dir=statistics.uri,
            upstream_ledger=upstream,
            input_format=input_format_of(examples),
        )
        vocabulary.set_string_custom_property("tables", ",".join(t.name for t in cfg.tables))
        for s in SPLITS:
            statistics.set_int_custom_property(f"{s}_examples_read", stats.splits[s]["examples_read"])
            transformed.set_int_custom_property(f"{s}_examples", stats.splits[s]["examples_written"])
        transformed.set_string_custom_property("vocabulary_uri", vocabulary.uri)
        # blocks: one tf.Example per block of rows (TFX's row-by-row readers would see blocks);
        # examples: one per row. The manifest beside the files says the same (transformed_format).
        transformed.set_string_custom_property("transformed_format", cfg.transformed_examples.format)
