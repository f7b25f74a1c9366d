"""The fresh process of `python -m pipelines check-serving` (serving_check.py): what a stock TF
Serving binary does with a model, in a `python -I -S` process whose `sys.path` is the standard
library and the environment's site-packages only, so that nothing of this project (nor TFX, Beam,
tf_keras) can be imported. This file imports TensorFlow alone and is run as a script:

    python -I -S serving_check_child.py ARGS_JSON

ARGS_JSON: {"model": dir, "result": file, "sys_path": [...], "batches": [1, 64, 1024], "calls": {...}}.
It lists every op of the SavedModel's graphs and function library and finds each in stock
TensorFlow's registry; loads the model (`tf.saved_model.load`, tag `serve`); replays TF Serving's
warm-up file (`assets.extra/tf_serving_warmup_requests`, PredictionLogs) through the signatures its
requests name, the request's inputs being the signature's; answers every signature once with
inputs built from its signature (empty text, NaN, -1); times `serving_default` (on the warm-up
file's records, repeated to each batch size), or the first signature on built inputs, at each batch
size (p50, p99). Everything it finds goes to the result file, a failure as its type and message.
"""
import json
import os
import sys
import time
import traceback

WARMUP = os.path.join("assets.extra", "tf_serving_warmup_requests")


def graph_ops(model_dir):
    """Every op a node of the SavedModel's graphs and function library runs (library functions excluded)."""
    from tensorflow.core.protobuf import saved_model_pb2  # lazy: TensorFlow loads after sys.path is set (main)

    sm = saved_model_pb2.SavedModel()
    with open(os.path.join(model_dir, "saved_model.pb"), "rb") as f:
        sm.ParseFromString(f.read())
    ops = set()
    for mg in sm.meta_graphs:
        library = mg.graph_def.library
        ops |= {n.op for n in mg.graph_def.node} | {n.op for fn in library.function for n in fn.node_def}
        ops -= {fn.signature.name for fn in library.function}
    return sorted(ops)


def synthetic_inputs(tf, fn, batch):
    """A batch of `batch` rows for a signature: empty text, NaN floats, -1 integers."""
    out = {}
    for name, spec in fn.structured_input_signature[1].items():
        if spec.dtype == tf.string:
            out[name] = tf.constant([b""] * batch)
        elif spec.dtype.is_floating:
            out[name] = tf.fill([batch], tf.constant(float("nan"), spec.dtype))
        else:
            out[name] = tf.fill([batch], tf.constant(-1, spec.dtype))
    return out


def replay(tf, model, model_dir, records):
    """Each warm-up request through its signature: [{"signature", "outputs": {name: list}}]; the
    serialized records of `serving_default`'s requests are added to `records` (for the timings)."""
    from tensorflow_serving.apis import prediction_log_pb2  # lazy: TensorFlow loads after sys.path is set (main)

    answers = []
    for record in tf.data.TFRecordDataset(os.path.join(model_dir, WARMUP)):
        request = prediction_log_pb2.PredictionLog.FromString(record.numpy()).predict_log.request
        name = request.model_spec.signature_name or "serving_default"
        fn = model.signatures[name]
        expected = set(fn.structured_input_signature[1])
        if set(request.inputs) != expected:  # TF Serving: the request's inputs must be the signature's
            raise ValueError(f"signature {name} takes inputs {sorted(expected)}; a warm-up request has "
                             f"{sorted(request.inputs)}")
        inputs = {k: tf.constant(tf.make_ndarray(v)) for k, v in request.inputs.items()}
        if name == "serving_default" and len(inputs) == 1:
            records += [bytes(r) for r in next(iter(inputs.values())).numpy().reshape(-1)]
        outputs = fn(**inputs)
        answers.append({"signature": name, "outputs": {k: v.numpy().reshape(-1).tolist() for k, v in outputs.items()}})
    return answers


def timings(tf, fn, batches, calls, inputs_for):
    """{batch: {"p50_ms", "p99_ms", "calls"}} of `fn` on inputs of each batch size."""
    out = {}
    for batch in batches:
        inputs = inputs_for(batch)
        fn(**inputs)  # the first call traces nothing (a loaded function) but warms the kernels
        seconds = []
        for _ in range(calls.get(str(batch), 20)):
            start = time.perf_counter()
            fn(**inputs)
            seconds.append(time.perf_counter() - start)
        seconds.sort()
        out[str(batch)] = {"p50_ms": 1e3 * seconds[len(seconds) // 2],
                           "p99_ms": 1e3 * seconds[min(len(seconds) - 1, int(len(seconds) * 0.99))],
                           "calls": len(seconds)}
    return out


def check(args):
    import tensorflow as tf  # lazy: TensorFlow loads after sys.path is set (main)
    from tensorflow.python.framework import op_def_registry  # lazy: TensorFlow loads after sys.path is set (main)

    model_dir = args["model"]
    result = {"ops": graph_ops(model_dir)}
    result["unknown_ops"] = [op for op in result["ops"] if op_def_registry.get(op) is None]
    if result["unknown_ops"]:
        raise RuntimeError("ops not in stock TensorFlow: " + ", ".join(result["unknown_ops"]))
    model = tf.saved_model.load(model_dir, tags=["serve"])
    result["signatures"] = sorted(model.signatures)
    records = []
    result["warmup"] = replay(tf, model, model_dir, records) if os.path.isfile(os.path.join(model_dir, WARMUP)) else None
    result["answers"] = {}
    for name in result["signatures"]:
        outputs = model.signatures[name](**synthetic_inputs(tf, model.signatures[name], 2))
        result["answers"][name] = {k: v.numpy().reshape(-1).tolist() for k, v in outputs.items()}
    name = "serving_default" if "serving_default" in model.signatures else result["signatures"][0]
    fn = model.signatures[name]

    def inputs_for(batch):
        if name == "serving_default" and records:
            (key,) = fn.structured_input_signature[1]
            return {key: tf.constant([records[i % len(records)] for i in range(batch)])}
        return synthetic_inputs(tf, fn, batch)

    result["timed_signature"] = name
    result["timed_on"] = ("the warm-up file's eval rows" if name == "serving_default" and records
                          else "built rows of missing values")
    result["timings"] = timings(tf, fn, args["batches"], args.get("calls") or {}, inputs_for)
    return result


def main():
    args = json.load(open(sys.argv[1], encoding="utf-8"))
    sys.path[:] = args["sys_path"]
    try:
        result = dict(check(args), ok=True)
    except Exception as err:  # noqa: BLE001 - the failure is the result
        result = {"ok": False, "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
    result["modules"] = sorted({m.split(".")[0] for m in sys.modules})
    with open(args["result"], "w", encoding="utf-8") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main()
