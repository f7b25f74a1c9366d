"""A serving check anyone can run: `python -m pipelines check-serving --model DIR`.

TF Serving cannot be installed here, so the check does what a stock TF Serving binary does with a
model, in a fresh process that can import TensorFlow and nothing of this project
(serving_check_child.py): every op of the graph found in stock TensorFlow, the model loaded, TF
Serving's warm-up file (`assets.extra/tf_serving_warmup_requests`) replayed as a server replays it at
load, every signature answered, and `serving_default` timed at batch 1, 64 and 1024 (p50, p99).

What to check the answers against is recorded by the exporter (`write_expected`): the warm-up file
holds `WARMUP_RECORDS` real eval rows as TF Serving's PredictionLogs (one request of one row each),
and `assets.extra/serving_check.json` the scores the exporter's own process computed for them. The
check compares each replayed answer with them (`TOLERANCE`: float32 rounding across processes). A
model exported before that record gets the op, load, signature and timing checks and one line that
says it has no answers to compare.

A model that cannot be loaded (a truncated or bit-flipped variables file, a missing one) fails the
check in one line naming the file (`damaged_file`), found by reading the variables' index and
checking each data file's size and each tensor's checksum as TensorFlow's bundle reader does.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

CHECK_FILE = os.path.join("assets.extra", "serving_check.json")
WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
WARMUP_RECORDS = 16  # eval rows in the warm-up file (TF Serving replays at most 1,000 at load)
TOLERANCE = 1e-6  # |replayed - recorded| allowed: the same graph in another process
BATCHES = (1, 64, 1024)
CALLS = {"1": 100, "64": 50, "1024": 10}  # timed calls per batch size
# Modules the model must not need; any of them in the fresh process fails the check.
NOT_NEEDED = ("components", "pipelines", "tests", "tfx", "tfx_bsl", "apache_beam", "tensorflow_transform",
              "tensorflow_model_analysis", "tensorflow_data_validation", "tf_keras", "tensorflow_recommenders")


class ServingCheckFailed(RuntimeError):
    """The model failed the check; one line naming what and, for a damaged model, the file."""


@dataclass
class ServingCheck:
    """What the check found."""

    model: str
    signatures: List[str] = field(default_factory=list)
    ops: int = 0
    compared: int = 0  # warm-up answers compared with the exporter's record
    max_diff: Optional[float] = None
    no_record: Optional[str] = None  # why nothing was compared
    timed_signature: str = ""
    timed_on: str = ""
    timings: Dict[str, Dict[str, float]] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return dict(self.__dict__)


def write_expected(model_dir: str, records: Sequence[bytes], loaded: Any) -> int:
    """Records what the check compares against: the warm-up file of `records` (one TF Serving
    request of one row each through `serving_default`) and the model's scores for them.

    Args:
      model_dir: the serving SavedModel directory (the exporter's, before it is published).
      records: serialized eval tf.Examples (the first WARMUP_RECORDS are used).
      loaded: that SavedModel as `tf.saved_model.load` returned it (the exporter loads it back
        to score it, and the record is scored on the same object).

    Returns:
      The number of rows recorded.
    """
    import tensorflow as tf  # lazy: the command line's check needs no TensorFlow in this process
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2  # lazy: as above

    records = list(records)[:WARMUP_RECORDS]
    fn = loaded.signatures["serving_default"]
    (key,) = fn.structured_input_signature[1]
    expected = []
    tf.io.gfile.makedirs(os.path.join(model_dir, "assets.extra"))
    with tf.io.TFRecordWriter(os.path.join(model_dir, WARMUP_FILE)) as writer:
        for record in records:
            request = predict_pb2.PredictRequest()
            request.model_spec.signature_name = "serving_default"
            request.inputs[key].CopyFrom(tf.make_tensor_proto([record], dtype=tf.string))
            writer.write(prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request)).SerializeToString())
            expected.append(float(fn(**{key: tf.constant([record])})["probabilities"].numpy().reshape(-1)[0]))
    with tf.io.gfile.GFile(os.path.join(model_dir, CHECK_FILE), "w") as fh:
        fh.write(json.dumps({"signature": "serving_default", "output": "probabilities", "expected": expected,
                             "tolerance": TOLERANCE}))
    return len(records)


def _stdlib_and_site_packages() -> List[str]:
    stdlib = [p for p in sys.path if p and not p.startswith(sys.prefix) and "site-packages" not in p
              and p.startswith(sys.base_prefix)]
    return stdlib + [sysconfig.get_paths()["purelib"]]


def run_child(model_dir: str, work: str) -> Dict[str, Any]:
    """Runs serving_check_child.py in a fresh `python -I -S` under `work`; returns its result."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serving_check_child.py")
    args_file, result_file = os.path.join(work, "args.json"), os.path.join(work, "result.json")
    with open(args_file, "w", encoding="utf-8") as fh:
        json.dump({"model": os.path.abspath(model_dir), "result": result_file, "sys_path": _stdlib_and_site_packages(),
                   "batches": list(BATCHES), "calls": CALLS}, fh)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": work, "TF_CPP_MIN_LOG_LEVEL": "2",
           "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-I", "-S", script, args_file], cwd=work, env=env,
                          capture_output=True, text=True, timeout=1800)
    if not os.path.isfile(result_file):
        raise ServingCheckFailed(f"--model {model_dir}: the checking process ended without a result (exit "
                                 f"{proc.returncode}): {(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
    with open(result_file, encoding="utf-8") as fh:
        return json.load(fh)


def damaged_file(model_dir: str) -> Optional[str]:
    """The file of a SavedModel whose bytes are not what its variables' index says, else None:
    saved_model.pb missing or unparsable, the index unreadable, a data file missing, cut short, or a
    tensor whose bytes fail the index's checksum (crc32c, as TensorFlow's bundle reader checks)."""
    import tensorflow as tf  # lazy: only a model that failed to load is looked at
    from tensorflow.core.protobuf import saved_model_pb2  # lazy: as above

    pb = os.path.join(model_dir, "saved_model.pb")
    try:
        saved_model_pb2.SavedModel.FromString(open(pb, "rb").read())
    except Exception:  # noqa: BLE001 - any failure to read it names it
        return pb
    prefix = os.path.join(model_dir, "variables", "variables")
    if not os.path.isfile(prefix + ".index"):
        return prefix + ".index"
    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)  # the bundle reader checks each tensor's crc32c
    except Exception as e:  # noqa: BLE001 - the file is named below
        data = sorted(p for p in os.listdir(os.path.dirname(prefix)) if p.startswith("variables.data-"))
        text = str(e)
        if ".index" in text and "data" not in text.lower():
            return prefix + ".index"
        return os.path.join(os.path.dirname(prefix), data[0]) if data else prefix + ".data-00000-of-00001"
    return None


def _compare(model_dir: str, found: Dict[str, Any], check: ServingCheck) -> None:
    path = os.path.join(model_dir, CHECK_FILE)
    if not os.path.isfile(path) or found.get("warmup") is None:
        check.no_record = ("the model has no answers to compare (exported before the exporter recorded "
                           f"{CHECK_FILE} and {WARMUP_FILE}): ops, load, signatures and timings checked only")
        return
    with open(path, encoding="utf-8") as fh:
        record = json.load(fh)
    got = [a["outputs"][record["output"]][0] for a in found["warmup"] if a["signature"] == record["signature"]]
    want = record["expected"]
    if len(got) != len(want):
        raise ServingCheckFailed(f"--model {model_dir}: {len(got)} warm-up answers for {len(want)} recorded scores "
                                 f"in {CHECK_FILE}; the model's assets.extra files do not belong together")
    diffs = [abs(a - b) for a, b in zip(got, want)]
    check.compared, check.max_diff = len(got), max(diffs) if diffs else 0.0
    if check.max_diff > record.get("tolerance", TOLERANCE):
        worst = diffs.index(check.max_diff)
        raise ServingCheckFailed(f"--model {model_dir}: warm-up request {worst} scored {got[worst]:.7f} in a fresh "
                                 f"TensorFlow process, {want[worst]:.7f} when exported (|diff| {check.max_diff:.2e} > "
                                 f"{record.get('tolerance', TOLERANCE):g}): the model's variables are not the ones "
                                 "exported")


def check_serving(model_dir: str) -> ServingCheck:
    """Checks a serving model as a stock TF Serving binary would load and answer it (module docstring).

    Args:
      model_dir: a serving SavedModel directory (a pushed version, the exporter's Format-Serving).

    Returns:
      What the check found (signatures, answers compared, timings).

    Raises:
      ServingCheckFailed: one line: an op TensorFlow lacks, a damaged file, a signature that does not
        answer, an answer other than the recorded one, or a module the model should not need.
    """
    if not os.path.isdir(model_dir):
        raise ServingCheckFailed(f"--model {model_dir}: no such directory; name a serving model directory")
    with tempfile.TemporaryDirectory(prefix="serving_check_") as work:
        found = run_child(model_dir, work)
    if not found.get("ok"):
        error = found.get("error", "")
        if error.startswith("RuntimeError: ops not in stock TensorFlow"):
            raise ServingCheckFailed(f"--model {model_dir}: {error.split(': ', 1)[1]}; a stock TF Serving cannot load it")
        bad = damaged_file(model_dir)
        where = f"{bad} is damaged (cut short, changed or missing)" if bad else "it does not load or answer"
        raise ServingCheckFailed(f"--model {model_dir}: {where}: {error.splitlines()[0][:300]}")
    needed = sorted(set(found.get("modules", [])) & set(NOT_NEEDED))
    if needed:
        raise ServingCheckFailed(f"--model {model_dir}: loading it imported {', '.join(needed)}; a stock TF Serving "
                                 "has none of them")
    check = ServingCheck(model=model_dir, signatures=found["signatures"], ops=len(found["ops"]),
                         timed_signature=found["timed_signature"], timed_on=found["timed_on"],
                         timings=found["timings"])
    for name, outputs in found["answers"].items():
        values = [v for vs in outputs.values() for v in vs]
        if not values or not all(0.0 <= v <= 1.0 for v in values):
            raise ServingCheckFailed(f"--model {model_dir}: signature {name} answered {values[:4]} to rows of missing "
                                     "values; expected probabilities in [0, 1]")
    _compare(model_dir, found, check)
    return check
