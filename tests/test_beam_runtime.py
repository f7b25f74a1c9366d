"""The Beam local-runner data-loss race (components/data_io/beam_runtime.py): reproduced deterministically,
closed by the workaround, refused on an unverified Beam, and applied by the ExampleGen executor."""
import json
import os
import subprocess
import sys

import pytest

from components.data_io import beam_runtime

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The runner's time-based stream, as the FnApiRunner uses it (fn_runner.py: write() chunks, then
# close()), with a 1 ms flush interval and a flush callback that takes 2 ms (a busy gRPC send): a
# write that lands while the callback runs is wiped by the flush's _clear(). Deterministic: every
# chunk written during a flush is lost.
RACE = r"""
import sys, time, json
from apache_beam.runners.worker import data_plane

def race():
    received = []
    def slow_send(data):
        time.sleep(0.002)
        received.append(len(data))
    stream = data_plane.TimeBasedBufferingClosableOutputStream(
        close_callback=lambda d: received.append(len(d)), flush_callback=slow_send, time_flush_threshold_ms=1)
    chunk = b"x" * 1000
    for i in range(3000):
        stream.write(chunk)
        if i % 50 == 0:
            time.sleep(0.001)
    stream.close()
    return {"written": 3000 * 1000, "received": sum(received)}

out = {"none": race()}  # Beam as installed first, then with the workaround (it patches Beam for good)
from components.data_io.beam_runtime import ensure_local_runner_safe
ensure_local_runner_safe()
out["workaround"] = race()
print(json.dumps(out))
"""


def test_race_loses_data_without_the_workaround_and_none_with_it():
    # a process of its own: the workaround patches Beam's module for the rest of the process
    env = dict(os.environ, PYTHONPATH=REPO, PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    runs = json.loads(r.stdout.strip().splitlines()[-1])
    without, with_fix = runs["none"], runs["workaround"]
    assert without["received"] < without["written"], without  # Beam 2.59 as installed: data is lost
    assert with_fix["received"] == with_fix["written"], with_fix


def test_refuses_an_unverified_beam_version():
    with pytest.raises(beam_runtime.UnverifiedBeamError, match="verified only for 2.59.0"):
        beam_runtime._check_version("2.60.0")
    beam_runtime._check_version("2.59.0")


def test_refuses_options_that_reopen_the_race():
    with pytest.raises(ValueError, match="data_buffer_time_limit_ms"):
        beam_runtime.ensure_local_runner_safe(["--experiments=data_buffer_time_limit_ms=5"])


@pytest.mark.slow(reason="ExampleGen over 30,000 rows under a 1 ms flush")
def test_example_gen_reads_every_row_under_a_forced_short_flush(tmp_path):
    """A run with the runner's flush interval forced to 1 ms (the race made likely) and parallel
    multi-threaded workers: the executor applies the workaround and every row is read and written."""
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    from tests.stages import example_gen_config as _cfg, run_example_gen

    rows = 30_000
    d = tmp_path / "in"
    d.mkdir()
    with open(d / "big.csv", "w") as fh:
        fh.write("label,I1,I2,C1,C2\n")
        for i in range(rows):
            fh.write(f"{i % 2},{i},{i % 7},c{i % 1000},a|b{i % 13}\n")
    worker_handlers.DATA_BUFFER_TIME_LIMIT_MS = 1
    cfg = _cfg(beam={"direct_running_mode": "multi_threading", "direct_num_workers": 2})
    led, records, err = run_example_gen(cfg, d, tmp_path / "out")
    assert worker_handlers.DATA_BUFFER_TIME_LIMIT_MS == 0
    assert err is None and led["balanced"]
    assert led["stages"][0]["rows_in"] == rows == len(records)


@pytest.mark.parametrize("args, local", [
    ([], True),  # Beam's default runner
    (["--runner=DirectRunner", "--direct_running_mode=multi_processing"], True),
    (["--runner=SwitchingDirectRunner"], True),
    (["--runner=direct"], True),
    (["--runner=apache_beam.runners.direct.direct_runner.BundleBasedDirectRunner"], True),
    (["--runner=DataflowRunner", "--project=p", "--region=r"], False),
    (["--runner=PortableRunner", "--job_endpoint=localhost:8099"], False),
    (["--runner=FlinkRunner"], False),
    (["--runner=DirectRunner", "--environment_type=LOOPBACK"], True),
    (["--runner=DirectRunner", "--environment_type=DOCKER"], False),  # workers in a container: TFX's package
    (["--runner=dataflow"], False),
])
def test_runs_on_this_machine(args, local):
    assert beam_runtime.runs_on_this_machine(args) is local


def _beam_executor(args):
    """Our preprocessing executor, a BaseBeamExecutor, constructed as TFX's launcher does."""
    from tfx.dsl.components.base.base_beam_executor import BaseBeamExecutor

    from components.embedding_preprocess.executor import Executor

    return Executor(BaseBeamExecutor.Context(beam_pipeline_args=list(args)))


def test_a_local_beam_executor_builds_no_tfx_sdist_and_a_remote_one_still_does(monkeypatch, tmp_path):
    """TFX's BaseBeamExecutor packages tfx into a never-removed temp sdist for every Beam component;
    our executor wraps that on construction: a DirectRunner's executor keeps its options and leaves
    nothing in the temp dir, while a remote runner's executor still gets TFX's package."""
    import tempfile

    from tfx.utils import dependency_utils

    tfx_flags = getattr(dependency_utils.make_beam_dependency_flags, "tfx_original",
                        dependency_utils.make_beam_dependency_flags)
    monkeypatch.setattr(dependency_utils, "make_beam_dependency_flags", tfx_flags)  # unwrapped, as TFX ships it
    monkeypatch.setattr(beam_runtime, "_dependency_wrapped", False)
    built = []
    monkeypatch.setattr(dependency_utils, "build_ephemeral_package", lambda: built.append(1) or "/pkg/tfx.tar.gz")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    local = ["--runner=DirectRunner", "--direct_num_workers=2"]
    assert _beam_executor(local)._beam_pipeline_args[:2] == local
    assert local == ["--runner=DirectRunner", "--direct_num_workers=2"]  # the caller's list left alone
    assert not built and not os.listdir(tmp_path)
    remote = _beam_executor(["--runner=DataflowRunner", "--project=p", "--region=r"])._beam_pipeline_args
    assert "--extra_package=/pkg/tfx.tar.gz" in remote and built == [1]
    # TFX's own rule still decides for remote runners: Dataflow with the project's image gets no package
    imaged = ["--runner=DataflowRunner", "--project=p", "--region=r", "--sdk_container_image=gcr.io/p/img"]
    assert _beam_executor(imaged)._beam_pipeline_args[:4] == imaged and built == [1]
    beam_runtime.skip_tfx_sdist_for_local_runners()  # idempotent: still wrapped once
    assert dependency_utils.make_beam_dependency_flags.tfx_original is tfx_flags


# ---- DoFn specs worked out once per DoFn object (components/data_io/beam_dofn_specs.py) ----------

def _beams_own_specs():
    """Beam's own get_dofn_specs, whether or not this process has wrapped it already."""
    from apache_beam.transforms import userstate

    return getattr(userstate.get_dofn_specs, "beam_original", userstate.get_dofn_specs)


def _counting_specs(monkeypatch):
    """Beam's own get_dofn_specs, counting its calls per DoFn object (objects kept alive, so that
    no id is reused), installed as the function `cache_dofn_specs` wraps."""
    from apache_beam.transforms import userstate

    beam = _beams_own_specs()
    calls, alive = {}, []

    def counted(dofn):
        alive.append(dofn)
        calls[id(dofn)] = calls.get(id(dofn), 0) + 1
        return beam(dofn)

    monkeypatch.setattr(userstate, "get_dofn_specs", counted)
    return calls


def _stateful_run():
    """A stateful DoFn (a bag and a timer per key) and a Map in an in-memory pipeline: the sums it
    emits per key."""
    import apache_beam as beam
    from apache_beam.coders import VarIntCoder
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to
    from apache_beam.transforms.timeutil import TimeDomain
    from apache_beam.transforms.userstate import BagStateSpec, TimerSpec, on_timer

    class SumPerKey(beam.DoFn):
        BAG = BagStateSpec("bag", VarIntCoder())
        FLUSH = TimerSpec("flush", TimeDomain.WATERMARK)

        def process(self, kv, bag=beam.DoFn.StateParam(BAG), flush=beam.DoFn.TimerParam(FLUSH)):
            bag.add(kv[1])
            flush.set(0)

        @on_timer(FLUSH)
        def emit(self, key=beam.DoFn.KeyParam, bag=beam.DoFn.StateParam(BAG)):
            yield key, sum(bag.read())

    with beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=in_memory"])) as p:
        sums = (p | beam.Create([("a", 1), ("b", 2), ("a", 3)]) | beam.ParDo(SumPerKey())
                | beam.Map(lambda kv: (kv[0], kv[1] * 10)))
        assert_that(sums, equal_to([("a", 40), ("b", 20)]))
    return SumPerKey


def test_beam_works_out_a_dofns_specs_at_every_look_and_the_cache_once_per_object(monkeypatch):
    from apache_beam.transforms import userstate

    from components.data_io.beam_dofn_specs import cache_dofn_specs

    calls = _counting_specs(monkeypatch)
    _stateful_run()
    assert max(calls.values()) >= 3, calls  # why: Beam 2.59 asks again and again for one object
    calls.clear()
    cache_dofn_specs()  # wraps the counting function: each object's specs are worked out once
    dofn = _stateful_run()
    assert calls and set(calls.values()) == {1}, calls
    state, timers = userstate.get_dofn_specs(dofn())  # the cached answer is Beam's own
    assert state == {dofn.BAG} and timers == {dofn.FLUSH}
    assert userstate.get_dofn_specs.beam_original(dofn()) == (state, timers)


def test_the_cache_refuses_what_beam_refuses_and_forgets_a_dofn_that_is_gone(monkeypatch):
    import gc

    import apache_beam as beam
    from apache_beam.coders import VarIntCoder
    from apache_beam.transforms import userstate
    from apache_beam.transforms.userstate import BagStateSpec

    from components.data_io.beam_dofn_specs import cache_dofn_specs

    # Beam's own function, unwrapped for this test, is what cache_dofn_specs wraps
    monkeypatch.setattr(userstate, "get_dofn_specs", _beams_own_specs())
    cache_dofn_specs()
    bag = BagStateSpec("bag", VarIntCoder())

    class Twice(beam.DoFn):
        def process(self, kv, a=beam.DoFn.StateParam(bag), b=beam.DoFn.StateParam(bag)):
            yield kv

    twice = Twice()
    for _ in range(2):  # refused at every call, as Beam refuses it: never cached
        with pytest.raises(ValueError, match="duplicate"):
            userstate.get_dofn_specs(twice)
    cached = userstate.get_dofn_specs.cached
    plain = beam.DoFn()
    assert userstate.get_dofn_specs(plain) == (set(), set()) and id(plain) in cached
    key = id(plain)
    del plain
    gc.collect()
    assert key not in cached  # gone with its DoFn: a new object at that address is looked at afresh

    class NoWeakReferences:  # not a DoFn (every DoFn can be weakly referenced): answered, not kept
        __slots__ = ()

    assert userstate.get_dofn_specs(NoWeakReferences()) == (set(), set()) and not cached
