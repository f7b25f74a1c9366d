"""Eval AUC along training, for tuning a config on preprocessed data without running the pipeline.

    .venv/bin/python bench/auc_curve.py --config configs/demo.yaml --examples DIR \\
        [--steps 2400] [--every 300] [--set training.model=dlrm --set training.dropout=0 ...]

DIR holds the preprocessing output's transformed examples (Split-train/, Split-eval/,
embedding_manifest.json, embedding_statistics.json), e.g. `python -m components.embedding_preprocess
... --output OUT` gives OUT/transformed. `--set` overrides a config field (dotted path, YAML value)
before validation. Prints `step auc log_loss seconds` every `--every` steps: the plan, model,
optimizers and input are the trainer's own (`model_building.build_model`, `make_dataset` with the
trainer's padded dense IDs), only the loop is plain `fit` with evaluations between. docs/training.md's
"Eval AUC on generated data" table was measured with it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import components  # noqa: E402,F401
import tensorflow as tf  # noqa: E402
import yaml  # noqa: E402

from components.config.loading import parse_config  # noqa: E402
from components.embedding_model.tf_objects import dense_id_widths  # noqa: E402
from components.planning.run_plan import derive_plan  # noqa: E402
from components.embedding_trainer import model_building, resolved_input  # noqa: E402
from tests.stages import examples_uri  # noqa: E402
from components.embedding_trainer.evaluation import evaluate  # noqa: E402
from components.embedding_model.input import make_dataset  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--examples", required=True, help="transformed examples directory")
    ap.add_argument("--steps", type=int, help="default: training.train_steps")
    ap.add_argument("--every", type=int, default=300)
    ap.add_argument("--set", action="append", default=[], metavar="PATH=VALUE")
    args = ap.parse_args()
    with open(args.config) as fh:
        raw = yaml.safe_load(fh)
    raw["input"]["path"] = os.path.abspath(args.config)  # not read: the examples are given
    for item in args.set:
        path, _, value = item.partition("=")
        node = raw
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = yaml.safe_load(value)
    cfg = parse_config(raw)
    t = cfg.training
    train_files = [os.path.join(args.examples, "Split-train", "*")]
    eval_files = [os.path.join(args.examples, "Split-eval", "*")]
    manifest = resolved_input.read_manifest(examples_uri(train_files))
    plan = derive_plan(cfg, manifest, resolved_input.read_statistics(examples_uri(train_files)))
    tf.keras.utils.set_random_seed(t.seed)
    train = make_dataset(train_files, manifest, t.batch_size, True, seed=t.seed, dense_id_widths=dense_id_widths(plan))
    evaluation = make_dataset(eval_files, manifest, 1024, False)
    model = model_building.build_model(plan, manifest, cfg, for_training=True)
    model.compile(optimizer=model.dense_optimizer, loss=tf.keras.losses.BinaryCrossentropy())
    steps = args.steps or t.train_steps
    start = time.time()
    print("step auc log_loss seconds", flush=True)
    for k in range(1, steps // args.every + 1):
        model.fit(train, epochs=1, steps_per_epoch=args.every, verbose=0)
        m = evaluate(model, evaluation)
        print(k * args.every, f"{m['auc']:.4f}", f"{m['log_loss']:.4f}", f"{time.time() - start:.0f}", flush=True)
    print(json.dumps({"eval_examples": m["examples"], "positive_rate": round(m["positive_rate"], 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
