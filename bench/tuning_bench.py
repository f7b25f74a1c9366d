"""The Tuner against the defaults on a public dataset (bench/README.md "Tuning").

    .venv/bin/python bench/tuning_bench.py OUTPUT_DIR CONFIG '<tuning section JSON>'

OUTPUT_DIR: a finished `pipelines run` of CONFIG (the transformed examples, manifest and
statistics are reused). Runs, on the same transformed splits: the Trainer's training and final
evaluation with CONFIG as it is (the defaults); then the Tuner's search (tuner_fn's tuner:
`tuning.trials` trials of `tuning.steps_per_trial` steps, each scored on the held-out slice of the
train split) and the same training with the best trial's values applied over CONFIG. Prints one
RESULT line (JSON): eval AUC (exact, whole eval split) and wall seconds of each, the search's
seconds, the best values and every trial's held-out AUC. Written as run for bench/README.md's
figures, then kept so anyone can rerun them.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import components  # noqa: E402,F401

from components.config.loading import apply_values, parse_config  # noqa: E402
from components.contracts.plan import CheckpointLayout  # noqa: E402
from components.embedding_trainer import model_artifact, training_loop  # noqa: E402
from components.planning.run_plan import derive_plan, training_steps  # noqa: E402
from components.embedding_trainer.tuner import build_tuner  # noqa: E402
from bench.defaults_sweep import finished_run  # noqa: E402
from components.planning.fitting import with_run  # noqa: E402


def train_and_evaluate(cfg, train, evals, manifest, stats):
    """The Trainer's training and final evaluation of `cfg`: (eval AUC, steps, seconds)."""
    plan = with_run(derive_plan(cfg, manifest, stats), vocabulary_dir=manifest.vocabulary_dir)
    length = training_steps(cfg, stats)
    work = tempfile.mkdtemp(prefix="tuning-bench-")
    start = time.time()
    ckpt, _, run = training_loop.train(cfg, plan, manifest, train, evals, os.path.join(work, "state"),
                                        train_steps=length["steps"], train_rows=length.get("train_rows"))
    plan = with_run(plan, checkpoint_layout=CheckpointLayout(**run["checkpoint_layout"]))
    metrics, _ = model_artifact.finish(cfg, plan, manifest, ckpt, evals, os.path.join(work, "serving"))
    return metrics["auc"], run["final_step"], round(time.time() - start, 1)


def main(output_dir: str, config_path: str, tuning: str) -> None:
    with open(config_path, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh)
    raw["input"]["path"] = os.path.abspath(os.path.join(os.path.dirname(config_path), raw["input"]["path"]))
    raw["tuning"] = json.loads(tuning)
    cfg = parse_config(raw)
    train, evals, manifest, stats = finished_run(output_dir)
    default_auc, default_steps, default_seconds = train_and_evaluate(cfg, train, evals, manifest, stats)
    start = time.time()
    tuner = build_tuner(cfg, manifest, stats, train, tempfile.mkdtemp(prefix="tuning-search-"))
    tuner.search()
    search_seconds = round(time.time() - start, 1)
    best = tuner.get_best_hyperparameters()[0].values
    tuned_auc, tuned_steps, tuned_seconds = train_and_evaluate(apply_values(cfg, best), train, evals, manifest, stats)
    print("RESULT " + json.dumps({
        "config": config_path, "tuning": raw["tuning"],
        "defaults": {"eval_auc": round(default_auc, 4), "steps": default_steps, "seconds": default_seconds},
        "tuned": {"eval_auc": round(tuned_auc, 4), "steps": tuned_steps, "seconds": tuned_seconds,
                  "search_seconds": search_seconds, "best": best},
        "trials": [{"values": r["values"], "holdout_auc": round(r["auc"], 4)} for r in tuner.results],
    }, sort_keys=True), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output_dir", help="a finished `pipelines run` of CONFIG")
    parser.add_argument("config", help="the pipeline YAML of that run")
    parser.add_argument("tuning", help="the tuning section as JSON (configs/README.md, tuning)")
    args = parser.parse_args()
    main(args.output_dir, args.config, args.tuning)
