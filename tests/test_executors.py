"""Each component's executor called directly, as TFX's own executor tests do: artifacts built by
hand, `Executor().Do(input_dict, output_dict, exec_properties)`, outputs checked. No pipeline, no
orchestrator, no ML Metadata: the chain ExampleGen -> EmbeddingPreprocess -> TFX Trainer (with this
project's run_fn) -> EmbeddingExporter on a small generated CSV, plus the refusals each executor
owes its caller."""
import json
import os

import pytest

import components  # noqa: F401

from tfx.types import artifact_utils, standard_artifacts
from tfx.utils import io_utils

from components.rows import ledger as ledger_lib
from components.tfx_wiring.artifact_types import EmbeddingStatistics, EmbeddingVocabulary
from components.reporting.errors import LedgerError
from components.embedding_exporter import executor as export_executor
from components.embedding_preprocess import executor as preprocess_executor
from components.model_registry import registry

from tests.stages import (BEAM_ARGS, ROWS, artifact as _artifact, beam_context as _beam_context, look_up, push,
                          examples_uri)
from components.tfx_wiring.component_keys import CONFIG_KEY
from components.tfx_wiring import component_keys


@pytest.mark.slow(reason="reads the executors' chain (every executor's Do() on 2,500 rows)")
def test_example_gen_do_writes_splits_and_a_balanced_ledger(chain):
    _, a, _ = chain
    examples = a["examples"]
    assert artifact_utils.decode_split_names(examples.split_names) == ["train", "eval"]
    ledger = json.loads(io_utils.read_string_file(os.path.join(examples.uri, ledger_lib.LEDGER_FILE)))
    stage = ledger["stages"][0]
    assert stage["rows_in"] == ROWS and stage["balanced"]
    train, evals = (examples.get_int_custom_property(f"{s}_rows") for s in ("train", "eval"))
    assert {"train": train, "eval": evals} == stage["rows_out"]
    assert train + evals == ROWS - sum(stage["malformed"].values()) - sum(stage["dropped"].values())
    assert 0 < evals < train


@pytest.mark.slow(reason="reads the executors' chain (every executor's Do() on 2,500 rows)")
def test_example_gen_output_is_read_by_tfx_own_tfxio(chain):
    """A standard Examples artifact: TFX's tfxio_utils (StatisticsGen, SchemaGen, Transform) reads
    the Parquet payload with tfx_bsl's ParquetTFXIO, every row and every column."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to
    from tfx.components.util import examples_utils, tfxio_utils
    from tfx.proto import example_gen_pb2

    _, a, _ = chain
    examples = a["examples"]
    assert examples_utils.get_payload_format(examples) == example_gen_pb2.FORMAT_PARQUET
    factory = tfxio_utils.get_tfxio_factory_from_artifact([examples], ["test"])
    tfxio = factory(io_utils.all_files_pattern(artifact_utils.get_split_uri([examples], "eval")))
    with beam.Pipeline() as p:
        rows = (p | tfxio.BeamSource() | beam.Map(lambda rb: rb.num_rows) | beam.CombineGlobally(sum))
        assert_that(rows, equal_to([examples.get_int_custom_property("eval_rows")]))


@pytest.mark.slow(reason="reads the executors' chain (every executor's Do() on 2,500 rows)")
def test_preprocess_do_writes_vocabularies_statistics_and_counts(chain):
    cfg, a, _ = chain
    examples, transformed = a["examples"], a["transformed"]
    for s in ("train", "eval"):
        assert a["statistics"].get_int_custom_property(f"{s}_examples_read") == examples.get_int_custom_property(f"{s}_rows")
        assert 0 < transformed.get_int_custom_property(f"{s}_examples") <= examples.get_int_custom_property(f"{s}_rows")
        assert os.listdir(os.path.join(transformed.uri, f"Split-{s}"))
    assert a["vocabulary"].get_string_custom_property("tables") == ",".join(t.name for t in cfg.tables)
    assert transformed.get_string_custom_property("vocabulary_uri") == a["vocabulary"].uri
    assert os.listdir(a["statistics"].uri)


@pytest.mark.slow(reason="reads the executors' chain (every executor's Do() on 2,500 rows)")
def test_trainer_do_with_run_fn_writes_the_model_artifact(chain):
    _, a, _ = chain
    serving_dir = os.path.join(a["model"].uri, "Format-Serving")
    assert os.path.exists(os.path.join(serving_dir, "saved_model.pb"))


@pytest.mark.slow(reason="reads the executors' chain (every executor's Do() on 2,500 rows)")
def test_exporter_do_blesses_a_verified_serving_model(chain):
    _, a, _ = chain
    serving, blessing = a["serving"], a["blessing"]
    assert os.path.exists(os.path.join(serving.uri, "Format-Serving", "saved_model.pb"))
    assert blessing.get_int_custom_property("blessed") == 1
    # TFX's names, and the Trainer model, which the Pusher registers (the next run's warm start).
    assert blessing.get_string_custom_property("current_model") == a["model"].uri
    assert blessing.get_int_custom_property("current_model_id") == a["model"].id
    assert blessing.get_string_custom_property("serving_model") == serving.uri
    metrics = json.load(open(os.path.join(a["model"].uri, "eval_metrics.json")))
    assert metrics["baseline"]["model"] == "logistic_regression" and 0 <= metrics["baseline"]["auc"] <= 1
    validation = json.load(open(os.path.join(serving.uri, "export_report.json")))["validation"]
    assert validation["blessed"] and validation["baseline"] == metrics["baseline"]
    assert [c["name"] for c in validation["checks"]] == ["last_blessed"] and validation["checks"][0]["skipped"]
    # nothing was pushed before: the lookup's note is the skipped check's reason
    assert "no model pushed to" in validation["checks"][0]["reason"]
    assert validation["last_blessed"]["found"] is False and validation["last_blessed"]["reference_auc"] is None
    assert serving.get_float_custom_property("parity_max_abs_diff") <= 1e-5
    assert blessing.get_int_custom_property("parity_examples") > 0
    assert os.path.exists(os.path.join(blessing.uri, "BLESSED"))


@pytest.mark.slow(reason="reads the executors' chain (every executor's Do() on 2,500 rows)")
def test_preprocess_do_refuses_examples_without_an_eval_split(chain, tmp_path):
    cfg, a, _ = chain
    only_train = _artifact(standard_artifacts.Examples, a["examples"].uri, split_names=["train"])
    outputs = {
        component_keys.TRANSFORMED_EXAMPLES_KEY: [_artifact(standard_artifacts.Examples, tmp_path / "t")],
        component_keys.VOCABULARY_KEY: [_artifact(EmbeddingVocabulary, tmp_path / "v")],
        component_keys.STATISTICS_KEY: [_artifact(EmbeddingStatistics, tmp_path / "s")],
    }
    with pytest.raises(ValueError, match=r"lack split\(s\) \['eval'\]"):
        preprocess_executor.Executor(_beam_context()).Do(
            {component_keys.EXAMPLES_KEY: [only_train]}, outputs, {CONFIG_KEY: cfg.to_json()}
        )
    assert not any(os.listdir(tmp_path / d) for d in ("t", "v", "s"))


@pytest.mark.slow(reason="reads the executors' chain (every executor's Do() on 2,500 rows)")
def test_exporter_do_refuses_examples_whose_ledger_does_not_balance(chain, tmp_path):
    cfg, a, _ = chain
    examples = _artifact(standard_artifacts.Examples, tmp_path / "examples", split_names=["train", "eval"])
    ledger = json.loads(io_utils.read_string_file(os.path.join(a["examples"].uri, ledger_lib.LEDGER_FILE)))
    ledger["stages"][0]["balanced"] = False  # as ExampleGen writes it when a row went missing
    ledger["stages"][0]["problems"] = ["written rows: sent to the writer 2,000 != found in the output files 1,999"]
    io_utils.write_string_file(os.path.join(examples.uri, ledger_lib.LEDGER_FILE), json.dumps(ledger))
    serving = _artifact(standard_artifacts.Model, tmp_path / "serving")
    blessing = _artifact(standard_artifacts.ModelBlessing, tmp_path / "blessing")
    with pytest.raises(LedgerError, match="EmbeddingExporter refuses its input.*1,999"):
        export_executor.Executor().Do(
            {component_keys.MODEL_KEY: [a["model"]], component_keys.EXAMPLES_KEY: [examples]},
            {component_keys.SERVING_MODEL_KEY: [serving], component_keys.BLESSING_KEY: [blessing]},
            {CONFIG_KEY: cfg.to_json()},
        )
    assert not os.listdir(serving.uri) and not os.listdir(blessing.uri)


@pytest.mark.slow(reason="reads the executors' chain (every executor's Do() on 2,500 rows)")
def test_lookup_do_on_an_empty_destination_finds_nothing_and_the_trainer_starts_fresh(chain):
    _, a, _ = chain
    assert a["last_blessed"].get_int_custom_property("found") == 0
    continuous = json.load(open(os.path.join(a["model"].uri, "continuous.json")))
    assert continuous["base_model"] is None and continuous["warm_start"] is None
    assert "no model pushed to" in continuous["note"] and "trained from scratch" in continuous["note"]


@pytest.mark.slow(reason="reads the executors' chain (every executor's Do() on 2,500 rows)")
def test_pusher_do_pushes_and_registers_the_blessed_model(chain):
    cfg, a, root = chain
    pushed = a["pushed"]
    assert pushed.get_int_custom_property("pushed") == 1
    destination = pushed.get_string_custom_property("pushed_destination")
    version = pushed.get_string_custom_property("pushed_version")
    assert destination == os.path.join(str(root / "serving"), version)
    assert os.path.exists(os.path.join(destination, "saved_model.pb"))
    entry = registry.read_entry(str(root / "serving"), int(version))
    report = json.load(open(os.path.join(a["serving"].uri, "export_report.json")))
    metrics = json.load(open(os.path.join(a["model"].uri, "eval_metrics.json")))
    assert entry["serving_model"] == destination and entry["exported_model"] == a["serving"].uri
    assert entry["trainer_model"] == a["model"].uri and entry["pipeline"] == cfg.name
    assert entry["eval_auc"] == report["eval_auc"]["serving"] and entry["eval_examples"] == report["eval_auc"]["examples"]
    assert entry["trainer_eval_auc"] == metrics["auc"] and entry["baseline_auc"] == metrics["baseline"]["auc"]
    assert entry["manifest"] == json.load(open(os.path.join(a["model"].uri, "embedding_manifest.json")))
    assert entry["plan"] == json.load(open(os.path.join(a["model"].uri, "embedding_plan.json")))
    assert entry["run"] == {"id": None, "name": None, "orchestrator": "unknown"}  # no orchestrator here
    assert [g["name"] for g in entry["gate"]] == ["last_blessed"] and entry["gate"][0]["skipped"]


@pytest.mark.slow(reason="reads the executors' chain (every executor's Do() on 2,500 rows)")
def test_next_run_finds_the_pushed_model_and_warm_starts_from_it(chain, tmp_path):
    """What a second run's LastBlessedModel hands the Trainer and the exporter."""
    from components.embedding_trainer.base_model import continuous_start
    from components.embedding_trainer.resolved_input import read_manifest, read_statistics

    cfg, a, root = chain
    found = look_up(tmp_path / "last_blessed", root / "serving")
    destination = a["pushed"].get_string_custom_property("pushed_destination")
    assert found.get_int_custom_property("found") == 1
    assert found.get_string_custom_property("served_model") == destination
    assert found.get_string_custom_property("trainer_model") == a["model"].uri
    # the Trainer gets TFX's base_model path (<artifact>/Format-Serving) and follows the pointer
    train = [os.path.join(a["transformed"].uri, "Split-train", "*")]
    start = continuous_start(cfg, os.path.join(found.uri, "Format-Serving"), read_manifest(examples_uri(train)),
                             read_statistics(examples_uri(train)))
    assert start["base_model"] == a["model"].uri and start["previous"].uri == a["model"].uri
    assert start["registry"]["served_model"] == destination and start["drift"]["tables"]


@pytest.mark.slow(reason="reads the executors' chain (every executor's Do() on 2,500 rows)")
def test_pusher_do_withholds_a_model_that_is_not_blessed(chain, tmp_path):
    _, a, root = chain
    blessing = _artifact(standard_artifacts.ModelBlessing, tmp_path / "blessing")
    blessing.set_int_custom_property("blessed", 0)
    before = sorted(os.listdir(root / "serving"))
    pushed = push(a["serving"], blessing, tmp_path / "pushed", root / "serving", "p")
    assert pushed.get_int_custom_property("pushed") == 0
    assert sorted(os.listdir(root / "serving")) == before


@pytest.mark.slow(reason="reads the executors' chain (every executor's Do() on 2,500 rows)")
def test_a_pusher_that_fails_registers_nothing(chain, tmp_path, monkeypatch):
    """The disk fills while the Pusher copies the model into its own artifact: the Pusher fails and
    no version is registered or servable at the destination (the copy came after the push, which
    left a served model behind a failed run)."""
    from components.model_registry import executor as registry_executor

    _, a, _ = chain
    serving = tmp_path / "serving"

    def full(src, dst):
        raise OSError(28, f"No space left on device: {dst}")

    monkeypatch.setattr(registry_executor.io_utils, "copy_dir", full)
    with pytest.raises(OSError, match="No space left"):
        push(a["serving"], a["blessing"], tmp_path / "pushed", serving, "p")
    assert registry.versions(str(serving)) == [] and registry.entry_versions(str(serving)) == []
    assert not registry.lookup(str(serving)).found


@pytest.mark.slow(reason="reads the executors' chain (every executor's Do() on 2,500 rows)")
def test_pusher_do_refuses_when_the_served_model_changed_since_the_gate(chain, tmp_path):
    """The chain's model was gated when nothing was served; its own push made a model served since.
    Pushing it again would replace a model its gate never compared with: refused, nothing pushed."""
    _, a, root = chain
    before = sorted(os.listdir(root / "serving")), registry.entry_versions(str(root / "serving"))
    with pytest.raises(registry.RegistryError, match="the served model changed while this run ran: its gate compared with "
                                              "nothing .* is served now; nothing pushed: rerun"):
        push(a["serving"], a["blessing"], tmp_path / "pushed", root / "serving", "p")
    assert (sorted(os.listdir(root / "serving")), registry.entry_versions(str(root / "serving"))) == before


@pytest.mark.slow(reason="reads the executors' chain (every executor's Do() on 2,500 rows)")
def test_a_served_version_whose_trainer_model_is_incomplete_trains_from_scratch(chain, tmp_path):
    """Its Trainer model directory is there but holds no checkpoint (cleaned up in part): the gate
    still has the served model to compare with; the Trainer starts fresh and says why."""
    from components.embedding_trainer.base_model import continuous_start
    from components.embedding_trainer.resolved_input import read_manifest, read_statistics

    cfg, a, root = chain
    found = registry.lookup(str(root / "serving"))
    found.warm_start_model = str(tmp_path / "trainer_model")
    os.makedirs(found.warm_start_model)
    registry.write_lookup(str(tmp_path / "pointer"), found)
    train = [os.path.join(a["transformed"].uri, "Split-train", "*")]
    start = continuous_start(cfg, str(tmp_path / "pointer" / "Format-Serving"), read_manifest(examples_uri(train)),
                             read_statistics(examples_uri(train)))
    assert start["base_model"] is None and "previous" not in start
    assert found.warm_start_model in start["note"] and "trained from scratch" in start["note"]


@pytest.mark.slow(reason="reads the executors' chain (every executor's Do() on 2,500 rows)")
def test_preprocessing_reads_parquet_and_tf_examples_alike(chain, tmp_path):
    """The columnar hand-off changes nothing downstream: the same rows given as TFRecords of
    tf.Examples (what TFX's own ExampleGens write) give byte-identical vocabularies and the same
    transformed row counts as ExampleGen's Parquet."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from components.embedding_preprocess.run import run_preprocessing
    import tensorflow as tf

    from components.data_io.examples_io import serialized_examples

    cfg, a, _ = chain
    examples = a["examples"]
    patterns = {}
    for s in ("train", "eval"):
        records = serialized_examples(io_utils.all_files_pattern(artifact_utils.get_split_uri([examples], s)), 1 << 40)
        assert len(records) == examples.get_int_custom_property(f"{s}_rows")
        os.makedirs(tmp_path / s)
        with tf.io.TFRecordWriter(str(tmp_path / s / "part.tfrecord")) as w:
            for r in records:
                w.write(r)
        patterns[s] = str(tmp_path / s / "*")
    vocab = tmp_path / "vocabulary"
    stats = run_preprocessing(beam.Pipeline(options=PipelineOptions(BEAM_ARGS)), cfg, patterns, str(vocab),
                              {s: str(tmp_path / "tx" / s) for s in patterns}, str(tmp_path / "stats"), input_format="tfrecord")
    for t in cfg.tables:
        for suffix in (".txt", ".counts.txt"):
            ours = open(os.path.join(a["vocabulary"].uri, t.name + suffix), "rb").read()
            assert open(vocab / (t.name + suffix), "rb").read() == ours, (t.name, suffix)
    for s in ("train", "eval"):
        assert stats.splits[s]["examples_written"] == a["transformed"].get_int_custom_property(f"{s}_examples")
