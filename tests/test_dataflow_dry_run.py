"""ExampleGen's and preprocessing's Beam pipelines as Dataflow jobs, built without Google Cloud.

Each pipeline is built by its own executor's `_make_beam_pipeline()` from the Beam options a
compiled Kubeflow task gets (`pipelines.kubeflow_config.kubeflow_beam_args` on
`configs/kubeflow.yaml`: DataflowRunner, project, region, temp_location, machine type, workers,
the pipeline image as `--sdk_container_image`) plus Beam's `--dry_run=True`, and run: Beam
round-trips the pipeline through its Runner API proto (pickling every DoFn and CombineFn), and
`DataflowRunner.run_pipeline` applies Dataflow's overrides, builds the portable proto in a Docker
environment and the `Job`, and stops before it needs a client. The test then builds the job's
request body as `DataflowApplicationClient.create_job_description` does for a real submission.

Stubbed, at the boundary only: the bucket's soft-delete lookup (a warning), the credentials, the
GCS and Dataflow API clients, and the uploads (`stage_file`, recorded instead). Any other attempt to
open a connection fails the test. The inputs and outputs are local files (the pipelines read and
write gs:// the same way, through Beam's FileSystems); nothing runs. Not proven here: workers
starting from the image, GCS reads and writes, the service's own validation of the job, autoscaling.
"""
import base64
import bz2
import io
import json
import os
import socket
import sys
import sysconfig

import pytest

from tests.stages import REPO

IMAGE = "REGISTRY/tpu-embedding-tfx:TAG"
# configs/kubeflow.yaml's placeholders, which Beam's option validator refuses (project ids and bucket
# names are lower case): replaced by names of the same shape; nothing else in its options changes.
PLACEHOLDERS = {"YOUR_PROJECT": "your-project", "YOUR_BUCKET": "your-bucket"}
# Where a pickled function's modules must come from: what the worker image installs
# (docker/Dockerfile: the lock's packages, the standard library, components/ and pipelines/).
WORKER_PATHS = tuple(
    {sysconfig.get_path(k) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    | {os.path.join(REPO, p) + os.sep for p in ("components", "pipelines")}
)


class NetworkCall(BaseException):
    """A connection attempted in a dry run (a BaseException: no retry loop swallows it)."""


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No network; the GCP boundary stubbed; returns the list the uploads are recorded in."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions
    from apache_beam.runners.dataflow.internal import apiclient

    def refuse(*args, **kwargs):
        raise NetworkCall(f"a dry run tried to connect: {args[:2]}")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(GoogleCloudOptions, "_warn_if_soft_delete_policy_enabled", lambda self, name: None)
    monkeypatch.setattr(apiclient, "get_service_credentials", lambda options: None)
    monkeypatch.setattr(apiclient, "create_storage_client", lambda options, use_credentials=True: None)
    monkeypatch.setattr(apiclient.dataflow, "DataflowV1b3", lambda **kwargs: None)
    uploads = []

    def stage_file(self, location, name, stream, mime_type=None, total_size=None):
        uploads.append((location, name, stream.read()))

    monkeypatch.setattr(apiclient.DataflowApplicationClient, "stage_file", stage_file)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # the SDK's staging files
    return uploads


def dataflow_config():
    """configs/kubeflow.yaml and its tasks' Beam options, with --dry_run=True."""
    import pipelines.kubeflow_config as kc
    from components.config.loading import load_config

    cfg = load_config(os.path.join(REPO, "configs", "kubeflow.yaml"))
    assert cfg.kubeflow.beam.runner == "dataflow"
    args = kc.kubeflow_beam_args(cfg, IMAGE)
    for old, new in PLACEHOLDERS.items():
        args = [a.replace(old, new) for a in args]
    return cfg, args + ["--dry_run=True"]


def dry_run(executor_cls, args, build):
    """The executor's pipeline with `build` applied, run by DataflowRunner with --dry_run: (the
    labels of every transform the project's code applied, the Job with its request body built).
    Transforms inside Beam's own composites are left out: Dataflow replaces some (its Create has
    no MaybeReshuffle)."""
    from apache_beam.pipeline import PipelineVisitor
    from apache_beam.runners.dataflow.internal import apiclient

    pipeline = executor_cls(executor_cls.Context(beam_pipeline_args=args))._make_beam_pipeline()
    build(pipeline)
    labels = set()

    class Labels(PipelineVisitor):
        def visit_transform(self, node):
            if node.parent is None:  # the pipeline's root
                return
            parent = node.parent.transform
            if parent is None or not type(parent).__module__.startswith("apache_beam."):
                labels.add(node.full_label)

        enter_composite_transform = visit_transform

    pipeline.visit(Labels())
    job = pipeline.run().job
    apiclient.DataflowApplicationClient(job.options, job.root_staging_location).create_job_description(job)
    return labels, job


def unpickled_fns(proto):
    """{transform name: (the unpickled DoFn or CombineFn, the `module.name`s its pickle imports)}."""
    import dill

    from apache_beam.portability import common_urns, python_urns
    from apache_beam.portability.api import beam_runner_api_pb2

    class Recording(dill.Unpickler):
        def find_class(self, module, name):
            self.refs.add(f"{module}.{name}")
            return super().find_class(module, name)

    def load(payload: bytes):
        u = Recording(io.BytesIO(bz2.decompress(base64.b64decode(payload))))  # pickler.dumps' encoding
        u.refs = set()
        return u.load(), u.refs

    combines = {common_urns.composites.COMBINE_PER_KEY.urn, common_urns.composites.COMBINE_GLOBALLY.urn,
                common_urns.combine_components.COMBINE_GROUPED_VALUES.urn}
    out = {}
    for t in proto.components.transforms.values():
        if t.spec.urn == common_urns.primitives.PAR_DO.urn:
            fn = beam_runner_api_pb2.ParDoPayload.FromString(t.spec.payload).do_fn
            if fn.urn != python_urns.PICKLED_DOFN_INFO:  # a DoFn of Beam's known by its URN (KeyWithVoid)
                continue
            (dofn, *_), refs = load(fn.payload)
        elif t.spec.urn in combines:
            fn = beam_runner_api_pb2.CombinePayload.FromString(t.spec.payload).combine_fn
            assert fn.urn == python_urns.PICKLED_COMBINE_FN, (t.unique_name, fn.urn)
            dofn, refs = load(fn.payload)
        else:
            continue
        out[t.unique_name] = (dofn, refs)
    return out


def check_job(job, labels, beam_args, uploads, fns_expected):
    """The job holds every transform applied, its functions unpickle from modules the worker image
    has, and its options and environment are the config's."""
    from apache_beam.portability.api import beam_runner_api_pb2

    proto = job.proto_pipeline
    names = {t.unique_name for t in proto.components.transforms.values()}
    assert not sorted(labels - names), f"transforms missing from the job: {sorted(labels - names)}"
    fns = unpickled_fns(proto)
    referenced = set().union(*(refs for _, refs in fns.values()))
    assert set(fns_expected) <= referenced, sorted(set(fns_expected) - referenced)
    for name, (fn, refs) in sorted(fns.items()):
        for ref in refs:
            origin = getattr(sys.modules.get(ref.split(".")[0]), "__file__", None)
            assert origin is None or origin.startswith(WORKER_PATHS), f"{name}: {fn!r} needs {ref} ({origin})"
    (env,) = proto.components.environments.values()
    assert beam_runner_api_pb2.DockerPayload.FromString(env.payload).container_image == IMAGE

    body = json.loads(job.json())
    options = body["environment"]["sdkPipelineOptions"]["options"]
    given = dict(a[2:].split("=", 1) for a in beam_args if a.startswith("--") and "=" in a)
    for key in ("project", "region", "machine_type", "sdk_container_image"):
        assert options[key] == given[key], key
    assert options["max_num_workers"] == int(given["max_num_workers"])
    staging = options["temp_location"]  # Beam adds the job's name under the configured location
    assert staging.startswith(given["temp_location"] + "/" + options["job_name"]), staging
    assert body["type"] == "JOB_TYPE_BATCH" and "use_runner_v2" in body["environment"]["experiments"]
    staged = {name: data for _, name, data in uploads}
    assert staged["pipeline.pb"] == proto.SerializeToString()
    assert {loc for loc, _, _ in uploads} == {staging}
    assert options["pipelineUrl"] == staging + "/pipeline.pb"


@pytest.mark.slow(reason="builds ExampleGen's and preprocessing's Dataflow jobs (DataflowRunner --dry_run)")
def test_example_gen_and_preprocess_build_dataflow_jobs(offline, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from components.embedding_preprocess import beam_pipeline
    from components.embedding_preprocess import executor as preprocess_executor
    from components.example_gen import executor as example_gen_executor
    from components.example_gen import ranges
    from components.example_gen.beam_io import WriteExamples
    from components.example_gen.split_hash import bucket_bounds

    cfg, args = dataflow_config()
    columns = list(dict.fromkeys([cfg.label] + cfg.numeric_columns() + cfg.categorical_columns()))
    csv = tmp_path / "data.csv"
    csv.write_text(",".join(columns) + "\n" + ",".join("1" for _ in columns) + "\n")
    splits = {s: str(tmp_path / "examples" / f"Split-{s}") for s in ("train", "eval")}

    def example_gen(p):  # what the executor's Do applies (components/example_gen/executor.py)
        byte_ranges = ranges.plan_ranges([(str(csv), csv.stat().st_size)], int(cfg.input.range_mb * (1 << 20)))
        bounds = bucket_bounds([cfg.input.train_buckets, cfg.input.eval_buckets])
        _ = p | "WriteExamples" >> WriteExamples(cfg.to_json(), byte_ranges, splits, bounds,
                                                 str(tmp_path / "examples" / "_tmp"), str(tmp_path / "counts.json"),
                                                 str(tmp_path / "blocks.json"))

    labels, job = dry_run(example_gen_executor.Executor, args, example_gen)
    assert {"WriteExamples/ReadAndWrite", "WriteExamples/ScanRanges", "WriteExamples/SumCounts",
            "WriteExamples/WriteBlocks"} <= labels
    check_job(job, labels, args, offline, [
        "components.example_gen.beam_io.ReadAndWriteRange", "components.example_gen.beam_io.SumCountsFn",
        "components.example_gen.beam_io.scan_outputs", "components.example_gen.beam_io.count_range",
    ])

    # Preprocessing reads what ExampleGen writes, Parquet list columns (Beam's Parquet source checks
    # at construction that its files exist).
    offline.clear()
    for d in splits.values():
        os.makedirs(d)
        row = {c: pa.array([[1.0]]) for c in [cfg.label] + cfg.numeric_columns()}
        row.update({c: pa.array([[b"a"]]) for c in cfg.categorical_columns()})
        pq.write_table(pa.table(row), os.path.join(d, "part.parquet"))
    out = {name: str(tmp_path / name) for name in ("vocabulary", "statistics")}

    def preprocess(p):  # what run_preprocessing applies (components/embedding_preprocess/run.py)
        beam_pipeline.build_pipeline(
            p, cfg, {s: os.path.join(d, "*") for s, d in splits.items()}, out["vocabulary"],
            {s: str(tmp_path / "transformed" / f"Split-{s}") for s in splits}, out["statistics"], "parquet",
        )

    labels, job = dry_run(preprocess_executor.Executor, args, preprocess)
    assert {"CountValues/CountPerBundle", "Transform[train]/Transform", "MergeStatistics/Merge"} <= labels
    check_job(job, labels, args, offline, [
        "components.embedding_preprocess.beam_pipeline._CountPerBundle",
        "components.embedding_preprocess.beam_pipeline._SummarizeBucket",
        "components.embedding_preprocess.beam_pipeline._TransformBatch",
        "components.embedding_preprocess.beam_pipeline.MergeSummariesFn",
        "components.embedding_preprocess.beam_pipeline.MergeStatsFn",
        "components.embedding_preprocess.beam_pipeline._write_vocabulary",
    ])
