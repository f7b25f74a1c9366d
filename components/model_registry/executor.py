"""Executors of the registry's two steps: LastBlessedModel (read) and the registering Pusher (write)."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from absl import logging
from tfx import types
from tfx.components.pusher import executor as tfx_pusher
from tfx.components.util import model_utils
from tfx.dsl.components.base import base_executor
from tfx.proto import pusher_pb2
from tfx.types import artifact_utils, standard_component_specs as specs
from tfx.utils import io_utils, proto_utils

from components.reporting import progress
from components.contracts import artifacts
from components.tfx_wiring.executor_base import read_json_if_exists
from components.model_registry import registry
from components.model_registry.evaluation import evaluator_check, read_evaluation
from components.tfx_wiring.metric_properties import set_metric_property
from components.tfx_wiring.component_keys import (EVALUATION_KEY, EVALUATOR_BLESSING_KEY, MODEL_KEY, PIPELINE_NAME_KEY,
                                                 RUN_ID_KEY, RUN_NAME_KEY, SERVING_DIR_KEY)

# The exporter's blessing names the Trainer model it exported (EmbeddingExporter executor).
CURRENT_MODEL_PROPERTY = "current_model"
NOT_PUSHED_REASON = "not_pushed_reason"  # on the PushedModel artifact of a model not pushed


class LookupExecutor(base_executor.BaseExecutor):
    """Reads the registry at the push destination (registry.lookup) into a Model artifact.

    The artifact holds `last_blessed.json` (what is served there, its entry, and the Trainer model
    to warm-start from) and no model of its own. The Trainer (`base_model`) and the exporter
    (`last_blessed_model`) read that file. A registry that cannot say what is served fails the step.
    """

    @progress.staged(progress.LAST_BLESSED)
    def Do(self, input_dict: Dict[str, List[types.Artifact]], output_dict: Dict[str, List[types.Artifact]],
           exec_properties: Dict[str, Any]) -> None:
        """Looks the served model up and writes it to the `model` artifact.

        Args:
          input_dict: none.
          output_dict: `model`: one Model artifact, given `last_blessed.json` and the
            custom properties `found`, `served_model`, `pushed_version`, `trainer_model`,
            `registered_eval_auc`.
          exec_properties: `serving_dir` (the push destination), `run_id`.

        Raises:
          RegistryError: the registry cannot say what is served.
        """
        out = artifact_utils.get_single_instance(output_dict[MODEL_KEY])
        found = registry.lookup(exec_properties[SERVING_DIR_KEY])
        for s in found.skipped:
            logging.warning("model registry: %s: %s", s["path"], s["reason"])
        if found.warm_start_note:
            logging.warning("model registry: %s", found.warm_start_note)
        logging.info("model registry: %s", found.note)
        progress.phase(progress.LAST_BLESSED, found.note)
        registry.write_lookup(out.uri, found)
        out.set_int_custom_property("found", int(found.found))
        if found.found:
            out.set_string_custom_property("served_model", found.served_model)
            out.set_string_custom_property("pushed_version", found.version)
            out.set_string_custom_property("trainer_model", found.entry["trainer_model"])
            set_metric_property(out, "registered_eval_auc", found.entry["eval_auc"])


def export_report(serving_model_uri: str) -> Dict[str, Any]:
    """Reads the exporter's report of a serving model.

    Args:
      serving_model_uri: the exporter's model folder.

    Returns:
      The parsed `artifacts.EXPORT_REPORT_FILE`.

    Raises:
      RegistryError: the folder has no report (the export is not complete).
    """
    report = read_json_if_exists(os.path.join(serving_model_uri, artifacts.EXPORT_REPORT_FILE))
    if report is None:
        raise registry.RegistryError(f"{serving_model_uri}: no {artifacts.EXPORT_REPORT_FILE}; only a complete export is registered")
    return report


def check_still_served(report: Dict[str, Any], serving_dir: str) -> None:
    """Refuses the push when the served version changed since this model's gate compared with it.

    Another run pushing meanwhile would make this push replace a model nobody compared it with.
    Checked only when the gate compared with the last blessed model (validation.regression_margin).

    Args:
      report: the exporter's report (its `validation` section).
      serving_dir: the push destination.

    Raises:
      RegistryError: another version is served now, or the registry cannot say which.
    """
    validation = report.get("validation") or {}
    last = validation.get("last_blessed")
    if last is None or not any(c["name"] == "last_blessed" for c in validation.get("checks", [])):
        return
    now = registry.lookup(serving_dir)
    if now.version != last.get("version"):
        raise registry.RegistryError(
            f"{serving_dir}: the served model changed while this run ran: its gate compared with "
            f"{last.get('served_model') or 'nothing (no model served then)'}, {now.served_model or 'nothing'} is "
            "served now; nothing pushed: rerun, so that this model is compared with the one served now")


def entry_fields(report: Dict[str, Any], serving_model_uri: str, trainer_model_uri: str, pipeline: str,
                 run: Dict[str, Any], evaluator: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Builds a registry entry's fields from the exporter's report and the Trainer model.

    registry.push adds the version, place and time.

    Args:
      report: the exporter's report (AUCs, validation, table dtype).
      serving_model_uri: the exporter's model folder.
      trainer_model_uri: the Trainer's model folder (its plan and manifest are recorded).
      pipeline: the pipeline's name.
      run: the run that made the model (`id`, `name`, `orchestrator`).
      evaluator: TFX's Evaluator's check (evaluation.evaluator_check), or None without an Evaluator;
        recorded with the gate's checks and in full under `evaluator`.

    Returns:
      The entry's fields: pipeline, run, models, AUCs, gate checks, evaluator, manifest and plan.

    Raises:
      KeyError: the report has no `eval_auc.serving` or `eval_auc.examples`.
    """
    validation = report.get("validation") or {}
    baseline = validation.get("baseline") or {}
    checks = list(validation.get("checks", [])) + ([evaluator] if evaluator else [])
    return {
        "pipeline": pipeline,
        "run": run,
        "exported_model": serving_model_uri,
        "trainer_model": trainer_model_uri,
        "eval_auc": report["eval_auc"]["serving"],  # the served model on its run's raw eval rows
        "eval_examples": report["eval_auc"]["examples"],
        "trainer_eval_auc": validation.get("model_eval_auc"),
        "baseline_auc": baseline.get("auc"),
        "table_dtype": report.get("table_dtype"),
        "gate": [{k: c.get(k) for k in ("name", "passed", "skipped", "model_auc", "reference_auc", "margin")}
                 for c in checks],
        "evaluator": evaluator,
        "manifest": read_json_if_exists(os.path.join(trainer_model_uri, artifacts.EMBEDDING_MANIFEST_FILE)),
        "plan": read_json_if_exists(os.path.join(trainer_model_uri, artifacts.PLAN_FILE)),
    }


def _run(exec_properties: Dict[str, Any], context) -> Dict[str, Any]:
    """The run that made the model: KFP's / Vertex's run (their `{{$.pipeline_job_uuid}}` and
    `{{$.pipeline_job_name}}` placeholders, substituted by the backend), else the local
    orchestrator's run id."""
    def given(key: str) -> Optional[str]:
        v = exec_properties.get(key) or ""
        return v if v and "{{$" not in v else None

    if given(RUN_ID_KEY):
        return {"id": given(RUN_ID_KEY), "name": given(RUN_NAME_KEY), "orchestrator": "kubeflow"}
    local = getattr(context, "pipeline_run_id", None) if context is not None else None
    return {"id": local, "name": None, "orchestrator": "local" if local else "unknown"}


def evaluator_check_of(input_dict: Dict[str, List[types.Artifact]]) -> Optional[Dict[str, Any]]:
    """Builds the `evaluator` check from TFX's Evaluator's blessing and evaluation.

    Args:
      input_dict: the Pusher's inputs (`evaluator_blessing`, `evaluation`, both optional).

    Returns:
      The check (evaluation.evaluator_check), or None when the pipeline has no Evaluator.
    """
    blessings = input_dict.get(EVALUATOR_BLESSING_KEY) or []
    if not blessings:
        return None
    blessing = artifact_utils.get_single_instance(blessings)
    evaluations = input_dict.get(EVALUATION_KEY) or []
    uri = evaluations[0].uri if evaluations else None
    return evaluator_check(model_utils.is_model_blessed(blessing), read_evaluation(uri) if uri else None, uri)


def not_blessed_reason(input_dict: Dict[str, List[types.Artifact]]) -> str:
    """Why TFX's blessing check refused the push: the exporter's gate, or the serving check (its reason)."""
    infra = input_dict.get(specs.INFRA_BLESSING_KEY) or []
    if infra and not model_utils.is_infra_validated(infra[0]):
        why = infra[0].get_string_custom_property("reason")
        return "the serving check did not bless the model" + (f": {why}" if why else "")
    return "the exporter's validation gate did not bless the model"


class RegistryPusherExecutor(tfx_pusher.Executor):
    """TFX's Pusher with the filesystem push replaced by registry.push.

    Kept from TFX: the blessing check, the model path, the `pushed_model` output and its
    properties. registry.push never reuses a version that exists (TFX's copy is skipped, yet
    reported pushed, when two pushes fall in one second), writes the registry entry first and
    makes the model loadable last. A model whose gate compared with a version that is no longer
    served is not pushed (check_still_served). Given TFX's Evaluator's blessing
    (`evaluator_blessing`), the push needs it too; when it does not bless, the model is not pushed
    and the Evaluator's reason goes on the output artifact.
    """

    @progress.staged(progress.PUSHER)
    def Do(self, input_dict: Dict[str, List[types.Artifact]], output_dict: Dict[str, List[types.Artifact]],
           exec_properties: Dict[str, Any]) -> None:
        """Pushes and registers the model when both blessings bless, else marks it not pushed.

        Args:
          input_dict: `model`, `model_blessing`, and optionally `evaluator_blessing` and `evaluation`.
          output_dict: `pushed_model`: one PushedModel artifact, marked pushed or not (with
            `not_pushed_reason`).
          exec_properties: `push_destination` (JSON), `pipeline_name`, `run_id`, `run_name`.

        Raises:
          NotImplementedError: the push destination is not a filesystem.
          RegistryError: the model has no export report, or the served version changed meanwhile.
        """
        model_push = artifact_utils.get_single_instance(output_dict[specs.PUSHED_MODEL_KEY])
        if not self.CheckBlessing(input_dict):
            self._MarkNotPushed(model_push)
            model_push.set_string_custom_property(NOT_PUSHED_REASON, not_blessed_reason(input_dict))
            progress.phase(progress.PUSHER, "not pushed: the model was not blessed")
            return
        evaluator = evaluator_check_of(input_dict)
        if evaluator is not None and not evaluator["passed"]:
            self._MarkNotPushed(model_push)
            model_push.set_string_custom_property(NOT_PUSHED_REASON, evaluator["reason"])
            logging.warning("model not pushed: %s", evaluator["reason"])
            progress.phase(progress.PUSHER, "not pushed: TFX's Evaluator did not bless the model")
            return
        destination = pusher_pb2.PushDestination()
        proto_utils.json_to_proto(exec_properties[specs.PUSH_DESTINATION_KEY], destination)
        if destination.WhichOneof("destination") != "filesystem":
            raise NotImplementedError(f"push destination {destination.WhichOneof('destination')!r}: only a "
                                      "filesystem destination keeps the model registry")
        model = artifact_utils.get_single_instance(input_dict[specs.MODEL_KEY])
        blessing = artifact_utils.get_single_instance(input_dict[specs.MODEL_BLESSING_KEY])
        trainer_model = blessing.get_string_custom_property(CURRENT_MODEL_PROPERTY)
        serving_dir = destination.filesystem.base_directory
        report = export_report(model.uri)
        check_still_served(report, serving_dir)
        fields = entry_fields(report, model.uri, trainer_model, exec_properties.get(PIPELINE_NAME_KEY) or "",
                              _run(exec_properties, getattr(self, "_context", None)), evaluator)
        # TFX's Pusher keeps a copy in its output artifact too (its archive of what was pushed), made
        # first: a copy that fails (a full disk) then fails the Pusher before anything is registered,
        # and a push that fails takes itself back out (registry.push), so a failed Pusher serves nothing new.
        io_utils.copy_dir(self.GetModelPath(input_dict), model_push.uri)
        store = os.path.join(model.uri, artifacts.STORE_DIR)  # export.store: row files and dense model, with their delta
        entry = registry.push(self.GetModelPath(input_dict), serving_dir, fields,
                              store_dir=store if io_utils.fileio.exists(os.path.join(store, registry.STORE_ROWS)) else None,
                              store_beam_args=(report.get("store") or {}).get("beam_args"))
        logging.info("model pushed to %s and registered as %s", entry["serving_model"],
                     registry.entry_path(destination.filesystem.base_directory, entry["version"]))
        progress.phase(progress.PUSHER, f"pushed to {entry['serving_model']}")
        delta = (entry.get("store") or {}).get("delta")
        if delta:  # export.store: what a store applies to go from the version served before to this one
            t = delta["tables"].values()
            progress.phase(progress.PUSHER, f"store delta against version {delta['base_version']}: "
                                            f"{sum(x['changed'] + x['new'] for x in t):,} rows put, "
                                            f"{sum(x['deleted'] for x in t):,} deleted ({delta['bytes']:,} bytes)")
        self._MarkPushed(model_push, pushed_destination=entry["serving_model"], pushed_version=entry["version"])
