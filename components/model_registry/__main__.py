"""`python -m components.model_registry SERVING_DIR`: what a push destination serves and its history.

Prints what the next pipeline run's LastBlessedModel step will find (the gate's reference and the
warm start) and every version with its state and registry entry. Exit status: 0 when the next run
can start (something is served, or nothing was pushed yet), 2 when the registry cannot say what is
served (the message names the path and the way out).
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # the file systems come from TensorFlow: no start-up log
from components.model_registry import registry  # noqa: E402


def main(argv=None) -> int:
    """Prints a push destination's served model, the next run's lookup and every version's history.

    Args:
      argv: the command-line arguments (without the program name); None reads sys.argv.

    Returns:
      The exit status: 0 when the next run can start, 2 when the registry cannot say what is served.
    """
    parser = argparse.ArgumentParser(prog="python -m components.model_registry", description=__doc__.split("\n")[0])
    parser.add_argument("serving_dir", help="the push destination (kubeflow.serving_dir, or <output dir>/serving for a local run)")
    args = parser.parse_args(argv)
    rows = registry.history(args.serving_dir)
    print(f"{'version':<12}{'state':<12}{'eval AUC':>9}  {'pushed at':<21}{'pipeline':<22}run")
    for r in rows:
        e = r.get("entry") or {}
        auc = f"{e['eval_auc']:.4f}" if isinstance(e.get("eval_auc"), (int, float)) else "-"
        run = (e.get("run") or {}).get("id") or "-"
        print(f"{r['version']:<12}{r['state']:<12}{auc:>9}  {e.get('pushed_at', '-'):<21}{e.get('pipeline', '-'):<22}{run}")
        if "error" in r:
            print(f"{'':<12}entry: {r['error']}")
    try:
        found = registry.lookup(args.serving_dir)
    except registry.RegistryError as err:
        print(f"error: the next run stops here: {err}", file=sys.stderr)
        return 2
    print(f"next run compares with: {found.served_model or 'nothing'} ({found.note})")
    if found.found:
        print(f"next run warm-starts from: {found.warm_start_model or 'nothing (' + str(found.warm_start_note) + ')'}")
    for s in found.skipped:
        print(f"skipped: {s['path']}: {s['reason']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
