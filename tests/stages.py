"""Stage outputs and configs that several test files need, in one place: plain functions, no
fixtures. tests/conftest.py turns the expensive ones into session fixtures (built once); test files
import from here, never from each other. Imports TensorFlow, TFX and Beam only inside the functions
that need them, so that importing this module (and conftest) leaves them unloaded."""
import json
import os
from types import SimpleNamespace

import yaml
from components.tfx_wiring import component_keys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A few dozen training steps make no model worth comparing with anything: configs of tests that
# are not about the validation gate leave the baseline out and the gate open (the gate and the
# baseline have their own tests: tests/test_validation_gate.py).
NO_GATE = {"baseline": {"enabled": False}, "baseline_margin": None, "regression_margin": None}


def minimal_raw_config() -> dict:
    """configs/minimal.yaml as a dict (three dense, five categorical columns)."""
    with open(os.path.join(REPO, "configs", "minimal.yaml"), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def demo_raw_config() -> dict:
    """configs/demo.yaml as a dict, to be changed by the caller."""
    with open(os.path.join(REPO, "configs", "demo.yaml"), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


# The demo's features that a scenario test needs to cover every kind (an own table, a table two
# features share, multi-hot with max_length, small and large vocabularies) at a fraction of the
# model: graph building and the Trainer's and exporter's work grow with the number of features.
FEW_CATEGORICAL = ("C1", "C2", "C3", "C4", "C12", "C20")
# The Trainer tests' (trainer_data): those, and the sequence feature the TPU branch's tests use
# (C24) with its query (C26).
TRAINER_CATEGORICAL = FEW_CATEGORICAL + ("C24", "C26")
FEW_DENSE = 3
# The TPU smoke test's parity check under the SparseCore harness (tests/test_smoke_mutations.py,
# test_sparsecore_training.py; `parity_data`): the fewest features that still give it every kind
# of table it compares (a table two features share, C3 multi-hot and C4; a TPU-embedding table of
# its own for Adagrad, C12 multi-hot; a TensorCore table, C20; each one's wide table, and the
# SparseCore stacks TF builds of them). Its step's graph, traced twice per run on two replicas,
# grows with the features: half of TRAINER_CATEGORICAL's.
PARITY_CATEGORICAL = ("C3", "C4", "C12", "C20")
# The parity check's CPU reference runs on parity_data (parity.sparsecore_training's `reference`:
# a CPU run does not depend on the TPU step), trained once per precision in a test process and
# judged against by every TPU run of the same steps: the correct step's
# (tests/test_sparsecore_training.py) and each broken one's (tests/test_smoke_mutations.py).
PARITY_REFERENCE = {}


def with_few_features(raw: dict, categorical=FEW_CATEGORICAL) -> dict:
    """`raw` (the demo config) keeping the `categorical` features and the first FEW_DENSE dense ones."""
    raw["categorical_features"] = [f for f in raw["categorical_features"] if f["name"] in categorical]
    raw["dense_features"] = raw["dense_features"][:FEW_DENSE]
    return raw


# ---- ExampleGen's executor on hand-made input (tests/test_example_gen.py, test_beam_runtime.py) ----

BASE = {
    "input": {"path": "unused.csv"},
    "label": "label",
    "dense_features": [{"name": "I1"}, {"name": "I2", "fill_value": -1.0}],
    "categorical_features": [{"name": "C1"}, {"name": "C2", "separator": "|"}],
    "beam": {"direct_running_mode": "in_memory"},
}


def example_gen_config(**over):
    """BASE (two dense, two categorical columns) with top-level fields replaced."""
    from components.config.loading import parse_config

    raw = json.loads(json.dumps(BASE))
    raw.update(over)
    return parse_config(raw)


def run_example_gen(cfg, input_dir, out_dir, pattern="*", buckets=(4, 1)):
    """EmbeddingExampleGen's executor on the files in `input_dir`: (ledger dict or None, the rows of
    every split as dicts, the LedgerError it raised or None)."""
    from tfx.proto import example_gen_pb2
    from tfx.types import artifact_utils, standard_artifacts
    from tfx.utils import proto_utils

    from components.rows import ledger
    from components.reporting.errors import LedgerError
    from components.example_gen import executor as ex
    from components.tfx_wiring.component_keys import CONFIG_KEY

    examples = standard_artifacts.Examples()
    examples.uri = str(out_dir)
    splits = [("train", buckets[0]), ("eval", buckets[1])]
    props = {
        "input_base": str(input_dir),
        "input_config": proto_utils.proto_to_json(
            example_gen_pb2.Input(splits=[example_gen_pb2.Input.Split(name="single_split", pattern=pattern)])
        ),
        "output_config": proto_utils.proto_to_json(
            example_gen_pb2.Output(split_config=example_gen_pb2.SplitConfig(splits=[
                example_gen_pb2.SplitConfig.Split(name=n, hash_buckets=b) for n, b in splits
            ]))
        ),
        "output_data_format": example_gen_pb2.FORMAT_PARQUET,
        "output_file_format": example_gen_pb2.FILE_FORMAT_PARQUET,
        CONFIG_KEY: cfg.to_json(),
    }
    executor = ex.Executor(ex.Executor.Context(beam_pipeline_args=cfg.beam_pipeline_args(), tmp_dir=str(out_dir) + "_tmp"))
    err = None
    try:
        executor.Do({}, {"examples": [examples]}, props)
    except LedgerError as e:
        err = e
    led = json.load(open(os.path.join(out_dir, ledger.LEDGER_FILE))) if os.path.exists(os.path.join(out_dir, ledger.LEDGER_FILE)) else None
    records = []
    for s in artifact_utils.decode_split_names(examples.split_names) if err is None else []:
        records += split_rows(artifact_utils.get_split_uri([examples], s))
    return led, records, err


def split_rows(split_dir):
    """The rows of one split's Parquet files, as dicts of lists (a null list read as [])."""
    import pyarrow.parquet as pq
    import tensorflow as tf

    rows = []
    for f in sorted(tf.io.gfile.glob(os.path.join(split_dir, "*"))):
        assert f.endswith(".parquet"), f
        rows += [{k: (v if v is not None else []) for k, v in r.items()} for r in pq.read_table(f).to_pylist()]
    return rows


# ---- preprocessed data for the Trainer's run_fn (the session's `trainer_data`) ----------------------

def small_cardinalities(cap: int):
    from components.example_gen.synthetic_data import GeneratorSpec

    return [min(c, cap) for c in GeneratorSpec().cardinalities]


SMALL_CAP = 3000


def trainer_config(root, categorical=TRAINER_CATEGORICAL, **training):
    from components.config.loading import parse_config

    return parse_config(trainer_raw_config(root, categorical, **training))


def trainer_raw_config(root, categorical=TRAINER_CATEGORICAL, **training):
    """The demo config on `root`'s CSV with a short fixed-length training, with the `categorical`
    features only (with_few_features; None: all of the demo's). The Trainer's work (graph
    building, steps on several replicas, export) grows with the features, not with the rows."""
    raw = demo_raw_config()
    if categorical:
        with_few_features(raw, categorical)
    raw["input"]["path"] = str(root / "train.csv")
    raw["training"].update({
        "batch_size": 64, "train_steps": 40, "checkpoint_every_steps": 10,
        # Tables up to 400 rows on the TensorCore, the rest in TPU embedding: both placements.
        "embedding": {"size_threshold": 400},
        # These tests check fixed-length training (steps, checkpoints, resume); the held-out
        # selection and early stopping have their own (tests/test_early_stopping.py).
        "early_stopping": {"enabled": False},
    })
    raw["training"].update(training)
    raw["validation"] = dict(NO_GATE)
    return raw


def preprocess_trainer_data(root, categorical=TRAINER_CATEGORICAL):
    """3,000 train and 600 eval generated rows (cardinalities capped at SMALL_CAP), preprocessed by
    run_preprocessing on Beam's in-memory runner into `root` (with `categorical`, only those
    categorical features): train.csv, eval.csv, vocab/, tx/, stats/. Read-only for its users: each
    writes its Trainer outputs under its own name (fn_args)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from components.embedding_preprocess.run import run_preprocessing
    from components.example_gen.synthetic_data import GeneratorSpec, write_csv

    small = small_cardinalities(SMALL_CAP)
    write_csv(GeneratorSpec(rows=3000, seed=11, cardinalities=small), str(root / "train.csv"))
    write_csv(GeneratorSpec(rows=600, seed=12, cardinalities=small), str(root / "eval.csv"))
    cfg = trainer_config(root, categorical)
    run_preprocessing(
        beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=in_memory"])),
        cfg,
        {"train": str(root / "train.csv"), "eval": str(root / "eval.csv")},
        str(root / "vocab"),
        {s: str(root / "tx" / f"Split-{s}") for s in ("train", "eval")},
        str(root / "stats"),
        input_format="csv",
    )
    return root


class Killed(Exception):
    """A training run stopped on purpose (`kill_after`), as a killed process stops."""


def kill_after(monkeypatch, step: int) -> None:
    """Trainings stop with Killed right after their checkpoint at `step`, leaving an unfinished
    state (resume_rule.py: only an unfinished state goes on under a longer run). Undone by
    `monkeypatch.undo()` or at the test's end."""
    from components.embedding_trainer import training_loop

    save = training_loop.Checkpointer.on_epoch_end

    def killed(self, epoch, logs=None):
        save(self, epoch, logs)
        if int(self.step.numpy()) == step:
            raise Killed()

    monkeypatch.setattr(training_loop.Checkpointer, "on_epoch_end", killed)


def examples_uri(split_files) -> str:
    """The transformed-examples directory of split file patterns these tests and benchmarks wrote
    themselves (`<dir>/Split-<name>/*`): what the Trainer's executor passes as the artifact's URI."""
    return os.path.dirname(os.path.dirname(list(split_files)[0]))


def fn_args(root, cfg, execution):
    """The Trainer's FnArgs for run_fn on `root`'s transformed splits, writing under
    root/Trainer/*/<execution>: give every run its own `execution` (the data is shared)."""
    from components.tfx_wiring.component_keys import CONFIG_KEY, EXAMPLES_URI_KEY

    model_uri = root / "Trainer" / "model" / str(execution)
    return SimpleNamespace(
        custom_config={CONFIG_KEY: cfg.to_json(), EXAMPLES_URI_KEY: str(root / "tx")},
        train_files=[str(root / "tx" / "Split-train" / "*")],
        eval_files=[str(root / "tx" / "Split-eval" / "*")],
        serving_model_dir=str(model_uri / "Format-Serving"),
        model_run_dir=str(root / "Trainer" / "model_run" / str(execution)),
        train_steps=None,
    )


# ---- the executors' chain (the session's `chain`) ----------------------------------------------------

ROWS = 2500
RUN_FN = "components.embedding_trainer.trainer_module.run_fn"  # what pipelines/pipeline.py wires
BEAM_ARGS = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def artifact(cls, uri, split_names=None):
    """A TFX artifact of type `cls` at `uri` (created), with its split names."""
    from tfx.types import artifact_utils

    a = cls()
    a.uri = str(uri)
    os.makedirs(a.uri, exist_ok=True)
    if split_names is not None:
        a.split_names = artifact_utils.encode_split_names(split_names)
    return a


def executors_config(csv_path):
    from components.config.loading import parse_config

    raw = demo_raw_config()
    raw["input"]["path"] = str(csv_path)
    # Fixed-length: the held-out selection has its own tests (test_early_stopping.py).
    raw["training"].update({"batch_size": 64, "train_steps": 30, "eval_steps": 5, "checkpoint_every_steps": 15,
                            "early_stopping": {"enabled": False}})
    # Tables of more than 110 rows in TPU embedding, the rest on the TensorCore: both placements in
    # the checkpoint (the exporter's layout tests re-lay the TPU-embedding ones out).
    raw["training"]["embedding"] = {"size_threshold": 110}
    # A small export: the same conversion and parity check, fewer examples scored, no int8/float16 variants.
    raw["export"].update(compare_compression=False, auc_sample_size=500, parity_sample_size=128)
    # The baseline is fitted (the Trainer's Do is tested with it); a 30-step model is not held to it.
    raw["validation"] = {"baseline_margin": None}
    return parse_config(raw)


def beam_context():
    """A Beam executor's context on the in-memory runner."""
    from tfx.dsl.components.base import base_beam_executor

    return base_beam_executor.BaseBeamExecutor.Context(beam_pipeline_args=BEAM_ARGS)


def make_chain(root):
    """The four executors run in order on hand-built artifacts under `root`: (config, {name:
    artifact}, root); the session's `chain` fixture (tests/conftest.py)."""
    from components.example_gen.synthetic_data import GeneratorSpec, write_csv

    data = root / "input"
    data.mkdir()
    write_csv(GeneratorSpec(rows=ROWS, seed=5, cardinalities=small_cardinalities(2000)), str(data / "data.csv"))
    cfg = executors_config(data / "data.csv")
    return cfg, run_chain(root, cfg, data), root


def run_chain(root, cfg, data):
    """ExampleGen (on the CSV files in `data`) -> Preprocess -> Trainer -> Exporter under `root`;
    returns {name: artifact}."""
    from components.embedding_trainer.executors import TrainerExecutor
    from tfx.proto import example_gen_pb2, trainer_pb2
    from tfx.types import standard_artifacts, standard_component_specs as specs
    from tfx.utils import proto_utils

    from components.tfx_wiring.artifact_types import EmbeddingStatistics, EmbeddingVocabulary
    from components.embedding_exporter import executor as export_executor
    from components.tfx_wiring.component_keys import CONFIG_KEY
    from components.embedding_preprocess import executor as preprocess_executor
    from components.example_gen import executor as example_gen_executor

    a = {}
    a["last_blessed"] = look_up(root / "LastBlessedModel" / "model", root / "serving")  # nothing pushed yet

    a["examples"] = artifact(standard_artifacts.Examples, root / "ExampleGen")
    input_config = example_gen_pb2.Input(splits=[example_gen_pb2.Input.Split(name="single_split", pattern="data.csv")])
    output_config = example_gen_pb2.Output(split_config=example_gen_pb2.SplitConfig(splits=[
        example_gen_pb2.SplitConfig.Split(name="train", hash_buckets=cfg.input.train_buckets),
        example_gen_pb2.SplitConfig.Split(name="eval", hash_buckets=cfg.input.eval_buckets),
    ]))
    example_gen_executor.Executor(beam_context()).Do({}, {specs.EXAMPLES_KEY: [a["examples"]]}, {
        specs.INPUT_BASE_KEY: str(data),
        specs.INPUT_CONFIG_KEY: proto_utils.proto_to_json(input_config),
        specs.OUTPUT_CONFIG_KEY: proto_utils.proto_to_json(output_config),
        specs.OUTPUT_DATA_FORMAT_KEY: example_gen_pb2.FORMAT_PARQUET,
        specs.OUTPUT_FILE_FORMAT_KEY: example_gen_pb2.FILE_FORMAT_PARQUET,
        CONFIG_KEY: cfg.to_json(),
    })

    a["transformed"] = artifact(standard_artifacts.Examples, root / "Preprocess" / "transformed")
    a["vocabulary"] = artifact(EmbeddingVocabulary, root / "Preprocess" / "vocabulary")
    a["statistics"] = artifact(EmbeddingStatistics, root / "Preprocess" / "statistics")
    preprocess_executor.Executor(beam_context()).Do(
        {component_keys.EXAMPLES_KEY: [a["examples"]]},
        {
            component_keys.TRANSFORMED_EXAMPLES_KEY: [a["transformed"]],
            component_keys.VOCABULARY_KEY: [a["vocabulary"]],
            component_keys.STATISTICS_KEY: [a["statistics"]],
        },
        {CONFIG_KEY: cfg.to_json()},
    )

    a["model"] = artifact(standard_artifacts.Model, root / "Trainer" / "model")
    a["model_run"] = artifact(standard_artifacts.ModelRun, root / "Trainer" / "model_run")
    TrainerExecutor().Do(
        {specs.EXAMPLES_KEY: [a["transformed"]], specs.BASE_MODEL_KEY: [a["last_blessed"]]},
        {specs.MODEL_KEY: [a["model"]], specs.MODEL_RUN_KEY: [a["model_run"]]},
        {
            specs.RUN_FN_KEY: RUN_FN,
            specs.TRAIN_ARGS_KEY: proto_utils.proto_to_json(trainer_pb2.TrainArgs(num_steps=cfg.training.train_steps)),
            specs.EVAL_ARGS_KEY: proto_utils.proto_to_json(trainer_pb2.EvalArgs(num_steps=cfg.training.eval_steps)),
            specs.CUSTOM_CONFIG_KEY: json.dumps({CONFIG_KEY: cfg.to_json()}),
        },
    )

    a["serving"] = artifact(standard_artifacts.Model, root / "Exporter" / "serving_model")
    a["blessing"] = artifact(standard_artifacts.ModelBlessing, root / "Exporter" / "blessing")
    export_executor.Executor().Do(
        {component_keys.MODEL_KEY: [a["model"]], component_keys.EXAMPLES_KEY: [a["examples"]],
         component_keys.LAST_MODEL_KEY: [a["last_blessed"]]},
        {component_keys.SERVING_MODEL_KEY: [a["serving"]], component_keys.BLESSING_KEY: [a["blessing"]]},
        {CONFIG_KEY: cfg.to_json()},
    )

    a["pushed"] = push(a["serving"], a["blessing"], root / "Pusher" / "pushed_model", root / "serving", cfg.name)
    return a


def look_up(uri, serving_dir):
    """LastBlessedModel's executor: the registry at `serving_dir` read into a Model artifact at `uri`."""
    from tfx.types import standard_artifacts

    from components.model_registry import executor as registry_executor

    out = artifact(standard_artifacts.Model, uri)
    registry_executor.LookupExecutor().Do({}, {component_keys.MODEL_KEY: [out]},
                                          {component_keys.SERVING_DIR_KEY: str(serving_dir)})
    return out


def push(serving, blessing, uri, serving_dir, pipeline_name, run_id=None):
    """The registering Pusher's executor (TFX's Pusher keys) on the exporter's outputs."""
    from tfx.proto import pusher_pb2
    from tfx.types import standard_artifacts, standard_component_specs as specs
    from tfx.utils import proto_utils

    from components.model_registry import executor as registry_executor

    pushed = artifact(standard_artifacts.PushedModel, uri)
    registry_executor.RegistryPusherExecutor().Do(
        {specs.MODEL_KEY: [serving], specs.MODEL_BLESSING_KEY: [blessing]},
        {specs.PUSHED_MODEL_KEY: [pushed]},
        {specs.PUSH_DESTINATION_KEY: proto_utils.proto_to_json(pusher_pb2.PushDestination(
            filesystem=pusher_pb2.PushDestination.Filesystem(base_directory=str(serving_dir)))),
         component_keys.PIPELINE_NAME_KEY: pipeline_name, component_keys.RUN_ID_KEY: run_id},
    )
    return pushed


# ---- the demo config's pipeline (the session's `pipeline_run`) -------------------------------------

# The demo config (configs/demo.yaml) on 100k generated rows (the demo's 375k less: ExampleGen,
# preprocessing and the tests' reads scale with rows) for a third of its 2,400 steps (the cosine
# schedule over those): measured, eval AUC 0.8530 against a best achievable 0.8646 (the bound is
# 0.02); 150k rows at 1,200 steps gave 0.8551 against 0.8646 for 121 CPU-s against 93.
PIPELINE_RUN_ROWS = 100_000
PIPELINE_RUN_STEPS = 800


def run_demo_pipeline(root):
    """The real pipeline on configs/demo.yaml under `root`, on PIPELINE_RUN_ROWS generated rows
    (seed 99) for PIPELINE_RUN_STEPS steps: (config, output dir, summary, data metadata)."""
    from components.config.loading import load_config
    from components.example_gen.synthetic_data import GeneratorSpec, ensure_dataset
    from pipelines.runner import run

    data = root / "data" / "criteo_like.csv"
    meta = ensure_dataset(str(data), GeneratorSpec(rows=PIPELINE_RUN_ROWS, seed=99))
    raw = demo_raw_config()
    raw["input"]["path"] = str(data)
    raw["beam"]["direct_num_workers"] = 2
    # The demo's model and Beam workers; without the baseline and the exporter's float16/int8
    # variants, which none of this fixture's tests reads (on 375k rows they took about a fifth of the
    # run). The baseline's fit is held to scikit-learn's in test_validation_gate.py and runs on real
    # data in test_public_data.py; the variants are exported in test_export.py.
    raw["validation"] = dict(NO_GATE)
    raw["export"]["compare_compression"] = False
    raw["training"]["train_steps"] = PIPELINE_RUN_STEPS
    raw["training"]["dense_optimizer"]["schedule"]["decay_steps"] = PIPELINE_RUN_STEPS
    raw["training"]["checkpoint_every_steps"] = PIPELINE_RUN_STEPS // 3
    cfg_path = root / "e2e.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    cfg = load_config(str(cfg_path))
    summary = run(cfg, str(root / "out")).summary
    return cfg, root / "out", summary, meta


# ---- input in the order a new user's logs come in (tests/test_ordered_input.py) ------------------

def write_sorted_by_label(path, rows, seed=5):
    """Generated demo rows written to the CSV `path` sorted by label (every 0 first, then every 1):
    the first rows of each split hold one class. Returns (rows, positives)."""
    from components.example_gen.synthetic_data import GeneratorSpec, write_csv

    unsorted = str(path) + ".unsorted"
    write_csv(GeneratorSpec(rows=rows, seed=seed), unsorted)
    with open(unsorted, encoding="utf-8") as fh:
        header, *body = fh.read().splitlines()
    os.remove(unsorted)
    os.remove(unsorted + ".meta.json")
    label = header.split(",").index("label")
    body.sort(key=lambda line: line.split(",")[label])
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join([header, *body]) + "\n")
    return len(body), sum(line.split(",")[label] == "1" for line in body)


# ---- configs/features.yaml (every feature kind) on small generated data ------------------------

def features_raw_config(csv_path) -> dict:
    """configs/features.yaml as a dict reading `csv_path` (data with the extra columns), its
    vocabulary file made absolute: every feature kind (identity, hashed, list, file and counted
    vocabularies, a shared table, weighted, multi-hot and sequence features)."""
    with open(os.path.join(REPO, "configs", "features.yaml"), encoding="utf-8") as fh:
        raw = yaml.safe_load(fh)
    raw["input"]["path"] = str(csv_path)
    for f in raw["categorical_features"]:  # the given file, relative to configs/
        v = f.get("vocabulary") or {}
        if v.get("kind") == "file":
            v["file"] = os.path.join(REPO, "configs", v["file"])
    return raw


FEATURES_ROWS = 3000  # the eval split (about a fifth) holds every feature kind's values many times over


def make_features_run(root):
    """(config, {name: artifact}, root): `python -m pipelines run`'s entry point (TFX's
    LocalDagRunner, every component wired as in production) on configs/features.yaml
    (features_raw_config: every feature kind) and FEATURES_ROWS rows written by the documented
    command (docs/data.md) with the extra columns, with what the feature-kind and BulkInferrer
    tests need of it: the items table in TPU embedding too (size_threshold 100), per-table
    optimizers with the gradient multiplier's warm-up, wide parts, the row files written by Beam,
    and bulk inference on the eval split. The run's output directory is `root / "out"`; its
    artifacts are keyed as run_chain's are (pipeline_artifacts)."""
    from components.config.loading import parse_config
    from components.example_gen import synthetic_data
    from pipelines.__main__ import main

    data = root / "input"
    data.mkdir()
    assert synthetic_data.main(["--rows", str(FEATURES_ROWS), "--seed", "9", "--max-cardinality", "2000",
                                "--extra-columns", "--output", str(data / "data.csv")]) == 0
    raw = features_raw_config(data / "data.csv")
    raw["training"]["embedding"] = {"size_threshold": 100}
    raw["training"].update({"batch_size": 64, "train_steps": 40, "eval_steps": 5, "checkpoint_every_steps": 20,
                            "embedding_gradient_multiplier": {"value": 1.0, "schedule": {"warmup_steps": 10}},
                            "early_stopping": {"enabled": False}})  # fixed-length (test_early_stopping.py)
    # row files (by a Beam pipeline), the dense model and their parity on every kind, wide parts (of
    # sequences too) included
    raw["export"].update(compare_compression=False, auc_sample_size=500, parity_sample_size=256,
                         store={"enabled": True, "max_file_mib": 1, "beam": True})
    raw["training"]["wide"] = {"enabled": True}
    raw["beam"] = {"direct_running_mode": "in_memory", "direct_num_workers": 1}
    raw["validation"] = dict(NO_GATE)
    raw["bulk_inference"] = {"enabled": True, "splits": ["eval"]}
    cfg_path = root / "features.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    assert main(["run", "--config", str(cfg_path), "--output-dir", str(root / "out"), "--json"]) == 0
    return parse_config(raw), pipeline_artifacts(root / "out"), root


# A pipeline run's outputs under run_chain's names: {name: (node, output key)}
PIPELINE_OUTPUTS = {
    "last_blessed": ("LastBlessedModel", "model"), "examples": ("EmbeddingExampleGen", "examples"),
    "transformed": ("EmbeddingPreprocess", "transformed_examples"), "vocabulary": ("EmbeddingPreprocess", "vocabulary"),
    "statistics": ("EmbeddingPreprocess", "statistics"), "model": ("Trainer", "model"),
    "model_run": ("Trainer", "model_run"), "serving": ("EmbeddingExporter", "serving_model"),
    "blessing": ("EmbeddingExporter", "blessing"), "pushed": ("Pusher", "pushed_model"),
    "copy": ("BulkInferrerExampleCopy", "tf_examples"), "inference": ("BulkInferrer", "inference_result"),
}


def pipeline_artifacts(output_dir):
    """{name: artifact} (PIPELINE_OUTPUTS' names) of the last pipeline run into `output_dir`, read
    from its ML Metadata with their properties (pipelines.summary.run_artifacts: the run's own)."""
    from tfx.types import artifact_utils

    from pipelines.pipeline import METADATA_FILE
    from pipelines.summary import readonly_store, run_artifacts

    path = os.path.join(str(output_dir), METADATA_FILE)
    uris = run_artifacts(path, 0)
    store = readonly_store(path)
    types = {t.id: t for t in store.get_artifact_types()}
    by_uri = {a.uri: a for a in store.get_artifacts()}
    out = {}
    for name, (node, key) in PIPELINE_OUTPUTS.items():
        uri = uris.get(f"{node}.{key}")
        if uri is not None:
            out[name] = artifact_utils.deserialize_artifact(types[by_uri[uri].type_id], by_uri[uri])
    return out


def read_prediction_logs(uri):
    """docs/tfx.md's snippet: every PredictionLog of a BulkInferrer's InferenceResult at `uri`."""
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    files = tf.io.gfile.glob(os.path.join(uri, "prediction_logs-*.gz"))
    return [prediction_log_pb2.PredictionLog.FromString(r.numpy())
            for r in tf.data.TFRecordDataset(files, compression_type="GZIP")]


# ---- a toy serving model (tests/test_batch_scoring.py, test_serving_check.py) ----------------------


def save_toy_serving_model(model_dir):
    """A small SavedModel with a `serve_features` signature and its inputs' record, as the exporter
    writes them (`Class Name` read as the input `Class_Name`): probability = sigmoid(I1, NaN as 0,
    + the length of `Class Name`'s text / 10 + a bias variable that holds 0). Returns its directory."""
    import tensorflow as tf

    class Toy(tf.Module):
        def __init__(self):
            super().__init__()
            self.bias = tf.Variable(tf.zeros([1024]))  # a variables file of some size

        @tf.function(input_signature=[{"I1": tf.TensorSpec([None], tf.float32, name="I1"),
                                       "Class_Name": tf.TensorSpec([None], tf.string, name="Class_Name")}])
        def serve(self, columns):
            x = tf.where(tf.math.is_nan(columns["I1"]), 0.0, columns["I1"])
            length = tf.cast(tf.strings.length(columns["Class_Name"]), tf.float32)
            return {"probabilities": tf.sigmoid(x + length / 10.0 + self.bias[0])[:, None]}

    module = Toy()
    tf.saved_model.save(module, str(model_dir), signatures={"serve_features": module.serve})
    os.makedirs(os.path.join(str(model_dir), "assets.extra"), exist_ok=True)
    with open(os.path.join(str(model_dir), "assets.extra", "serving_inputs.json"), "w", encoding="utf-8") as fh:
        json.dump({"version": 1, "serving_inputs": [
            {"input": "I1", "column": "I1", "dtype": "float32", "typed_dtype": None, "features": ["I1"]},
            {"input": "Class_Name", "column": "Class Name", "dtype": "string", "typed_dtype": None,
             "features": ["C1"]}]}, fh)
    return str(model_dir)


# ---- the Trainer's variables created before the fit (model_building.create_variables) -------------

def fits_with_variables_created_before_and_by_the_first_step(cfg, plan, manifest, files, root, steps=3):
    """Two `steps`-step fits of the Trainer's model from the run's seed under `cfg`'s hardware
    (place_training: the harness's TPU strategy where one is installed): the first with its
    variables created before the fit (model_building.create_variables, checked to be a no-op
    once built), the second by its first step. Returns, for each (True: created before), the
    training step's trace count and every value of its checkpoint after the fit."""
    import tensorflow as tf

    from components.embedding_model.checkpoint_keys import OBJECT_GRAPH_KEY
    from components.embedding_trainer import hardware, model_building, training_data

    runs = {}
    for before in (True, False):
        tf.keras.utils.set_random_seed(cfg.training.seed)
        hw = hardware.place_training(cfg)
        fitted_plan, model = model_building.build_training_model(cfg, plan, manifest, hw)
        ds = training_data.training_dataset(cfg, fitted_plan, manifest, files, hw, 0, 0.0)
        strategy = hw.strategy if hw.on_tpu else None
        if before:
            assert model_building.create_variables(model, ds.element_spec, strategy)
            assert not model_building.create_variables(model, ds.element_spec, strategy)  # built: nothing again
        model.fit(ds, epochs=1, steps_per_epoch=steps, verbose=0)
        reader = tf.train.load_checkpoint(tf.train.Checkpoint(model=model).save(str(root / str(before) / "ckpt")))
        runs[before] = (model.train_function.experimental_get_tracing_count(),
                        {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
                         if not k.startswith((OBJECT_GRAPH_KEY, "save_counter"))})
    return runs


def assert_traced_once_with_the_first_steps_values(runs, more_than: int) -> None:
    """`runs` (fits_with_variables_created_before_and_by_the_first_step's): the step traced once
    with the variables created before the fit, twice without, and every checkpoint value (more
    than `more_than` of them, optimizer slots among them) the same in both."""
    import numpy as np

    (traces, values), (traces_without, values_without) = runs[True], runs[False]
    assert (traces, traces_without) == (1, 2)
    assert sorted(values) == sorted(values_without) and len(values) > more_than
    assert any("OPTIMIZER_SLOT" in k for k in values)
    for k in values:
        np.testing.assert_array_equal(values[k], values_without[k], err_msg=k)
