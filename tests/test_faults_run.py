"""Faults and hostile input around a run: the command line refuses, in one line and before any
work, what would overwrite a user's data, write outside the run, or hold the machine; and a run
reports only what its own executions did (a rerun whose data stages come from the cache is described
by those cached artifacts, not the newest on disk: test_continuous.py, on the daily spans' runs).

The data-side faults are in test_faults_data.py, the training- and export-side ones in
test_faults_training.py.
"""
import json
import os

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(tmp_path, data, **changes):
    raw = yaml.safe_load(open(os.path.join(REPO, "configs", "demo.yaml"), encoding="utf-8"))
    raw["input"]["path"] = str(data)
    raw.update(changes)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def _main(argv, capsys):
    from pipelines.__main__ import main

    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_demo_never_overwrites_a_users_file(tmp_path, capsys):
    data = tmp_path / "mine.csv"
    data.write_text("label,I1\n1,2\n0,3\n", encoding="utf-8")
    before = data.read_bytes()
    status, out, err = _main(["demo", "--config", _config(tmp_path, data), "--rows", 50,
                              "--output-dir", tmp_path / "out"], capsys)
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {data} is a file the data generator did not write")
    assert "use `run`" in lines[0]
    assert data.read_bytes() == before and not (tmp_path / "out").exists()
    assert not os.path.exists(f"{data}.meta.json")


def test_the_generator_replaces_only_what_it_wrote(tmp_path):
    from components.config.schema import ConfigError
    from components.example_gen.synthetic_data import GeneratorSpec, ensure_dataset

    data = str(tmp_path / "gen.csv")
    first = ensure_dataset(data, GeneratorSpec(rows=20, seed=1))
    assert first["bytes"] == os.path.getsize(data)
    assert ensure_dataset(data, GeneratorSpec(rows=30, seed=1))["rows"] == 30  # its own file, another spec
    with open(data, "a", encoding="utf-8") as fh:  # the user edited the generated file
        fh.write("1" + ",x" * 39 + "\n")
    edited = open(data, encoding="utf-8").read()
    with pytest.raises(ConfigError, match="the data generator did not write"):
        ensure_dataset(data, GeneratorSpec(rows=40, seed=1))
    assert open(data, encoding="utf-8").read() == edited
    os.makedirs(tmp_path / "a_dir")
    with pytest.raises(ConfigError, match="is a directory the data generator did not write"):
        ensure_dataset(str(tmp_path / "a_dir"), GeneratorSpec(rows=20, seed=1))


def test_the_generator_knows_its_files_by_content_and_writes_nothing_through_a_link(tmp_path):
    """An edit that keeps the file's size makes it the user's file (the size alone was trusted);
    a symlink planted at the generator's temporary name is replaced, not followed into the file it
    points at; a pattern is never a file to write (demo's `input.path: dir/*.csv` wrote a file
    named `*.csv` that later runs read as data)."""
    from components.config.schema import ConfigError
    from components.example_gen.synthetic_data import GeneratorSpec, ensure_dataset

    data = str(tmp_path / "gen.csv")
    ensure_dataset(data, GeneratorSpec(rows=20, seed=1))
    text = open(data, encoding="utf-8").read()
    same_size = text[:-2] + ("0" if text[-2] != "0" else "1") + text[-1]
    open(data, "w", encoding="utf-8").write(same_size)
    with pytest.raises(ConfigError, match="the data generator did not write"):
        ensure_dataset(data, GeneratorSpec(rows=40, seed=1))
    assert open(data, encoding="utf-8").read() == same_size

    victim = tmp_path / "users.csv"
    victim.write_text("mine\n", encoding="utf-8")
    fresh = str(tmp_path / "fresh.csv")
    os.symlink(victim, fresh + ".partial")
    os.symlink(victim, fresh + ".partial.meta")
    ensure_dataset(fresh, GeneratorSpec(rows=20, seed=2))
    assert victim.read_text(encoding="utf-8") == "mine\n"
    assert not os.path.islink(fresh) and sum(1 for _ in open(fresh, encoding="utf-8")) == 21

    for pattern in ("*.csv", "day-?.csv", "[ab].csv"):
        with pytest.raises(ConfigError, match=r"is a file pattern \(it holds"):
            ensure_dataset(str(tmp_path / pattern), GeneratorSpec(rows=20, seed=1))
        assert not os.path.lexists(tmp_path / pattern)


def test_demo_refuses_a_glob_as_its_target(tmp_path, capsys):
    folder = tmp_path / "data"
    folder.mkdir()
    status, out, err = _main(["demo", "--config", _config(tmp_path, folder / "*.csv"), "--rows", 50,
                              "--output-dir", tmp_path / "out"], capsys)
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {folder / '*.csv'} is a file pattern"), lines
    assert os.listdir(folder) == [] and not (tmp_path / "out").exists()


HOSTILE_NAMES = ["../../outside", "/tmp/abs", "a/b", "..", ".hidden", "a\\b", "x\0y", ""]


@pytest.mark.parametrize("where", ["name", "feature", "table"])
def test_a_name_that_could_leave_its_directory_is_refused_at_config_load(where):
    from components.config.loading import parse_config
    from components.config.schema import ConfigError

    demo = open(os.path.join(REPO, "configs", "demo.yaml"), encoding="utf-8").read()
    for hostile in HOSTILE_NAMES:
        raw = yaml.safe_load(demo)
        if where == "name":
            raw["name"] = hostile
        elif where == "feature":
            raw["categorical_features"][0]["name"] = hostile
        else:
            old = raw["tables"][0]["name"]
            raw["tables"][0]["name"] = hostile
            for f in raw["categorical_features"]:
                f["table"] = hostile if f.get("table") == old else f.get("table")
        with pytest.raises(ConfigError, match=r"name: (missing|.* not a valid)"):
            parse_config(raw, "c.yaml")


def test_every_file_named_after_a_table_stays_in_its_directory(tmp_path):
    """Every path built from a configured name goes through `artifacts.named_file`: a safe name stays
    directly inside the directory, and anything else is refused there, whoever calls it."""
    import random
    import re

    from components.contracts import artifacts
    from components.rules.names import SAFE_NAME

    rng = random.Random(7)
    alphabet = "abcXYZ_019"
    for _ in range(200):
        name = rng.choice("aZ_") + "".join(rng.choice(alphabet) for _ in range(rng.randrange(8)))
        assert SAFE_NAME.fullmatch(name)
        for build in (artifacts.vocabulary_file, artifacts.counts_file,
                      lambda d, n: artifacts.named_file(d, n, ".npy"), lambda d, n: artifacts.named_file(d, n, ".scale.npy")):
            path = build(str(tmp_path), name)
            assert os.path.dirname(os.path.realpath(path)) == os.path.realpath(tmp_path)
    for hostile in HOSTILE_NAMES:
        for build in (artifacts.vocabulary_file, artifacts.counts_file):
            with pytest.raises(ValueError, match="not a file name inside"):
                build(str(tmp_path), hostile)
    # and nothing in the product builds such a path by hand: `f"{<name>}.txt"`-like joins live in artifacts.py
    by_hand = re.compile(r"os\.path\.join\([^)]*f\"\{[a-z_.]*name\}\.")
    for root in ("components", "pipelines"):
        for dirpath, _, files in os.walk(os.path.join(REPO, root)):
            for f in files:
                if f.endswith(".py") and f != "artifacts.py":
                    text = open(os.path.join(dirpath, f), encoding="utf-8").read()
                    assert not by_hand.search(text), os.path.join(dirpath, f)


BILLION_LAUGHS = """name: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path, capsys):
    path = tmp_path / "bomb.yaml"
    path.write_text(BILLION_LAUGHS, encoding="utf-8")
    assert len(BILLION_LAUGHS) < 500
    status, out, err = _main(["run", "--config", path, "--output-dir", tmp_path / "out"], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "anchors and aliases expand to more than 100,000 values" in err and len(err) < 400
    assert not (tmp_path / "out").exists()


def test_a_self_referring_anchor_and_an_oversized_file_are_refused(tmp_path):
    from components.config.loading import MAX_CONFIG_BYTES, load_config
    from components.config.schema import ConfigError

    loop = tmp_path / "loop.yaml"
    loop.write_text("name: &a [1, *a]\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="an anchor refers to itself"):
        load_config(str(loop))
    big = tmp_path / "big.yaml"
    big.write_text("name: x\n" + "#" * MAX_CONFIG_BYTES + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="more than a configuration file may hold"):
        load_config(str(big))


def test_a_message_quotes_at_most_a_short_excerpt_of_a_value(tmp_path):
    from components.config.loading import load_config
    from components.config.schema import ConfigError

    raw = yaml.safe_load(open(os.path.join(REPO, "configs", "demo.yaml"), encoding="utf-8"))
    huge = "x" * 50_000
    for change in ({"label": ["a"] * 10_000}, {"name": huge}):
        cfg = _config(tmp_path, raw["input"]["path"], **change)
        with pytest.raises(ConfigError) as e:
            load_config(str(cfg))
        assert len(str(e.value)) < 600, str(e.value)[:300]
    raw["categorical_features"][0]["name"] = "x-" * 25_000
    (tmp_path / "feature.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        load_config(str(tmp_path / "feature.yaml"))
    assert len(str(e.value)) < 600 and "not a valid feature name" in str(e.value)


def _cfg_for_run(tmp_path):
    data = tmp_path / "data.csv"
    data.write_text("label,I1\n1,2\n", encoding="utf-8")
    return _config(tmp_path, data)


def test_an_output_dir_that_is_a_file_is_refused_in_one_line(tmp_path, capsys):
    cfg = _cfg_for_run(tmp_path)
    a_file = tmp_path / "taken"
    a_file.write_text("mine", encoding="utf-8")
    for out in (a_file, a_file / "below"):
        status, stdout, err = _main(["run", "--config", cfg, "--output-dir", out], capsys)
        assert status == 2 and err.strip().splitlines() == [
            f"error: --output-dir {out}: it, or a folder above it, is a file; name a directory (it is created when missing)"]
    assert a_file.read_text(encoding="utf-8") == "mine"


def test_an_output_dir_that_cannot_be_written_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    import errno

    cfg = _cfg_for_run(tmp_path)
    locked = tmp_path / "readonly"
    locked.mkdir()
    locked.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere: the refusal a user meets, from the kernel's answer to them
        real_open = os.open

        def refused(path, *args, **kwargs):
            if str(path).startswith(str(locked)):
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(os, "makedirs", lambda p, exist_ok=False: refused(p))
        monkeypatch.setattr(os, "open", refused)
    status, stdout, err = _main(["run", "--config", cfg, "--output-dir", locked / "out"], capsys)
    assert status == 2
    assert err.strip().splitlines() == [
        f"error: --output-dir {locked / 'out'}: cannot write there (not writable); choose a directory you can write to"]


def test_a_push_destination_that_is_a_file_or_not_writable_is_refused_before_the_run(tmp_path, capsys, monkeypatch):
    """Both were found only at the Pusher, after the whole run."""
    import errno

    cfg = _cfg_for_run(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "serving").write_text("not a folder", encoding="utf-8")
    status, stdout, err = _main(["run", "--config", cfg, "--output-dir", out], capsys)
    assert status == 2 and err.strip().splitlines() == [
        f"error: the push destination {out / 'serving'} is a file, not a folder; move it away (the run pushes its "
        "models there) or choose another --output-dir"]
    (out / "serving").unlink()
    (out / "serving").mkdir()
    real_open = os.open

    def read_only(path, *args, **kwargs):  # a read-only mount: what the kernel answers even root
        if str(path).startswith(str(out / "serving")):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    status, stdout, err = _main(["run", "--config", cfg, "--output-dir", out], capsys)
    assert status == 2 and err.strip().splitlines() == [
        f"error: the push destination {out / 'serving'} cannot be written (Read-only file system); make it writable "
        "or choose another --output-dir"]


def test_a_second_run_into_a_held_output_dir_is_refused_naming_the_holder(tmp_path, capsys):
    import subprocess
    import sys

    cfg = _cfg_for_run(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "pipeline.log").write_text("the first run's log\n", encoding="utf-8")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pipelines.runner import output_dir_lock\n"
                               f"with output_dir_lock({str(out)!r}):\n    print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
    try:
        assert holder.stdout.readline().strip() == "held"
        status, stdout, err = _main(["run", "--config", cfg, "--output-dir", out], capsys)
    finally:
        holder.communicate("", timeout=60)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: --output-dir {out} is in use by another run: process {holder.pid} on ")
    assert lines[0].endswith("; wait for it to finish, or choose another --output-dir")
    assert (out / "pipeline.log").read_text(encoding="utf-8") == "the first run's log\n"
    # once the holder is gone (however it ended), the directory is free again
    from pipelines.runner import output_dir_lock

    with output_dir_lock(str(out)) as held:
        assert held == str(out)


def test_links_planted_in_the_output_dir_are_replaced_or_refused_never_written_through(tmp_path, capfd, monkeypatch):
    """`OUT/pipeline.log`, `summary.json`, the report and the progress file pointing at a user's file
    overwrote it; `.run.lock` pointing at one truncated it."""
    from components.config.loading import load_config
    from pipelines import runner
    from pipelines.progress_view import progress_path

    cfg = load_config(str(_cfg_for_run(tmp_path)))
    out, mine = tmp_path / "out", tmp_path / "mine.txt"
    out.mkdir()
    mine.write_text("the user's own file\n", encoding="utf-8")
    names = [runner.LOG_FILE, runner.SUMMARY_FILE, runner.REPORT_HTML, os.path.basename(progress_path(str(out)))]
    for name in names:
        os.symlink(mine, out / name)
    # The pipeline itself is not under test: it runs nothing and its summary is a stub.
    monkeypatch.setattr(runner, "create_pipeline", lambda *a, **k: None)
    monkeypatch.setattr(runner, "run_locally", lambda p: None)
    monkeypatch.setattr(runner, "run_artifacts", lambda *a: {})
    monkeypatch.setattr(runner, "summarize", lambda *a: {"stub": True})
    runner.run(cfg, str(out), quiet=True)
    assert mine.read_text(encoding="utf-8") == "the user's own file\n"
    assert all(not os.path.islink(out / n) for n in names[:3]), names
    assert json.loads((out / runner.SUMMARY_FILE).read_text())["stub"] is True
    assert not [n for n in os.listdir(out) if ".tmp" in n]  # no temporary left behind

    os.unlink(out / runner.LOCK_FILE)
    os.symlink(mine, out / runner.LOCK_FILE)
    status, stdout, err = _main(["run", "--config", _cfg_for_run(tmp_path),
                                 "--output-dir", out], capfd)
    assert status == 2 and err.strip().splitlines() == [
        f"error: --output-dir {out}: {runner.LOCK_FILE} there is a symbolic link (to {mine}); remove it and rerun"]
    assert mine.read_text(encoding="utf-8") == "the user's own file\n"


@pytest.mark.parametrize("how, status, words", [("ctrl-c", 130, "Ctrl-C (SIGINT)"), ("sigterm", 143, "SIGTERM")])
def test_ctrl_c_or_sigterm_ends_a_run_in_one_line_naming_the_stage(tmp_path, capfd, monkeypatch, how, status, words):
    """Ctrl-C printed an 85-line traceback; SIGTERM mid-Exporter printed nothing."""
    import signal
    import time

    from components.reporting import progress
    from pipelines import runner

    def stopped(cfg, output_dir, *args):
        progress.start(progress.EXPORTER)  # the printer names the running stage from the progress file
        if how == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)  # the handler `main` installed raises in here
            time.sleep(5)
        raise KeyboardInterrupt()

    monkeypatch.setattr(runner, "_run", stopped)
    before = signal.getsignal(signal.SIGTERM)
    code, stdout, err = _main(["run", "--config", _cfg_for_run(tmp_path), "--output-dir", tmp_path / "out"], capfd)
    # Under capfd the run's log (stderr, in a real run the log file) is captured too: the terminal's line is `error:`.
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == status and len(lines) == 1, err
    assert lines[0].startswith(f"error: {words} stopped the run while {progress.EXPORTER} ran; rerun the same command")
    assert lines[0].endswith(f"full log: {tmp_path / 'out' / runner.LOG_FILE}")
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is the command's only


def test_ml_metadatas_store_on_a_full_disk_is_named_as_out_of_space(tmp_path, capfd, monkeypatch):
    """SQLite's "database or disk is full" was shown as it is, not as the documented out-of-space line."""
    from pipelines import runner

    def full(pipeline):
        raise RuntimeError("Error when executing query: database or disk is full")

    monkeypatch.setattr(runner, "create_pipeline", lambda *a, **k: None)
    monkeypatch.setattr(runner, "run_locally", full)
    out = tmp_path / "out"
    code, stdout, err = _main(["run", "--config", _cfg_for_run(tmp_path), "--output-dir", out], capfd)
    # Under capfd the run's log (stderr, in a real run the log file) is captured too: the terminal's line is `error:`.
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(lines) == 1, err
    assert (f"ML Metadata: no space left on device (errno 28) while writing under {out / 'metadata.sqlite'}: the disk "
            "is full; free space there or point the output at a larger disk, then rerun") in lines[0]


def _raw_with_table(vocabulary, dim=16, batch_size=256, optimizer="adagrad", **training):
    from tests.stages import minimal_raw_config

    raw = minimal_raw_config()
    first = raw["categorical_features"][0]["name"]
    raw["tables"] = [{"name": "big", "dim": dim, "vocabulary": vocabulary}]
    raw["categorical_features"][0]["table"] = "big"
    raw.setdefault("training", {})["batch_size"] = batch_size
    raw["training"]["embedding_optimizer"] = {"name": optimizer, "learning_rate": 0.1}
    raw["training"].update(training)
    return raw, first


def test_the_memory_floor_counts_what_the_config_fixes():
    from components.config.loading import parse_config
    from components.planning.capacity import BATCHES_HELD, EXAMPLE_BYTES, config_rows, memory_floor

    raw, _ = _raw_with_table({"kind": "hashed", "num_buckets": 1000}, dim=8)
    cfg = parse_config(raw)
    floor = memory_floor(cfg)
    assert config_rows(cfg, "big") == 1000
    assert floor.host_table_bytes["big"] == 1000 * 8 * 4 * 2  # weights and Adagrad's accumulators
    counted = [t.name for t in cfg.tables if t.name != "big"]
    assert all(config_rows(cfg, n) == cfg.table(n).vocabulary.num_oov_buckets for n in counted)  # known after preprocessing
    values = 1 + len(cfg.dense_features) + sum(f.max_length or 1 for f in cfg.categorical_features)
    assert floor.batch_bytes == BATCHES_HELD * 256 * values * EXAMPLE_BYTES
    raw, _ = _raw_with_table({"kind": "list", "values": ["a", "b", "c"], "num_oov_buckets": 2}, dim=8)
    assert config_rows(parse_config(raw), "big") == 5
    assert floor.shuffle_bytes == cfg.training.shuffle_buffer_rows * values * EXAMPLE_BYTES


def test_the_dense_floor_counts_the_cross_layers_and_mlps():
    from components.config.loading import parse_config
    from components.planning.capacity import DENSE_COPIES, dense_parameters, memory_floor

    raw = {"input": {"path": "x.csv"}, "dense_features": [{"name": "I1"}, {"name": "I2"}],
           "categorical_features": [{"name": "C1", "table": "t"}, {"name": "C2", "table": "t"}, {"name": "C3", "dim": 4}],
           "tables": [{"name": "t", "dim": 8, "vocabulary": {"kind": "hashed", "num_buckets": 100}}],
           "training": {"bottom_mlp": [6, 5], "top_mlp": [7], "cross_layers": 3, "cross_projection_dim": 2}}
    cfg = parse_config(raw)
    width = 8 + 8 + 4 + 5  # C1 and C2 (table t), C3, the bottom MLP's output
    expected = 2 * 6 + 6 * 5 + 3 * 2 * width * 2 + width * 7 + 7
    assert dense_parameters(cfg, {"t": 8, "C3": 4}) == expected
    assert memory_floor(cfg).dense_bytes == DENSE_COPIES * 4 * expected
    raw["training"]["cross_projection_dim"] = None  # full rank: width x width a layer
    assert dense_parameters(parse_config(raw), {"t": 8, "C3": 4}) == expected - 3 * 2 * width * 2 + 3 * width * width


def test_tables_or_batches_that_cannot_fit_are_refused_before_the_data_stages(tmp_path, capsys):
    from components.config.loading import parse_config
    from components.config.schema import ConfigError
    from components.planning.capacity import check_host_floor, check_tpu_floor

    raw, _ = _raw_with_table({"kind": "hashed", "num_buckets": 120_000_000})  # 120M x 16 x 4 x 2 = 14.3 GiB
    cfg = parse_config(raw)
    check_tpu_floor(cfg)  # sharded over the default slice it fits a chip
    check_host_floor(cfg, 15 * 2**30)
    with pytest.raises(ConfigError, match=r"^training needs at least 14\.3\d GiB of memory on this machine \(tables "
                                          r"with their optimizer slots 14\.3\d GiB \(largest: big \(120,000,000 rows: "
                                          r"14\.31 GiB\)\).* and 8\.00 GiB is available; lower"):
        check_host_floor(cfg, 8 * 2**30)
    raw, _ = _raw_with_table({"kind": "hashed", "num_buckets": 10_000}, batch_size=2**30)
    with pytest.raises(ConfigError, match=r"2 batches of training.batch_size 1,073,741,824 examples"):
        check_host_floor(parse_config(raw), 64 * 2**30)
    # A cross layer of rank 5,000,000 was killed for memory; a shuffle buffer of 2**40 rows crashed TensorFlow.
    raw, _ = _raw_with_table({"kind": "hashed", "num_buckets": 10_000}, cross_projection_dim=5_000_000)
    with pytest.raises(ConfigError, match=r"the dense network \(training.bottom_mlp, cross_layers, cross_projection_dim, "
                                          r"top_mlp\) \d+\.\d\d GiB.*lower training.cross_projection_dim"):
        check_host_floor(parse_config(raw), 8 * 2**30)
    raw, _ = _raw_with_table({"kind": "hashed", "num_buckets": 10_000}, shuffle_buffer_rows=2**40)
    with pytest.raises(ConfigError, match=r"training.shuffle_buffer_rows 1,099,511,627,776 examples .* lower "
                                          r"training.shuffle_buffer_rows,"):
        check_host_floor(parse_config(raw), 64 * 2**30)
    raw, _ = _raw_with_table({"kind": "identity", "num_buckets": 20_000_000_000})
    with pytest.raises(ConfigError, match=r"^training.embedding.topology: the tables whose size the config fixes "
                                          r"already need .* largest: big \(20,000,000,000 rows"):
        check_tpu_floor(parse_config(raw))
    # the command line: one line, exit 2, nothing run and no output directory made
    raw, _ = _raw_with_table({"kind": "hashed", "num_buckets": 10**12})
    raw["input"]["path"] = str(tmp_path / "data.csv")
    (tmp_path / "data.csv").write_text("label\n1\n", encoding="utf-8")
    (tmp_path / "huge.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    status, out, err = _main(["run", "--config", tmp_path / "huge.yaml", "--output-dir", tmp_path / "out"], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: training")
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_dir_inside_the_push_destination_is_refused_before_the_run(tmp_path, capsys):
    cfg = _cfg_for_run(tmp_path)
    raw = yaml.safe_load(cfg.read_text(encoding="utf-8"))
    raw["training"]["checkpoint_dir"] = str(tmp_path / "out" / "serving" / "ckpt")
    cfg.write_text(yaml.safe_dump(raw), encoding="utf-8")
    status, out, err = _main(["run", "--config", cfg, "--output-dir", tmp_path / "out"], capsys)
    assert status == 2 and err.strip().splitlines() == [
        f"error: training.checkpoint_dir {tmp_path / 'out' / 'serving' / 'ckpt'} is inside the push destination "
        f"{tmp_path / 'out' / 'serving'}: its checkpoints would be left among the served versions; point "
        "training.checkpoint_dir outside it (or leave it unset: the state then lives under the pipeline root and is "
        "removed when the Trainer finishes)"]
    assert not (tmp_path / "out").exists()


def test_empty_or_compressed_input_is_refused_before_the_run(tmp_path, capsys):
    import gzip

    data = tmp_path / "data.csv"
    data.write_text("label,I1\n", encoding="utf-8")  # a header only
    cfg = _config(tmp_path, data)
    status, out, err = _main(["run", "--config", cfg, "--output-dir", tmp_path / "out"], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1 and "no data rows (a header only)" in err
    data.write_bytes(gzip.compress(b"label,I1\n1,2\n"))
    status, out, err = _main(["run", "--config", cfg, "--output-dir", tmp_path / "out"], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert f"{data}: holds gzip-compressed bytes, but its name does not end in .gz" in err
    assert not (tmp_path / "out").exists()
