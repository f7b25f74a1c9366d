"""Live progress (components/reporting/progress.py, pipelines/progress_view.py), the one report renderer
(components/reporting/report.py, pipelines/summary.py), the exit statuses and the HTML run report."""
import io
import json
import multiprocessing
import os
from html.parser import HTMLParser

import pytest

from components.reporting import progress
from components.reporting.report import KEPT_BEST, KEPT_LAST, Report, error_line, render
from pipelines import feature_health_view
from pipelines import summary as summary_lib
from pipelines.progress_view import ProgressPrinter


# ---- progress events ------------------------------------------------------------------------


def test_progress_is_a_no_op_without_the_environment_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(progress.ENV, raising=False)
    progress.count("X", "rows read", 5)
    progress.phase("X", "p")
    assert not list(tmp_path.iterdir())


def _writer(path, k):
    os.environ[progress.ENV] = path
    for i in range(400):
        progress.count("EmbeddingPreprocess", f"transforming {k}", 3, total=2400)
        progress.phase("EmbeddingPreprocess", "x" * 300)  # longer lines too


def test_events_from_several_processes_stay_whole_lines(tmp_path):
    """Beam's workers append to one file: every line must come back whole (one write per line)."""
    path = str(tmp_path / "progress.jsonl")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, k)) for k in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    lines = open(path).read().splitlines()
    assert len(lines) == 3 * 800
    events = [json.loads(line) for line in lines]
    done = {}
    for e in events:
        if e["event"] == progress.COUNT:
            done[e["phase"]] = done.get(e["phase"], 0) + e["done"]
    assert done == {f"transforming {k}": 1200 for k in range(3)}


def _events(path, events):
    with open(path, "w") as fh:
        for e in events:
            fh.write(json.dumps(e) + "\n")


def test_printer_shows_every_stage_with_counts_steps_and_evaluations(tmp_path):
    path = str(tmp_path / "p.jsonl")
    t = 1_700_000_000.0
    _events(path, [
        {"t": t, "stage": "EmbeddingExampleGen", "event": "start"},
        {"t": t + 1, "stage": "EmbeddingExampleGen", "event": "count", "phase": "rows read", "done": 5000, "total": None, "unit": "rows"},
        {"t": t + 3, "stage": "EmbeddingExampleGen", "event": "count", "phase": "rows read", "done": 5000, "total": None, "unit": "rows"},
        {"t": t + 4, "stage": "EmbeddingExampleGen", "event": "done", "seconds": 4.0},
        {"t": t + 5, "stage": "EmbeddingPreprocess", "event": "start"},
        {"t": t + 5, "stage": "EmbeddingPreprocess", "event": "count", "phase": "counting values", "done": 0, "total": 8000, "unit": "rows"},
        {"t": t + 6, "stage": "EmbeddingPreprocess", "event": "count", "phase": "counting values", "done": 2000, "total": None, "unit": "rows"},
        {"t": t + 8, "stage": "EmbeddingPreprocess", "event": "count", "phase": "counting values", "done": 2000, "total": None, "unit": "rows"},
        {"t": t + 9, "stage": "EmbeddingPreprocess", "event": "done", "seconds": 4.0},
        {"t": t + 10, "stage": "Trainer", "event": "start"},
        {"t": t + 10, "stage": "Trainer", "event": "phase", "text": "training 100 steps of 256 examples"},
        {"t": t + 11, "stage": "Trainer", "event": "step", "step": 10, "total": 100, "loss": 0.7, "examples_per_second": None},
        {"t": t + 21, "stage": "Trainer", "event": "step", "step": 60, "total": 100, "loss": 0.5, "examples_per_second": 1280.0},
        {"t": t + 29, "stage": "Trainer", "event": "step", "step": 100, "total": 100, "loss": 0.45, "examples_per_second": 1280.0},
        {"t": t + 30, "stage": "Trainer", "event": "eval", "step": 100, "metrics": {"auc": 0.81, "log_loss": 0.44}},
        {"t": t + 31, "stage": "Trainer", "event": "done", "seconds": 21.0},
        {"t": t + 32, "stage": "EmbeddingExporter", "event": "start"},
        {"t": t + 33, "stage": "EmbeddingExporter", "event": "phase", "text": "validation gate: blessed"},
        {"t": t + 34, "stage": "EmbeddingExporter", "event": "failed", "seconds": 2.0, "error": "ExportRefused"},
    ])
    out = io.StringIO()
    printer = ProgressPrinter(path, out, tty=False, every=5.0)
    printer.drain()
    text = out.getvalue()
    assert "EmbeddingExampleGen running" in text and "EmbeddingExampleGen finished in 4s" in text
    # 5,000 rows arrived in the 2 s between the counts (the first event's rows were read before it)
    assert "rows read: 10,000 rows (2.5k rows/s)" in text
    # the total announced when the pass starts (t+5): 4,000 rows in 3 s
    assert "counting values: 4,000 / 8,000 rows (50%, 1.3k rows/s, ETA 3s)" in text
    assert "Trainer: training 100 steps of 256 examples" in text
    assert "step 60/100, loss 0.5000, 1.3k examples/s, ETA 8s" in text  # (21-11)/(60-10) s a step
    assert "step 100/100, loss 0.4500" in text
    assert "eval at step 100: auc 0.8100, log_loss 0.4400" in text
    assert "EmbeddingExporter failed after 2s (ExportRefused)" in text
    assert printer.current == "EmbeddingExporter"  # the stage to name in the error line
    # a line still being written waits for its end
    with open(path, "a") as fh:
        fh.write('{"t": 1, "stage": "Pusher", "event": "sta')
    printer.drain()
    assert "Pusher" not in out.getvalue()
    with open(path, "a") as fh:
        fh.write('rt"}\n')
    printer.drain()
    assert "Pusher running" in out.getvalue()


def test_the_final_eval_line_names_the_kept_model(tmp_path):
    """The Trainer's final evaluation scores the kept checkpoint: its line names that step and how it
    was chosen, never the last step's (before: `eval at step 700: auc 0.9155` for step 400's model)."""
    path = str(tmp_path / "p.jsonl")
    _events(path, [
        {"t": 1.0, "stage": "Trainer", "event": "start"},
        {"t": 2.0, "stage": "Trainer", "event": "eval", "step": 400, "metrics": {"holdout_auc": 0.93}},
        {"t": 3.0, "stage": "Trainer", "event": "eval", "step": 700, "metrics": {"holdout_auc": 0.91}},
        {"t": 4.0, "stage": "Trainer", "event": "eval", "step": 400, "kept": KEPT_BEST,
         "metrics": {"auc": 0.9155, "examples": 5000, "log_loss": 0.31}},
        {"t": 5.0, "stage": "Trainer", "event": "eval", "step": 700, "kept": KEPT_LAST, "metrics": {"auc": 0.9}},
    ])
    out = io.StringIO()
    ProgressPrinter(path, out, tty=False).drain()
    text = out.getvalue()
    assert "eval at step 400: holdout_auc 0.9300" in text and "eval at step 700: holdout_auc 0.9100" in text
    assert ("Trainer: eval of the kept model (step 400, best on the held-out slice): auc 0.9155, examples 5,000, "
            "log_loss 0.3100") in text
    assert "Trainer: eval of the kept model (step 700, the last step): auc 0.9000" in text
    assert "eval at step 700: auc" not in text and "eval at step 400: auc" not in text


def test_the_eval_line_prints_the_auc_the_summary_prints(tmp_path, monkeypatch):
    """The progress event carries the metric unrounded, so the line's 4 decimals are the summary's
    (a finefoods run printed auc 0.8426 against the summary's 0.8425: 0.84254962 rounded twice)."""
    from components.reporting import progress

    path = str(tmp_path / "p.jsonl")
    monkeypatch.setenv(progress.ENV, path)
    progress.evaluated("Trainer", 63, {"auc": 0.8425496285847449}, kept=KEPT_BEST)
    out = io.StringIO()
    ProgressPrinter(path, out, tty=False).drain()
    text = out.getvalue()
    assert f"auc {0.8425496285847449:.4f}" == "auc 0.8425" and "auc 0.8425" in text and "auc 0.8426" not in text, text


def test_printer_on_a_terminal_draws_bars(tmp_path):
    path = str(tmp_path / "p.jsonl")
    _events(path, [
        {"t": 1.0, "stage": "Trainer", "event": "start"},
        {"t": 2.0, "stage": "Trainer", "event": "step", "step": 5, "total": 10, "loss": 0.6, "examples_per_second": 100.0},
        {"t": 3.0, "stage": "Trainer", "event": "step", "step": 10, "total": 10, "loss": 0.5, "examples_per_second": 100.0},
        {"t": 4.0, "stage": "Trainer", "event": "done", "seconds": 3.0},
    ])
    out = io.StringIO()
    printer = ProgressPrinter(path, out, tty=True)
    printer.drain()
    printer.stop()
    text = out.getvalue()
    assert "Trainer running" in text and "step 10/10" in text and "Trainer finished in 3s" in text


# ---- one report style --------------------------------------------------------------------------


def test_reports_align_labels_and_errors_are_one_line():
    r = Report("x summary").add("rows read", "train 10").sub("detail", "y").add("a much longer label than usual", "z")
    assert render(r).splitlines() == [
        "=== x summary ===",
        "rows read:            train 10",
        "  detail:             y",
        "a much longer label than usual: z",
    ]
    line = error_line("boom\nsecond line", "Trainer", "/tmp/log")
    assert line == "error: Trainer failed: boom (full log: /tmp/log)"


PUSHED = {"serving_model": "/o/serving/2", "pushed_by_this_run": True, "registry_error": None,
          "validation": {"blessed": True, "checks": [], "reasons": []}, "rows_read": {"eval": 25, "train": 75},
          "rows_dropped": {"eval": {"missing_label": 0}, "train": {"missing_label": 2}},
          "ledger": {"stages": [{"stage": "EmbeddingExampleGen", "rows_in": 102, "malformed": {"too_few_fields": 0},
                                 "dropped": {"missing_label": 2}, "rows_out": {"eval": 25, "train": 75}, "balanced": True,
                                 "problems": []}]}}
REFUSED = dict(PUSHED, serving_model="/o/serving/1", pushed_by_this_run=False, serving_model_this_run="/o/x/7",
               validation={"blessed": False, "reasons": ["AUC 0.70 is below the baseline's 0.75 + 0.01"],
                           "checks": [{"name": "baseline", "passed": False, "reason": "AUC 0.70 < 0.76"}]})


def _unwrapped(text):
    """The summary's rows as one line each: a wrapped row's continuation lines (text alone, under
    the text column) joined back onto it."""
    lines = []
    for line in text.splitlines():
        if lines and line.startswith(" " * 22) and line[22:23] != " ":
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return "\n".join(lines)


def test_summary_names_this_runs_model_or_why_none_was_pushed():
    text = render(summary_lib.summary_report(PUSHED))
    assert "serving model:        /o/serving/2 (pushed by this run)" in text
    assert "rows read:            eval 25, train 75 (dropped: train/missing_label 2)" in text
    assert "ledger EmbeddingExampleGen: in 102; dropped missing_label 2; out eval 25, train 75 (adds up)" in text
    assert "{" not in text  # no dict reprs
    text = _unwrapped(render(summary_lib.summary_report(REFUSED)))
    assert ("serving model:        none pushed: the validation gate kept the model back: "
            "AUC 0.70 is below the baseline's 0.75 + 0.01") in text
    assert "  still served:       /o/serving/1" in text  # the earlier push, named as such
    nothing = dict(REFUSED, serving_model=None)
    assert "  still served:       nothing" in render(summary_lib.summary_report(nothing))


@pytest.mark.parametrize("summary, status", [
    (PUSHED, 0), (REFUSED, 3), (dict(PUSHED, pushed_by_this_run=False), 1), ({}, 1),
])
def test_exit_status_of_a_run(summary, status):
    assert summary_lib.exit_status(summary) == status


def test_cli_exit_statuses(monkeypatch, capsys, tmp_path):
    """`python -m pipelines run`: 0 pushed, 3 kept back by the gate, 1 failed, 2 bad config; --json."""
    import pipelines.__main__ as cli
    from pipelines import runner

    cfg = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "demo.yaml")
    data = tmp_path / "d.csv"
    data.write_text("label,I1\n1,2\n")
    import yaml

    raw = yaml.safe_load(open(cfg))
    raw["input"]["path"] = str(data)
    good = tmp_path / "c.yaml"
    good.write_text(yaml.safe_dump(raw))

    def fake(summary=None, fail=None):
        def run(cfg, output_dir, quiet=False, span=None, cache=True, progress_to_stderr=False):
            if fail:
                raise runner.RunFailed(fail)
            return runner.RunResult(dict(summary), output_dir)
        return run

    monkeypatch.setattr(runner, "run", fake(PUSHED))
    assert cli.main(["run", "--config", str(good), "--output-dir", str(tmp_path / "o")]) == 0
    assert "(pushed by this run)" in capsys.readouterr().out
    monkeypatch.setattr(runner, "run", fake(REFUSED))
    assert cli.main(["run", "--config", str(good), "--output-dir", str(tmp_path / "o"), "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["validation"]["blessed"] is False
    monkeypatch.setattr(runner, "run", fake(fail="Trainer failed: boom (full log: x)"))
    assert cli.main(["run", "--config", str(good), "--output-dir", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: Trainer failed: boom (full log: x)"]
    raw["training"]["batch_sise"] = 3
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    assert cli.main(["run", "--config", str(bad), "--output-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "batch_sise" in err[0]


# ---- the HTML run report ----------------------------------------------------------------------


class _Sections(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.svgs, self.links, self.stack = [], 0, [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "h2":
            self.ids.append(a.get("id"))
        if tag == "svg":
            self.svgs += 1
        if tag == "a":
            self.links.append(a.get("href"))
        if tag not in ("meta", "br", "line", "circle", "polyline", "text", "img"):
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in ("line", "circle", "polyline", "text", "meta"):
            return
        assert self.stack and self.stack[-1] == tag, (tag, self.stack[-5:])
        self.stack.pop()


def test_run_report_has_every_section_and_the_training_curves(tmp_path):
    import tensorflow as tf

    from pipelines.run_report import SECTIONS, write_run_report

    out = tmp_path / "run"
    run_dir = out / "pipeline_root" / "Trainer" / "model_run" / "5"
    for series, values in (("train", [0.7, 0.6, 0.5]), ("validation", [0.65, 0.6, 0.58])):
        w = tf.summary.create_file_writer(str(run_dir / series))
        with w.as_default():
            for step, v in enumerate(values):
                tf.summary.scalar("epoch_loss", v, step=step * 100)
        w.close()
    w = tf.summary.create_file_writer(str(run_dir / "train"))
    with w.as_default():
        for step, v in ((100, 0.69), (200, 0.62)):
            tf.summary.scalar("batch_loss", v, step=step)
    w.close()
    model = out / "pipeline_root" / "Trainer" / "model" / "5"
    model.mkdir(parents=True)
    (model / "training_run.json").write_text(json.dumps({"selection": {
        "evaluations": [{"step": 100, "auc": 0.7, "log_loss": 0.66}, {"step": 200, "auc": 0.72, "log_loss": 0.63}],
        "best_step": 200, "best_auc": 0.72, "stopped_at": None, "note": None}}))
    stats = out / "pipeline_root" / "EmbeddingPreprocess" / "statistics" / "3"
    stats.mkdir(parents=True)
    (stats / "statistics.html").write_text("<html></html>")
    summary = dict(PUSHED, eval_auc=0.8, eval_log_loss=0.45, baseline_auc=0.75, vocabulary_sizes={"C1": 10},
                   export_parity={"passed": True, "max_abs_diff": 0.0, "examples": 64, "tolerance": 1e-5},
                   export_layout="A", export_compression={"float32": {"table_bytes": 2e6, "auc_change": 0.0}},
                   continuous={"base_model": "/o/Trainer/model/1", "note": None,
                               "warm_start": {"rows_carried": 5, "rows": 10, "tokens_carried": 5, "tokens_new": 5,
                                              "tokens_dropped": 1, "tables_with_slots": 1, "tables": 1,
                                              "dense_weights_carried": 4, "dense_weights_fresh": 0, "dense_slots_carried": 4},
                               "drift": {"new_token_share": {"value": 0.1, "name": "C1"}}},
                   artifacts={"Trainer.model_run": str(run_dir), "Trainer.model": str(model),
                              "EmbeddingPreprocess.statistics": str(stats)})
    summary["validation"] = {"blessed": True, "reasons": [], "checks": [
        {"name": "baseline", "passed": True, "reason": "ok", "model_auc": 0.8, "reference_auc": 0.75},
        {"name": "last_blessed", "passed": True, "reason": "ok", "model_auc": 0.8, "reference_auc": 0.79}]}
    path = write_run_report(summary, str(out), str(out / "run_report.html"))
    page = open(path).read()
    parsed = _Sections()
    parsed.feed(page)
    parsed.close()
    assert parsed.ids == [k for k, _ in SECTIONS]
    assert parsed.svgs == 3 and "epoch_loss" in page and "validation" in page
    # the loss per batch (with the held-out log loss on the same steps) beside the held-out AUC
    pair = page[page.index('<div class="charts">'):page.index("</div>", page.index('<div class="charts">'))]
    assert pair.count("<svg") == 2 and "training loss (batch_loss)" in pair and "held-out AUC (model: step 200" in pair
    assert "pipeline_root/EmbeddingPreprocess/statistics/3/statistics.html" in parsed.links
    assert "0.7900" in page and "0.7500" in page  # the last blessed model's and the baseline's AUC
    assert "rows carried" in page and "new token share" in page
    # a run that stopped early still gets every section, each saying what is missing
    path = write_run_report({"serving_model": None}, str(tmp_path / "empty"), str(tmp_path / "r.html"))
    parsed = _Sections()
    parsed.feed(open(path).read())
    assert parsed.ids == [k for k, _ in SECTIONS]


def test_a_refusal_says_how_far_the_model_was_and_what_to_try():
    from components.config.loading import parse_config

    s = dict(REFUSED, validation={"blessed": False, "reasons": ["r"], "checks": [
        {"name": "baseline", "passed": False, "reason": "r", "model_auc": 0.70, "reference_auc": 0.75, "margin": 0.01}]})
    cfg = parse_config({"name": "x", "input": {"path": "d.csv"}, "label": "label",
                        "dense_features": [{"name": "I1"}], "categorical_features": [{"name": "C1"}],
                        "training": {"train_steps": 100, "batch_size": 256}})
    s["training"] = summary_lib.training_length(cfg, {"final_step": 100, "length": {"source": "training.train_steps"}},
                                      {"splits": {"train": {"examples_written": 16_000}}})
    # epochs count passes over the 14,400 rows trained on (16,000 less the held-out tenth), as the
    # default length does: 15 epochs of them / 256 = 844 steps; 100 steps x 256 / 14,400 = 1.78
    assert s["training"]["epochs"] == 1.78 and s["training"]["default_steps"] == 844
    assert s["training"]["trained_rows"] == 14_400 == cfg.training.trained_rows(16_000)
    text = _unwrapped(render(summary_lib.summary_report(s)))
    assert ("  what to try:        the model's eval AUC 0.7000 is 0.0400 short of what the baseline check asks "
            "(0.7500 - margin 0.01)") in text
    assert ("  what to try:        trained 100 steps, 1.78 epochs of the 14,400 rows trained on; the defaults "
            "would train 844 steps (15 epochs): unset training.train_steps, or raise it") in text
    assert "training:             100 steps of 256, 1.78 epochs of the 14,400 rows trained on" in text
    s["training"] = summary_lib.training_length(cfg, {"final_step": 900}, {"splits": {"train": {"examples_written": 16_000}}})
    assert "more epochs (training.epochs)" in _unwrapped(render(summary_lib.summary_report(s)))
    stopped = {"final_step": 160, "model_step": 100, "selection": {"stopped_at": 160, "best_auc": 0.71, "best_step": 100}}
    s["training"] = summary_lib.training_length(cfg, stopped, {"splits": {"train": {"examples_written": 16_000}}})
    assert ("trained 160 steps, 2.84 epochs of the 14,400 rows trained on: stopped early, the held-out slice of "
            "the train split peaked at step 100 (AUC 0.7100)") in _unwrapped(render(summary_lib.summary_report(s)))


def test_the_summary_and_the_run_report_name_the_kept_models_step_and_auc(tmp_path):
    """The eval split's AUC is the kept model's (step 400, the best on the held-out slice, not the
    last step 700): the summary's eval AUC row and the run report's evaluation table say so, and the
    epochs count the rows trained on (18,893 train rows less the held-out slice: 17,004)."""
    from components.config.loading import parse_config
    from pipelines.pipeline import PIPELINE_ROOT
    from pipelines.run_report import write_run_report

    root = tmp_path / PIPELINE_ROOT
    model = root / "Trainer" / "model" / "7"
    model.mkdir(parents=True)
    (model / "eval_metrics.json").write_text(json.dumps(
        {"auc": 0.9155, "log_loss": 0.31, "examples": 5000, "model_step": 400, "model_choice": KEPT_BEST}))
    selection = {"evaluations": [{"step": 400, "auc": 0.93, "log_loss": 0.3}, {"step": 700, "auc": 0.91, "log_loss": 0.33}],
                 "best_step": 400, "best_auc": 0.93, "stopped_at": None, "note": None}
    (model / "training_run.json").write_text(json.dumps(
        {"final_step": 700, "model_step": 400, "model_choice": KEPT_BEST, "selection": selection,
         "length": {"steps": 700, "source": "training.train_steps"}}))
    stats = root / "EmbeddingPreprocess" / "statistics" / "3"
    stats.mkdir(parents=True)
    (stats / "statistics.json").write_text(json.dumps({"splits": {
        s: {"examples_read": n, "examples_written": n, "examples_dropped": {}} for s, n in (("train", 18_893), ("eval", 4_000))},
        "tables": {}}))
    cfg = parse_config({"name": "x", "input": {"path": "d.csv"}, "label": "label",
                        "dense_features": [{"name": "I1"}], "categorical_features": [{"name": "C1"}],
                        "training": {"train_steps": 700, "batch_size": 256}})
    artifacts = {"Trainer.model": str(model), "EmbeddingPreprocess.statistics": str(stats)}
    s = summary_lib.summarize(cfg, str(tmp_path), artifacts)
    assert s["eval_model"] == {"step": 400, "choice": KEPT_BEST}
    assert s["training"]["epochs"] == round(700 * 256 / 17_004, 2) == 10.54  # not 700 x 256 / 18,893 = 9.49
    text = _unwrapped(render(summary_lib.summary_report(s)))
    assert ("training:             700 steps of 256, 10.54 epochs of the 17,004 rows trained on; the model is step "
            "400, the best on the held-out slice of the train split (AUC 0.9300)") in text
    assert "eval AUC:             the kept model (step 400, best on the held-out slice): 0.9155; log loss 0.3100" in text
    page = open(write_run_report(s, str(tmp_path), str(tmp_path / "r.html"))).read()
    assert "this run&#x27;s model: the kept model (step 400, best on the held-out slice)" in page
    assert "step 700, " not in page
    # artifacts written before eval_metrics.json named its model: the training record says which
    (model / "eval_metrics.json").write_text(json.dumps({"auc": 0.9155, "log_loss": 0.31}))
    assert summary_lib.summarize(cfg, str(tmp_path), artifacts)["eval_model"] == {"step": 400, "choice": KEPT_BEST}


# ---- feature health in words, grouped; the summary's width -------------------------------------


def test_health_reasons_read_as_words():
    """One wording for a feature's reasons: rows with their share, dropped values by count."""
    from components.embedding_preprocess.health import describe_reasons

    assert describe_reasons({"missing": 30105}, 301050) == "30,105 rows missing (10.0%)"
    assert describe_reasons({"not_numeric": 270, "missing": 29, "nan": 0}, 299) == (
        "270 rows not a number (90.3%), 29 rows missing (9.7%)")
    assert describe_reasons({"rows_without_a_valid_value": 1, "invalid_values/not_utf8": 12}, 4) == (
        "1 row without a valid value (25.0%), 12 values not UTF-8 text")
    assert describe_reasons({"missing": 5}) == "5 rows missing"  # no rows: no share
    assert describe_reasons({"missing": 0}, 10) == "none"


def test_every_invalid_reason_of_the_rulebook_has_words():
    from components.embedding_preprocess import health
    from components.rules import rulebook

    reasons = {v for k, v in vars(rulebook).items() if k.startswith("INVALID_")}
    assert reasons <= set(health.ROW_REASONS) | set(health.VALUE_REASONS)


def _warnings():
    """The embedded demo's warnings, by hand: 13 dense features 10% missing, 11 categorical 5% without a value."""
    dense = {f"I{k}": {"kind": "dense", "share": 0.1 + k / 10_000, "status": "warn", "reasons": {"missing": 1000 + k},
                       "rows": 10_000, "fill_value": -2.0 if k == 2 else -1.0} for k in range(1, 14)}
    cat = {f"C{k}": {"kind": "categorical", "share": 0.0505, "status": "warn", "rows": 10_000,
                     "reasons": {"rows_without_a_valid_value": 505}} for k in (2, 6, 9, 14, 16, 17, 18, 20, 22, 23, 24)}
    return {**dense, **cat}


def test_name_ranges_shorten_numbered_runs():
    assert feature_health_view.name_ranges([f"I{k}" for k in range(13, 0, -1)]) == "I1..I13"
    assert feature_health_view.name_ranges(["C18", "C2", "C16", "C6", "C17", "C7", "x"]) == "C2, C6, C7, C16..C18, x"


def test_summary_groups_the_feature_warnings_and_says_what_to_do():
    s = {"feature_warnings": _warnings(),
         "feature_health_limits": {"rows": 10_000, "warn_invalid_share": 0.05, "max_invalid_share": 0.5}}
    text = _unwrapped(render(summary_lib.summary_report(s)))
    lines = text.splitlines()
    start = lines.index("feature health:       24 features flagged above input.warn_invalid_share (5%)")
    assert lines[start + 1:start + 6] == [
        "  dense:              13 features: 10% of rows missing (I1..I13)",
        "  categorical:        11 features: 5% of rows without a valid value (C2, C6, C9, C14, C16..C18, C20, "
        "C22..C24)",
        "  what to do:         missing dense values are replaced by dense_features[].fill_value (now -2.0 for I2; "
        "-1.0 for I1, I3..I13): make sure it is a value the model cannot mistake for real data, or fill the gaps "
        "at the source",
        "  what to do:         a categorical feature's rows without a valid value pool to a zero vector: check the "
        "source column for empty cells, or for the values statistics.html counts as invalid",
        "  what to do:         if this much is expected, raise input.warn_invalid_share (now 5%): 11% quiets all "
        "of these; above input.max_invalid_share (50%) the run stops unless the feature is listed in "
        "input.allow_invalid",
    ]
    # a lone feature keeps its own share; invalid values and an allowed stop say so
    alone = {"T1": {"kind": "dense", "share": 0.9, "status": "allowed", "rows": 10,
                    "reasons": {"not_numeric": 8, "missing": 1}, "fill_value": 0.0}}
    assert feature_health_view.feature_health_lines(alone) == [
        ("dense", "1 feature: 90.0% of rows not a number or missing (T1): above input.max_invalid_share, allowed "
                  "by input.allow_invalid")]
    assert "dense rows not a number get the fill_value too" in " ".join(feature_health_view.feature_health_hints(alone))


def test_summary_lines_wrap_at_100_columns_under_the_text():
    path = "/o/" + "x" * 120  # longer than a line: kept whole
    s = dict(PUSHED, serving_model=path, feature_warnings=_warnings(),
             vocabulary_sizes={f"C{k}": 1000 * k for k in range(40)})
    lines = render(summary_lib.summary_report(s)).splitlines()
    assert max(len(x) for x in lines if path not in x) <= summary_lib.SUMMARY_WIDTH
    assert f"serving model:        {path}" in lines
    vocab = lines.index("vocabularies:         40 tables, 780,000 entries in all")
    assert lines[vocab + 1].startswith(" " * 22 + "C0=0, C1=1,000") and lines[vocab + 2].startswith(" " * 22 + "C")


def test_run_report_shows_the_held_out_auc_and_health_in_words(tmp_path):
    """The held-out evaluations the Trainer recorded in training_run.json (no TensorBoard events
    here): the AUC chart with the kept checkpoint ringed; the health table in words."""
    from pipelines.run_report import holdout_evaluations, write_run_report

    out = tmp_path / "run"
    model = out / "pipeline_root" / "Trainer" / "model" / "4"
    model.mkdir(parents=True)
    selection = {"evaluations": [{"step": s, "auc": a, "log_loss": 0.5, "examples": 9}
                                 for s, a in ((100, 0.70), (200, 0.71), (300, 0.705))],
                 "best_step": 200, "best_auc": 0.71, "stopped_at": 300, "note": None}
    (model / "training_run.json").write_text(json.dumps({"final_step": 300, "selection": selection}))
    summary = dict(PUSHED, feature_warnings={"I1": _warnings()["I1"]}, artifacts={"Trainer.model": str(model)})
    page = open(write_run_report(summary, str(out), str(out / "r.html"))).read()
    parsed = _Sections()
    parsed.feed(page)
    assert parsed.svgs == 1 and "held-out AUC (model: step 200, 0.7100)" in page
    assert '<circle cx="' in page and "training stopped early at step 300" in page
    assert "1,001 rows missing (10.0%)" in page and "{&#x27;missing" not in page
    assert holdout_evaluations({"final_step": 5, "selection": None})["note"].startswith("training.early_stopping is off")
    assert holdout_evaluations(None) is None


def test_the_continuous_spans_report_wraps_like_the_summary():
    """`python -m pipelines continuous`'s rows wrap at SUMMARY_WIDTH (summary.wrap_rows), a span's
    long AUC reason included; the --json data is the summaries as they are."""
    import pipelines.__main__ as cli

    why = "undefined: the 1,234,567-row eval split holds only label 0 (every click of the day was dropped)"
    spans = [dict(PUSHED, span=1, eval_auc=0.8, baseline_auc=0.75, validation={"blessed": True},
                  continuous={"warm_start": {"rows_carried": 1_234_567, "rows": 2_345_678}}),
             dict(REFUSED, span=2, eval_auc=None, eval_auc_undefined=why, validation={"blessed": False})]
    report = cli.spans_report(spans, [0, 3])
    lines = render(report).splitlines()
    assert max(len(line) for line in lines) <= summary_lib.SUMMARY_WIDTH, lines
    text = _unwrapped(render(report))
    assert ("span 1:               warm start 1,234,567/2,345,678 rows; model AUC 0.8000, baseline 0.7500; "
            "blessed, pushed") in text
    assert f"span 2:               warm start from scratch; model AUC {why}; not blessed, not pushed" in text
    assert report.data == {"spans": spans, "exit_statuses": [0, 3]}
