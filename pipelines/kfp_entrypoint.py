"""The container command of every task of the compiled pipeline (`python -m pipelines.kfp_entrypoint`).

A thin wrapper around TFX's own Kubeflow V2 entrypoint
(`tfx.orchestration.kubeflow.v2.container.kubeflow_v2_run_executor`) that supplies what
open-source KFP v2 does not give a TFX 1.16 task, without patching TFX:

1. Input artifact types. Open-source KFP hands a task its input artifacts with an empty type
   (`instanceSchema: ""`; tensorflow/tfx#7768), and TFX's entrypoint then fails with
   `'NoneType' object has no attribute 'get'` while importing the artifact class. Vertex fills the
   type. Every compiled task also carries its inputs spec (`--json_serialized_inputs_spec_args`,
   pipeline spec 2.1), so untyped input artifacts get their type from there.
2. The ExampleGen driver. TFX compiles FileBasedExampleGen's driver (span, version and input
   fingerprint; span patterns in input_config) as a `lifecycle.preCacheCheck` hook, which Vertex runs
   before the executor and open-source KFP ignores. When the driver has not run (no executor output
   file yet), this entrypoint runs it first, in the same process, so the Examples artifact carries the
   same span / fingerprint properties on both.

It also imports `components` first, which selects legacy Keras before TensorFlow loads.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any, Dict, List, Optional, Tuple

import yaml
from absl import logging as absl_logging
from google.protobuf import json_format

import components  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow is imported)
from components.data_io.beam_runtime import skip_tfx_sdist_for_local_runners

log = logging.getLogger("kfp_entrypoint")

# KFP's generic artifact type: what a type-less artifact may come back as from KFP's metadata store.
_GENERIC_TITLES = ("", "system.Artifact")


def artifact_type_title(type_schema: Optional[Dict[str, Any]]) -> str:
    """The type title of an ArtifactTypeSchema dict.

    Args:
      type_schema: an artifact's `type` (ArtifactTypeSchema as a dict), or None.

    Returns:
      Its schema title, '' when it carries none.
    """
    if not type_schema:
        return ""
    if "schemaTitle" in type_schema:
        return type_schema["schemaTitle"] or ""
    if "instanceSchema" in type_schema:
        try:
            data = yaml.safe_load(type_schema["instanceSchema"] or "")
        except yaml.YAMLError:
            return ""
        return (data or {}).get("title", "") if isinstance(data, dict) else ""
    return ""


def restore_input_types(executor_input: Dict[str, Any], inputs_spec: Optional[Dict[str, Any]]) -> List[str]:
    """Gives every untyped input artifact the type its inputs spec declares.

    Args:
      executor_input: the task's ExecutorInput as a dict, changed in place.
      inputs_spec: the task's ComponentInputsSpec as a dict (`--json_serialized_inputs_spec_args`).

    Returns:
      The names of the inputs whose types it restored.

    Raises:
      ValueError: an input is untyped and the spec does not declare it (TFX could only fail later,
        less clearly).
    """
    restored = []
    declared = (inputs_spec or {}).get("artifacts", {})
    for name, artifact_list in executor_input.get("inputs", {}).get("artifacts", {}).items():
        for art in artifact_list.get("artifacts", []):
            if artifact_type_title(art.get("type")) not in _GENERIC_TITLES:
                continue
            if name not in declared:
                raise ValueError(
                    f"input artifact {name!r} ({art.get('uri', '?')}) has no type and the task's "
                    "--json_serialized_inputs_spec_args does not declare it; recompile the pipeline "
                    "with `python -m pipelines compile` (pipeline spec 2.1)"
                )
            art["type"] = dict(declared[name]["artifactType"])
            if name not in restored:
                restored.append(name)
    return restored


def _parse_flags(argv: List[str]) -> Tuple[argparse.Namespace, List[str]]:
    parser = argparse.ArgumentParser(prog="python -m pipelines.kfp_entrypoint")
    parser.add_argument("--executor_class_path", required=True)
    parser.add_argument("--json_serialized_invocation_args", required=True)
    parser.add_argument("--json_serialized_inputs_spec_args", default=None)
    return parser.parse_known_args(argv)


def _is_file_based_example_gen(executor_class_path: str, executor_input: Dict[str, Any]) -> bool:
    # lazy: TFX loads TensorFlow; the type-restoring functions above are used without it
    from tfx.components.example_gen.base_example_gen_executor import BaseExampleGenExecutor
    from tfx.utils import import_utils

    cls = import_utils.import_class_by_path(executor_class_path)
    params = executor_input.get("inputs", {}).get("parameterValues", {})
    return issubclass(cls, BaseExampleGenExecutor) and "input_base" in params


def _run_example_gen_driver(executor_input: Dict[str, Any], inputs_spec_json: Optional[str]) -> None:
    # TFX's own driver function (module-private, the same code Vertex's preCacheCheck hook runs);
    # calling it keeps span / version / fingerprint logic in one place.
    # lazy: TFX loads TensorFlow; the type-restoring functions above are used without it
    from kfp.pipeline_spec import pipeline_spec_pb2
    from tfx.orchestration.kubeflow.v2.file_based_example_gen import driver

    ei = pipeline_spec_pb2.ExecutorInput()
    json_format.ParseDict(executor_input, ei, ignore_unknown_fields=True)
    spec = None
    if inputs_spec_json:
        spec = pipeline_spec_pb2.ComponentInputsSpec()
        json_format.Parse(inputs_spec_json, spec, ignore_unknown_fields=True)
    driver._run_driver(ei, spec)  # pylint: disable=protected-access


def run(argv: List[str]) -> None:
    """Runs one task through TFX's Kubeflow V2 executor entrypoint, supplying what KFP left out.

    Restores the input artifact types first, and runs the ExampleGen driver where KFP did not.

    Args:
      argv: the task's arguments as TFX compiled them (`--executor_class_path`,
        `--json_serialized_invocation_args`, `--json_serialized_inputs_spec_args`, Beam's options).

    Raises:
      ValueError: an untyped input artifact its inputs spec does not declare.
    """
    # lazy: TFX loads TensorFlow; the type-restoring functions above are used without it
    from tfx.dsl.io import fileio
    from tfx.orchestration.kubeflow.v2.container import kubeflow_v2_run_executor

    args, beam_args = _parse_flags(argv)
    skip_tfx_sdist_for_local_runners()
    executor_input = json.loads(args.json_serialized_invocation_args)
    inputs_spec = json.loads(args.json_serialized_inputs_spec_args) if args.json_serialized_inputs_spec_args else None
    restored = restore_input_types(executor_input, inputs_spec)
    if restored:
        log.info("input artifact types restored from the inputs spec (untyped, as open-source KFP passes them): %s",
                 ", ".join(restored))
    output_file = executor_input.get("outputs", {}).get("outputFile", "")
    if output_file and _is_file_based_example_gen(args.executor_class_path, executor_input):
        if not fileio.exists(output_file):
            log.info("ExampleGen driver has not run (open-source KFP skips lifecycle hooks): running it")
            _run_example_gen_driver(executor_input, args.json_serialized_inputs_spec_args)
    args.json_serialized_invocation_args = json.dumps(executor_input)
    kubeflow_v2_run_executor.main((args, beam_args))


def main(argv: Optional[List[str]] = None) -> int:
    """The container command: INFO logging, then `run`.

    Args:
      argv: the arguments (default: the process's).

    Returns:
      0 (a failing task raises).
    """
    absl_logging.set_verbosity(absl_logging.INFO)
    logging.basicConfig(level=logging.INFO)
    run(list(sys.argv[1:] if argv is None else argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
