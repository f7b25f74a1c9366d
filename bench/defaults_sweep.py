"""The candidate sweep behind the training defaults (bench/README.md "Defaults on real data").

    .venv/bin/python bench/defaults_sweep.py OUTPUT_DIR CONFIG '{"training": {...}}' ['{...}' ...]

OUTPUT_DIR: a finished `pipelines run` of CONFIG (its newest transformed examples, manifest and
statistics are reused: only the Trainer's `train` and `finish` run, once per candidate). Each
candidate is a JSON mapping of config sections to fields merged over CONFIG, e.g.
'{"training": {"embedding_optimizer": {"name": "adagrad", "learning_rate": 1.0}, "epochs": 5}}';
'{}' is the config as it is. Prints one RESULT line per candidate: eval AUC (exact, whole eval
split), steps, the checkpoint kept and the held-out slice's AUC at each evaluation (early stopping), seconds. Written as run for bench/README.md's figures, then kept so anyone can rerun them.
"""
import json
import os
import sys
import tempfile
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import components  # noqa: E402,F401

from components.config.loading import parse_config  # noqa: E402
from components.contracts.plan import CheckpointLayout  # noqa: E402
from components.planning.run_plan import derive_plan, training_steps  # noqa: E402
from components.embedding_trainer import model_artifact, resolved_input, training_loop  # noqa: E402
from tests.stages import examples_uri  # noqa: E402
from components.planning.fitting import with_run  # noqa: E402


def finished_run(output_dir: str):
    """(train pattern, eval pattern, manifest, statistics) of the transformed examples of the last
    run into `output_dir`, as its summary.json names them (that run's own, from its ML Metadata)."""
    with open(os.path.join(output_dir, "summary.json"), encoding="utf-8") as fh:
        artifacts = json.load(fh).get("artifacts") or {}
    tx = artifacts.get("EmbeddingPreprocess.transformed_examples")
    if not tx:
        raise SystemExit(f"{output_dir}/summary.json names no transformed examples: run `python -m pipelines run` "
                         "into it again (a summary from before runs recorded their artifacts, or a failed run)")
    train, evals = [os.path.join(tx, "Split-train", "*")], [os.path.join(tx, "Split-eval", "*")]
    return train, evals, resolved_input.read_manifest(examples_uri(train)), resolved_input.read_statistics(examples_uri(train))


def config_with(config_path: str, overrides=None):
    """CONFIG with its input path made absolute and `overrides` ({section: fields}) merged in."""
    with open(config_path, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh)
    raw["input"]["path"] = os.path.abspath(os.path.join(os.path.dirname(config_path), raw["input"]["path"]))
    for section, fields in (overrides or {}).items():
        raw.setdefault(section, {}).update(fields)
    return parse_config(raw)


def main(output_dir: str, config_path: str, candidates) -> None:
    train, evals, manifest, stats = finished_run(output_dir)
    for spec in candidates:
        cfg = config_with(config_path, json.loads(spec))
        plan = with_run(derive_plan(cfg, manifest, stats), vocabulary_dir=manifest.vocabulary_dir)
        length = training_steps(cfg, stats)
        work = tempfile.mkdtemp(prefix="sweep-")
        start = time.time()
        ckpt, _, run = training_loop.train(cfg, plan, manifest, train, evals, os.path.join(work, "state"), train_steps=length["steps"],
                               train_rows=length.get("train_rows"))
        plan = with_run(plan, checkpoint_layout=CheckpointLayout(**run["checkpoint_layout"]))
        metrics, _ = model_artifact.finish(cfg, plan, manifest, ckpt, evals, os.path.join(work, "serving"),
                                           precision=run["precision"]["used"])
        sel = run.get("selection") or {}
        chosen = (f" model_step {run['model_step']} of {run['final_step']} holdout_auc {sel['best_auc']:.4f}"
                  + (" (stopped early)" if sel.get("stopped_at") else "")) if sel.get("best_auc") is not None else ""
        curve = " holdout " + " ".join(f"{e['step']}:{e['auc']:.4f}" for e in sel.get("evaluations", []))
        # a bfloat16 run's eval AUC as trained beside `auc`, served (float32)
        trained = (f" trained_{metrics['trained_precision']['precision']}_auc {metrics['trained_precision']['auc']:.4f}"
                   if "trained_precision" in metrics else "")
        print(f"RESULT {spec} auc {metrics['auc']:.4f}{trained} steps {length['steps']}{chosen} seconds {time.time() - start:.0f}"
              f"{curve if sel.get('evaluations') else ''}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
