"""One resolved training input (components/embedding_trainer/resolved_input.py) and the executors that
pass the transformed examples' artifact URI (components/embedding_trainer/executors.py).

- The Trainer's and Tuner's executors add the Examples input's URI to the custom_config that
  run_fn and tuner_fn receive; an input of another number of artifacts is refused by name.
- The resolved input finds the manifest and statistics at that URI, not from the shape of a split
  file's path: split files moved elsewhere still resolve, and FnArgs without the URI are refused in
  one line naming the key and the way out.
"""
import json
import os
import shutil
from types import SimpleNamespace

import pytest

from components.config.loading import config_from_json
from components.tfx_wiring.component_keys import CONFIG_KEY, EXAMPLES_URI_KEY, SERVING_DIR_KEY
from tests.stages import trainer_config, trainer_raw_config


def _examples(uri):
    return SimpleNamespace(uri=str(uri))


def test_the_executors_pass_the_examples_uri_in_custom_config():
    from components.embedding_trainer.executors import with_examples_uri

    props = {"custom_config": json.dumps({CONFIG_KEY: "{}", "other": 1}), "run_fn": "m.run_fn"}
    out = with_examples_uri({"examples": [_examples("/a/Transform/transformed_examples/7")]}, props)
    assert json.loads(out["custom_config"]) == {CONFIG_KEY: "{}", "other": 1,
                                                EXAMPLES_URI_KEY: "/a/Transform/transformed_examples/7"}
    assert out["run_fn"] == "m.run_fn" and json.loads(props["custom_config"]).keys() == {CONFIG_KEY, "other"}  # a copy
    assert EXAMPLES_URI_KEY in json.loads(with_examples_uri({"examples": [_examples("/x")]}, {})["custom_config"])
    for wrong in ([], [_examples("/x"), _examples("/y")]):
        with pytest.raises(ValueError, match=rf"the 'examples' input holds {len(wrong)} artifacts"):
            with_examples_uri({"examples": wrong}, props)


def test_the_trainer_executor_runs_tfxs_with_the_uri_added(monkeypatch):
    from tfx.components.trainer import executor as tfx_trainer_executor

    from components.embedding_trainer.executors import TrainerExecutor

    seen = []
    monkeypatch.setattr(tfx_trainer_executor.GenericExecutor, "Do", lambda self, i, o, props: seen.append(props))
    TrainerExecutor().Do({"examples": [_examples("/tx/3")]}, {}, {"custom_config": json.dumps({CONFIG_KEY: "{}"})})
    assert json.loads(seen[0]["custom_config"])[EXAMPLES_URI_KEY] == "/tx/3"


def _fn_args(cfg, root, train_files, **custom):
    model_uri = root / "Trainer" / "model" / "1"
    return SimpleNamespace(custom_config={CONFIG_KEY: cfg.to_json(), **custom}, train_files=train_files,
                           eval_files=[str(root / "tx" / "Split-eval" / "*")], serving_model_dir=str(model_uri / "Format-Serving"),
                           model_run_dir=str(root / "Trainer" / "model_run" / "1"), train_steps=None,
                           hyperparameters={"values": {"training.dropout": 0.25}})


def test_the_input_is_found_at_the_artifacts_uri_not_by_the_shape_of_a_path(trainer_data, tmp_path):
    from components.embedding_trainer.resolved_input import resolve_training_input

    cfg = trainer_config(trainer_data)
    moved = tmp_path / "elsewhere" / "files"  # split files two levels below no manifest at all
    shutil.copytree(trainer_data / "tx" / "Split-train", moved)
    given = resolve_training_input(_fn_args(cfg, tmp_path, [str(moved / "*")], **{
        EXAMPLES_URI_KEY: str(trainer_data / "tx"), SERVING_DIR_KEY: str(tmp_path / "serving")}))
    assert given.examples_uri == str(trainer_data / "tx") and given.train_files == [str(moved / "*")]
    assert given.manifest.vocabulary_dir and given.plan.vocabulary_dir == given.manifest.vocabulary_dir
    assert given.statistics is not None and given.length()["steps"] == cfg.training.train_steps
    assert (given.tuned, given.config.training.dropout, given.untuned.training.dropout) == (
        {"training.dropout": 0.25}, 0.25, cfg.training.dropout)
    assert given.serving_dir == str(tmp_path / "serving") and given.base_model is None
    assert given.model_dir == str(tmp_path / "Trainer" / "model" / "1")
    assert given.data_identity["files"] == len(os.listdir(moved)) and given.data_identity is given.data_identity  # read once
    assert config_from_json(given.config.to_json()).training.dropout == 0.25


def test_fn_args_without_the_examples_uri_are_refused_naming_the_key(trainer_data, tmp_path):
    from components.embedding_trainer.resolved_input import resolve_training_input

    args = _fn_args(trainer_config(trainer_data), tmp_path, [str(trainer_data / "tx" / "Split-train" / "*")])
    with pytest.raises(ValueError, match=rf"custom_config has no '{EXAMPLES_URI_KEY}': run the Trainer and Tuner "
                                         r"with this project's executors"):
        resolve_training_input(args)


def test_a_config_naming_other_features_than_the_examples_is_refused_naming_them(trainer_data, tmp_path):
    """Fewer categorical features than preprocessing's failed in the model's build as
    `KeyError: 'C24'`; the resolved input names both sides' features, each feature read otherwise
    (here another table, another max_length), and the way out."""
    from components.config.loading import parse_config
    from components.embedding_trainer.resolved_input import resolve_training_input
    from components.reporting.errors import InputError
    from tests.stages import FEW_CATEGORICAL

    files = [str(trainer_data / "tx" / "Split-train" / "*")]
    uri = {EXAMPLES_URI_KEY: str(trainer_data / "tx")}
    fewer = _fn_args(trainer_config(trainer_data, categorical=FEW_CATEGORICAL), tmp_path, files, **uri)
    with pytest.raises(InputError, match=r"^Trainer: the examples were preprocessed with other features than this "
                                         r"config names: categorical features C24, C26 are in the examples but not in "
                                         r"the config; run preprocessing with this config, or give the Trainer the config "
                                         r"preprocessing ran with$"):
        resolve_training_input(fewer)
    every = _fn_args(trainer_config(trainer_data, categorical=None), tmp_path, files, **uri)  # the demo's 26 and 13
    with pytest.raises(InputError, match=r"categorical features C10, C11, C13, .*, C9 are in the config but not in the "
                                         r"examples; dense features I10, I11, .*, I9 are in the config but not in the "
                                         r"examples; run preprocessing"):
        resolve_training_input(every, stage="Tuner")
    raw = trainer_raw_config(trainer_data)  # the same features, two read otherwise than preprocessing did
    for f in raw["categorical_features"]:
        if f["name"] == "C4":
            del f["table"]  # a table of its own: its IDs were counted in shared_c3_c4's vocabulary
        if f["name"] == "C12":
            f["max_length"] = 3
    moved = _fn_args(parse_config(raw), tmp_path, files, **uri)
    with pytest.raises(InputError, match=r"^Trainer: the examples were preprocessed with other features than this "
                                         r"config names: C12.max_length is 3 in the config, 5 in the examples; "
                                         r"C4.table is 'C4' in the config, 'shared_c3_c4' in the examples; run "):
        resolve_training_input(moved)
