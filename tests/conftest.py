import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def pipeline_run(tmp_path_factory):
    """The real pipeline on `configs/demo.yaml` and the demo's amount of data (seed 99), run once
    for the end-to-end and the exporter tests: (config, output dir, summary, data metadata)."""
    import yaml

    from components.config import load_config
    from components.synthetic_data import GeneratorSpec, ensure_dataset
    from pipelines.__main__ import DEMO_ROWS, run

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    root = tmp_path_factory.mktemp("e2e")
    data = root / "data" / "criteo_like.csv"
    meta = ensure_dataset(str(data), GeneratorSpec(rows=DEMO_ROWS, seed=99))
    with open(os.path.join(repo, "configs", "demo.yaml")) as fh:
        raw = yaml.safe_load(fh)
    raw["input"]["path"] = str(data)
    raw["beam"]["direct_num_workers"] = 2
    cfg_path = root / "e2e.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    cfg = load_config(str(cfg_path))
    summary = run(cfg, str(root / "out"))
    return cfg, root / "out", summary, meta
