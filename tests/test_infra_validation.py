"""What TFX's InfraValidator would check of the exporter's serving model, short of a model server
(issue 64): TensorFlow Serving cannot be installed on these machines (docs/tfx.md, "InfraValidator").

- **The request** is the one InfraValidator sends: TFX's own request builder
  (`tfx.components.infra_validator.request_builder.build_requests`, `request_spec.tensorflow_serving`
  with `serving_default`) reads the tf.Examples of `TFExampleCopy`'s copy of the eval split and makes
  one `PredictRequest` per record, which InfraValidator's executor wraps in a `PredictionLog` and
  writes as the model's warmup file (`assets.extra/tf_serving_warmup_requests`), in a copy of the
  model laid out as TF Serving loads it (`<model_name>/<version>/`).
- **A fresh process with only TensorFlow**: `python -I -S` (no PYTHONPATH, no user site, no `.pth`
  files: the venv's editable install of this project is one), its working directory outside the
  repository and its `sys.path` the standard library plus the venv's site-packages, set explicitly.
  There `components` and `pipelines` cannot be imported; the process lists every op of the SavedModel's
  graph and function library and finds each in stock TensorFlow's op registry, loads the model with
  `tf.saved_model.load`, replays the warmup file as TF Serving does (each request's inputs must be the
  signature's inputs, by name) and writes a `PredictLog` (request and `PredictResponse`, outputs as
  TensorProtos) for each. None of TFX, tfx_bsl, Beam, TensorFlow Transform or tf_keras is imported.
- **The answer** is the model's: each response's outputs equal `serving_default`'s on the same
  record, computed here in the test's process from the exporter's own directory.
- **A broken model fails it**, in the same kind of process: a request whose input has another name,
  a model without its variables, and a model with one op renamed to an op TensorFlow does not have.
"""
import json
import os
import shutil
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

from tests.stages import artifact, beam_context
from components.tfx_wiring import component_keys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_NAME = "embedding_model"  # serving_spec.model_name
VERSION = 1
NUM_EXAMPLES = 16  # request_spec.num_examples
SLOW = "exports the executors' chain's model, copies its eval split as tf.Examples and loads it in a fresh TensorFlow process"

# Modules the model must not need; any of them imported in the fresh process fails the check.
NOT_NEEDED = ("components", "pipelines", "tests", "tfx", "tfx_bsl", "apache_beam", "tensorflow_transform",
              "tensorflow_model_analysis", "tensorflow_data_validation", "tf_keras", "tensorflow_text",
              "tensorflow_recommenders")

# The fresh process. Arguments: a JSON file {"jobs": [{"model": dir, "out": file}], "result": file}.
# Each job: the ops, the load, the warmup file replayed; the result file says what happened to each.
CHILD = r'''
import importlib.util, json, os, sys, traceback

args = json.load(open(sys.argv[1]))
sys.path[:] = args["sys_path"]
result = {"sys_path": list(sys.path), "cwd": os.getcwd(), "project_imports": {}, "jobs": []}
for name in ("components", "pipelines", "tests"):
    try:
        __import__(name)
        result["project_imports"][name] = "imported from " + str(getattr(sys.modules[name], "__file__", None))
    except ImportError as err:
        result["project_imports"][name] = "ImportError: " + str(err)

import tensorflow as tf
from tensorflow.python.framework import op_def_registry
from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

WARMUP = os.path.join("assets.extra", "tf_serving_warmup_requests")


# The product's own check (components/embedding_exporter/serving_check_child.py) lists the ops: loaded
# from its file, as this process cannot import the project.
_spec = importlib.util.spec_from_file_location("serving_check_child", args["child"])
_child = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_child)
graph_ops = _child.graph_ops


def serve(model_dir, out):
    ops = graph_ops(model_dir)
    job = {"ops": ops, "unknown_ops": [op for op in ops if op_def_registry.get(op) is None], "responses": 0}
    if job["unknown_ops"]:
        raise RuntimeError("ops not in stock TensorFlow: " + ", ".join(job["unknown_ops"]))
    model = tf.saved_model.load(model_dir, tags=["serve"])
    with tf.io.TFRecordWriter(out) as writer:
        for record in tf.data.TFRecordDataset(os.path.join(model_dir, WARMUP)):
            log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
            request = log.predict_log.request
            name = request.model_spec.signature_name or "serving_default"
            fn = model.signatures[name]
            expected = set(fn.structured_input_signature[1])
            if set(request.inputs) != expected:  # TF Serving: the request's inputs must be the signature's
                raise ValueError("signature %s takes inputs %s; the request has %s"
                                 % (name, sorted(expected), sorted(request.inputs)))
            outputs = fn(**{k: tf.constant(tf.make_ndarray(v)) for k, v in request.inputs.items()})
            response = predict_pb2.PredictResponse()
            response.model_spec.CopyFrom(request.model_spec)
            response.model_spec.signature_name = name
            for key, value in outputs.items():
                response.outputs[key].CopyFrom(tf.make_tensor_proto(value.numpy()))
            writer.write(prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request, response=response)).SerializeToString())
            job["responses"] += 1
    if not job["responses"]:
        raise ValueError("no request in " + WARMUP)
    return job


for spec in args["jobs"]:
    try:
        job = dict(serve(spec["model"], spec["out"]), ok=True)
    except Exception as err:  # each job's failure is its result
        job = {"ok": False, "error": "%s: %s" % (type(err).__name__, err), "traceback": traceback.format_exc()}
    result["jobs"].append(job)
result["modules"] = sorted({m.split(".")[0] for m in sys.modules})
json.dump(result, open(args["result"], "w"))
'''


def _site_packages():
    return sysconfig.get_paths()["purelib"]  # this interpreter's: the venv's


def run_fresh(tmp, jobs):
    """Runs CHILD in a fresh `python -I -S` with `cwd` and its files under `tmp` (outside the repo);
    returns its result."""
    tmp.mkdir(parents=True, exist_ok=True)
    script, args_file, result_file = tmp / "serve.py", tmp / "args.json", tmp / "result.json"
    script.write_text(CHILD)
    stdlib = [p for p in sys.path if p and not p.startswith(sys.prefix) and "site-packages" not in p
              and p.startswith(sys.base_prefix)]
    child = os.path.join(REPO, "components", "embedding_exporter", "serving_check_child.py")
    args_file.write_text(json.dumps({"jobs": jobs, "result": str(result_file), "sys_path": stdlib + [_site_packages()],
                                     "child": child}))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp), "TF_CPP_MIN_LOG_LEVEL": "2",
           "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-I", "-S", str(script), str(args_file)], cwd=str(tmp), env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and result_file.exists(), proc.stderr[-4000:]
    return json.loads(result_file.read_text())


def read_logs(path):
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    return [prediction_log_pb2.PredictionLog.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(path))]


@pytest.fixture(scope="module")
def served(chain, tmp_path_factory):
    """The exporter's serving model in TF Serving's layout with InfraValidator's warmup requests
    (made by TFX from TFExampleCopy's eval split), and the fresh process's answers, its jobs the
    good model's then three broken copies' (`_broken_copies`):
    (exporter's model dir, model copy dir, requests, child result, tmp root)."""
    from tfx.components.infra_validator import executor as iv_executor
    from tfx.components.infra_validator import request_builder
    from tfx.proto import infra_validator_pb2
    from tfx.types import standard_artifacts
    from tfx.utils import io_utils, path_utils

    from components.tf_example_copy import executor as copy_executor

    _, a, _ = chain
    root = tmp_path_factory.mktemp("infra_validation")
    tf_examples = artifact(standard_artifacts.Examples, root / "TFExampleCopy")
    copy_executor.Executor(beam_context()).Do({component_keys.EXAMPLES_KEY: [a["examples"]]},
                                              {component_keys.TF_EXAMPLES_KEY: [tf_examples]},
                                              {component_keys.SPLITS_KEY: json.dumps(["eval"])})
    request_spec = infra_validator_pb2.RequestSpec(
        tensorflow_serving=infra_validator_pb2.TensorFlowServingRequestSpec(signature_names=["serving_default"]),
        split_name="eval", num_examples=NUM_EXAMPLES, make_warmup=True)
    requests = list(request_builder.build_requests(MODEL_NAME, a["serving"], tf_examples, request_spec))
    assert len(requests) == NUM_EXAMPLES

    source = path_utils.serving_model_path(a["serving"].uri, path_utils.is_old_model_artifact(a["serving"]))
    model = str(root / "models" / MODEL_NAME / str(VERSION))  # TF Serving's <model_base_path>/<version>
    shutil.copytree(source, model)
    # as InfraValidator's executor writes it with make_warmup (_CreateWarmupModel)
    io_utils.write_tfrecord_file(path_utils.warmup_file_path(model),
                                 *[iv_executor._convert_to_prediction_log(r) for r in requests])
    # the good model, then three broken copies, in one fresh process (test_a_broken_model_or_request_fails_the_check)
    broken = _broken_copies(model, requests, root / "broken")
    result = run_fresh(root / "fresh", [{"model": model, "out": str(root / "fresh" / "predict_logs")}]
                       + [{"model": m, "out": str(root / "broken" / f"out{i}")} for i, m in enumerate(broken)])
    return source, model, requests, result, root


@pytest.mark.slow(reason=SLOW)
def test_the_fresh_process_has_only_tensorflow_and_no_project_code(served):
    *_, result, root = served
    assert result["cwd"] == str(root / "fresh")
    # the standard library and the venv's site-packages only: the repository root is not on it (the
    # venv lives under the repository, but its site-packages holds no project package: the editable
    # install maps them with a `.pth` file the process never reads)
    site = _site_packages()
    assert result["sys_path"][-1] == site and all(p.startswith(sys.base_prefix) for p in result["sys_path"][:-1])
    assert REPO not in result["sys_path"] and not any(os.path.exists(os.path.join(site, m)) for m in ("components", "pipelines"))
    assert all(v.startswith("ImportError") for v in result["project_imports"].values()), result["project_imports"]
    assert not set(result["modules"]) & set(NOT_NEEDED), set(result["modules"]) & set(NOT_NEEDED)
    assert "tensorflow" in result["modules"]


def test_without_the_explicit_path_the_editable_install_would_put_the_project_on_it(tmp_path):
    """Why the fresh process skips `site` (-S): with it, the venv's `.pth` files (this project's
    editable install) make `components` importable even under `-I` from another directory."""
    probe = "import importlib.util as u, json, sys; print(json.dumps(bool(u.find_spec('components'))))"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    with_site = subprocess.run([sys.executable, "-I", "-c", probe], cwd=str(tmp_path), env=env, capture_output=True, text=True)
    without = subprocess.run([sys.executable, "-I", "-S", "-c",
                              f"import sys; sys.path.append({_site_packages()!r}); " + probe],
                             cwd=str(tmp_path), env=env, capture_output=True, text=True)
    assert without.returncode == 0 and json.loads(without.stdout) is False, without.stderr
    assert with_site.returncode == 0, with_site.stderr
    if not json.loads(with_site.stdout):
        pytest.skip("the project is not installed in editable mode in this venv: nothing to contrast")


@pytest.mark.slow(reason=SLOW)
def test_every_op_is_stock_tensorflow(served):
    *_, result, _ = served
    job = result["jobs"][0]
    assert job["ok"], job.get("traceback")
    assert job["unknown_ops"] == [] and len(job["ops"]) > 20
    assert "ParseExampleV2" in job["ops"], job["ops"]  # serving_default's own parsing, in the library


@pytest.mark.slow(reason=SLOW)
def test_the_fresh_process_answers_infra_validators_requests_with_the_models_scores(served):
    import tensorflow as tf

    source, _, requests, result, root = served
    job = result["jobs"][0]
    assert job["ok"], job.get("traceback")
    logs = read_logs(root / "fresh" / "predict_logs")
    assert job["responses"] == len(logs) == len(requests) == NUM_EXAMPLES
    fn = tf.saved_model.load(source).signatures["serving_default"]
    (input_key,) = fn.structured_input_signature[1]
    records = []
    for log, request in zip(logs, requests):
        assert log.WhichOneof("log_type") == "predict_log"
        assert log.predict_log.request == request  # InfraValidator's request, unchanged
        assert request.model_spec.name == MODEL_NAME and request.model_spec.signature_name == "serving_default"
        (record,) = tf.make_ndarray(request.inputs[input_key])
        records.append(record)
        response = log.predict_log.response
        assert response.model_spec.signature_name == "serving_default"
        expected = fn(**{input_key: tf.constant([record])})
        assert set(response.outputs) == set(expected)
        for key, value in expected.items():
            got = tf.make_ndarray(response.outputs[key])
            assert got.dtype == value.numpy().dtype and got.shape == value.shape
            np.testing.assert_array_equal(got, value.numpy(), err_msg=key)
    assert len(set(records)) > 1  # distinct examples
    batch = fn(**{input_key: tf.constant(records)})  # and the batch of them scores the same
    for key, value in batch.items():
        got = np.concatenate([tf.make_ndarray(log.predict_log.response.outputs[key]) for log in logs])
        np.testing.assert_allclose(got, value.numpy(), rtol=1e-5, atol=1e-6, err_msg=key)


def _broken_copies(model, requests, broken):
    """Three broken copies of the TF Serving layout's `model` under `broken`: a warm-up request
    under another input name, no variables, a custom op. Returns their model directories."""
    from tensorflow.core.protobuf import saved_model_pb2
    from tensorflow_serving.apis import prediction_log_pb2
    from tfx.utils import io_utils, path_utils

    wrong_input = str(broken / "wrong_input" / MODEL_NAME / str(VERSION))
    shutil.copytree(model, wrong_input)
    logs = []
    for r in requests:
        r = type(r).FromString(r.SerializeToString())
        (key,) = list(r.inputs)
        r.inputs["inputs"].CopyFrom(r.inputs[key])  # a generic client's name for the serialized examples
        del r.inputs[key]
        logs.append(prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=r)))
    io_utils.write_tfrecord_file(path_utils.warmup_file_path(wrong_input), *logs)

    no_variables = str(broken / "no_variables" / MODEL_NAME / str(VERSION))
    shutil.copytree(model, no_variables)
    shutil.rmtree(os.path.join(no_variables, "variables"))

    custom_op = str(broken / "custom_op" / MODEL_NAME / str(VERSION))
    shutil.copytree(model, custom_op)
    sm = saved_model_pb2.SavedModel()
    pb = os.path.join(custom_op, "saved_model.pb")
    with open(pb, "rb") as f:
        sm.ParseFromString(f.read())
    node = next(n for fn in sm.meta_graphs[0].graph_def.library.function for n in fn.node_def if n.op == "ParseExampleV2")
    node.op = "ProjectParseExample"  # what a model built with a custom kernel would hold
    with open(pb, "wb") as f:
        f.write(sm.SerializeToString())

    return [wrong_input, no_variables, custom_op]


@pytest.mark.slow(reason=SLOW)
def test_a_broken_model_or_request_fails_the_check(served):
    """The same process, after the good model, on three broken copies: each job fails, saying why."""
    *_, result, _ = served
    wrong, missing, custom = result["jobs"][1:]
    assert not wrong["ok"] and "takes inputs ['examples']; the request has ['inputs']" in wrong["error"], wrong
    assert not missing["ok"] and "variables" in missing["error"], missing
    assert not custom["ok"] and custom["error"] == "RuntimeError: ops not in stock TensorFlow: ProjectParseExample", custom
