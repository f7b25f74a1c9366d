"""What identifies a run's data (components/data_io/data_identity.py): the input ExampleGen read and the
config that makes rows of it, not the transformed examples' bytes, which vary with Beam's bundles.

- The same input files anywhere, read with any range size or worker count, are the same data;
  another row of the same size, another file name or another label rule are not; a table's dim or
  optimizer is the plan's to judge, not the data's.
- The Trainer's identity comes from ExampleGen's ledger stage; examples without one (a stock
  ExampleGen) fall back to the transformed files.
- A resume compares records of one rule only, and refuses other input in one line.
"""
import json

import pytest

from components.config.loading import parse_config
from components.contracts.plan import CheckpointLayout
from components.embedding_model import sparsecore_state
from components.data_io.checksums import block_digests, content_fingerprint, sampled_fingerprint
from components.data_io.data_identity import (FROM_EXAMPLES, FROM_INPUT, FROM_INPUT_BYTES, data_config, input_identity,
                                           training_data_identity)
from tests.stages import BASE, run_example_gen

LAYOUT_A = CheckpointLayout(kind="A", embedding_api="TPUEmbeddingForServing (CPU/GPU variables)")
CSV = "label,I1,I2,C1,C2\n" + "".join(f"{i % 2},{i},{i * 0.5},a{i % 5},b{i % 3}|c{i % 4}\n" for i in range(200))


def _cfg(**over):
    raw = json.loads(json.dumps(BASE))
    for key, value in over.items():
        raw[key] = dict(raw.get(key) or {}, **value) if isinstance(value, dict) else value
    return parse_config(raw)


def _identity(path):
    """As ExampleGen records it: every block of the file hashed."""
    blocks = [(str(path), k, h) for k, h in block_digests(str(path), 0, None)]
    return input_identity([(str(path), path.stat().st_size)], lambda p: open(p, "rb"), blocks)


def test_blocks_hashed_over_any_cut_give_one_fingerprint_and_see_every_byte(tmp_path):
    """The blocks are the file's, not the ranges': any cut into ranges hashes the same blocks; a
    range missing or read twice is refused; an edit between the sampled windows is seen."""
    path = tmp_path / "f.bin"
    data = bytes(range(256)) * 40  # 10,240 bytes, blocks of 1,024 in this test
    path.write_bytes(data)
    whole = content_fingerprint(len(data), block_digests(str(path), 0, None, block=1024), block=1024)
    for cuts in ([0, 10240], [0, 3000, 5001, 10240], [0, 1, 1024, 1025, 10239, 10240]):
        digests = [d for a, b in zip(cuts, cuts[1:]) for d in block_digests(str(path), a, b, block=1024)]
        assert content_fingerprint(len(data), digests, block=1024) == whole, cuts
    with pytest.raises(ValueError, match="were not hashed"):
        content_fingerprint(len(data), block_digests(str(path), 0, 5000, block=1024), block=1024)
    with pytest.raises(ValueError, match="hashed twice"):
        content_fingerprint(len(data), block_digests(str(path), 0, None, block=1024) * 2, block=1024)
    big = bytearray(bytes(range(256)) * 4096)  # 1 MiB: the sampled fingerprint reads half of it
    (tmp_path / "big.bin").write_bytes(big)
    big[70_000] ^= 1  # between the first two sampled windows
    (tmp_path / "edited.bin").write_bytes(big)
    a, b = tmp_path / "big.bin", tmp_path / "edited.bin"
    assert sampled_fingerprint(str(a), len(big)) == sampled_fingerprint(str(b), len(big))  # the sample misses it
    assert _identity(a)["fingerprint"] != _identity(b)["fingerprint"] and _identity(a)["rule"] == FROM_INPUT_BYTES


def _no_fallback():
    raise AssertionError("the transformed examples were read though ExampleGen recorded its input")


def test_the_same_file_anywhere_is_the_same_input_and_one_changed_byte_is_not(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "day.csv").write_text(CSV)
    (tmp_path / "b" / "day.csv").write_text(CSV)  # a copy elsewhere
    (tmp_path / "b" / "edited.csv").write_text(CSV.replace("a3,", "a4,", 1))  # one row, same size
    (tmp_path / "b" / "renamed.csv").write_text(CSV)
    first = _identity(tmp_path / "a" / "day.csv")
    assert first == _identity(tmp_path / "b" / "day.csv") and first["bytes"] == len(CSV)
    assert first["files"][0]["name"] == "day.csv"
    assert _identity(tmp_path / "b" / "edited.csv")["fingerprint"] != first["fingerprint"]
    assert _identity(tmp_path / "b" / "renamed.csv")["fingerprint"] != first["fingerprint"]


def test_the_data_config_holds_what_makes_rows_not_where_they_are_or_how_they_train():
    base = data_config(_cfg())
    same = [_cfg(input={"path": "elsewhere/x.csv", "range_mb": 1.0}), _cfg(beam={"direct_num_workers": 2}),
            _cfg(categorical_defaults={"dim": 8}), _cfg(name="another-name")]
    other = [_cfg(input={"path": "unused.csv", "max_invalid_share": 0.1}), _cfg(label_rule={"column": "I1", "value": 3}),
             _cfg(categorical_defaults={"vocabulary": {"min_frequency": 2}}),
             _cfg(dense_features=[{"name": "I1"}, {"name": "I2", "fill_value": 0.0}])]
    assert all(data_config(c) == base for c in same)
    assert all(data_config(c) != base for c in other)


def test_the_trainer_takes_the_input_from_the_ledger_and_falls_back_to_the_examples():
    cfg = _cfg()
    ledger = {"stages": [{"stage": "EmbeddingExampleGen", "input_identity": {
        "fingerprint": "f" * 32, "files": [{"name": "day.csv", "bytes": 10, "fingerprint": "x"}], "bytes": 10}},
        {"stage": "EmbeddingPreprocess"}]}
    found = training_data_identity(cfg, ledger, _no_fallback)
    assert (found["from"], found["examples"], found["files"], found["bytes"]) == (FROM_INPUT, "day.csv", 1, 10)
    # The same input under another label rule is other data; under another table dim it is not.
    assert training_data_identity(_cfg(label_rule={"column": "I1", "value": 3}), ledger, _no_fallback) != found
    assert training_data_identity(_cfg(categorical_defaults={"dim": 8}), ledger, _no_fallback) == found
    stock = training_data_identity(cfg, {"stages": [{"stage": "EmbeddingPreprocess"}]},
                                   lambda: {"fingerprint": "e" * 32, "examples": "/tx", "files": 2, "bytes": 5})
    assert stock["from"] == FROM_EXAMPLES and stock["fingerprint"] == "e" * 32


def test_a_resume_compares_one_rule_and_refuses_other_input_in_one_line(tmp_path):
    state, signature = str(tmp_path / "state"), {"tables": {"t": {"rows": 50}}}
    mine = {"fingerprint": "a" * 32, "examples": "day.csv", "files": 1, "bytes": 10, "from": FROM_INPUT}
    sparsecore_state.write_layout(state, LAYOUT_A, signature, mine)
    sparsecore_state.check_resumable(state, state + "/ckpt-4", LAYOUT_A, signature, dict(mine))
    # A record of the other rule says nothing about the input files: not compared.
    sparsecore_state.check_resumable(state, state + "/ckpt-4", LAYOUT_A, signature,
                                     dict(mine, fingerprint="b" * 32, **{"from": FROM_EXAMPLES}))
    with pytest.raises(sparsecore_state.DataMismatch) as e:
        sparsecore_state.check_resumable(state, state + "/ckpt-4", LAYOUT_A, signature,
                                         dict(mine, fingerprint="b" * 32, examples="other.csv"))
    assert len(str(e.value).splitlines()) == 1
    assert "input files day.csv" in str(e.value) and "input files other.csv" in str(e.value)


def test_example_gen_records_its_input_and_two_readings_of_one_file_are_one_data(tmp_path):
    """ExampleGen over one file in ranges of 2 KiB records what the file hashed in one piece gives
    (`_identity`: what a run reading it as one range records), and the range size is no part of the
    data. One run: a second one reading a single range costs a Beam pipeline to compare the same
    hashes (test_example_gen_hashes_every_block_across_its_ranges runs both, in test-all)."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "day.csv").write_text(CSV)
    one_cfg = _cfg()
    two_cfg = _cfg(input={"path": "unused.csv", "range_mb": 2048 / (1 << 20)})
    two, _, err = run_example_gen(two_cfg, tmp_path / "in", tmp_path / "out")
    assert err is None and two["stages"][0]["byte_ranges"] > 1
    assert two["stages"][0]["input_identity"] == _identity(tmp_path / "in" / "day.csv")
    found = training_data_identity(two_cfg, two, _no_fallback)
    assert found["from"] == FROM_INPUT_BYTES and training_data_identity(one_cfg, two, _no_fallback) == found
    assert not (tmp_path / "out" / "_input_blocks.json").exists()  # the workers' digests are not left behind



@pytest.mark.slow(reason="ExampleGen's executor three times (Beam in this process)")
def test_example_gen_hashes_every_block_across_its_ranges(tmp_path, monkeypatch):
    """Blocks of 1 KiB (4 MiB in a run) over the ranges of 2 KiB of a 3.9 KB file: the workers hash
    every block once, the same identity as one range, and one changed byte in the middle of the
    file is other data."""
    import functools

    from components.data_io import data_identity
    from components.example_gen import ranges

    monkeypatch.setattr(ranges, "BLOCK", 1024)  # what ExampleGen's ranges hash by
    monkeypatch.setattr(data_identity, "content_fingerprint", functools.partial(content_fingerprint, block=1024))
    for name, text in (("same", CSV), ("edited", CSV[:2000] + CSV[2000:].replace("a3,", "a4,", 1))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "day.csv").write_text(text)
    cut = _cfg(input={"path": "unused.csv", "range_mb": 2048 / (1 << 20)})
    found = {}
    for name, cfg in (("same", _cfg()), ("same", cut), ("edited", cut)):
        ledger, _, err = run_example_gen(cfg, tmp_path / name, tmp_path / f"out-{len(found)}")
        assert err is None
        found[len(found)] = training_data_identity(cfg, ledger, _no_fallback)
    assert found[0] == found[1] and found[1]["from"] == FROM_INPUT_BYTES
    assert found[0]["fingerprint"] != found[2]["fingerprint"]
