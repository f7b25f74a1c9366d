"""Exporter benchmark: table conversion throughput and peak memory, and serving latency.

    .venv/bin/python bench/export_bench.py conversion [--gib 2.0] [--repeats 3]
    .venv/bin/python bench/export_bench.py latency [--model DIR --examples GLOB]   # after `make demo`

conversion: generated tables (4 tables, dims 64/64/128/32, `--gib` GiB of float32 in all) are saved
twice in the same run: as a SparseCore layout-B checkpoint (stacked by dim, rows padded and
mod-sharded over 32 SparseCores with rotations, with the layout record) and as a layout-A
checkpoint. Each contender runs in a fresh child process, alternating, `--repeats` times:
- copy (the baseline): the checkpoint's data file read into numpy (np.array of a memory map) and
  written out again with np.save: a plain numpy copy of the same bytes, file to file;
- convert B / convert A: the exporter's `CheckpointTables.read` (slice reads, un-rotating and
  un-padding the shards for B) of every table, each written as the row-aligned .npy the exporter
  writes (`tables/<table>.npy`), one table at a time;
- "(in memory)": the same two without writing anything (the checkpoint read from the page cache
  into numpy): the conversion's own work, without the disk writes that bound the others.
Throughput = bytes moved / wall seconds (copy: the data file's bytes; convert: the logical tables'
bytes, padding not counted). Peak memory = the child's peak RSS above its RSS before the work,
next to the largest single table. Target: convert B within 2x of copy (copy GB/s / convert GB/s <= 2).

latency: the demo's trained model (default: the newest Model artifact under output/demo) exported
by the exporter once per serving table dtype (`--dtypes`, default float32 float16 int8), loaded
from disk; per batch size 1, 64, 1024, p50/p99 of single calls on CPU, the contenders alternating
call by call, for: each serving SavedModel on raw serialized tf.Examples (parsing, vocabulary
lookup, model), the float32 one also through its JSON signature (`serve_features`: one value per
raw column and row, as a REST client sends them; checked to score as `serving_default` does; with
no-op signatures of the same inputs beside them: a loaded signature's Python call costs ~30 us
per input before any graph runs, which TF Serving's C++ server does not pay),
the trained Keras model (rebuilt, restored, in a tf.function) on the same rows
already preprocessed and parsed, and the trainer's SavedModel on the preprocessed serialized rows
(the baseline: every row has p50 and p99 over its; `--calls` calls at batch 1 and 64, half as many
at 1024, so that p99 is not a single call's stall). Also each serving model's memory, in a fresh
process per model: RSS growth on loading it, on its first batch of 1024, and over 50 more.
Target (issue 17): serving p50 <= 1.25x and p99 <= 1.5x the trainer's SavedModel at every batch.
Results go to bench/results/export_<part>.json and print as markdown tables.
"""
from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import resource
import shutil
import statistics as st
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

RESULTS = os.path.join(REPO, "bench", "results")
TRAINER_SM = "trainer's SavedModel, preprocessed tf.Examples"  # the latency baseline
JSON_SM = "serving SavedModel (float32), JSON columns (serve_features)"
FLOOR_EXAMPLES = "no-op signature, one input (Python call floor)"
FLOOR_JSON = "no-op signature, the JSON inputs (Python call floor)"
TABLE_DIMS = {"t_users": 64, "t_items": 64, "t_queries": 128, "t_tags": 32}
NUM_CHIPS, SC_PER_CHIP = 8, 4


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _AnonSampler:
    """Peak anonymous (heap) RSS, sampled every millisecond: memory-mapped checkpoint pages are
    file-backed page cache the kernel can drop, so they are reported apart (VmHWM counts them)."""

    def __init__(self):
        import threading

        self.peak = self._anon()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def _anon() -> int:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
        return 0

    def _run(self):
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, self._anon())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, self._anon())


def _reset_peak_rss() -> bool:
    """Linux: writing 5 to clear_refs resets the peak RSS (VmHWM), so imports do not count."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _peak_rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


# ---- conversion ----------------------------------------------------------------------------------


def _plan(rows):
    from components.planning.derivation import hand_built_plan

    return hand_built_plan(
        {n: (rows[n], d, "tpu_embedding") for n, d in TABLE_DIMS.items()},
        global_batch_size=1024, num_chips=NUM_CHIPS, sparse_cores_per_chip=SC_PER_CHIP,
        optimizer={"name": "adagrad", "learning_rate": 0.1},
    )


def build_checkpoints(work: str, gib: float) -> dict:
    import tensorflow as tf
    from tensorflow.core.tpu.kernels import sparse_core_layout_pb2

    from components.embedding_model import layouts as layouts_lib
    from components.embedding_model.sparsecore_layout import recompute_sparse_core_layouts, stacked_variables

    per_table = gib * 2**30 / len(TABLE_DIMS)
    rows = {n: int(per_table // (d * 4)) + 3 for n, d in TABLE_DIMS.items()}  # +3: uneven, padded
    plan = _plan(rows)
    layouts = recompute_sparse_core_layouts(
        [{"name": n, "rows": rows[n], "dim": d, "group": "adagrad", "samples": 128} for n, d in TABLE_DIMS.items()],
        NUM_CHIPS, SC_PER_CHIP,
    )
    rng = np.random.default_rng(0)
    values = {n: rng.standard_normal((rows[n], d), dtype=np.float32) for n, d in TABLE_DIMS.items()}
    a_names = [layouts_lib.table_key(n, "tpu_embedding") for n in values]
    a_tensors = list(values.values())
    stacked = stacked_variables(values, layouts)
    b_names = [layouts_lib.TPU_PREFIX + layouts_lib.escape_name(name) + layouts_lib.ATTR for name in stacked]
    b_tensors = list(stacked.values())
    stacks = {}
    for name, layout in layouts.items():
        stacks.setdefault(layout.stacked_table_name, []).append(name)
    record = sparse_core_layout_pb2.SparseCoreTableLayouts(tables=list(layouts.values())).SerializeToString()
    prefixes = {"B": os.path.join(work, "ckpt_b", "ckpt"), "A": os.path.join(work, "ckpt_a", "ckpt")}
    tf.raw_ops.SaveV2(prefix=prefixes["B"], tensor_names=b_names + [layouts_lib.LAYOUT_RECORD_KEY], shape_and_slices=[""] * (len(b_names) + 1),
                      tensors=[tf.constant(t) for t in b_tensors] + [tf.constant(record)])
    tf.raw_ops.SaveV2(prefix=prefixes["A"], tensor_names=a_names, shape_and_slices=[""] * len(a_names),
                      tensors=[tf.constant(t) for t in a_tensors])
    with open(os.path.join(work, "plan.json"), "w") as fh:
        fh.write(plan.to_json())
    return {
        "prefixes": prefixes,
        "table_bytes": sum(rows[n] * d * 4 for n, d in TABLE_DIMS.items()),
        "largest_table_bytes": max(rows[n] * d * 4 for n, d in TABLE_DIMS.items()),
        "stacked_bytes": int(sum(t.nbytes for t in b_tensors)),
        "rows": rows,
        "stacks": stacks,
        "num_sparse_cores": NUM_CHIPS * SC_PER_CHIP,
    }


def child(mode: str, work: str, out: str) -> None:
    """One contender, in a fresh process; prints a JSON line."""
    import tensorflow as tf  # noqa: F401  (imported before the RSS baseline, as the exporter has it)

    from components.embedding_model import layouts as layouts_lib

    from components.contracts.plan import EmbeddingPlan

    plan = EmbeddingPlan.from_json(open(os.path.join(work, "plan.json")).read())
    os.makedirs(out, exist_ok=True)
    gc.collect()
    base = _rss_bytes()
    if not _reset_peak_rss():
        raise RuntimeError("cannot reset the peak RSS (/proc/self/clear_refs); the peak would include imports")
    anon_base = _AnonSampler._anon()
    sampler = _AnonSampler()
    t0 = time.perf_counter()
    moved = 0
    write = not mode.endswith("(in memory)")
    if mode.startswith("copy"):
        for data in sorted(glob.glob(os.path.join(work, "ckpt_b", "ckpt.data-*"))):
            # np.array of a memory map: the faster of the plain copies here (np.fromfile measured slower).
            array = np.array(np.memmap(data, dtype=np.uint8, mode="r"))
            if write:
                np.save(os.path.join(out, os.path.basename(data) + ".npy"), array)
            moved += array.nbytes
            del array
    else:
        prefix = os.path.join(work, f"ckpt_{mode.split()[1].lower()}", "ckpt")
        tables = layouts_lib.CheckpointTables(prefix, plan)
        for name in plan.tables:
            values = tables.read(name)
            if write:
                np.save(os.path.join(out, f"{name}.npy"), values)
            moved += values.nbytes
            del values
    seconds = time.perf_counter() - t0
    anon_peak = sampler.stop()
    print(json.dumps({"mode": mode, "seconds": seconds, "bytes": moved, "peak_extra_bytes": anon_peak - anon_base,
                      "peak_extra_rss_bytes": _peak_rss_bytes() - base}))


def run_conversion(args) -> dict:
    work = tempfile.mkdtemp(prefix="export_bench_", dir=args.workdir)
    try:
        t = time.perf_counter()
        info = build_checkpoints(work, args.gib)
        print(f"built checkpoints in {time.perf_counter() - t:.0f} s: {info['table_bytes'] / 2**30:.2f} GiB of tables", flush=True)
        gc.collect()
        # Machine reference: an in-memory numpy copy of the largest table's bytes.
        a = np.ones(info["largest_table_bytes"] // 4, np.float32)
        b = np.empty_like(a)
        best = min(_timed(lambda: np.copyto(b, a)) for _ in range(3))
        memcpy_gbps = a.nbytes / best / 1e9
        del a, b
        runs = {"copy": [], "convert B": [], "convert A": [], "copy (in memory)": [], "convert B (in memory)": []}
        for r in range(args.repeats):
            for mode in runs:
                out = os.path.join(work, "out")
                proc = subprocess.run([sys.executable, __file__, "_child", mode, work, out],
                                      capture_output=True, text=True, check=False)
                if proc.returncode != 0:
                    raise RuntimeError(proc.stderr[-3000:])
                res = json.loads(proc.stdout.strip().splitlines()[-1])
                shutil.rmtree(out, ignore_errors=True)
                res["gbps"] = res["bytes"] / res["seconds"] / 1e9
                runs[mode].append(res)
                print(f"repeat {r + 1} {mode}: {res['gbps']:.2f} GB/s, peak heap +{res['peak_extra_bytes'] / 2**20:.0f} MiB, "
                      f"peak RSS incl. mapped file pages +{res['peak_extra_rss_bytes'] / 2**20:.0f} MiB", flush=True)
        summary = {}
        for mode, rs in runs.items():
            g = [x["gbps"] for x in rs]
            summary[mode] = {"best_gbps": max(g), "median_gbps": st.median(g),
                             "peak_extra_bytes": max(x["peak_extra_bytes"] for x in rs),
                             "peak_extra_rss_bytes": max(x["peak_extra_rss_bytes"] for x in rs), "bytes": rs[0]["bytes"]}
        result = {
            "machine": {"cpus": os.cpu_count(), "memcpy_gbps": memcpy_gbps},
            "tables": info,
            "runs": runs,
            "summary": summary,
            "copy_over_convert_B": {"best": summary["copy"]["best_gbps"] / summary["convert B"]["best_gbps"],
                                    "median": summary["copy"]["median_gbps"] / summary["convert B"]["median_gbps"]},
            "copy_over_convert_B_in_memory": {
                "best": summary["copy (in memory)"]["best_gbps"] / summary["convert B (in memory)"]["best_gbps"],
                "median": summary["copy (in memory)"]["median_gbps"] / summary["convert B (in memory)"]["median_gbps"]},
            "peak_over_largest_table_B": summary["convert B"]["peak_extra_bytes"] / info["largest_table_bytes"],
        }
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# ---- latency -------------------------------------------------------------------------------------


def run_latency(args) -> dict:
    import tensorflow as tf

    from components.config.loading import config_from_json, load_config
    from components.embedding_exporter.export import export_serving_model
    from components.embedding_preprocess import vocabulary
    from components.embedding_preprocess.transform import make_lookups, transform_batch
    from components.contracts.manifest import VocabularyManifest
    from components.embedding_trainer import model_building, resolved_input
    from components.contracts.artifacts import SERVING_INPUTS_FILE, TRAINER_CONFIG_FILE
    from components.embedding_model.input import parse_batch

    model_dir = args.model or max(glob.glob(os.path.join(REPO, "output/demo/pipeline_root/Trainer/model/*")), key=os.path.getmtime)
    examples = args.examples or glob.glob(os.path.join(REPO, "output/demo/pipeline_root/EmbeddingExampleGen/examples/*/Split-eval"))[0] + "/*"
    cfg_file = os.path.join(model_dir, TRAINER_CONFIG_FILE)
    cfg = config_from_json(open(cfg_file).read()) if os.path.exists(cfg_file) else load_config(os.path.join(REPO, "configs/demo.yaml"))
    cfg.export.compare_compression = False
    cfg.export.auc_sample_size = 2048
    out = tempfile.mkdtemp(prefix="export_latency_")
    try:
        # One serving model per table dtype, each exported (and verified) by the exporter.
        reports, servings, loaded_bytes = {}, {}, {}
        for dtype in args.dtypes:
            cfg.export.table_dtype = dtype
            reports[dtype] = export_serving_model(cfg, model_dir, examples, os.path.join(out, dtype))
        trained_sm = tf.saved_model.load(os.path.join(model_dir, "Format-Serving")).signatures["serving_default"]
        manifest = VocabularyManifest.from_json(open(os.path.join(model_dir, "embedding_manifest.json")).read())
        plan = resolved_input.read_plan(model_dir)
        keras_model = model_building.build_model(plan, manifest, cfg, for_training=False)

        from tfx_bsl.coders import example_coder

        from components.embedding_exporter.export import read_raw_examples

        raw = read_raw_examples(examples, 2048)
        vocabs = {n: vocabulary.read_vocabulary(manifest.vocabulary_dir, n) for n in manifest.vocabularies}
        rb = example_coder.ExamplesToRecordBatchDecoder().DecodeBatch(raw)
        transformed = transform_batch(cfg, make_lookups(cfg, vocabs), rb)
        raw = [r for r, k in zip(raw, transformed.keep) if k]
        tx = example_coder.RecordBatchToExamplesEncoder().encode(transformed.batch)
        features, _ = parse_batch(tf.constant(tx[:8]), manifest)
        keras_model(features)
        tf.train.Checkpoint(model=keras_model).restore(tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))).expect_partial()
        keras_fn = tf.function(lambda f: keras_model(f), reduce_retracing=True)
        # Memory of each serving model, each in a fresh process (`_memory_child`): in one process
        # the figures depended on the load order and the allocator's state (int8, loaded last,
        # "added" 18 to 104 MiB from run to run).
        for dtype in args.dtypes:
            proc = subprocess.run([sys.executable, __file__, "_memory_child", os.path.join(out, dtype, "Format-Serving"),
                                   examples], check=True, capture_output=True, text=True)
            loaded_bytes[dtype] = json.loads(proc.stdout.strip().splitlines()[-1])
            servings[dtype] = tf.saved_model.load(os.path.join(out, dtype, "Format-Serving")).signatures["serving_default"]
        # The JSON signature (float32 model): one value per raw column and row, as a REST client
        # sends them (categorical: the cell's text, '' when missing; dense: the value, NaN).
        json_fn, json_columns = None, {}
        if "float32" in args.dtypes:
            json_fn = tf.saved_model.load(os.path.join(out, "float32", "Format-Serving")).signatures["serve_features"]
            parsed = [tf.train.Example.FromString(r).features.feature for r in raw[:1024]]
            # each input's raw column, as the exporter recorded it (docs/export.md, "Serving input names")
            with open(os.path.join(out, "float32", "Format-Serving", SERVING_INPUTS_FILE), encoding="utf-8") as fh:
                column_of = {e["input"]: e["column"] for e in json.load(fh)["serving_inputs"]}
            for name, spec in json_fn.structured_input_signature[1].items():
                column = column_of[name]
                if spec.dtype == tf.string:
                    cells = []
                    for f in parsed:
                        values = list(f[column].bytes_list.value) or [str(v).encode() for v in f[column].int64_list.value]
                        cells.append(values[0] if values else b"")
                    json_columns[name] = tf.constant(cells, tf.string)
                else:
                    json_columns[name] = tf.constant(
                        [(list(f[column].float_list.value) or [float("nan")])[0] for f in parsed], tf.float32)
            # What calling a loaded signature costs in Python before any graph runs (binding each
            # input: ~30 us apiece): no-op signatures of the same inputs, saved and loaded alike.
            # TF Serving's C++ server has no such cost.
            floor = tf.Module()
            floor.examples = tf.function(lambda examples: {"probabilities": tf.zeros([tf.shape(examples)[0], 1])},
                                         input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
            floor.columns = tf.function(lambda columns: {"probabilities": tf.zeros([tf.shape(next(iter(columns.values())))[0], 1])},
                                        input_signature=[{k: tf.TensorSpec([None], v.dtype, name=k)
                                                          for k, v in json_fn.structured_input_signature[1].items()}])
            tf.saved_model.save(floor, os.path.join(out, "floor"),
                                signatures={"serving_default": floor.examples, "serve_features": floor.columns})
            floor = tf.saved_model.load(os.path.join(out, "floor"))
            floor_fns = (floor.signatures["serving_default"], floor.signatures["serve_features"])
            for batch in (1, 64, 1024):  # the two signatures score alike
                by_example = servings["float32"](examples=tf.constant(raw[:batch]))["probabilities"].numpy()
                by_json = json_fn(**{c: v[:batch] for c, v in json_columns.items()})["probabilities"].numpy()
                if not np.allclose(by_example, by_json, rtol=0, atol=1e-6):
                    raise SystemExit(f"serve_features and serving_default differ at batch {batch}")
        rows = []
        for batch in (1, 64, 1024):
            # p99 needs samples: at 1024 it was once read off 30 calls (its largest), which one
            # stall of the host decided; now 150 at the default --calls.
            calls = {1: args.calls, 64: args.calls, 1024: max(args.calls // 2, 100)}[batch]
            raw_b, tx_b = tf.constant(raw[:batch]), tf.constant(tx[:batch])
            feats_b, _ = parse_batch(tx_b, manifest)
            contenders = {f"serving SavedModel ({d}), raw tf.Examples": (lambda fn=fn: fn(examples=raw_b)) for d, fn in servings.items()}
            if json_fn is not None:
                json_b = {c: v[:batch] for c, v in json_columns.items()}
                contenders[JSON_SM] = lambda: json_fn(**json_b)
                contenders[FLOOR_EXAMPLES] = lambda: floor_fns[0](examples=raw_b)
                contenders[FLOOR_JSON] = lambda: floor_fns[1](**json_b)
            contenders.update({
                "trained Keras model, preprocessed + parsed": lambda: keras_fn(feats_b),
                TRAINER_SM: lambda: trained_sm(examples=tx_b),
            })
            for fn in contenders.values():  # warm-up
                for _ in range(10):
                    fn()
            times = {name: [] for name in contenders}
            for _ in range(calls):  # alternating: every contender sees the same machine state
                for name, fn in contenders.items():
                    t = time.perf_counter()
                    fn()
                    times[name].append((time.perf_counter() - t) * 1e3)
            base = times[TRAINER_SM]
            for name, ts in times.items():
                rows.append({"batch": batch, "model": name, "calls": calls,
                             "p50_ms": float(np.percentile(ts, 50)), "p99_ms": float(np.percentile(ts, 99)),
                             "p50_vs_trainer": float(np.percentile(ts, 50) / np.percentile(base, 50)),
                             "p99_vs_trainer": float(np.percentile(ts, 99) / np.percentile(base, 99))})
                print(f"batch {batch:5d} {name}: p50 {rows[-1]['p50_ms']:.2f} ms, p99 {rows[-1]['p99_ms']:.2f} ms", flush=True)
        return {"model": model_dir, "parity": {d: r["parity"] for d, r in reports.items()}, "rows": rows,
                "loaded_model_rss_bytes": loaded_bytes, "machine": {"cpus": os.cpu_count()}}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def memory_child(saved_model: str, examples: str) -> None:
    """RSS of a fresh process before loading a serving model, after loading it, after its first
    batch of 1024 raw rows and after 50 more (the steady state), printed as JSON (bytes)."""
    import tensorflow as tf

    from components.embedding_exporter.export import read_raw_examples

    raw = tf.constant(read_raw_examples(examples, 1024))
    gc.collect()
    start = _rss_bytes()
    fn = tf.saved_model.load(saved_model).signatures["serving_default"]
    loaded = _rss_bytes()
    fn(examples=raw)
    first = _rss_bytes()
    for _ in range(50):
        fn(examples=raw)
    print(json.dumps({"load": loaded - start, "first_batch": first - loaded, "after_50_batches": _rss_bytes() - first}))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        child(*sys.argv[2:5])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_memory_child":
        memory_child(*sys.argv[2:4])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("part", choices=("conversion", "latency"))
    p.add_argument("--gib", type=float, default=2.0, help="conversion: GiB of float32 tables")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workdir", default=None, help="conversion: where the checkpoints go (default: the temp dir)")
    p.add_argument("--model", help="latency: Model artifact dir (default: newest under output/demo)")
    p.add_argument("--examples", help="latency: raw eval tf.Example file pattern")
    p.add_argument("--calls", type=int, default=300, help="latency: timed calls at batch 1")
    p.add_argument("--dtypes", nargs="+", default=["float32", "float16", "int8"], help="latency: serving table dtypes")
    args = p.parse_args()
    result = run_conversion(args) if args.part == "conversion" else run_latency(args)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, f"export_{args.part}.json"), "w") as fh:
        json.dump(result, fh, indent=2)
    if args.part == "conversion":
        print("\n| contender | best GB/s | median GB/s | peak heap | peak RSS (incl. mapped checkpoint pages) |")
        print("| --- | --- | --- | --- | --- |")
        for mode, s in result["summary"].items():
            print(f"| {mode} | {s['best_gbps']:.2f} | {s['median_gbps']:.2f} | {s['peak_extra_bytes'] / 2**20:.0f} MiB | "
                  f"{s['peak_extra_rss_bytes'] / 2**20:.0f} MiB |")
        print(f"\ncopy / convert B: {result['copy_over_convert_B']['best']:.2f} (best), "
              f"{result['copy_over_convert_B']['median']:.2f} (median); in memory: "
              f"{result['copy_over_convert_B_in_memory']['best']:.2f} (best), "
              f"{result['copy_over_convert_B_in_memory']['median']:.2f} (median); largest table "
              f"{result['tables']['largest_table_bytes'] / 2**20:.0f} MiB; in-memory copy {result['machine']['memcpy_gbps']:.1f} GB/s")
    else:
        print("\n| batch | model | p50 ms | p99 ms | p50 / trainer's | p99 / trainer's |")
        print("| --- | --- | --- | --- | --- | --- |")
        for r in result["rows"]:
            print(f"| {r['batch']} | {r['model']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                  f"{r['p50_vs_trainer']:.2f} | {r['p99_vs_trainer']:.2f} |")
        print("\nmemory of each serving model, each in a fresh process (RSS growth, MiB: load / first batch of 1024 / "
              "50 more batches): " + ", ".join(
                  f"{d} {m['load'] / 2**20:.0f} / {m['first_batch'] / 2**20:.0f} / {m['after_50_batches'] / 2**20:.0f}"
                  for d, m in result["loaded_model_rss_bytes"].items()))


if __name__ == "__main__":
    main()
