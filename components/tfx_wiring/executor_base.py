"""What the executors of this project share: the pipeline configuration as an execution property,
ExampleGen's row ledger read by the stages after it, and small JSON / text files on any
filesystem Beam reaches (local disk, GCS, S3, HDFS) without importing TensorFlow (which costs
~20 s of start-up in every process that imports it)."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

CONFIG_KEY = "config_json"  # the execution property (or Trainer custom_config key) holding the config


def config_of(properties: Dict[str, Any]):
    """The PipelineConfig in an executor's execution properties (or the Trainer's custom_config)."""
    from components.config.loading import config_from_json

    return config_from_json(properties[CONFIG_KEY])


def write_text(path: str, text: str) -> None:
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.create(path) as fh:
        fh.write(text.encode("utf-8"))


def read_json(path: str) -> Any:
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.open(path) as fh:
        return json.loads(fh.read().decode("utf-8"))


def read_json_if_exists(path: str) -> Optional[Any]:
    from apache_beam.io.filesystems import FileSystems

    return read_json(path) if FileSystems.exists(path) else None


def upstream_ledger(examples_uri: str) -> Optional[Dict[str, Any]]:
    """ExampleGen's row ledger beside its splits; None for Examples from another ExampleGen."""
    from components.rows.ledger import LEDGER_FILE

    return read_json_if_exists(os.path.join(examples_uri, LEDGER_FILE))
