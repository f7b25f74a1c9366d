"""TFX's stock BulkInferrer in the pipeline (pipelines/bulk_inference.py): the `bulk_inference`
section's checks, its wiring (in `create_pipeline` and through `extra_components`), its compiled
Kubeflow tasks in both modes, and its PredictionLogs on a model of every feature kind equal to
`serving_default`'s scores of the same serialized records."""
import json
import os
import re

import pytest
import yaml

from tests.stages import demo_raw_config, read_prediction_logs

from components.config.loading import parse_config
from components.config.schema import ConfigError
from pipelines import bulk_inference  # noqa: F401  (registers the section's checks)

IMAGE = "REGISTRY/tpu-embedding-tfx:TAG"


def _raw(csv_path="/nonexistent/data.csv", **section):
    raw = demo_raw_config()
    raw["input"]["path"] = str(csv_path)
    raw["bulk_inference"] = dict({"enabled": True}, **section)
    return raw


def _config(**section):
    return parse_config(_raw(**section), "b.yaml")  # never read: parsing only


# ---- the section's checks ----------------------------------------------------------------------

@pytest.mark.parametrize("section, message", [
    ({"splits": ["test"]}, "bulk_inference.splits[0]: 'test' is not a split ExampleGen writes; one of train, eval"),
    ({"splits": ["eval", "Eval"]}, "bulk_inference.splits[1]: 'Eval' is not a split ExampleGen writes"),
    ({"splits": []}, "bulk_inference.splits: empty; name the splits to score, some of train, eval"),
    ({"splits": ["eval", "eval"]}, "bulk_inference.splits: eval named twice"),
])
def test_bad_bulk_inference_section_names_the_field(section, message):
    with pytest.raises(ConfigError, match="^" + re.escape("b.yaml: " + message)):
        _config(**section)


def test_bulk_inference_defaults_score_the_eval_split_when_on():
    off = parse_config(dict(_raw(), bulk_inference={}), "b.yaml").bulk_inference
    assert (off.enabled, off.splits) == (False, ["eval"])
    assert _config(splits=["train", "eval"]).bulk_inference.splits == ["train", "eval"]
    with pytest.raises(ConfigError, match=r"b\.yaml: bulk_inference\.split: unknown field"):
        _config(split=["eval"])


def test_bulk_inference_section_is_no_part_of_the_data_stages_shares():
    """Turning bulk inference on changes no execution property of ExampleGen, preprocessing or the
    exporter: a cached run keeps their outputs."""
    from components.config.stages import stage_json

    on, off = _config(splits=["train", "eval"]), _config(enabled=False)
    for stage in ("example_gen", "preprocess", "exporter"):
        assert stage_json(on, stage) == stage_json(off, stage), stage


# ---- wiring ------------------------------------------------------------------------------------

def _small_input(tmp_path):
    from components.example_gen.synthetic_data import GeneratorSpec, write_csv

    path = tmp_path / "data.csv"
    write_csv(GeneratorSpec(rows=10, seed=1), str(path))
    return path


def _pipeline(tmp_path, extra_components=None, **section):
    from pipelines.pipeline import create_pipeline

    cfg = parse_config(_raw(_small_input(tmp_path), **section), "b.yaml")
    return cfg, create_pipeline(cfg, str(tmp_path / "root"), str(tmp_path / "m.sqlite"), str(tmp_path / "serving"),
                                extra_components=extra_components)


def _wiring(p):
    """{component id: {input key: (producer id, output key)}}."""
    return {c.id: {k: (ch.producer_component_id, ch.output_key) for k, ch in c.inputs.items()} for c in p.components}


def test_create_pipeline_adds_the_copy_and_the_bulk_inferrer_on_the_serving_model(tmp_path):
    from tfx.proto import bulk_inferrer_pb2
    from tfx.utils import proto_utils

    _, p = _pipeline(tmp_path, splits=["train", "eval"])
    w = _wiring(p)
    assert {"BulkInferrerExampleCopy", "BulkInferrer"} <= set(w)
    assert w["BulkInferrerExampleCopy"] == {"examples": ("EmbeddingExampleGen", "examples")}
    assert w["BulkInferrer"] == {"examples": ("BulkInferrerExampleCopy", "tf_examples"),
                                 "model": ("EmbeddingExporter", "serving_model"),
                                 "model_blessing": ("EmbeddingExporter", "blessing")}
    by_id = {c.id: c for c in p.components}
    assert json.loads(by_id["BulkInferrerExampleCopy"].exec_properties["splits"]) == ["train", "eval"]
    inferrer = by_id["BulkInferrer"].exec_properties
    data_spec = proto_utils.json_to_proto(inferrer["data_spec"], bulk_inferrer_pb2.DataSpec()) \
        if isinstance(inferrer["data_spec"], str) else inferrer["data_spec"]
    model_spec = proto_utils.json_to_proto(inferrer["model_spec"], bulk_inferrer_pb2.ModelSpec()) \
        if isinstance(inferrer["model_spec"], str) else inferrer["model_spec"]
    assert list(data_spec.example_splits) == ["train", "eval"]
    assert list(model_spec.model_signature_name) == ["serving_default"]
    assert not inferrer.get("output_example_spec")  # PredictionLogs in `inference_result`
    # nothing waits for it: the Pusher's inputs and upstream nodes are as without it
    assert "BulkInferrer" not in {n.id for n in by_id["Pusher"].upstream_nodes}
    assert "BulkInferrer" not in {ch.producer_component_id for ch in by_id["Pusher"].inputs.values()}


def test_bulk_inference_off_leaves_the_pipeline_unchanged(tmp_path):
    _, p = _pipeline(tmp_path, enabled=False)
    assert not {"BulkInferrerExampleCopy", "BulkInferrer"} & {c.id for c in p.components}


def test_extra_components_route_wires_the_same_steps(tmp_path):
    """docs/tfx.md's route for your own pipeline code: a function given our components by id."""
    from pipelines.bulk_inference import bulk_inferrer_components

    cfg = _config(enabled=False)  # off: the function adds them (its splits: the default, eval)

    def extra(ours):
        exporter = ours["EmbeddingExporter"]
        return bulk_inferrer_components(cfg, ours["EmbeddingExampleGen"].outputs["examples"],
                                        exporter.outputs["serving_model"], exporter.outputs["blessing"])

    _, by_extra = _pipeline(tmp_path, extra_components=extra, enabled=False)
    _, by_switch = _pipeline(tmp_path / "switch", splits=["eval"])
    assert _wiring(by_extra) == _wiring(by_switch)


@pytest.mark.parametrize("output", ["p.yaml", "p.json"])
def test_compiles_for_kubeflow_in_both_modes(tmp_path, output):
    """Open-source KFP (.yaml) and Vertex (.json): the two tasks, their inputs from the exporter and
    the copy, container executors only, nothing open-source KFP's backend refuses."""
    from pipelines.__main__ import main
    from pipelines.kfp_local import oss_backend_refusal
    from pipelines.kubeflow import load_compiled

    raw = _raw(_small_input(tmp_path), splits=["eval"])
    path = tmp_path / "bulk.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["compile", "--config", str(path), "--image", IMAGE, "--output", str(tmp_path / output),
                 "--pipeline-root", "gs://b/root"]) == 0
    loaded = load_compiled(str(tmp_path / output))
    spec = loaded["pipeline_spec"] if "pipeline_spec" in loaded else loaded["pipelineSpec"]
    tasks = spec["root"]["dag"]["tasks"]
    inputs = tasks["BulkInferrer"]["inputs"]["artifacts"]
    assert {k: v["taskOutputArtifact"]["producerTask"] for k, v in inputs.items()} == {
        "examples": "BulkInferrerExampleCopy", "model": "EmbeddingExporter", "model_blessing": "EmbeddingExporter"}
    assert tasks["BulkInferrerExampleCopy"]["inputs"]["artifacts"]["examples"]["taskOutputArtifact"]["producerTask"] \
        == "EmbeddingExampleGen"
    assert "BulkInferrer" not in tasks["Pusher"].get("dependentTasks", [])
    executors = spec["deploymentSpec"]["executors"]
    assert all(list(e) == ["container"] or list(e) == ["importer"] for e in executors.values())
    assert executors["BulkInferrer_executor"]["container"]["image"] == IMAGE
    if output.endswith(".yaml"):
        assert oss_backend_refusal(spec) is None


# ---- its PredictionLogs equal serving_default's scores, on every feature kind ---------------------

def _infer(root, name, copy, serving, blessing, splits):
    """TFX's BulkInferrer executor with the exec properties our component gives it."""
    from tfx.components.bulk_inferrer import executor as bulk_executor
    from tfx.proto import bulk_inferrer_pb2
    from tfx.types import standard_artifacts, standard_component_specs as specs
    from tfx.utils import proto_utils

    from pipelines.bulk_inference import SIGNATURE
    from tests.stages import artifact, beam_context

    out = artifact(standard_artifacts.InferenceResult, root / name)
    bulk_executor.Executor(beam_context()).Do(
        {specs.EXAMPLES_KEY: [copy], specs.MODEL_KEY: [serving], specs.MODEL_BLESSING_KEY: [blessing]},
        {specs.INFERENCE_RESULT_KEY: [out]},
        {specs.DATA_SPEC_KEY: proto_utils.proto_to_json(bulk_inferrer_pb2.DataSpec(example_splits=splits)),
         specs.MODEL_SPEC_KEY: proto_utils.proto_to_json(bulk_inferrer_pb2.ModelSpec(model_signature_name=[SIGNATURE]))})
    return out


@pytest.mark.slow(reason="the pipeline on configs/features.yaml with its TFExampleCopy and stock BulkInferrer")
def test_prediction_logs_equal_serving_default_on_every_feature_kind(features_run):
    """The pipeline run's BulkInferrer (the stock component on the exporter's serving model and
    blessing, after our TFExampleCopy): every eval row scored once; each PredictionLog's outputs are
    `serving_default`'s on the same serialized record, which is the copy's record, within float32
    rounding."""
    import numpy as np
    import tensorflow as tf

    cfg, a, root = features_run
    assert a["blessing"].get_int_custom_property("blessed") == 1
    assert cfg.bulk_inference.splits == ["eval"]
    copy = a["copy"]
    rows = copy.get_int_custom_property("eval_rows")
    logs = read_prediction_logs(a["inference"].uri)
    assert rows > 100 and len(logs) == rows

    files = tf.io.gfile.glob(os.path.join(copy.uri, "Split-eval", "*.gz"))
    copied = sorted(r.numpy() for r in tf.data.TFRecordDataset(files, compression_type="GZIP"))
    fn = tf.saved_model.load(os.path.join(a["serving"].uri, "Format-Serving")).signatures["serving_default"]
    (alias,) = fn.structured_input_signature[1]
    records = [log.predict_log.request.inputs[alias].string_val[0] for log in logs]
    assert sorted(records) == copied  # the copy's records, each once
    # every feature kind is in the records scored
    kinds = {k for r in records[:50] for k in tf.train.Example.FromString(r).features.feature}
    assert {"item_id", "history", "weight", "C4", "C9", "C10", "C12", "C24"} <= kinds
    want = {k: v.numpy() for k, v in fn(**{alias: tf.constant(records)}).items()}
    assert "probabilities" in want
    for i, log in enumerate(logs):
        outputs = log.predict_log.response.outputs
        assert set(outputs) == set(want), set(outputs)
        assert log.predict_log.request.model_spec.signature_name == "serving_default"
        for key, values in want.items():
            got = tf.make_ndarray(outputs[key])
            assert got.shape == (1,) + values.shape[1:] and got.dtype == values.dtype, key
            # the same graph; a record in another batch than here may differ in its last bits
            np.testing.assert_allclose(got[0], values[i], rtol=0, atol=1e-6, err_msg=f"row {i} {key}")
    probs = want["probabilities"].reshape(-1)
    assert len(np.unique(probs)) > rows // 2  # the scores are not one constant: the rows' features count

    # The stock executor on an Examples artifact without the split scores nothing and says nothing:
    # the pipeline's config check and TFExampleCopy's refusal are what stop a missing split.
    assert read_prediction_logs(_infer(root, "BulkInferrerNoSplit", copy, a["serving"], a["blessing"], ["train"]).uri) == []


def test_the_summary_says_what_was_scored_and_why_nothing_was():
    from components.reporting.report import render
    from pipelines import summary as summary_lib

    scored = {"scored": True, "rows": {"eval": 1200, "train": 4800}, "output": "/o/BulkInferrer/inference_result/9",
              "why_not": None}
    text = render(summary_lib.summary_report({"bulk_inference": scored}))
    assert "batch scoring:        eval 1,200, train 4,800 rows scored: /o/BulkInferrer/inference_result/9" in text
    kept_back = dict(scored, scored=False, rows={}, why_not="the model was not blessed (the validation gate kept it back)")
    assert ("batch scoring:        nothing scored: the model was not blessed (the validation gate kept it back)"
            in render(summary_lib.summary_report({"bulk_inference": kept_back})))
