"""Runs a compiled KFP v2 pipeline spec locally, the way KFP's driver and launcher run it.

`python -m pipelines.kfp_local --spec pipeline.yaml --work-dir DIR [--mode oss|vertex]`

No cluster can be reached from the development machine, and `kfp.local` (kfp 2.5) runs neither
TFX-compiled containers nor DAGs, so this harness does the orchestrator's part by hand. For each
task of the root DAG, in dependency order, it:

1. builds the task's ExecutorInput JSON: parameter values (constants or pipeline parameters),
   input artifacts from the upstream tasks' outputs (uri, name and the metadata the upstream
   executor reported), output artifacts with fresh URIs under the pipeline root, and the output
   file path;
2. substitutes it for `{{$}}` in the container's command and args (any other placeholder is
   refused: the spec would need something this harness does not emulate);
3. runs that command in a subprocess with the project's Python environment instead of the image
   (the command's leading `python` becomes this interpreter), with the container's env, and
4. reads the executor's output file and passes the reported artifacts downstream.

Two modes, the two KFP backends:
- `oss`: open-source KFP v2. Before any task runs, the spec goes through the checks of the
  backend's compiler (`oss_backend_refusal`: kubeflow/pipelines `backend/src/v2/compiler`, the
  `argocompiler.Compile` every run submission goes through), and a spec it refuses is refused
  here with the backend's own words: only `container` and `importer` executors, no resolver or
  custom-job executor, no artifact iterator, no condition on an importer task. Input artifacts are
  untyped (`instanceSchema: ""`, as open-source KFP v2 passes them; tensorflow/tfx#7768); lifecycle
  hooks are ignored, as open-source KFP ignores them; the output file lives in a per-task local
  directory, like the launcher's `/tmp/kfp_outputs`.
- `vertex`: Vertex AI Pipelines. Input artifacts typed; the container's `lifecycle.preCacheCheck`
  hook (the TFX ExampleGen driver) runs before the executor. Resolver tasks (ML Metadata queries,
  which Vertex runs) find nothing here, as on a pipeline's first run: this harness keeps no MLMD.

Both substitute the run placeholders KFP's driver substitutes when a parameter's constant is
exactly one of them (`{{$.pipeline_job_uuid}}`, `{{$.pipeline_job_name}}`, ...: `RUN_PLACEHOLDERS`).

What this does not emulate: images (the project's environment stands in for the image), resource
requests and node selectors (recorded, not enforced), caching, retries, MLMD, Kubernetes, and the
object store (the pipeline root and the push destination are local directories).
"""
from __future__ import annotations

import argparse
import graphlib
import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any, Dict, List, Optional, Union

from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from pipelines.fork_server import ForkServer
from pipelines.kubeflow import load_compiled

MODES = ("vertex", "oss")
# What every task's command imports (TFX's container entry points, this project's executors): a
# fork server imports them once (`fork_server=True`).
FORK_PRELOAD = ["tfx.orchestration.kubeflow.v2.container.kubeflow_v2_run_executor",
                "tfx.orchestration.kubeflow.v2.file_based_example_gen.driver", "pipelines.kfp_entrypoint",
                "components.example_gen.executor", "components.embedding_preprocess.executor",
                "components.embedding_trainer.executors", "components.embedding_exporter.executor",
                "components.model_registry.executor", "tfx.components.evaluator.executor"]
UNTYPED = {"instanceSchema": ""}  # what open-source KFP v2 passes as an input artifact's type
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def harness_env(env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Every task's base environment: this process's, with legacy Keras, the project on PYTHONPATH
    and `env` over them (a shared ForkServer is started with it)."""
    out = dict(os.environ)
    out.update({"TF_USE_LEGACY_KERAS": "1", "PYTHONPATH": os.pathsep.join(
        p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p)})
    out.update(env or {})
    return out


class HarnessError(RuntimeError):
    """The harness refuses a spec, a task fails, or the spec needs something the harness does not emulate."""


# ---- open-source KFP's backend compiler, as strict as it is ---------------------------------------
# kubeflow/pipelines backend/src/v2/compiler, read at commit 7b70c7b (2026-08-21): visitor.go
# (Accept: a depth-first walk over the components, leaves before their DAG) and
# argocompiler/dag.go (DAG, task). The API server wraps the error: "Failed to compile job: ...".
# These are the refusals a spec can meet; the messages are the backend's (Go's %q quoting).
OSS_SOURCE = "kubeflow/pipelines backend/src/v2/compiler @7b70c7b"


def _q(name: str) -> str:
    return json.dumps(name, ensure_ascii=False)  # Go's %q for the plain names specs use


def _oss_task_refusal(key: str, t: Dict[str, Any], executors: Dict[str, Any], components: Dict[str, Any]) -> Optional[str]:
    """argocompiler/dag.go (*workflowCompiler).task: what it refuses in one task (errors wrapped
    `compiling task %q`); an iterator task is compiled again as its "iteration-item"."""
    if "parameterIterator" in t:  # iteratorTask -> iterationItemTask -> task("iteration-item", ...)
        inner = {k: v for k, v in t.items() if k != "parameterIterator"}
        err = _oss_task_refusal("iteration-item", inner, executors, components)
        return f"compiling task {_q(key)}: iterator task: iterationItem task: {err}" if err else None
    label = components.get(t.get("componentRef", {}).get("name", ""), {}).get("executorLabel")
    if not label:
        return None  # a sub-DAG: checked when the walk reached it
    ex = executors[label]
    err = None
    if "container" in ex:
        pass
    elif "importer" in ex:
        if t.get("triggerPolicy", {}).get("condition"):
            err = "triggerPolicy.condition on importer task is not supported"
    elif "resolver" in ex:
        err = "resolver executors not implemented"
    elif "customJob" in ex:
        err = "custom job executors is Google Cloud only, it's not supported"
    else:
        err = f"unknown executor spec type: {sorted(ex)}"
    return f"compiling task {_q(key)}: {err}" if err else None


def _oss_dag_refusal(name: str, dag: Dict[str, Any], executors: Dict[str, Any], components: Dict[str, Any]) -> Optional[str]:
    """argocompiler/dag.go: (*workflowCompiler).DAG, errors wrapped `compiling DAG %q`."""
    tasks = dag.get("tasks", {})

    def in_dag(err: str) -> str:
        return f"compiling DAG {_q(name)}: {err}"

    for t in tasks.values():  # addImplicitDependencies
        producers = [b["taskOutputParameter"]["producerTask"] for b in t.get("inputs", {}).get("parameters", {}).values()
                     if "taskOutputParameter" in b]
        producers += [b["taskOutputArtifact"]["producerTask"] for b in t.get("inputs", {}).get("artifacts", {}).values()
                      if "taskOutputArtifact" in b]
        for producer in producers:
            if producer not in tasks:
                return in_dag(f"failed to add implicit deps: unknown producer task {_q(producer)} in DAG")

    def exit_task(t: Dict[str, Any]) -> bool:
        return t.get("triggerPolicy", {}).get("strategy") == "ALL_UPSTREAM_TASKS_COMPLETED"

    for key in sorted(tasks):  # first loop: iterators, and the exit tasks
        t = tasks[key]
        if "parameterIterator" in t and "artifactIterator" in t:
            return in_dag(f"invalid task {_q(key)}: parameterIterator and artifactIterator cannot be specified at the same time")
        if "artifactIterator" in t:
            return in_dag("artifact iterator not implemented yet")
        if exit_task(t):
            err = _oss_task_refusal(key, t, executors, components)
            if err:
                return in_dag(err)
    for key in sorted(tasks):  # second loop: every other task
        if not exit_task(tasks[key]):
            err = _oss_task_refusal(key, tasks[key], executors, components)
            if err:
                return in_dag(err)
    if not any(not exit_task(t) for t in tasks.values()):
        return in_dag(f"DAG {name} must contain one or more non-exit tasks")
    return None


def oss_backend_refusal(spec: Dict[str, Any]) -> Optional[str]:
    """Gives open-source KFP's answer to submitting this spec as a run, the compiler's part of it.

    The API server prefixes the answer with "Failed to create a new run: Failed to generate the
    ExecutionSpec: ".

    Args:
      spec: the compiled PipelineSpec, as a dict.

    Returns:
      The backend's refusal ("Failed to compile job: ..."), or None when its compiler takes the spec.
    """
    if not spec.get("pipelineInfo", {}).get("name"):
        return "Failed to compile job: pipelineInfo.name is empty"
    try:  # compiler.GetDeploymentConfig: protojson, unknown fields discarded, a oneof set twice refused
        json_format.ParseDict(spec.get("deploymentSpec", {}), pipeline_spec_pb2.PipelineDeploymentConfig(),
                              ignore_unknown_fields=True)
    except json_format.ParseError as e:
        return f"Failed to compile job: {e}"
    executors = spec.get("deploymentSpec", {}).get("executors", {})
    components = spec.get("components", {})
    visited = set()

    def dfs(name: str, comp: Optional[Dict[str, Any]]) -> Optional[str]:  # visitor.go: pipelineDFS.dfs
        if name in visited or comp is None:
            return None
        visited.add(name)

        def err(message: str) -> str:
            return f"error processing component name={_q(name)}: {message}"

        label = comp.get("executorLabel", "")
        if label:
            if label not in executors:
                return err(f"executor(label={_q(label)}) not found in deployment config")
            if "container" in executors[label] or "importer" in executors[label]:
                return None
            return err(f"executor(label={_q(label)}): non-container and non-importer executor not implemented")
        if "dag" not in comp:
            return err(f"unknown component implementation: {sorted(comp)}")
        for key in sorted(comp["dag"].get("tasks", {})):
            t = comp["dag"]["tasks"][key]
            ref = t.get("componentRef", {}).get("name", "")
            if not ref:
                return err(f"component ref name is empty for task name={_q(t.get('taskInfo', {}).get('name', ''))}")
            if ref not in components:
                return err(f"cannot find component ref name={_q(ref)}")
            found = dfs(ref, components[ref])
            if found:
                return found
        return _oss_dag_refusal(name, comp["dag"], executors, components)

    refusal = dfs("root", spec.get("root"))
    return f"Failed to compile job: {refusal}" if refusal else None


def oss_parameters_refusal(spec: Dict[str, Any], values: Dict[str, Any]) -> Optional[str]:
    """Checks a run's parameter names as open-source KFP's API server does.

    That is the part about names of template/v2_template.go validatePipelineJobInputs: values the
    pipeline does not take, and required parameters without one.

    Args:
      spec: the compiled PipelineSpec, as a dict.
      values: the run's parameter values, by name.

    Returns:
      The server's refusal, or None when the names pass.
    """
    declared = spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    for name, p in sorted(declared.items()):
        if name not in values and not p.get("isOptional") and "defaultValue" not in p:
            return f"parameter {name} is not optional, yet has neither default value nor user provided value"
    extra = [n for n in values if n not in declared]
    return f"parameter(s) provided are not required by pipeline: {', '.join(extra)}" if extra else None


# The run placeholders KFP's driver substitutes in a parameter whose constant is exactly one of
# them (backend/src/v2/driver/resolve.go; Vertex does the same): placeholder -> LocalKfpRun attribute.
RUN_PLACEHOLDERS = {
    "{{$.pipeline_job_name}}": "run_name",
    "{{$.pipeline_job_resource_name}}": "run_resource_name",
    "{{$.pipeline_job_uuid}}": "run_uuid",
    "{{$.pipeline_job_create_time_utc}}": "run_create_time",
    "{{$.pipeline_job_schedule_time_utc}}": "run_create_time",
}


def parse_pipeline_spec(spec: Dict[str, Any]):
    """Strict parse into KFP's PipelineSpec proto.

    Args:
      spec: a PipelineSpec as a dict.

    Returns:
      The `pipeline_spec_pb2.PipelineSpec`.

    Raises:
      json_format.ParseError: a field KFP does not know, or a value of the wrong type.
    """
    return json_format.ParseDict(spec, pipeline_spec_pb2.PipelineSpec(), ignore_unknown_fields=False)


def task_order(spec: Dict[str, Any]) -> List[str]:
    """Orders the root DAG's tasks by their dependencies, ties broken by name so the order is stable.

    Args:
      spec: the compiled PipelineSpec, as a dict.

    Returns:
      The task names, each after the tasks it depends on.
    """
    tasks = spec["root"]["dag"]["tasks"]
    graph = {}
    for name, t in tasks.items():
        deps = set(t.get("dependentTasks", []))
        for a in t.get("inputs", {}).get("artifacts", {}).values():
            if "taskOutputArtifact" in a:
                deps.add(a["taskOutputArtifact"]["producerTask"])
        for p in t.get("inputs", {}).get("parameters", {}).values():
            if "taskOutputParameter" in p:
                deps.add(p["taskOutputParameter"]["producerTask"])
        graph[name] = deps
    sorter = graphlib.TopologicalSorter(graph)
    sorter.prepare()
    order = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready())
        order.extend(ready)
        sorter.done(*ready)
    return order


def _substitute(items: List[str], executor_input_json: str, where: str) -> List[str]:
    out = []
    for item in items:
        if "{{$" in item.replace("{{$}}", ""):
            raise HarnessError(f"{where}: placeholder in {item[:80]!r} is not emulated (only {{{{$}}}} is)")
        out.append(item.replace("{{$}}", executor_input_json))
    return out


def _local_command(cmd: List[str]) -> List[str]:
    if cmd and cmd[0] in ("python", "python3"):
        return [sys.executable] + cmd[1:]
    return cmd


class LocalKfpRun:
    """Runs a compiled pipeline spec once, task by task; `run()` returns a record per task.

    Args:
      compiled_path: the compiled pipeline (.yaml PipelineSpec or .json PipelineJob).
      work_dir: where logs, run.json and (oss mode) the per-task output files go.
      mode: `oss` (open-source KFP v2) or `vertex` (Vertex AI Pipelines).
      pipeline_root: a local pipeline root; None takes the compiled one.
      env: environment variables added to every task's.
      parameter_values: pipeline parameter values over the compiled ones.
      fork_server: run each `python -m` command as a fork of one process that imported TensorFlow,
        TFX and this project once (pipelines/fork_server.py: about 4 s less per command); commands
        whose import-steering environment differs run as subprocesses all the same. True: a server
        of this run's own, closed when it ends; a ForkServer (`harness_env()`'s environment): one
        the caller shares between runs and closes (each server's imports take about 4 s).

    Raises:
      HarnessError: an unknown mode, a spec open-source KFP refuses (oss mode), or a pipeline
        root that is not local.
      json_format.ParseError: a spec KFP's PipelineSpec proto does not take.
    """

    def __init__(self, compiled_path: str, work_dir: str, mode: str = "oss", pipeline_root: Optional[str] = None,
                 env: Optional[Dict[str, str]] = None, parameter_values: Optional[Dict[str, Any]] = None,
                 fork_server: Union[bool, ForkServer] = False):
        if mode not in MODES:
            raise HarnessError(f"mode {mode!r} is not one of {', '.join(MODES)}")
        loaded = load_compiled(compiled_path)
        self.spec = loaded["pipeline_spec"]
        parse_pipeline_spec(self.spec)  # refuse a spec KFP would refuse
        if mode == "oss":
            refusal = (oss_parameters_refusal(self.spec, dict(loaded["runtime_config"].get("parameterValues", {}),
                                                              **(parameter_values or {})))
                       or oss_backend_refusal(self.spec))
            if refusal:
                raise HarnessError(f"open-source KFP refuses {compiled_path}: {refusal} ({OSS_SOURCE})")
        self.platform_spec = loaded["platform_spec"]
        self.mode = mode
        self.work_dir = os.path.abspath(work_dir)
        rc = loaded["runtime_config"]
        # The compiled root (gcsOutputDirectory / defaultPipelineRoot), unless told otherwise; it must be
        # local here. (The compiled config's own paths, e.g. the Pusher's serving_dir, are not moved.)
        self.pipeline_root = pipeline_root or loaded["pipeline_root"]
        if not self.pipeline_root or "://" in self.pipeline_root:
            raise HarnessError(
                f"pipeline root {self.pipeline_root!r} is not a local directory; compile with a local "
                "--pipeline-root (and a local input.path) to run the spec here"
            )
        self.params = dict(rc.get("parameterValues", {}))
        self.params.update(parameter_values or {})
        self.job_id = f"{self.spec['pipelineInfo']['name']}-{uuid.uuid4().hex[:8]}"
        self.run_name = self.run_resource_name = self.job_id
        self.run_uuid = str(uuid.uuid4())
        self.run_create_time = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.env = harness_env(env)
        self.outputs: Dict[str, Dict[str, List[Dict[str, Any]]]] = {}
        self._own_server = fork_server is True
        self.fork_server = ForkServer(FORK_PRELOAD, self.env) if fork_server is True else (fork_server or None)

    # --- ExecutorInput ---------------------------------------------------------------------
    def _parameter(self, task: str, name: str, binding: Dict[str, Any]) -> Any:
        if "runtimeValue" in binding:
            value = binding["runtimeValue"]["constant"]
            if isinstance(value, str) and value in RUN_PLACEHOLDERS:
                return getattr(self, RUN_PLACEHOLDERS[value])
            if isinstance(value, str) and "{{$." in value:
                raise HarnessError(f"task {task}: parameter {name!r}: placeholder in {value[:80]!r} is not emulated")
            return value
        if "componentInputParameter" in binding:
            key = binding["componentInputParameter"]
            if key in self.params:
                return self.params[key]
            default = self.spec["root"].get("inputDefinitions", {}).get("parameters", {}).get(key, {})
            if "defaultValue" in default:
                return default["defaultValue"]
            raise HarnessError(f"task {task}: parameter {name!r} needs pipeline parameter {key!r}, which has no value")
        raise HarnessError(f"task {task}: parameter {name!r} binding {sorted(binding)} is not emulated")

    def _task_dir(self, task: str, task_uid: str) -> str:
        """Where the task's output artifacts go: {root}/{project number}/{job}/{task}_{uid} on Vertex,
        {root}/{run}/{task} on open-source KFP."""
        if self.mode == "vertex":
            return os.path.join(self.pipeline_root, "123456789", self.job_id, f"{task}_{task_uid}")
        return os.path.join(self.pipeline_root, self.job_id, task)

    def _task_and_component(self, task: str):
        t = self.spec["root"]["dag"]["tasks"][task]
        return t, self.spec["components"][t["componentRef"]["name"]]

    def executor_input(self, task: str, task_uid: str) -> Dict[str, Any]:
        """Builds a task's ExecutorInput as KFP's driver does.

        Args:
          task: the task's name in the root DAG.
          task_uid: a unique suffix for the task's directories.

        Returns:
          The ExecutorInput as a dict: parameter values, input artifacts from upstream outputs,
          output artifacts with fresh URIs, and the output file's path.

        Raises:
          HarnessError: the task needs a binding, policy or placeholder this harness does not emulate.
        """
        t, comp = self._task_and_component(task)
        for unsupported in ("triggerPolicy", "iteratorPolicy", "parameterIterator", "artifactIterator"):
            if unsupported in t:
                raise HarnessError(f"task {task}: {unsupported} is not emulated")
        declared_inputs = comp.get("inputDefinitions", {}).get("artifacts", {})
        params = {n: self._parameter(task, n, b) for n, b in t.get("inputs", {}).get("parameters", {}).items()}
        in_artifacts = {}
        for name, binding in t.get("inputs", {}).get("artifacts", {}).items():
            if "taskOutputArtifact" not in binding:
                raise HarnessError(f"task {task}: input artifact {name!r} binding {sorted(binding)} is not emulated")
            src = binding["taskOutputArtifact"]
            produced = self.outputs[src["producerTask"]][src["outputArtifactKey"]]
            arts = []
            for a in produced:
                a = json.loads(json.dumps(a))
                a["type"] = dict(declared_inputs[name]["artifactType"]) if self.mode == "vertex" else dict(UNTYPED)
                arts.append(a)
            in_artifacts[name] = {"artifacts": arts}
        out_artifacts = {}
        for key, d in comp.get("outputDefinitions", {}).get("artifacts", {}).items():
            art_id = uuid.uuid4().int % (10 ** 12)
            out_artifacts[key] = {"artifacts": [{
                "name": (f"projects/123456789/locations/local/metadataStores/default/artifacts/{art_id}"
                         if self.mode == "vertex" else str(art_id)),
                "uri": os.path.join(self._task_dir(task, task_uid), key),
                "type": dict(d["artifactType"]),  # both backends type outputs from the component spec
                "metadata": {},
            }]}
        if self.mode == "vertex":
            output_file = os.path.join(self._task_dir(task, task_uid), "executor_output.json")
        else:  # the launcher's pod-local /tmp/kfp_outputs/output_metadata.json
            output_file = os.path.join(self.work_dir, "pods", f"{task}-{task_uid}", "tmp", "kfp_outputs",
                                       "output_metadata.json")
        return {
            "inputs": {"parameterValues": params, "artifacts": in_artifacts},
            "outputs": {"artifacts": out_artifacts, "outputFile": output_file},
        }

    # --- running ---------------------------------------------------------------------------
    def _exec(self, task: str, cmd: List[str], env: Dict[str, str], log_path: str) -> float:
        start = time.time()
        with open(log_path, "ab") as log:
            log.write(("$ " + " ".join(c if len(c) < 200 else c[:60] + "...'" for c in cmd) + "\n").encode())
            log.flush()
            if self.fork_server is not None and self.fork_server.can_run(cmd, env):
                rc = self.fork_server.run(cmd, env, os.path.dirname(log_path), log_path)
            else:
                rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     cwd=os.path.dirname(log_path))
        if rc != 0:
            with open(log_path, "rb") as fh:
                tail = fh.read()[-4000:].decode(errors="replace")
            raise HarnessError(f"task {task} failed (exit {rc}); log {log_path}; last lines:\n{tail}")
        return time.time() - start

    def run_task(self, task: str) -> Dict[str, Any]:
        """Runs one task's container command locally and records its outputs for downstream tasks.

        Args:
          task: the task's name in the root DAG.

        Returns:
          The task's record: image, resources, Kubernetes settings, ExecutorInput, log path,
          seconds per command, and outputs.

        Raises:
          HarnessError: the executor is not a container (or a resolver in vertex mode), a
            placeholder is not emulated, or the command fails.
        """
        _, comp = self._task_and_component(task)
        label = comp["executorLabel"]
        executor = self.spec["deploymentSpec"]["executors"][label]
        if "resolver" in executor and self.mode == "vertex":
            # A resolver task queries ML Metadata, which Vertex runs: this harness keeps no MLMD,
            # so every query finds nothing, as on a pipeline's first run. (Open-source KFP refuses
            # the spec before anything runs: oss_backend_refusal.)
            queries = executor["resolver"].get("outputArtifactQueries", {})
            self.outputs[task] = {key: [] for key in queries}
            return {"task": task, "resolver": queries, "outputs": self.outputs[task], "seconds": {}}
        if "container" not in executor:
            raise HarnessError(f"task {task}: executor kind {sorted(executor)} is not emulated (containers only)")
        container = executor["container"]
        uid = uuid.uuid4().hex[:8]
        ei = self.executor_input(task, uid)
        ei_json = json.dumps(ei)
        os.makedirs(os.path.dirname(ei["outputs"]["outputFile"]), exist_ok=True)
        log_dir = os.path.join(self.work_dir, "logs")
        os.makedirs(log_dir, exist_ok=True)
        log_path = os.path.join(log_dir, f"{task}.log")
        env = dict(self.env)
        env.update({e["name"]: e.get("value", "") for e in container.get("env", [])})
        k8s = ((self.platform_spec or {}).get("platforms", {}).get("kubernetes", {})
               .get("deploymentSpec", {}).get("executors", {}).get(label, {}))
        record = {"task": task, "image": container.get("image"), "resources": container.get("resources", {}),
                  "kubernetes": k8s, "executor_input": ei, "log": log_path, "seconds": {}}
        hook = container.get("lifecycle", {}).get("preCacheCheck")
        if hook and self.mode == "vertex":
            cmd = _local_command(_substitute(hook.get("command", []) + hook.get("args", []), ei_json, f"{task} preCacheCheck"))
            record["seconds"]["pre_cache_check"] = round(self._exec(task, cmd, env, log_path), 1)
        cmd = _local_command(_substitute(container.get("command", []) + container.get("args", []), ei_json, task))
        record["seconds"]["executor"] = round(self._exec(task, cmd, env, log_path), 1)
        self.outputs[task] = self._collect_outputs(task, ei)
        record["outputs"] = self.outputs[task]
        return record

    def _collect_outputs(self, task: str, ei: Dict[str, Any]) -> Dict[str, List[Dict[str, Any]]]:
        """What the launcher records: the provisioned output artifacts, updated with the metadata
        (and uri) the executor reported in its output file."""
        out_file = ei["outputs"]["outputFile"]
        reported: Dict[str, Any] = {}
        if os.path.isfile(out_file):
            with open(out_file, encoding="utf-8") as fh:
                reported = json.load(fh).get("artifacts", {})
        result = {}
        for key, provisioned in ei["outputs"]["artifacts"].items():
            arts = [dict(a) for a in provisioned["artifacts"]]
            got = reported.get(key, {}).get("artifacts", [])
            if got:
                if len(got) != len(arts):
                    raise HarnessError(f"task {task}: output {key!r}: executor reported {len(got)} artifacts, expected {len(arts)}")
                for a, g in zip(arts, got):
                    a["metadata"] = g.get("metadata", {})
                    a["uri"] = g.get("uri") or a["uri"]
            result[key] = arts
        return result

    def run(self, log=print) -> List[Dict[str, Any]]:
        """Runs every task in dependency order and writes `run.json` to the work directory.

        Args:
          log: called with one line per task started and finished.

        Returns:
          The tasks' records, in the order they ran.

        Raises:
          HarnessError: a task fails or needs something this harness does not emulate.
        """
        records = []
        try:
            for task in task_order(self.spec):
                log(f"[kfp-local {self.mode}] {task} ...")
                rec = self.run_task(task)
                log(f"[kfp-local {self.mode}] {task} done in {sum(rec['seconds'].values()):.0f} s")
                records.append(rec)
        finally:
            if self._own_server:
                self.fork_server.close()
        with open(os.path.join(self.work_dir, "run.json"), "w", encoding="utf-8") as fh:
            json.dump({"mode": self.mode, "job_id": self.job_id, "tasks": records}, fh, indent=1, sort_keys=True)
        return records


def main(argv=None) -> int:
    """Runs a compiled pipeline locally from the command line.

    Args:
      argv: the command-line arguments (without the program name); None reads sys.argv.

    Returns:
      The exit status: 0 when every task succeeded, 1 on a HarnessError (printed).
    """
    parser = argparse.ArgumentParser(prog="python -m pipelines.kfp_local", description=__doc__.split("\n")[0])
    parser.add_argument("--spec", required=True, help="compiled pipeline (.yaml PipelineSpec or .json PipelineJob)")
    parser.add_argument("--work-dir", required=True, help="local pipeline root, logs and executor files")
    parser.add_argument("--mode", choices=MODES, default="oss")
    parser.add_argument("--pipeline-root", default=None, help="default: the compiled pipeline root (must be local)")
    args = parser.parse_args(argv)
    try:
        LocalKfpRun(args.spec, args.work_dir, args.mode, pipeline_root=args.pipeline_root).run()
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
