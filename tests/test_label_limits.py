"""The label column held to `input.max_invalid_share` (components/example_gen/label_limits.py): a
label column gone wrong stops the run at ExampleGen in one line, before training; a few bad labels
are counted and trained past, and the summary names them by reason."""
import pytest

from components.example_gen.label_limits import check_labels
from components.reporting.errors import InputError
from pipelines import summary as summary_lib
from components.reporting.report import render
from tests.stages import example_gen_config, run_example_gen

HEADER = "label,I1,I2,C1,C2\n"


def _csv(d, labels):
    d.mkdir()
    (d / "day.csv").write_text(HEADER + "".join(f"{y},{i},{i * 0.5},a{i % 5},b{i % 3}\n" for i, y in enumerate(labels)))


def _one_line(e):
    text = str(e.value)
    assert len(text.splitlines()) == 1, text
    return text


def test_labels_mostly_not_0_or_1_stop_example_gen_naming_the_column_and_the_limit(tmp_path):
    """95% of labels `yes`: trained on the rest and pushed before, with "(dropped: none)"."""
    _csv(tmp_path / "in", ["yes"] * 95 + ["1", "0"] * 2 + [""])
    with pytest.raises(InputError) as e:
        run_example_gen(example_gen_config(), tmp_path / "in", tmp_path / "out")
    line = _one_line(e)
    assert "96.0% of the 100 rows parsed have no usable label in the label column 'label'" in line, line
    assert "invalid_label 95, missing_label 1" in line.replace("missing_label 1, invalid_label 95",
                                                                "invalid_label 95, missing_label 1")
    assert "above input.max_invalid_share 0.5" in line and "train on the 4 rows left" in line
    assert (tmp_path / "out" / "ledger.json").exists()  # the counts stay readable


def test_no_usable_label_at_all_is_refused_whatever_the_limit(tmp_path):
    _csv(tmp_path / "in", ["yes"] * 30)
    cfg = example_gen_config(input={"path": "unused.csv", "allow_invalid": ["label"]})
    with pytest.raises(InputError) as e:
        run_example_gen(cfg, tmp_path / "in", tmp_path / "out")
    assert "no row of the 30 parsed has a usable label (invalid_label 30)" in _one_line(e)


def test_a_few_bad_labels_are_counted_and_trained_past_and_a_raised_limit_or_exemption_lets_more_pass(tmp_path):
    """One ExampleGen run, 60% of labels bad under a raised limit: the config's limit reaches
    ExampleGen's check, and the bad rows are counted and trained past. On that run's ledger stage
    the default limit refuses and the label column in `allow_invalid` passes (the same check, the
    same config section). Bad labels under the default limit pass through ExampleGen in
    tests/test_example_gen.py (test_csv_every_case_counted_and_typed: 5 of 10 rows, at the limit)."""
    _csv(tmp_path / "in", ["yes"] * 60 + ["1", "0"] * 20)
    raised = example_gen_config(input={"path": "unused.csv", "max_invalid_share": 0.7})
    led, records, err = run_example_gen(raised, tmp_path / "in", tmp_path / "out")
    stage = led["stages"][0]
    assert err is None and len(records) == 40 and stage["dropped"]["invalid_label"] == 60
    with pytest.raises(InputError, match="60.0% of the 100 rows parsed"):
        check_labels(example_gen_config(), stage)
    check_labels(example_gen_config(input={"path": "unused.csv", "allow_invalid": ["label"]}), stage)


def test_the_summary_names_labels_dropped_before_the_split():
    s = {"rows_read": {"eval": 20, "train": 70}, "rows_dropped": {"train": {}, "eval": {}},
         "rows_dropped_before_split": {"invalid_label": 10, "missing_label": 0}}
    text = render(summary_lib.summary_report(s))
    assert "rows read:            eval 20, train 70 (dropped: none; before the split: invalid_label 10)" in text
