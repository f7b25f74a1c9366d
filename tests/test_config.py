"""Configuration: loading, resolution of shared tables, and every bad-configuration case."""
import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest

from components.config.loading import config_from_json, load_config, parse_config
from components.config.schema import ConfigError, PipelineConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "configs", "demo.yaml")


def minimal(**overrides):
    data = {
        "input": {"path": "data.csv"},
        "label": "label",
        "dense_features": [{"name": "I1"}],
        "categorical_features": [{"name": "C1"}, {"name": "C2", "dim": 8, "combiner": "sum"}],
    }
    data.update(overrides)
    return data


def error_of(data) -> str:
    with pytest.raises(ConfigError) as e:
        parse_config(data, "test.yaml")
    return str(e.value)


def test_demo_config_loads_and_resolves_tables():
    cfg = load_config(DEMO)
    assert len(cfg.categorical_features) == 26 and len(cfg.dense_features) == 13
    shared = cfg.table("shared_c3_c4")
    assert list(cfg.resolved.table("shared_c3_c4").features) == ["C3", "C4"] and shared.vocabulary.num_oov_buckets == 8
    assert cfg.feature_table(cfg.categorical_features[0]).name == "C1"
    assert len(cfg.tables) == 25  # 24 features of their own + one shared table
    assert os.path.isabs(cfg.input.path) and cfg.input.path.endswith("data/demo/criteo_like.csv")
    assert {f.name: f.max_length for f in cfg.categorical_features if f.separator}["C3"] == 5


def test_defaults_and_per_feature_overrides():
    cfg = parse_config(minimal(categorical_defaults={"dim": 4}))
    assert cfg.table("C1").dim == 4 and cfg.table("C1").combiner == "mean"
    assert cfg.table("C2").dim == 8 and cfg.table("C2").combiner == "sum"


def test_num_chips_is_unset_unless_configured():
    """Not set (None): the plan is sized for 8 chips until the TPU says how many it has; set: a TPU
    with another count is refused (tests/test_plan.py). Both survive the JSON the Trainer reads."""
    unset = parse_config(minimal())
    assert unset.training.embedding.topology.num_chips is None
    assert config_from_json(unset.to_json()).training.embedding.topology.num_chips is None
    four = parse_config(minimal(training={"embedding": {"topology": {"num_chips": 4}}}))
    assert config_from_json(four.to_json()).training.embedding.topology.num_chips == 4
    assert "training.embedding.topology.num_chips: must be positive" in error_of(
        minimal(training={"embedding": {"topology": {"num_chips": 0}}}))
    assert "training.embedding.topology.num_chips: expected an integer" in error_of(
        minimal(training={"embedding": {"topology": {"num_chips": "eight"}}}))


def test_shared_table_takes_dim_from_features():
    cfg = parse_config(
        minimal(
            tables=[{"name": "t"}],
            categorical_features=[{"name": "A", "table": "t", "dim": 8}, {"name": "B", "table": "t"}],
        )
    )
    assert cfg.table("t").dim == 8 and list(cfg.resolved.table("t").features) == ["A", "B"]


def test_json_round_trip_is_identical():
    cfg = load_config(DEMO)
    again = config_from_json(cfg.to_json())
    assert again.to_dict() == cfg.to_dict()


def test_resolved_form_is_frozen_and_travels_with_the_json():
    cfg = parse_config(
        minimal(
            tables=[{"name": "t"}, {"name": "u", "dim": 4}],
            categorical_features=[{"name": "A", "table": "t"}, {"name": "B", "table": "t"},
                                  {"name": "C", "dim": 8}, {"name": "D"}, {"name": "E", "table": "u"}],
        ),
        "r.yaml",
    )
    r = cfg.resolved
    assert r.source_file == "r.yaml"
    assert [(t.name, t.features, t.dim_explicit) for t in r.tables] == [
        ("t", ("A", "B"), False), ("u", ("E",), True), ("C", ("C",), True), ("D", ("D",), False)]
    assert [t.name for t in cfg.tables] == [t.name for t in r.tables] and cfg.table("t").dim == 16
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.tables[0].dim_explicit = True
    assert not hasattr(cfg.table("t"), "features") and "features" not in cfg.to_dict()["tables"][0]
    again = config_from_json(cfg.to_json())
    assert again.resolved.tables == r.tables and again.resolved.source_file == "<serialized config>"
    # JSON written before the resolved form had its own section (features / dim_explicit per table)
    old = json.loads(cfg.to_json())
    for t in old["tables"]:
        t.update(old["resolved"]["tables"][t["name"]])
    del old["resolved"]
    assert config_from_json(json.dumps(old)).to_dict() == cfg.to_dict()
    with pytest.raises(RuntimeError, match="not resolved"):
        PipelineConfig().resolved


def test_kubeflow_section_is_checked_once_pipelines_is_loaded():
    import pipelines  # noqa: F401  (registers pipelines.kubeflow_config.check_kubeflow_config)

    assert "kubeflow.beam.runner: 'prism' is not one of" in error_of(minimal(kubeflow={"beam": {"runner": "prism"}}))


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"bogus": 1}, "bogus: unknown field"),
        ({"training": {"batch_sise": 3}}, "training.batch_sise: unknown field"),
        ({"training": {"batch_size": "big"}}, "training.batch_size: expected an integer, got 'big'"),
        ({"training": {"batch_size": True}}, "training.batch_size: expected an integer"),
        ({"training": {"train_steps": 0}}, "training.train_steps: must be positive"),
        ({"input": {"path": "x.csv", "range_mb": 0}}, "input.range_mb: must be positive"),
        ({"input": {"path": "x.csv", "range_mb": "big"}}, "input.range_mb: expected a number"),
        # Values that failed late, deep in TensorFlow or NumPy, refused where they are read.
        ({"dense_features": [{"name": "I1", "fill_value": float("nan")}]},
         "dense_features[0].fill_value: nan is not a finite number"),
        ({"training": {"dropout": float("inf")}}, "training.dropout: inf is not a finite number"),
        ({"training": {"seed": 2**70}}, "training.seed: 1180591620717411303424 is beyond a 64-bit integer"),
        ({"training": {"seed": 2**40}}, "training.seed: 1099511627776 is not a whole number in [0, 4,294,967,295]"),
        ({"training": {"seed": -1}}, "training.seed: -1 is not a whole number in [0, 4,294,967,295]"),
        ({"label": 3}, "label: expected a string"),
        ({"dense_features": {"name": "x"}}, "dense_features: expected a list"),
        ({"categorical_features": [{"name": "C1", "dim": 0}]}, "categorical_features[0].dim: must be positive"),
        ({"categorical_features": [{"name": "C1", "dim": -3}]}, "categorical_features[0].dim: must be positive"),
        ({"categorical_defaults": {"dim": 0}}, "categorical_defaults.dim: must be positive"),
        ({"tables": [{"name": "t", "dim": -1}], "categorical_features": [{"name": "a", "table": "t"}]},
         "tables[0].dim: must be positive"),
        ({"categorical_features": [{"name": "C1", "table": "nope"}]},
         "categorical_features[0].table: 'nope' is not in tables"),
        ({"tables": [{"name": "t", "dim": 8}],
          "categorical_features": [{"name": "a", "table": "t"}, {"name": "b", "table": "t", "dim": 16}]},
         "categorical_features[1].dim: 16 conflicts with 8 from tables[0].dim"),
        ({"tables": [{"name": "t"}],
          "categorical_features": [{"name": "a", "table": "t", "dim": 4}, {"name": "b", "table": "t", "dim": 16}]},
         "categorical_features[1].dim: 16 conflicts with 4 from categorical_features[0].dim"),
        ({"tables": [{"name": "t"}],
          "categorical_features": [{"name": "a", "table": "t", "combiner": "sum"},
                                   {"name": "b", "table": "t", "combiner": "mean"}]},
         "categorical_features[1].combiner: 'mean' conflicts with 'sum'"),
        ({"tables": [{"name": "t"}], "categorical_features": [{"name": "a", "table": "t", "vocabulary": {}}]},
         "set the options under tables[0].vocabulary"),
        ({"tables": [{"name": "t"}], "categorical_features": [{"name": "a"}]}, "table 't' is used by no feature"),
        ({"categorical_features": [{"name": "C1", "combiner": "max"}]},
         "categorical_features[0].combiner: 'max' is not one of mean, sum, sqrtn"),
        ({"categorical_features": [{"name": "C1", "max_length": 3}]}, "only applies to multi-hot features"),
        ({"categorical_features": [{"name": "C1", "vocabulary": {"num_oov_buckets": 0}}]},
         "categorical_features[0].vocabulary.num_oov_buckets: must be positive"),
        ({"categorical_features": [{"name": "C1"}, {"name": "C1"}]}, "'C1' is already used by categorical_features[0]"),
        # Feature and table names name files, variables and keys: plain identifiers; a column is any text.
        ({"categorical_features": [{"name": "C1"}, {"name": "C2"}, {"name": "Class Name"}]},
         "categorical_features[2].name: 'Class Name' is not a valid feature name (letters, digits and _, not starting "
         "with a digit); name the feature and read the column by `column`: {name: Class_Name, column: \"Class Name\"}"),
        ({"categorical_features": [{"name": "../x"}]},
         "categorical_features[0].name: '../x' is not a valid feature name (letters, digits and _, not starting with a "
         "digit); name the feature and read the column by `column`: {name: x, column: \"../x\"}"),
        ({"dense_features": [{"name": "1st order", "column": "1st order"}]},
         "dense_features[0].name: '1st order' is not a valid feature name"),
        ({"dense_features": [{"name": "größe"}]}, "dense_features[0].name: 'größe' is not a valid feature name"),
        ({"categorical_features": [{"name": "C1", "column": ""}]},
         "categorical_features[0].column: empty; name the input column to read (any text, e.g. \"Class Name\")"),
        ({"dense_features": [{"name": "I1", "column": ""}]}, "dense_features[0].column: empty"),
        ({"tables": [{"name": "sha.red"}], "categorical_features": [{"name": "a", "table": "sha.red"}]},
         "tables[0].name: 'sha.red' is not a valid table name (letters, digits and _, not starting with a digit)"),
        ({"tables": [{"name": "../t"}], "categorical_features": [{"name": "a", "table": "../t"}]},
         "tables[0].name: '../t' is not a valid table name"),
        ({"categorical_features": []}, "categorical_features: empty"),
        ({"input": {"path": ""}}, "input.path: missing"),
        ({"input": {"path": "x", "format": "orc"}}, "input.format: 'orc' is not one of csv, tfrecord, parquet"),
        ({"training": {"embedding_optimizer": {"name": "rmsprop"}}},
         "training.embedding_optimizer.name: 'rmsprop' is not one of sgd, adagrad, adam, ftrl"),
        ({"training": {"dense_optimizer": {"learning_rate": -1}}}, "training.dense_optimizer.learning_rate"),
        ({"training": {"model": "wide_deep"}}, "training.model: 'wide_deep' is not one of dlrm, dcn_v2"),
        ({"training": {"epochs": 0}}, "training.epochs: must be positive"),
        ({"validation": {"baseline_margin": 2}}, "validation.baseline_margin: 2.0 is not an AUC difference"),
        ({"validation": {"regression_margin": "x"}}, "validation.regression_margin: expected a number, got 'x'"),
        ({"validation": {"baseline": {"enabled": False}}}, "validation.baseline_margin: the baseline is disabled"),
        ({"validation": {"baseline": {"optimizer": {"name": "lbfgs"}}}}, "validation.baseline.optimizer.name: 'lbfgs'"),
        ({"validation": {"baseline": {"epochs": -1}}}, "validation.baseline.epochs: must be positive"),
        ({"validation": {"gate": 1}}, "validation.gate: unknown field"),
        ({"training": {"model": "dcn_v2", "cross_layers": 0}}, "training.cross_layers: must be positive"),
        ({"training": {"dropout": 1.0}}, "training.dropout: 1.0 is not a rate in [0, 1)"),
        ({"training": {"input_dropout": -0.1}}, "training.input_dropout: -0.1 is not a rate in [0, 1)"),
        ({"training": {"input_dropout_mask": "bits"}}, "training.input_dropout_mask: 'bits' is not one of float, byte"),
        ({"training": {"dense_buckets": {"into": "bottom"}}},
         "training.dense_buckets.into: 'bottom' is not one of interaction, bottom_mlp"),
        ({"training": {"dense_buckets": {"into": 3}}}, "training.dense_buckets.into: expected a string, got 3"),
        ({"training": {"dense_buckets": {"encoding": "ple"}}}, "training.dense_buckets.encoding"),
        ({"training": {"dense_buckets": {"encoding": "piecewise_linear", "buckets": 2}}},
         "training.dense_buckets.buckets: 2 buckets have 1 boundary, no bin"),
        ({"training": {"checkpoint_every_steps": 0}}, "training.checkpoint_every_steps: must be positive"),
        ({"training": {"train_steps": 100, "checkpoint_every_steps": 50, "steps_per_execution": 30}},
         "training.steps_per_execution: 30 must divide checkpoint_every_steps (50) and train_steps (100)"),
    ],
)
def test_bad_configuration_names_the_field(overrides, expected):
    message = error_of(minimal(**overrides))
    assert message.startswith("test.yaml: ")
    assert expected in message


def test_a_column_may_be_any_non_empty_text():
    """Columns (a feature's `column`, the label, weight columns, the label rule's column) are read
    by name from the input: spaces, dots, slashes, parentheses, non-ASCII letters, a leading digit."""
    cfg = parse_config(minimal(
        label="Recommended IND",
        dense_features=[{"name": "price", "column": "price/unit"}, {"name": "size_cm", "column": "size (cm)"},
                        {"name": "_private", "column": "Größe"}],
        categorical_features=[{"name": "Class_Name", "column": "Class Name"}, {"name": "item_id", "column": "item.id"},
                              {"name": "first", "column": "1st order", "separator": "|", "weight_column": "w t"}],
    ))
    assert cfg.numeric_columns() == ["Recommended IND", "price/unit", "size (cm)", "Größe", "w t"]
    assert cfg.categorical_columns() == ["Class Name", "item.id", "1st order"]
    derived = parse_config(minimal(label="clicked", label_rule={"column": "rating (1-5)", "op": ">=", "value": 4}))
    assert derived.label_source() == "rating (1-5)"


def test_top_level_must_be_mapping():
    assert "top level must be a mapping" in error_of([1, 2])


def test_missing_file_and_invalid_yaml(tmp_path):
    with pytest.raises(ConfigError, match="configuration file not found"):
        load_config(str(tmp_path / "absent.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("input: {path: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(str(bad))
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError, match="the file is empty"):
        load_config(str(empty))


def _cli(*args, cwd=REPO):
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run(
        [sys.executable, "-m", "pipelines", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_cli_bad_configs_exit_2_with_one_message(tmp_path):
    cases = {
        "missing": (str(tmp_path / "nope.yaml"), "configuration file not found"),
        "yaml": ("input: [", "invalid YAML"),
        "unknown": ("input: {path: x.csv}\ncategorical_features: [{name: C1, colour: red}]\n",
                    "categorical_features[0].colour: unknown field"),
        "type": ("input: {path: x.csv}\ncategorical_features: [{name: C1, dim: sixteen}]\n",
                 "categorical_features[0].dim: expected an integer"),
        "table": ("input: {path: x.csv}\ncategorical_features: [{name: C1, table: t9}]\n", "'t9' is not in tables"),
        "no_input_file": ("input: {path: nothing_here/*.csv}\ncategorical_features: [{name: C1}]\n",
                          "matches no file"),
    }
    for name, (content, expected) in cases.items():
        if name == "missing":
            path = content
        else:
            path = str(tmp_path / f"{name}.yaml")
            with open(path, "w") as fh:
                fh.write(textwrap.dedent(content))
        r = _cli("run", "--config", path, "--output-dir", str(tmp_path / "out"))
        assert r.returncode == 2, (name, r.stderr)
        assert expected in r.stderr, (name, r.stderr)
        assert "Traceback" not in r.stderr, (name, r.stderr)
        assert not (tmp_path / "out").exists(), name  # stopped before any work


# ---- table initializers and safe lookups (issue 18, item 5) --------------------------------------


def test_initializer_defaults_and_overrides_resolve_per_table():
    cfg = parse_config(minimal(
        categorical_defaults={"initializer": {"name": "random_uniform", "maxval": 0.2}},
        tables=[{"name": "t", "initializer": {"name": "zeros"}}],
        categorical_features=[{"name": "C1", "table": "t"}, {"name": "C2"},
                              {"name": "C3", "initializer": {"name": "random_normal", "stddev": 0.5}}],
    ))
    assert cfg.table("t").initializer.name == "zeros"
    assert (cfg.table("C2").initializer.name, cfg.table("C2").initializer.maxval) == ("random_uniform", 0.2)
    assert (cfg.table("C3").initializer.name, cfg.table("C3").initializer.stddev) == ("random_normal", 0.5)
    assert parse_config(minimal()).table("C1").initializer.name == "truncated_normal"  # the seeds' default


@pytest.mark.parametrize("init,message", [
    ({"name": "glorot"}, "categorical_features[0].initializer.name: 'glorot' is not one of"),
    ({"name": "zeros", "stddev": 0.1}, "initializer.stddev: zeros takes no parameters; remove stddev"),
    ({"name": "random_uniform", "mean": 0.0}, "initializer.mean: random_uniform takes minval, maxval; remove mean"),
    ({"name": "truncated_normal", "minval": -1.0}, "initializer.minval: truncated_normal takes mean, stddev"),
    ({"name": "random_normal", "stddev": 0.0}, "initializer.stddev: 0.0; a standard deviation must be positive"),
    ({"name": "random_uniform", "minval": 1.0, "maxval": 1.0}, "initializer: minval 1.0 is not below maxval 1.0"),
    ({"name": "random_uniform", "minval": 0.5}, "table 'C1': initializer random_uniform from 0.5 to 0.25 is empty"),
])
def test_bad_initializers_name_the_field(init, message):
    assert message in error_of(minimal(categorical_features=[{"name": "C1", "initializer": init}]))


def test_initializer_of_a_shared_table_is_set_on_the_table():
    msg = error_of(minimal(tables=[{"name": "t"}], categorical_features=[
        {"name": "C1", "table": "t", "initializer": {"name": "zeros"}}]))
    assert "categorical_features[0].initializer: 'C1' uses table 't', whose initializer is shared" in msg
    assert "set the options under tables[0].initializer instead" in msg


def test_use_safe_embedding_lookup_must_be_a_boolean():
    msg = error_of(minimal(categorical_features=[{"name": "C1", "use_safe_embedding_lookup": "no"}]))
    assert "categorical_features[0].use_safe_embedding_lookup" in msg


# ---- per-table optimizers and the embedding gradient multiplier (issue 18, item 2) -------------


def test_table_optimizer_inherits_unless_it_names_another():
    from components.config.binding import table_optimizer

    cfg = parse_config(minimal(
        training={"embedding_optimizer": {"name": "adagrad", "learning_rate": 0.05, "clipvalue": 1.0,
                                          "initial_accumulator_value": 0.2}},
        tables=[{"name": "t", "optimizer": {"learning_rate": 0.5, "schedule": {"name": "cosine", "decay_steps": 10}}}],
        categorical_features=[{"name": "C1", "table": "t"}, {"name": "C2", "optimizer": {"name": "sgd", "learning_rate": 1.5}},
                              {"name": "C3"}]))
    t = table_optimizer(cfg, "t")  # same optimizer: the set fields over training.embedding_optimizer
    assert (t.name, t.learning_rate, t.clipvalue, t.initial_accumulator_value, t.schedule.name) == (
        "adagrad", 0.5, 1.0, 0.2, "cosine")
    c2 = table_optimizer(cfg, "C2")  # another optimizer: nothing inherited
    assert (c2.name, c2.learning_rate, c2.clipvalue, c2.schedule.name) == ("sgd", 1.5, None, "constant")
    assert table_optimizer(cfg, "C3") == cfg.training.embedding_optimizer
    again = config_from_json(cfg.to_json())  # the override travels to the executors (implicit tables too)
    assert table_optimizer(again, "C2") == c2 and table_optimizer(again, "t") == t


@pytest.mark.parametrize("feature, message", [
    ({"name": "C1", "optimizer": {"name": "adam"}},
     "categorical_features[0].optimizer.learning_rate: missing; a table whose optimizer (adam) differs"),
    ({"name": "C1", "optimizer": {"name": "rmsprop", "learning_rate": 0.1}},
     "categorical_features[0].optimizer.name: 'rmsprop' is not one of"),
    ({"name": "C1", "optimizer": {"learning_rate": -1.0}}, "categorical_features[0].optimizer.learning_rate: must be positive"),
    ({"name": "C1", "optimizer": {"clipvalue": 0.0}}, "categorical_features[0].optimizer.clipvalue: must be positive"),
    ({"name": "C1", "optimizer": {"clipnorm": 1.0}}, "categorical_features[0].optimizer.clipnorm: unknown field"),
    ({"name": "C1", "optimizer": {"schedule": {"name": "exponential", "decay_rate": 2.0}}},
     "categorical_features[0].optimizer.schedule.decay_rate: must be in (0, 1]"),
])
def test_bad_table_optimizers_name_the_field(feature, message):
    assert message in error_of(minimal(categorical_features=[feature]))


def test_optimizer_of_a_shared_table_is_set_on_the_table():
    msg = error_of(minimal(tables=[{"name": "t", "optimizer": {"learning_rate": 0.1}}], categorical_features=[
        {"name": "C1", "table": "t", "optimizer": {"learning_rate": 0.2}}]))
    assert "categorical_features[0].optimizer: 'C1' uses table 't', whose optimizer is shared" in msg
    msg = error_of(minimal(tables=[{"name": "t", "optimizer": {"name": "ftrl"}}],
                           categorical_features=[{"name": "C1", "table": "t"}]))
    assert "tables[0].optimizer.learning_rate: missing" in msg


@pytest.mark.parametrize("multiplier, message", [
    ({"value": 0.0}, "training.embedding_gradient_multiplier.value: must be a positive number"),
    ({"value": float("inf")}, "training.embedding_gradient_multiplier.value: inf is not a finite number"),
    ({"schedule": {"name": "linear"}}, "training.embedding_gradient_multiplier.schedule.name: 'linear' is not one of"),
    ({"schedule": {"warmup_steps": -1}}, "training.embedding_gradient_multiplier.schedule.warmup_steps: must be 0 or more"),
])
def test_bad_gradient_multiplier_names_the_field(multiplier, message):
    assert message in error_of(minimal(training={"embedding_gradient_multiplier": multiplier}))


# ---- column kinds (issue 18, item 4) ---------------------------------------------------------------


@pytest.mark.parametrize("vocabulary, message", [
    ({"kind": "bucketized"}, "categorical_features[0].vocabulary.kind: 'bucketized' is not one of"),
    ({"kind": "hashed"}, "vocabulary.num_buckets: missing; a hashed column needs its number of rows"),
    ({"kind": "identity", "num_buckets": 0}, "vocabulary.num_buckets: must be positive"),
    ({"kind": "identity", "num_buckets": 10, "default_value": 10},
     "vocabulary.default_value: 10 is not a row of the table (0 to 9)"),
    ({"kind": "hashed", "num_buckets": 10, "top_k": 5}, "vocabulary.top_k: vocabulary kind hashed takes num_buckets; remove top_k"),
    ({"kind": "identity", "num_buckets": 10, "num_oov_buckets": 3}, "vocabulary.num_oov_buckets: vocabulary kind identity takes"),
    ({"kind": "counted", "num_buckets": 10}, "vocabulary.num_buckets: vocabulary kind counted takes top_k"),
    ({"default_value": 1}, "vocabulary.default_value: vocabulary kind counted takes"),
    ({"kind": "list"}, "vocabulary.values: missing or empty"),
    ({"kind": "list", "values": ["a", "b", "a"]}, "vocabulary.values: item 2 repeats b'a' (item 0); each value may appear once"),
    ({"kind": "list", "values": ["a", ""]}, "vocabulary.values: item 1 (b'') is not a token (empty)"),
    ({"kind": "list", "values": ["a\nb"]}, "vocabulary.values: item 0 (b'a\\nb') is not a token (line_break)"),
    ({"kind": "list", "values": [7]}, "vocabulary.values[0]: expected a string, got 7"),
    ({"kind": "file"}, "vocabulary.file: missing; name the vocabulary file"),
    ({"kind": "file", "file": "v.txt", "min_frequency": 2}, "vocabulary.min_frequency: vocabulary kind file takes file"),
])
def test_bad_column_kinds_name_the_field(vocabulary, message):
    assert message in error_of(minimal(categorical_features=[{"name": "C1", "vocabulary": vocabulary}]))


def test_given_vocabulary_file_is_checked_naming_file_and_line(tmp_path):
    from components.config.schema import VocabularyOptions
    from components.embedding_preprocess.vocabulary import given_vocabulary

    def check(data):
        path = tmp_path / "v.txt"
        path.write_bytes(data)
        return given_vocabulary(VocabularyOptions(kind="file", file=str(path)))

    assert check(b"a\r\nb\r\n") == [b"a", b"b"]  # CRLF and the last line break are not part of a value
    assert check(b"a\nb") == [b"a", b"b"]
    for data, message in ((b"a\n\nb\n", "line 2 (b'') is not a token (empty)"),
                          (b"a\nb\na\n", "line 3 repeats b'a' (line 1)"),
                          (b"a\n\xff\n", "line 2 (b'\\xff') is not a token (not_utf8)"),
                          (b"", "is empty; list one value per line")):
        with pytest.raises(ConfigError, match=".*") as e:
            check(data)
        assert message in str(e.value) and "v.txt" in str(e.value)
    with pytest.raises(ConfigError, match="cannot be read"):
        given_vocabulary(VocabularyOptions(kind="file", file=str(tmp_path / "missing.txt")))


def test_vocabulary_file_is_relative_to_the_config_file(tmp_path):
    (tmp_path / "vocab").mkdir()
    (tmp_path / "vocab" / "c1.txt").write_text("a\nb\n")
    data = minimal(categorical_features=[{"name": "C1", "vocabulary": {"kind": "file", "file": "vocab/c1.txt"}}])
    (tmp_path / "cfg.yaml").write_text(json.dumps(data))
    cfg = load_config(str(tmp_path / "cfg.yaml"))
    assert cfg.table("C1").vocabulary.file == str(tmp_path / "vocab" / "c1.txt")
    assert config_from_json(cfg.to_json()).table("C1").vocabulary.file == str(tmp_path / "vocab" / "c1.txt")


# ---- weighted IDs (issue 18, item 3) ---------------------------------------------------------------


@pytest.mark.parametrize("feature, message", [
    ({"name": "C1", "weight_column": ""}, "categorical_features[0].weight_column: empty"),
    ({"name": "C1", "weight_column": "C1"}, "categorical_features[0].weight_column: 'C1' is the feature's own column"),
    ({"name": "C1", "weight_column": "C2"}, "column(s) ['C2'] are also read as numbers"),
])
def test_bad_weight_columns_name_the_field(feature, message):
    assert message in error_of(minimal(categorical_features=[feature, {"name": "C2"}]))


def test_weight_column_is_read_as_a_number():
    cfg = parse_config(minimal(categorical_features=[{"name": "C1", "weight_column": "w"}, {"name": "C2"}]))
    assert "w" in cfg.numeric_columns() and cfg.weight_columns() == ["w"]


# ---- sequence features (issue 18, item 1) ----------------------------------------------------------


@pytest.mark.parametrize("features, message", [
    ([{"name": "C1", "sequence": {"pooling": "max"}}], "categorical_features[0].sequence.pooling: 'max' is not one of"),
    ([{"name": "C1", "sequence": {"length": 0}}], "categorical_features[0].sequence.length: must be positive"),
    ([{"name": "C1", "sequence": {"percentile": "p75"}}], "sequence.percentile: 'p75' is not one of"),
    ([{"name": "C1", "combiner": "sum", "sequence": {}}],
     "categorical_features[0].combiner: 'C1' is a sequence feature, whose positions are pooled by sequence.pooling"),
    ([{"name": "C1", "weight_column": "w", "sequence": {}}], "categorical_features[0].weight_column: a sequence feature"),
    ([{"name": "C1", "sequence": {"pooling": "attention"}}], "sequence.query: attention pooling needs the candidate"),
    ([{"name": "C1", "sequence": {"pooling": "mean", "query": "C2"}}, {"name": "C2"}], "only attention takes one"),
    ([{"name": "C1", "sequence": {"pooling": "attention", "query": "C9"}}], "sequence.query: 'C9' is not another categorical"),
    ([{"name": "C1", "sequence": {"pooling": "attention", "query": "C2"}}, {"name": "C2", "sequence": {}}],
     "sequence.query: 'C2' is a sequence feature"),
    ([{"name": "C1", "sequence": {"pooling": "attention", "query": "C2"}}, {"name": "C2", "dim": 8}],
     "sequence.query: 'C2' has dim 8, 'C1' dim 16"),
])
def test_bad_sequence_features_name_the_field(features, message):
    assert message in error_of(minimal(categorical_features=features))


@pytest.mark.parametrize("buckets", [0, True, 5000, 2.5])
def test_value_count_buckets_must_be_a_whole_number_from_1_to_4096(buckets):
    assert "beam.value_count_buckets" in error_of(minimal(beam={"value_count_buckets": buckets}))
    assert parse_config(minimal(beam={"value_count_buckets": 1})).beam.value_count_buckets == 1
