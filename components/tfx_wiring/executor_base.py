"""What the executors of this project share: the pipeline configuration as an execution property,
ExampleGen's row ledger read by the stages after it, and small JSON / text files on any
filesystem Beam reaches (local disk, GCS, S3, HDFS) without importing TensorFlow (a long start-up
in every process that imports it)."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

from apache_beam.io.filesystems import FileSystems

from components.config.loading import config_from_json
from components.data_io.beam_runtime import skip_tfx_sdist_for_local_runners
from components.config.schema import PipelineConfig
from components.rows.ledger import LEDGER_FILE
from components.tfx_wiring.component_keys import CONFIG_KEY



def config_of(properties: Dict[str, Any]) -> PipelineConfig:
    """Reads the pipeline configuration from an executor's execution properties.

    Args:
      properties: the execution properties (or the Trainer's custom_config), holding `CONFIG_KEY`.

    Returns:
      The resolved configuration.
    """
    return config_from_json(properties[CONFIG_KEY])


def write_text(path: str, text: str) -> None:
    """Writes `text` (UTF-8) to `path` on any filesystem Beam reaches.

    Args:
      path: local or remote (gs://, s3://, hdfs://).
      text: the whole file.
    """
    with FileSystems.create(path) as fh:
        fh.write(text.encode("utf-8"))


def read_json(path: str) -> Any:
    """Reads a JSON file on any filesystem Beam reaches.

    Args:
      path: local or remote.

    Returns:
      The parsed JSON.
    """
    with FileSystems.open(path) as fh:
        return json.loads(fh.read().decode("utf-8"))


def read_json_if_exists(path: str) -> Optional[Any]:
    """Like `read_json`, None when the file does not exist.

    Args:
      path: local or remote.

    Returns:
      The parsed JSON, or None.
    """
    return read_json(path) if FileSystems.exists(path) else None


def upstream_ledger(examples_uri: str) -> Optional[Dict[str, Any]]:
    """Reads ExampleGen's row ledger beside its splits.

    Args:
      examples_uri: the Examples artifact's URI.

    Returns:
      The ledger dict; None for Examples from another ExampleGen.
    """
    return read_json_if_exists(os.path.join(examples_uri, LEDGER_FILE))


class NoSdistOnLocalRunners:
    """Mixin, first among an executor's bases: a BaseBeamExecutor that builds no unused tfx sdist.

    `BaseBeamExecutor.__init__` packages tfx into a temp sdist that is never removed unless the Beam
    options name a dependency; `skip_tfx_sdist_for_local_runners` (components/data_io/beam_runtime.py)
    skips it for a DirectRunner. Installed here too, not only by the local pipeline runner, because
    an executor is also constructed on its own (a Kubeflow task, a test, the component CLIs).
    """

    def __init__(self, context=None):
        skip_tfx_sdist_for_local_runners()
        super().__init__(context)
