"""The continuous-training demo: daily spans with drifting IDs, one pipeline run per span.

`python -m pipelines continuous` (docs/continuous.md): for day 1..N it writes that day's
span (`<data dir>/span-<day>/data.csv`: the generator with a new seed and the IDs shifted by
`id_shift` per day), then runs the pipeline whose input is `<data dir>/span-{SPAN}` on that span
(ExampleGen's driver, with a static RangeConfig; without one it takes the latest span) into one
output directory, so the days share one push destination: each run's LastBlessedModel step finds
the model served there in its registry, the Trainer warm-starts from it and measures the drift, and
the exporter's gate compares the new model with it on the new eval rows. Prints per span what
carried over, the drift, both AUCs, the gate's decision and what was pushed.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

import yaml

from components.config.loading import load_config
from components.config.schema import PipelineConfig
from components.example_gen.synthetic_data import CRITEO_CARDINALITIES, GeneratorSpec, ensure_dataset
from components.reporting.report import Report, emit
from pipelines.runner import run
from pipelines.summary import continuous_rows, metric_measured, metric_text, not_pushed_reason, wrap_rows

SPAN_DIR = "span-{SPAN}"


def span_config(base_config: str, data_dir: str, output_dir: str, overrides: Optional[Dict[str, Any]] = None) -> PipelineConfig:
    """Loads a configuration whose input is the daily spans.

    It is written to `<output_dir>/continuous.yaml`, so that the run's config is a file a user
    can read and reuse.

    Args:
      base_config: the YAML configuration to start from.
      data_dir: where the spans are written (`<data_dir>/span-<day>`).
      output_dir: the runs' output folder.
      overrides: sections to merge into the config (a dict updates the section, anything else
        replaces it).

    Returns:
      The resolved configuration, named `<name>-continuous`.

    Raises:
      ConfigError: the resulting configuration is invalid.
    """
    with open(base_config, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh)
    raw["name"] = raw.get("name", "pipeline") + "-continuous"
    raw["input"]["path"] = os.path.join(os.path.abspath(data_dir), SPAN_DIR)
    for section, values in (overrides or {}).items():
        if isinstance(values, dict):
            raw.setdefault(section, {}).update(values)
        else:
            raw[section] = values
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "continuous.yaml")
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(raw, fh, sort_keys=False)
    return load_config(path)


def write_span(data_dir: str, day: int, rows: int, id_shift: int, seed: int, max_cardinality: Optional[int] = None) -> Dict[str, Any]:
    """Writes one day's span of synthetic data, unless the same span is already there.

    Args:
      data_dir: where the spans go (`<data_dir>/span-<day>/data.csv`).
      day: the day, from 1.
      rows: the span's rows.
      id_shift: IDs shift by this much per day after the first.
      seed: the generator's seed on day 0 (day d uses seed + d).
      max_cardinality: caps every feature's cardinality; None keeps Criteo's.

    Returns:
      The span's metadata (its `.meta.json`: `rows`, the spec, ...).
    """
    cards = [min(c, max_cardinality) for c in CRITEO_CARDINALITIES] if max_cardinality else list(CRITEO_CARDINALITIES)
    spec = GeneratorSpec(rows=rows, seed=seed + day, cardinalities=cards, id_shift=id_shift * (day - 1))
    return ensure_dataset(os.path.join(data_dir, f"span-{day}", "data.csv"), spec)


def run_spans(cfg: PipelineConfig, data_dir: str, output_dir: str, spans: int, rows: int, id_shift: int,
              seed: int = 7, max_cardinality: Optional[int] = None, quiet: bool = True,
              show: bool = True, progress_to_stderr: bool = False) -> List[Dict[str, Any]]:
    """Runs the pipeline once per daily span: writes the span, runs on it, collects its summary.

    Args:
      cfg: the configuration (`span_config`).
      data_dir: where the spans are written.
      output_dir: the runs' shared output folder (one push destination).
      spans: the number of days.
      rows: rows per span.
      id_shift: IDs shift by this much per day.
      seed: the generator's base seed.
      max_cardinality: caps every feature's cardinality; None keeps Criteo's.
      quiet: send the runs' logs to `<output_dir>/pipeline.log`.
      show: print each span's report when its run ends.
      progress_to_stderr: the quiet runs' progress goes to stderr.

    Returns:
      Each run's summary (pipelines.summary.summarize), with `span` and `rows` added.
    """
    out = []
    for day in range(1, spans + 1):
        meta = write_span(data_dir, day, rows, id_shift, seed, max_cardinality)
        if show:
            print(f"\n=== span {day}: {meta['rows']:,} rows, IDs shifted by {id_shift * (day - 1)} ===", flush=True)
        # this day's span, even when later ones exist
        summary = run(cfg, output_dir, quiet=quiet, span=day, progress_to_stderr=progress_to_stderr).summary
        summary.update(span=day, rows=meta["rows"])
        out.append(summary)
        if show:
            emit(span_report(summary))
    return out


def span_report(s: Dict[str, Any]):
    """Builds one span's report: warm start and drift, the AUCs, the gate, what was pushed.

    Args:
      s: the span's summary (`run_spans`).

    Returns:
      The Report, whose data is the summary.
    """
    r = Report(f"span {s['span']} (ExampleGen read span {(s.get('input') or {}).get('span')})", data=s)
    continuous_rows(r, s.get("continuous"))
    # an AUC undefined on the eval split (one label) shows its reason, as the run summary does
    r.add("AUC", f"model {metric_text(s, 'eval_auc')}"
          + (f", baseline {metric_text(s, 'baseline_auc')}" if metric_measured(s, "baseline_auc") else ""))
    v = s.get("validation") or {}
    r.add("validation gate", "blessed" if v.get("blessed") else "NOT BLESSED")
    for c in v.get("checks", []):
        r.sub(c["name"], f"{'passed' if c['passed'] else 'FAILED'}: {c['reason']}")
    r.add("pushed", s["serving_model"] if s.get("pushed_by_this_run")
          else f"nothing ({not_pushed_reason(s)}; serving stays {s.get('serving_model')})")
    return wrap_rows(r)
