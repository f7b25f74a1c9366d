"""Caching: each component's execution properties hold only its share of the configuration, so an
edit to a section it does not read leaves its cache key as it was; the registry steps are never
taken from the cache, locally or on Kubeflow."""
import copy
import json
import os

import pytest

from components.config.loading import load_config
from components.config.stages import STAGES, stage_config, stage_json

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def cfg():
    return load_config(os.path.join(REPO, "configs", "demo.yaml"))


@pytest.fixture(scope="module")
def shares(cfg):
    """Every stage's share of the unedited configuration, as `stage_json` gives it: worked out once
    for the edit cases below (each share costs two read-backs of the configuration)."""
    return {stage: stage_json(cfg, stage) for stage in STAGES}


def _edited(cfg, edit):
    c = copy.deepcopy(cfg)
    edit(c)
    return c


EDITS_NOT_READ_BY_DATA_STAGES = {
    "export": lambda c: setattr(c.export, "parity_sample_size", 7),
    "kubeflow": lambda c: setattr(c.kubeflow, "serving_dir", "gs://elsewhere/serving"),
    "validation": lambda c: setattr(c.validation, "regression_margin", 0.25),
    "continuous": lambda c: setattr(c.continuous, "warm_start", False),
    "training.train_steps": lambda c: setattr(c.training, "train_steps", 17),
    "training.dropout": lambda c: setattr(c.training, "dropout", 0.1),
}


@pytest.mark.parametrize("section", sorted(EDITS_NOT_READ_BY_DATA_STAGES))
def test_edits_outside_a_stage_leave_its_share_as_it_was(cfg, shares, section):
    edited = _edited(cfg, EDITS_NOT_READ_BY_DATA_STAGES[section])
    for stage in ("example_gen", "preprocess"):
        assert stage_json(edited, stage) == shares[stage], (stage, section)
    assert stage_json(edited, "trainer") != shares["trainer"]  # the trainer keys its state by all of it


@pytest.mark.parametrize("stage,edit", [
    ("example_gen", lambda c: setattr(c.input, "range_mb", 8.0)),
    ("example_gen", lambda c: setattr(c.dense_features[0], "column", "I2")),
    ("preprocess", lambda c: setattr(c.training, "batch_size", 512)),
    ("preprocess", lambda c: setattr(c.input, "max_invalid_share", 0.9)),
    ("preprocess", lambda c: setattr(c.statistics, "top_values", 3)),
    ("exporter", lambda c: setattr(c.export, "parity_sample_size", 7)),
    ("exporter", lambda c: setattr(c.validation, "regression_margin", 0.25)),
])
def test_edits_a_stage_reads_change_its_share(cfg, shares, stage, edit):
    assert stage_json(_edited(cfg, edit), stage) != shares[stage]


def test_the_exporters_share_keeps_the_beam_options_only_when_the_store_is_written_by_beam(cfg):
    """`export.store.beam`: the store's row files (and the Pusher's delta) are written by Beam with
    the `beam` section's options, e.g. Dataflow's in `extra_args`; without it the exporter runs no
    Beam, and an edit to `beam` leaves its cache key as it was."""
    dataflow = lambda c: setattr(c.beam, "extra_args", ["--runner=DataflowRunner", "--project=p"])  # noqa: E731
    store = _edited(cfg, lambda c: setattr(c.export.store, "beam", True))
    assert stage_config(_edited(store, dataflow), "exporter").beam_pipeline_args() == ["--runner=DataflowRunner", "--project=p"]
    assert stage_json(_edited(store, dataflow), "exporter") != stage_json(store, "exporter")
    assert stage_json(_edited(cfg, dataflow), "exporter") == stage_json(cfg, "exporter")


def test_every_share_of_every_shipped_config_reads_back(cfg):
    import glob

    for path in sorted(glob.glob(os.path.join(REPO, "configs", "**", "*.yaml"), recursive=True)):
        full = load_config(path)
        features = json.loads(full.to_json())["categorical_features"]
        for stage in STAGES:
            share = stage_config(full, stage)  # read back and checked on its own
            # what every stage reads in common is kept whole; share.to_json() is stage_json's value
            # (each stage_json call reads the share back again: twice the cost for the same text)
            assert share.label == full.label and [t.name for t in share.tables] == [t.name for t in full.tables], (path, stage)
            assert json.loads(share.to_json())["categorical_features"] == features, (path, stage)
    with pytest.raises(ValueError, match="unknown stage"):
        stage_json(cfg, "pusher")


def test_registry_steps_are_never_cached(cfg, tmp_path):
    from tfx.orchestration.portable import tfx_runner

    from pipelines.pipeline import LAST_BLESSED, NEVER_CACHED, PUSHER, create_pipeline, without_cache_for

    assert set(NEVER_CACHED) == {LAST_BLESSED, PUSHER}
    (tmp_path / "in.csv").write_text("label\n")
    cfg = copy.deepcopy(cfg)
    cfg.input.path = str(tmp_path / "in.csv")
    p = create_pipeline(cfg, str(tmp_path / "root"), str(tmp_path / "m.sqlite"), str(tmp_path / "serving"))
    ir = without_cache_for(tfx_runner._make_pipeline_proto(p))
    cached = {n.pipeline_node.node_info.id: n.pipeline_node.execution_options.caching_options.enable_cache for n in ir.nodes}
    assert cached == {LAST_BLESSED: False, "EmbeddingExampleGen": True, "EmbeddingPreprocess": True, "Trainer": True,
                      "EmbeddingExporter": True, PUSHER: False}
    off = create_pipeline(cfg, str(tmp_path / "root"), str(tmp_path / "m.sqlite"), str(tmp_path / "serving"), enable_cache=False)
    ir = tfx_runner._make_pipeline_proto(off)
    assert not any(n.pipeline_node.execution_options.caching_options.enable_cache for n in ir.nodes)


@pytest.mark.parametrize("target,uncached", [
    ("pipeline.yaml", {"LastBlessedModel", "Pusher", "EmbeddingExampleGen"}),  # open-source KFP
    ("pipeline.json", {"LastBlessedModel", "Pusher"}),  # Vertex runs the ExampleGen driver before its cache check
])
def test_compiled_specs_cache_every_task_but_the_registry_steps(cfg, tmp_path, target, uncached):
    import yaml

    from pipelines.kubeflow import compile_pipeline

    (tmp_path / "in.csv").write_text("label\n")
    cfg = copy.deepcopy(cfg)
    cfg.input.path = str(tmp_path / "in.csv")
    out = tmp_path / target
    compile_pipeline(cfg, "local/tpu-embedding-tfx:test", str(out), pipeline_root="gs://bucket/root")
    text = out.read_text()
    spec = json.loads(text)["pipelineSpec"] if target.endswith(".json") else next(yaml.safe_load_all(text))
    tasks = spec["root"]["dag"]["tasks"]
    cached = {name: bool(t.get("cachingOptions", {}).get("enableCache")) for name, t in tasks.items()}
    assert {n for n, c in cached.items() if not c} == uncached
    assert len(cached) == 6
