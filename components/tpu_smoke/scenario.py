"""The TPU smoke test's scenario: the generated data preprocessed once, the base, parity and Trainer
configurations, and what the parity plan must cover on a topology (components/tpu_smoke)."""
from __future__ import annotations

import copy
import os
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import yaml

from components.config.loading import parse_config
from components.config.training_schema import OptimizerConfig
from components.planning.derivation import optimizer_spec
from components.data_io.sampling import sample_transformed_rows
from components.embedding_model import optimizers as optimizers_lib
from components.embedding_model.sparsecore_layout import plan_sparse_core_layouts
from components.embedding_model.tf_objects import learning_rate
from components.embedding_trainer import resolved_input
from components.embedding_trainer.resolved_input import resolve_training_input
from components.planning.run_plan import derive_plan
from components.example_gen.synthetic_data import GeneratorSpec, write_csv
from components.tfx_wiring.component_keys import CONFIG_KEY, EXAMPLES_URI_KEY


PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PARITY_ADAGRAD = {"name": "adagrad", "learning_rate": 0.1}


def config_path(path: str) -> str:
    """The config file's path: as given when it exists, else relative to the checkout or image root.

    Args:
      path: `--config`.

    Returns:
      `path` itself when absolute or present, else `path` under the root that holds configs/.
    """
    if os.path.isabs(path) or os.path.exists(path):
        return path
    return os.path.join(PACKAGE_ROOT, path)


def base_raw_config(args, root: str) -> Dict[str, Any]:
    """The raw config of `--config`, reading the generated `train.csv` under `root`.

    Args:
      args: the parsed command line (`--config`, `--size-threshold`).
      root: the work directory.

    Returns:
      The config as parsed YAML, with input.path and, if given, the embedding size threshold set.
    """
    with open(config_path(args.config), encoding="utf-8") as fh:
        raw = yaml.safe_load(fh)
    raw["input"]["path"] = os.path.join(root, "train.csv")
    if args.size_threshold is not None:
        raw["training"].setdefault("embedding", {})["size_threshold"] = args.size_threshold
    return raw


def trainer_raw_config(args, root: str, tpu: Optional[str]) -> Dict[str, Any]:
    """trainer_tpu's raw config: the given one, trained for --steps steps.

    The held-out selection runs (its CPU twin reading the TPU checkpoints) but never stops the run
    before --steps.

    Args:
      args: the parsed command line.
      root: the work directory.
      tpu: training.tpu (`local` on a TPU VM).

    Returns:
      The raw config.
    """
    raw = base_raw_config(args, root)
    raw["training"].update(train_steps=args.steps, checkpoint_every_steps=args.steps, tpu=tpu,
                           pipeline_execution_with_tensor_core=args.pipelining,
                           early_stopping={"evaluations": 2, "patience": 1_000_000})
    return raw


def parity_raw_config(raw: Dict[str, Any]) -> Dict[str, Any]:
    """The configuration `sparsecore_training` compares (a copy of `raw`): its model and
    optimizers with the wide part on beside every table (one-dimensional tables with the wide
    optimizer: lazy Adam by default), and nothing that makes a
    multi-replica TPU step differ from a CPU step by design: no dropout (masks are drawn per
    replica), no pipelining (the SparseCore then looks up with the previous step's tables), no
    early stopping. Stays on CPU (training.tpu unset): `sparsecore_training` takes the strategy.

    Args:
      raw: a raw config (parsed YAML).

    Returns:
      The parity configuration, a deep copy.
    """
    raw = copy.deepcopy(raw)
    t = raw.setdefault("training", {})
    t.update(dropout=0.0, input_dropout=0.0, pipeline_execution_with_tensor_core=False, tpu=None,
             early_stopping={"enabled": False})
    t.setdefault("wide", {})["enabled"] = True
    return raw


def with_adagrad_table(raw: Dict[str, Any], plan) -> Dict[str, Any]:
    """`raw` with an Adagrad TPU-embedding table beside the FTRL ones when the plan has none: the
    largest TPU-embedding table that belongs to one feature gets `optimizer: adagrad` (that
    feature's own). Unchanged when one is there already.

    Args:
      raw: the parity configuration (raw).
      plan: its embedding plan.

    Returns:
      `raw` itself, or a deep copy with one feature's optimizer set to Adagrad.

    Raises:
      AssertionError: no TPU-embedding table of a feature of its own exists.
    """
    tpu = plan.tables_placed("tpu_embedding")
    if any(t.optimizer.get("name") == "adagrad" for t in tpu.values()):
        return raw
    own = {f["name"] for f in raw["categorical_features"] if f.get("table") in (None, f["name"])}
    candidates = sorted((t.rows, n) for n, t in tpu.items() if n in own and not t.wide_of)
    if not candidates:
        raise AssertionError("no TPU-embedding table of a feature of its own to train with Adagrad; "
                             "lower --size-threshold or raise --rows")
    raw = copy.deepcopy(raw)
    name = candidates[-1][1]
    next(f for f in raw["categorical_features"] if f["name"] == name)["optimizer"] = dict(PARITY_ADAGRAD)
    return raw


def parity_plan(raw: Dict[str, Any], root: str):
    """The parity configuration on the transformed data, resolved as the Trainer resolves its input.

    Args:
      raw: the base raw config (`base_raw_config`).
      root: the work directory holding the transformed examples (`examples_dir`).

    Returns:
      (config, plan, manifest) of the parity configuration (`parity_raw_config`, with an Adagrad
      table): resolved_input.resolve_training_input's, so the checks that refuse a Trainer's input
      (the row ledger, the plan) refuse it here too.
    """
    raw = parity_raw_config(raw)
    given = resolve_training_input(trainer_fn_args(parse_config(with_adagrad_table(raw, derived_plan(raw, root))), root,
                                                   "parity"))
    return given.config, given.plan, given.manifest


def derived_plan(raw: Dict[str, Any], root: str):
    """The embedding plan the Trainer derives from `raw` on the data under `root` (placements,
    optimizers, sizes; before the run's own facts).

    Args:
      raw: a raw config.
      root: the work directory holding the transformed examples (`examples_dir`).

    Returns:
      The plan.
    """
    examples = examples_dir(root)
    return derive_plan(parse_config(raw), resolved_input.read_manifest(examples), resolved_input.read_statistics(examples))


def trainer_fn_args(cfg, root: str, name: str) -> SimpleNamespace:
    """The FnArgs our Trainer executor would hand run_fn for the data under `root` (the smoke test
    runs the Trainer's own functions, without TFX).

    Args:
      cfg: the pipeline config.
      root: the work directory holding the transformed examples.
      name: the run's name: its Model artifact is `<root>/Trainer/model/<name>`.

    Returns:
      custom_config (the config, the examples' URI), the splits' files, the model's directories.
    """
    model_uri = os.path.join(root, "Trainer", "model", name)
    return SimpleNamespace(
        custom_config={CONFIG_KEY: cfg.to_json(), EXAMPLES_URI_KEY: examples_dir(root)},
        train_files=split_files(root, "train"), eval_files=split_files(root, "eval"),
        serving_model_dir=os.path.join(model_uri, "Format-Serving"),
        model_run_dir=os.path.join(root, "Trainer", "model_run", name), train_steps=None)


def coverage(plan, replicas: int, sparse_cores_per_chip: int, user_plan=None) -> str:
    """What the parity plan covers on this topology.

    Args:
      plan: the parity plan.
      replicas: the TPU's replicas.
      sparse_cores_per_chip: SparseCores per chip.
      user_plan: the plan of the user's own config (`derived_plan` of `base_raw_config`), whose
        every placement and optimizer the parity plan must train; None checks the parity plan alone.

    Returns:
      One line: the TPU-embedding tables, their optimizers and SparseCore stacks; the TensorCore
      tables and their optimizers.

    Raises:
      AssertionError: the plan lacks an FTRL or an Adagrad TPU-embedding table, a SparseCore stack
        of several tables, a one-dimensional wide table, a TensorCore table (whose updates are the
        XLA row rules), or a placement and optimizer of the user's plan.
    """
    tpu, tensor_core = plan.tables_placed("tpu_embedding"), plan.tables_placed("tensor_core")
    layouts = plan_sparse_core_layouts(plan, replicas, sparse_cores_per_chip, plan.global_batch_size // replicas)
    stacks: Dict[str, List[str]] = {}
    for name, layout in layouts.items():
        stacks.setdefault(layout.stacked_table_name, []).append(name)
    optimizers = {t.optimizer.get("name") for t in tpu.values()}
    wide = sorted(n for n, t in tpu.items() if t.wide_of and t.dim == 1)
    rotated = [s for s, ns in stacks.items() if len(ns) > 1]
    missing = [what for what, ok in (("an FTRL table", "ftrl" in optimizers), ("an Adagrad table", "adagrad" in optimizers),
                                     ("a stack of several tables", bool(rotated)), ("a dim-1 wide table", bool(wide)))
               if not ok]
    if not tensor_core:
        missing.append("a TensorCore table (raise --size-threshold: tables of at most that many rows go there)")
    trained = _placed_optimizers(plan)
    missing += [f"a {placement} table trained by {name} (as the config's {', '.join(tables)})"
                for (placement, name), tables in sorted(_placed_optimizers(user_plan).items()) if (placement, name) not in trained]
    if missing:
        raise AssertionError(f"the parity plan's TPU-embedding tables ({sorted(tpu)}) and TensorCore tables "
                             f"({sorted(tensor_core)}) lack {', '.join(missing)}; lower --size-threshold or raise --rows")
    core = sorted({t.optimizer.get("name") for t in tensor_core.values()})
    return (f"{len(tpu)} TPU-embedding tables ({', '.join(f'{o}' for o in sorted(optimizers))}) in {len(stacks)} "
            f"SparseCore stacks on {replicas} replicas x {sparse_cores_per_chip} SparseCores; stacks of several: "
            f"{', '.join(rotated)}; dim-1 wide tables: {', '.join(wide)}; {len(tensor_core)} TensorCore tables "
            f"({', '.join(core)})")


def _placed_optimizers(plan) -> Dict[Tuple[str, str], List[str]]:
    """{(placement, optimizer name): its tables} of a plan ({} for None)."""
    out: Dict[Tuple[str, str], List[str]] = {}
    for name, t in sorted((plan.tables if plan is not None else {}).items()):
        out.setdefault((str(t.placement), t.optimizer.get("name")), []).append(name)
    return out


def sparsecore_optimizer(plan) -> str:
    """The parity plan's TPU-embedding optimizers (every table's) pass the SparseCore check.

    Args:
      plan: the parity plan.

    Returns:
      One line: clipped Adagrad refused, and the optimizers accepted.

    Raises:
      AssertionError: Adagrad with clipvalue was accepted, or refused for another reason.
      EmbeddingOptimizerError: a table's optimizer fails the SparseCore check.
    """

    def tpu_opt(spec):
        return optimizers_lib.tpu_optimizer(spec, learning_rate(spec), step_fn=lambda: 0)

    clipped = optimizer_spec(OptimizerConfig(name="adagrad", learning_rate=0.1, clipvalue=0.5))
    try:
        optimizers_lib.check_sparsecore_optimizer(tpu_opt(clipped))
    except optimizers_lib.EmbeddingOptimizerError as err:
        if "clipvalue" not in str(err):
            raise AssertionError(f"clipped Adagrad refused for another reason: {err}") from None
    else:
        raise AssertionError("Adagrad with clipvalue was accepted for SparseCore, which ignores clipping")
    specs: Dict[str, List[str]] = {}
    for name, t in sorted(plan.tables_placed("tpu_embedding").items()):
        optimizers_lib.check_sparsecore_optimizer(tpu_opt(dict(t.optimizer)), f"the optimizer of table {name!r}")
        specs.setdefault(f"{t.optimizer['name']} lr {t.optimizer['learning_rate']}", []).append(name)
    return ("adagrad with clipvalue 0.5 refused on SparseCore; the TPU-embedding tables' optimizers accepted: "
            + "; ".join(f"{k} ({len(v)} tables)" for k, v in specs.items()))


def prepare_data(args, root: str) -> str:
    """Generates train and eval CSVs under `root` and preprocesses them with Beam.

    Args:
      args: the parsed command line (`--rows`, `--config`).
      root: the work directory; the transformed splits go to `root/tx`.

    Returns:
      One line: the rows generated and preprocessed.
    """
    # lazy: keeps Beam off the checks that tests import without preprocessing
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from components.embedding_preprocess.run import run_preprocessing

    write_csv(GeneratorSpec(rows=args.rows, seed=11), os.path.join(root, "train.csv"))
    write_csv(GeneratorSpec(rows=max(args.rows // 5, 1000), seed=12), os.path.join(root, "eval.csv"))
    # One preprocessing for both trainings: the parity configuration changes the model only.
    run_preprocessing(
        beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=in_memory"])),
        parse_config(base_raw_config(args, root)),
        {"train": os.path.join(root, "train.csv"), "eval": os.path.join(root, "eval.csv")},
        os.path.join(root, "vocab"), {s: os.path.join(examples_dir(root), f"Split-{s}") for s in ("train", "eval")},
        os.path.join(root, "stats"), input_format="csv",
    )
    return f"{args.rows} train rows generated and preprocessed"


def examples_dir(root: str) -> str:
    """The transformed examples' directory under the work directory `root` (`prepare_data` writes it)."""
    return os.path.join(root, "tx")


def split_files(root: str, split: str) -> List[str]:
    """The file pattern of a transformed split under `root`, as the Trainer's FnArgs give it."""
    return [os.path.join(examples_dir(root), f"Split-{split}", "*")]


def eval_records(root: str, n: int = 64, seed: int = 0):
    """`n` transformed eval rows drawn across the split, as serialized tf.Examples (what the
    Trainer's signature takes); never its first rows, which in a sorted split are one part of it.

    Drawn by `sampling.sample_transformed_rows` (blocks cut back into rows).

    Args:
      root: the work directory.
      n: how many rows.
      seed: the draw's seed (the same seed and split give the same rows).

    Returns:
      min(n, rows in the split) serialized tf.Examples, a list of bytes.
    """
    files = split_files(root, "eval")
    return sample_transformed_rows(files[0], resolved_input.read_manifest(examples_dir(root)), n, seed)
