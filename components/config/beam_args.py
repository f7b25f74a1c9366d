"""Beam options of a local run, from the `beam` section.

Here rather than in pipelines/ because component CLIs (`python -m components.embedding_preprocess`)
run Beam from a config without the pipeline; Kubeflow's Beam options are pipelines/kubeflow_config.py's.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, List

if TYPE_CHECKING:
    from components.config.schema import BeamConfig


def local_beam_args(beam: BeamConfig) -> List[str]:
    """DirectRunner with the configured mode and workers, then `extra_args`; a `--runner` among
    `extra_args` replaces the DirectRunner options altogether."""
    args = [
        "--runner=DirectRunner",  # named explicitly: newer Beam would pick Prism and download it
        f"--direct_running_mode={beam.direct_running_mode}",
        f"--direct_num_workers={beam.direct_num_workers}",
    ]
    if any(a.startswith("--runner") for a in beam.extra_args):
        args = []
    return args + list(beam.extra_args)
