"""Faults and hostile input on the data side (issue 63): a full disk fails a stage in one line
instead of hanging it; a row of a million fields is counted, not handed to pyarrow (whose reader
crashes on it); compressed bytes behind a plain name and input without a data row are refused
before any work, in one line naming the file and what to change.

The faults around a run are in test_faults_run.py.
"""
import errno
import gzip
import io
import json
import os
import queue
import re
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from components.config.schema import ConfigError
from components.reporting.errors import InputError, one_line
from tests.stages import example_gen_config, run_example_gen

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = b"label,I1,I2,C1,C2\n"
ROW = b"1,1,2,a,b\n"


# ---- a full disk (ENOSPC), a quota or a file-size limit (EFBIG) ----


class _FullDisk(io.TextIOBase):
    """A stderr on a full disk: every write fails with ENOSPC."""

    def write(self, s):
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_failed_bundle_is_reported_even_when_stderr_is_on_a_full_disk(monkeypatch):
    """Beam's SDK harness prints a failed bundle's traceback to stderr before it sends the failure
    to the runner; on a full disk the print raised and the runner waited forever (the hang)."""
    from apache_beam.portability.api import beam_fn_api_pb2
    from apache_beam.runners.worker import sdk_worker
    from components.data_io import beam_runtime

    beam_runtime.report_bundle_failures()
    harness = object.__new__(sdk_worker.SdkHarness)  # no channels: only what _execute touches
    harness._responses = queue.Queue()

    def bundle():
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sys, "stderr", _FullDisk())
    request = beam_fn_api_pb2.InstructionRequest(instruction_id="bundle_1")
    harness._execute(bundle, request)
    response = harness._responses.get_nowait()
    assert response.instruction_id == "bundle_1" and "[Errno 28] No space left on device" in response.error


def test_the_workers_import_the_plugin_that_reports_their_failures():
    from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions
    from components.data_io import beam_runtime

    options = PipelineOptions(["--runner=DirectRunner", "--beam_plugins=other.plugin"])
    beam_runtime.add_worker_plugin(options)
    beam_runtime.add_worker_plugin(options)  # once only
    assert options.view_as(SetupOptions).beam_plugins == ["other.plugin", beam_runtime.WORKER_PLUGIN]
    __import__(beam_runtime.WORKER_PLUGIN)  # importable, as the worker imports it


@pytest.mark.parametrize("text, code, words", [
    # what the runner raises for a failed worker: its traceback as text
    ("Traceback (most recent call last):\n  File ...\nOSError: [Errno 28] No space left on device "
     "[while running 'WriteExamples/ReadAndWrite']", errno.ENOSPC, "the disk is full"),
    ("Traceback (most recent call last):\nOSError: [Errno 27] File too large", errno.EFBIG, "ulimit -f"),
    ("IOError: Error writing bytes to file. Detail: [errno 122] Disk quota exceeded", errno.EDQUOT, "quota"),
])
def test_a_write_that_ran_out_of_space_becomes_one_line_naming_the_stage_and_the_path(tmp_path, text, code, words):
    from components.data_io.out_of_space import OutOfSpaceError, out_of_space_named

    with pytest.raises(OutOfSpaceError) as e:
        with out_of_space_named("EmbeddingPreprocess", str(tmp_path / "out")):
            raise RuntimeError(text)
    line = one_line(e.value)
    assert e.value.errno == code and "\n" not in line
    assert line.startswith(f"OutOfSpaceError: EmbeddingPreprocess: {os.strerror(code).lower()} (errno {code}) "
                           f"while writing under {tmp_path / 'out'}: ")
    assert words in line and line.endswith("then rerun (nothing of this attempt is kept or reused)")
    with pytest.raises(RuntimeError, match="Errno 13"):  # another failure passes unchanged
        with out_of_space_named("EmbeddingPreprocess", str(tmp_path)):
            raise RuntimeError("PermissionError: [Errno 13] Permission denied")


def _run_pipeline(cfg, out, preexec_fn=None):
    """`python -m pipelines run`: its result. A hang fails the test by the timeout (TimeoutExpired)."""
    env = dict(os.environ, PYTHONPATH=REPO, TF_USE_LEGACY_KERAS="1", PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "pipelines", "run", "--config", str(cfg), "--output-dir", str(out)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300, preexec_fn=preexec_fn)


class _SmallDisk:
    """A disk of `size` that fills up: a tmpfs mounted on `path` where this process may mount one
    (root with CAP_SYS_ADMIN: the full disk itself, ENOSPC, with the run's log on it too, which is
    what hung Beam's workers), else a file-size limit on the run (RLIMIT_FSIZE, with SIGXFSZ
    ignored as Python does: a write past it fails with EFBIG, as one on a full disk does with
    ENOSPC). `grow()` gives it room again."""

    def __init__(self, path, size):
        self.path, self.size, self.limit = path, size, size
        os.makedirs(path)
        self.mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                                      capture_output=True).returncode == 0

    def preexec(self):
        import resource
        import signal

        if not self.mounted:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (self.limit, self.limit))

    def grow(self):
        import resource

        if self.mounted:
            subprocess.run(["mount", "-o", "remount,size=512m", str(self.path)], check=True)
        self.limit = resource.RLIM_INFINITY

    def close(self):
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], check=False)


@pytest.mark.slow(reason="runs the local pipeline (multi_processing workers) until ExampleGen fills the disk, then again")
def test_a_full_disk_in_example_gen_fails_the_run_in_one_line_and_a_rerun_recovers(tmp_path):
    from components.example_gen.synthetic_data import GeneratorSpec, ensure_dataset
    from tests.stages import NO_GATE, with_few_features

    data = tmp_path / "data.csv"
    ensure_dataset(str(data), GeneratorSpec(rows=20000, seed=5))  # a train split of ~2.4 MB of Parquet
    raw = yaml.safe_load(open(os.path.join(REPO, "configs", "demo.yaml"), encoding="utf-8"))
    with_few_features(raw)  # the disk and the run's recovery are under test, not the model
    raw["input"]["path"] = str(data)
    raw["beam"].update(direct_running_mode="multi_processing", direct_num_workers=1)  # a worker process fills the disk
    raw["training"].update(train_steps=10, checkpoint_every_steps=5, early_stopping={"enabled": False})
    raw["export"].update(auc_sample_size=200, parity_sample_size=32, compare_compression=False)
    raw["validation"] = dict(NO_GATE)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(raw), encoding="utf-8")
    # 1 MB: above ML Metadata's file and the log, below ExampleGen's train split
    disk = _SmallDisk(tmp_path / "disk", 1 << 20)
    out = disk.path / "out"
    try:
        r = _run_pipeline(cfg, out, disk.preexec)
        assert r.returncode == 1, r.stderr[-3000:]
        errors = [line for line in (r.stdout + r.stderr).splitlines() if line.startswith("error:")]
        assert len(errors) == 1, (r.stdout[-3000:], r.stderr[-3000:])
        cause = "no space left on device (errno 28)" if disk.mounted else "file too large (errno 27)"
        assert errors[0].startswith(f"error: EmbeddingExampleGen failed: OutOfSpaceError: EmbeddingExampleGen: "
                                    f"{cause} while writing under "
                                    f"{out / 'pipeline_root' / 'EmbeddingExampleGen' / 'examples'}"), errors[0]
        assert "Traceback" not in r.stdout + r.stderr
        assert not os.path.exists(out / "serving")
        # nothing of the failed attempt is left for a later run to take (TFX removed its output)
        left = [os.path.join(d, f) for d, _, fs in os.walk(out / "pipeline_root" / "EmbeddingExampleGen" / "examples")
                for f in fs]
        assert left == []
        disk.grow()  # space again: the same command runs through and pushes (in this process: the
        # disk, not a fresh process, is what the rerun needs; a process's exit is the first run's)
        from pipelines.__main__ import main

        assert main(["run", "--config", str(cfg), "--output-dir", str(out)]) == 0
        summary = json.load(open(out / "summary.json", encoding="utf-8"))
        assert summary["pushed_by_this_run"] and summary["ledger"]["balanced"]
        assert sum(summary["rows_read"].values()) == 20000
    finally:
        disk.close()


# ---- one row of a million fields ----


WIDE = HEADER + ROW + b"0,1,2,a,b" + b",x" * 1_000_000 + b"\n" + b'1,"3\n",4,c,d\n' + ROW


@pytest.mark.parametrize("name", ["wide.csv", "wide.csv.gz"])
def test_a_row_of_a_million_fields_is_counted_as_too_many_fields_not_parsed(tmp_path, name):
    """pyarrow's CSV reader crashed the worker (SIGSEGV) on a record of ~327k fields or more."""
    from components.example_gen import csv_records, ranges
    from components.example_gen.header import read_csv_header

    path = tmp_path / name
    path.write_bytes(gzip.compress(WIDE) if name.endswith(".gz") else WIDE)
    rs = ranges.plan_ranges([(str(path), path.stat().st_size)], 1 << 20)  # a plain file: 2 ranges
    before = ranges.before_each_range([ranges.count_quotes(r) for r in rs])
    malformed = csv_records.MalformedRows(5)
    batches = [b for r in rs for b in csv_records.read_csv_range(r, read_csv_header(str(path)), before, malformed)]
    assert sum(b.num_rows for b in batches) == 3
    assert malformed.counts == {"too_many_fields": 1}
    assert malformed.examples == {"malformed/too_many_fields": [f"{path}:3 (1,000,005 fields, header has 5)"]}
    assert [v for b in batches for v in b.column("I1").to_pylist()] == [b"1", b"3\n", b"1"]


@pytest.mark.parametrize("name", ["long.csv", "long.csv.gz"])
def test_a_record_longer_than_a_block_is_counted_as_too_long_not_parsed(tmp_path, name, monkeypatch):
    """A 50 MB cell failed the run (pyarrow: a record straddles two block boundaries); shown here
    at 1/16 of the sizes, blocks of 1 MiB and a 2 MiB quoted cell."""
    from components.example_gen import csv_records, ranges
    from components.example_gen.header import read_csv_header

    monkeypatch.setattr(csv_records, "READ_BLOCK_BYTES", 1 << 20)
    monkeypatch.setattr(csv_records, "MAX_RECORD_BYTES", 256 << 10)
    data = HEADER + ROW + b'0,2,3,"' + b"free text, " * ((2 << 20) // 11) + b'",b\n' + ROW
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    rs = ranges.plan_ranges([(str(path), path.stat().st_size)], 8 << 20)
    before = ranges.before_each_range([ranges.count_quotes(r) for r in rs])
    malformed = csv_records.MalformedRows(5)
    batches = [b for r in rs for b in csv_records.read_csv_range(r, read_csv_header(str(path)), before, malformed)]
    assert sum(b.num_rows for b in batches) == 2 and malformed.counts == {"record_too_long": 1}
    assert malformed.examples == {"malformed/record_too_long": [f"{path}:3 (2.0 MiB, more than 0.25 MiB)"]}


def test_only_records_wider_than_the_header_are_cut_found_across_quoted_line_breaks(monkeypatch):
    from components.example_gen import csv_records

    monkeypatch.setattr(csv_records, "WIDE_WINDOW", 8)  # records over 16 bytes are looked at
    long_text = b'1,"' + b"a\n" * 20 + b'",x\n'  # 47 bytes, 3 fields: kept
    wide_quoted = b"0" + b',"\n"' * 10 + b",z\n"  # 12 fields, a quoted line break in 10 of them
    wide = b"1" + b",y" * 12 + b"\n"  # 13 fields
    data = b"a,b,c\n" + long_text + wide_quoted + wide + b"2,b,c"
    kept, cuts = csv_records.blank_wide_records(data, 3)
    assert cuts == [(6 + len(long_text), "too_many_fields", "12 fields, header has 3"),
                    (6 + len(long_text) + len(wide_quoted), "too_many_fields", "13 fields, header has 3")]
    assert kept == b"a,b,c\n" + long_text + b"\n" * wide_quoted.count(b"\n") + b"\n" + b"2,b,c"


# ---- compressed bytes behind a plain name ----


COMPRESSED = {
    "gzip": gzip.compress(HEADER + ROW),
    "bzip2": b"BZh91AY&SY" + b"\0" * 20,
    "zstd": b"\x28\xb5\x2f\xfd" + b"\0" * 20,
    "zip": b"PK\x03\x04" + b"\0" * 20,
}


@pytest.mark.parametrize("kind", sorted(COMPRESSED))
def test_compressed_bytes_behind_a_plain_csv_name_are_refused_naming_the_file(tmp_path, kind):
    """Read as text, a gzip file named .csv failed with "line contains NUL", naming no file."""
    d = tmp_path / "in"
    d.mkdir()
    (d / "data.csv").write_bytes(COMPRESSED[kind])
    with pytest.raises(InputError) as e:
        run_example_gen(example_gen_config(input={"path": str(d)}), d, tmp_path / "out")
    line = one_line(e.value)
    assert line.startswith(f"{d / 'data.csv'}: holds {kind}-compressed bytes"), line
    assert ("unzip it" if kind == "zip" else "decompress it, or rename it to data.csv.") in line
    assert not os.path.exists(tmp_path / "out" / "ledger.json")


def test_many_files_are_peeked_at_together_and_the_first_refusal_in_order_is_raised(tmp_path, monkeypatch):
    """A remote store answers each read in tens of milliseconds: the compression check reads the
    files' first bytes several at a time, and still names the first offending file in order."""
    import threading
    import time

    from components.example_gen import input_checks

    files = []
    for i in range(64):
        path = tmp_path / f"part-{i:03d}.csv"
        path.write_bytes(COMPRESSED["gzip"] if i in (37, 50) else HEADER + ROW)
        files.append((str(path), path.stat().st_size))
    read, in_flight, most = input_checks._head, [0], [0]
    lock = threading.Lock()

    def slow_head(path, n):  # a store's latency, and how many reads wait at once
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        time.sleep(0.01)
        with lock:
            in_flight[0] -= 1
        return read(path, n)

    monkeypatch.setattr(input_checks, "_head", slow_head)
    with pytest.raises(InputError, match=r"part-037\.csv: holds gzip-compressed bytes"):
        input_checks.check_files(example_gen_config(input={"path": str(tmp_path)}), files)
    assert most[0] > 1, most  # several reads were waiting together
    input_checks.check_files(example_gen_config(input={"path": str(tmp_path)}), files[:37])


def test_a_range_size_that_cuts_the_input_into_too_many_ranges_is_refused_before_reading(tmp_path, capsys):
    """`input.range_mb: 1e-9` (a range a byte) hung the run while ExampleGen planned its ranges:
    refused in one line before the pipeline starts, naming the field and the size that works; the
    default and a small range on a small file pass, and Parquet (cut by row groups) is not held to it."""
    from components.example_gen import input_checks
    from components.reporting.errors import InputError
    from tests.stages import example_gen_config

    path = tmp_path / "a.csv"
    path.write_bytes(HEADER + ROW * 20_000)
    files = [(str(path), path.stat().st_size)]
    with pytest.raises(InputError) as e:
        input_checks.check_files(example_gen_config(input={"path": str(path), "range_mb": 1e-9}), files)
    message = str(e.value)
    assert len(message.splitlines()) == 1 and message.startswith("input.range_mb 1e-09 cuts the input's")
    assert f"{files[0][1]:,} byte ranges, more than 100,000: raise input.range_mb" in message
    for range_mb in (64.0, 4096 / (1 << 20)):
        input_checks.check_files(example_gen_config(input={"path": str(path), "range_mb": range_mb}), files)
    input_checks.check_range_count(example_gen_config(input={"path": str(path), "format": "parquet", "range_mb": 1e-9}),
                                   files)
    # the pipeline's own check before any stage: exit 2, one line, nothing run
    from pipelines.__main__ import main

    raw = yaml.safe_load(open(os.path.join(REPO, "configs", "demo.yaml"), encoding="utf-8"))
    raw["input"].update(path=str(path), range_mb=1e-9)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(raw), encoding="utf-8")
    status = main(["run", "--config", str(cfg), "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "input.range_mb 1e-09 cuts the input's" in err[0], err
    assert not (tmp_path / "out" / "pipeline_root").exists()


def test_compressed_names_are_read_and_checked_against_their_bytes(tmp_path):
    from components.example_gen.input_checks import check_compression

    good = tmp_path / "a.csv.gz"
    good.write_bytes(gzip.compress(HEADER + ROW))
    check_compression(str(good), "csv")
    liar = tmp_path / "b.csv.gz"
    liar.write_bytes(HEADER + ROW)
    with pytest.raises(InputError, match=r"b\.csv\.gz: its name says gzip, but its bytes are not compressed"):
        check_compression(str(liar), "csv")
    tfrecord = tmp_path / "c.tfrecord"  # gzipped TFRecord is read whatever its name
    tfrecord.write_bytes(gzip.compress(b""))
    check_compression(str(tfrecord), "tfrecord")
    parquet = tmp_path / "d.parquet"
    parquet.write_bytes(COMPRESSED["gzip"])
    with pytest.raises(InputError, match="decompress it"):
        check_compression(str(parquet), "parquet")


# ---- input without a data row ----


def _parquet(path, table):
    pq.write_table(table, str(path))


NO_ROWS = {
    "a header only": ("csv", {"a.csv": HEADER}),
    "0 bytes": ("csv", {"a.csv": b"", "b.csv": b""}),
    "blank lines only": ("csv", {"a.csv": b"\r\n\n"}),
    "no columns": ("parquet", {"a.parquet": pa.table({})}),
    "0 rows": ("parquet", {"a.parquet": pa.table({c: pa.array([], pa.string()) for c in ("label", "I1", "I2", "C1", "C2")})}),
    "0 bytes (tfrecord)": ("tfrecord", {"a.tfrecord": b""}),
}


def _write(d, files):
    d.mkdir()
    for name, content in files.items():
        _parquet(d / name, content) if isinstance(content, pa.Table) else (d / name).write_bytes(content)


@pytest.mark.parametrize("case", sorted(NO_ROWS))
def test_input_without_a_data_row_is_refused_before_any_work(tmp_path, case):
    """Such input passed ExampleGen as 0 rows, then preprocessing failed with a traceback
    (`RuntimeError: Traceback ...`; `IndexError` for Parquet without columns)."""
    from components.example_gen.input_checks import check_input

    fmt, files = NO_ROWS[case]
    d = tmp_path / "in"
    _write(d, files)
    cfg = example_gen_config(input={"path": str(d), "format": fmt})
    why = case.split(" (")[0]
    with pytest.raises(InputError) as e:  # ExampleGen's executor (a Kubeflow run)
        run_example_gen(cfg, d, tmp_path / "out")
    line = one_line(e.value)
    assert line.startswith(f"input.path {d}") and "no data rows" in line and why in line, line
    assert line.endswith("then rerun")
    assert not os.path.exists(tmp_path / "out" / "ledger.json")
    with pytest.raises(ConfigError, match=f"input.path {re.escape(str(d))}.*no data rows.*{why}"):  # before a pipeline starts
        check_input(cfg)


def test_a_file_without_rows_beside_one_with_rows_is_only_counted(tmp_path):
    from components.example_gen.input_checks import check_input

    d = tmp_path / "in"
    _write(d, {"a.csv": b"", "b.csv": HEADER, "c.csv": HEADER + ROW})
    check_input(example_gen_config(input={"path": str(d)}))
    one = tmp_path / "one.csv"
    one.write_bytes(HEADER + b"\n" * 3 + ROW.rstrip(b"\n"))  # blank lines, then a row without a newline
    check_input(example_gen_config(input={"path": str(one)}))


def test_the_preprocessing_cli_refuses_compressed_bytes_behind_a_plain_name(tmp_path, capsys):
    from components.embedding_preprocess.__main__ import main

    data = tmp_path / "train.csv"
    data.write_bytes(COMPRESSED["gzip"])
    status = main(["--config", os.path.join(REPO, "configs", "minimal.yaml"), "--input", str(data),
                   "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith(f"error: {data}: holds gzip-compressed bytes"), err


# ---- what an input folder holds besides the data ----


def test_a_fifo_among_the_input_files_is_refused_in_one_line_not_waited_on(tmp_path):
    """A FIFO named `x.csv` in the input folder hung the run (its first bytes were peeked at)."""
    import signal

    from components.example_gen.input_checks import check_input

    d = tmp_path / "in"
    d.mkdir()
    (d / "a.csv").write_bytes(HEADER + ROW * 5)
    os.mkfifo(d / "x.csv")
    cfg = example_gen_config(input={"path": str(d)})
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the FIFO was opened: the run waits for a writer"))
    signal.alarm(30)
    try:
        with pytest.raises(InputError) as e:
            run_example_gen(cfg, d, tmp_path / "out", pattern="*.csv")
        with pytest.raises(ConfigError, match=re.escape(f"input file {d / 'x.csv'} is a FIFO (named pipe)")):
            check_input(cfg)  # the command line's check, before a pipeline starts
    finally:
        signal.alarm(0)
    assert one_line(e.value).startswith(f"input file {d / 'x.csv'} is a FIFO (named pipe), not a regular file")


def test_hidden_files_are_skipped_and_whatever_the_pattern_leaves_out_is_listed(tmp_path):
    """A macOS `._a.csv` was read and failed the run without naming the file; `.CSV`, `.csv.gz`
    and subfolders were skipped without a word."""
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.csv").write_bytes(HEADER + ROW * 5)
    (d / "._a.csv").write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        ")  # AppleDouble
    (d / "b.CSV").write_bytes(HEADER + ROW)
    (d / "c.csv.gz").write_bytes(gzip.compress(HEADER + ROW))
    (d / "sub").mkdir()
    (d / "sub" / "d.csv").write_bytes(HEADER + ROW)
    led, records, err = run_example_gen(example_gen_config(input={"path": str(d)}), d, tmp_path / "out", pattern="*.csv")
    stage = led["stages"][0]
    assert err is None and len(records) == 5 and stage["files"] == [str(d / "a.csv")]
    assert {os.path.basename(e["path"]): e["reason"].split(" (")[0] for e in stage["files_skipped"]} == {
        "._a.csv": "hidden name", "b.CSV": "not *.csv", "c.csv.gz": "not *.csv", "sub": "a folder"}
    assert stage["files_skipped_count"] == 4
    # A hidden file named by input.path itself is read.
    led, records, err = run_example_gen(example_gen_config(input={"path": str(d / "_named.csv")}), d,
                                        tmp_path / "out-named", pattern="_named.csv") if (
        d / "_named.csv").write_bytes(HEADER + ROW) else (None, None, None)
    assert err is None and len(records) == 1


def test_the_summary_lists_what_the_input_folder_held_and_was_not_read():
    from pipelines import summary as summary_lib
    from components.reporting.report import render

    skipped = [{"path": "/d/._a.csv", "reason": "hidden name"}, {"path": "/d/sub", "reason": "a folder"}]
    text = render(summary_lib.summary_report({"input": {"span": 0, "files": 1, "skipped": skipped, "skipped_count": 3}}))
    assert "input not read:       ._a.csv (hidden name), sub (a folder), and 1 more" in text


def test_a_folder_holding_only_hidden_files_is_refused_saying_they_are_not_read(tmp_path):
    """A folder with a macOS `._data.csv` only was refused as matching no file, without a word of it."""
    from pipelines.pipeline import input_location

    d = tmp_path / "in"
    d.mkdir()
    (d / "._data.csv").write_bytes(HEADER + ROW)
    with pytest.raises(ConfigError, match=r"matches no file \(hidden files are not read: \._data\.csv\)"):
        input_location(example_gen_config(input={"path": str(d)}))
