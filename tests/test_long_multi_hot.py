"""A long multi-hot (text-like) feature through the whole pipeline on tiny data: the statistics
choose its table's combiner (a bag) and the wide part beside it, the plan records why, and the
model trains, exports with parity and is pushed. With the bad input the issue named: one row whose
text holds thousands of words; and a column empty in every row, refused by the feature-health check
unless allowed (then it trains as a feature with no IDs). One run of the module holds both."""
import csv
import json
import glob
import random

import pytest
import yaml

from tests.stages import NO_GATE

ROWS = 400
WORDS = [f"w{i}" for i in range(300)]
GOOD = set(WORDS[:20])


def _write(path, huge_rows=(7,), huge_words=3000):
    rng = random.Random(3)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["review text", "genre", "label"])
        for i in range(ROWS):
            n = huge_words if i in huge_rows else rng.randrange(8, 25)
            words = [rng.choice(WORDS) for _ in range(n)]
            p = 0.15 + 0.7 * min(1.0, sum(t in GOOD for t in words) / 3)
            w.writerow([" ".join(words), "|".join(rng.sample("abc", rng.randrange(1, 3))), int(rng.random() < p)])


def _config(data):
    return {
        "name": "long-multi-hot",
        "input": {"path": str(data), "format": "csv"},
        "label": "label",
        "categorical_features": [{"name": "review", "column": "review text", "separator": " "},
                                 {"name": "genre", "separator": "|"}],
        "categorical_defaults": {"dim": 4},
        "training": {"batch_size": 32, "train_steps": 6, "checkpoint_every_steps": 3, "eval_steps": 2,
                     "bottom_mlp": [8], "top_mlp": [8], "early_stopping": {"enabled": False}},
        "export": {"compare_compression": False, "auc_sample_size": 100, "parity_sample_size": 64},
        "validation": dict(NO_GATE),
        "beam": {"direct_running_mode": "in_memory", "direct_num_workers": 1},
    }


def _write_with_empty_column(path):
    """The reviews with a `notes` column empty in every row. The split hashes every configured
    column, `notes` too: the huge row is row 13 here, which lands in the train split (row 7, the
    row of the reviews alone, lands in eval once `notes` is configured)."""
    import pandas as pd

    _write(path, huge_rows=(13,))
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    df["notes"] = ""
    df.to_csv(path, index=False)


def _config_with_notes(data, allowed):
    raw = _config(data)
    raw["categorical_features"].append({"name": "notes"})
    if allowed:
        raw["input"]["allow_invalid"] = ["notes"]
    return raw


@pytest.fixture(scope="module")
def long_run(tmp_path_factory):
    """One local pipeline run on the reviews (the 3,000-word row among them) with an empty `notes`
    column listed under input.allow_invalid: (summary, output dir, data file)."""
    from components.config.loading import load_config
    from pipelines.runner import run

    root = tmp_path_factory.mktemp("long")
    data = root / "reviews.csv"
    _write_with_empty_column(data)
    cfg_path = root / "long.yaml"
    cfg_path.write_text(yaml.safe_dump(_config_with_notes(data, allowed=True)), encoding="utf-8")
    return run(load_config(str(cfg_path)), str(root / "out")).summary, root / "out", data


@pytest.mark.slow(reason="runs the local pipeline on 400 rows (the module's run)")
def test_a_long_multi_hot_feature_gets_a_bag_and_the_wide_part_end_to_end(long_run):
    from components.contracts import artifacts
    from components.planning.derivation import LONG_MULTI_HOT_IDS
    from components.config.training_schema import WIDE_SUFFIX
    from pipelines.summary import EXIT_PUSHED, exit_status

    summary, out, _ = long_run
    assert exit_status(summary) == EXIT_PUSHED, summary
    assert summary["export_parity"]["passed"]
    assert summary["rows_read"]["train"] + summary["rows_read"]["eval"] == ROWS  # the 3,000-word row too

    [plan_file] = glob.glob(str(out / "pipeline_root" / "Trainer" / "model" / "*" / "**" / artifacts.PLAN_FILE),
                            recursive=True)
    plan = json.load(open(plan_file, encoding="utf-8"))
    review, genre = plan["tables"]["review"], plan["tables"]["genre"]
    assert review["combiner"] == "sum" and review["combiner_source"].startswith("statistics: review has")
    assert genre["combiner"] == "mean" and genre["combiner_source"].startswith("default")  # about 1.5 genres a row
    assert set(plan["tables"]) == {"review", "genre", "notes", "review" + WIDE_SUFFIX}  # notes: test below
    assert plan["wide_part"]["features"] == ["review"] and str(LONG_MULTI_HOT_IDS)[:1] in plan["wide_part"]["source"]
    assert plan["features"]["review"]["ids_per_example"]["max"] >= 3000 * 0.9  # the huge row was counted, not cut


@pytest.mark.slow(reason="runs the local pipeline on 400 rows until preprocessing refuses a column (and the module's run)")
def test_a_column_whose_every_row_is_empty_is_refused_naming_it_or_allowed(long_run, tmp_path):
    """Refused by the feature-health check, naming the feature, its share and the fix; listed under
    input.allow_invalid (the module's run), it trains as a feature with no IDs (every row pools to
    zeros) and exports."""
    from components.config.loading import load_config
    from components.reporting.errors import FeatureHealthError
    from pipelines.runner import run
    from pipelines.summary import EXIT_PUSHED, exit_status

    summary, _, data = long_run
    cfg_path = tmp_path / "empty.yaml"
    cfg_path.write_text(yaml.safe_dump(_config_with_notes(data, allowed=False)), encoding="utf-8")
    with pytest.raises(FeatureHealthError, match=r"notes \(categorical\): 100.0% of \d+ train rows unusable.*input.allow_invalid"):
        run(load_config(str(cfg_path)), str(tmp_path / "out"))
    assert exit_status(summary) == EXIT_PUSHED and summary["export_parity"]["passed"], summary
    notes = summary["feature_warnings"]["notes"]  # allowed: reported, not refused
    assert notes["status"] == "allowed" and notes["share"] == 1.0, notes
