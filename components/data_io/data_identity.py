"""What identifies a run's data: the input as ExampleGen read it and the config that makes rows of it.

A training state records it and a resume compares it (sparsecore_state.check_resumable): the same
input resumes from any output directory, other input is refused. It is computed from what does not
vary between runs: each input file's name (relative to the files' common directory), size and
content fingerprint (data_io/checksums.py: every byte, hashed in blocks where ExampleGen's workers
read them, `content_fingerprint`; a sample of the bytes for Parquet files, which no worker reads
whole, `sampled_fingerprint`), and the config fields
that decide which rows and values reach training (`data_config`). Not from the transformed
examples' bytes: two runs over the same input write other bytes (tfx_bsl's encoder orders each
Example's feature map differently in each process, and a runner that splits bundles dynamically
may group the rows into other records). Not from the input's location or times: a copy elsewhere is the same data.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import IO, Any, Callable, Dict, List, Optional, Sequence, Tuple

from components.config.schema import PipelineConfig
from components.data_io.checksums import content_fingerprint, sampled_fingerprint

# What the Trainer records where ExampleGen recorded no input identity (examples from a stock
# ExampleGen): the transformed examples' own files (training_state.data_signature).
FROM_INPUT = "input files"  # sampled bytes (Parquet input; and every record written before blocks were hashed)
FROM_INPUT_BYTES = "input files (every byte)"
FROM_EXAMPLES = "transformed examples"

# The fields of a categorical feature or table that shape the model, not the rows: a change of
# them is the plan's or the training config's to judge, not the data's.
_MODEL_FIELDS = ("dim", "combiner", "initializer", "optimizer", "use_safe_embedding_lookup")


def input_identity(files: Sequence[Tuple[str, int]], opener: Callable[[str], IO[bytes]],
                   blocks: Optional[Sequence[Sequence[Any]]] = None) -> Dict[str, Any]:
    """What identifies the input files ExampleGen read.

    Args:
      files: (path, size in bytes) of every input file.
      opener: opens a path for binary reading (Beam's `FileSystems.open` for any filesystem), for
        the sampled fingerprint.
      blocks: (path, block index, SHA-256 hex) of every block of every file, as ExampleGen's
        workers hashed them (ranges.scan_range, range_blocks); None (Parquet input): each file is known by a
        sample of its bytes.

    Returns:
      {"fingerprint", "files": [{"name", "bytes", "fingerprint"}], "bytes", "rule"}: names
      relative to the files' common directory; `rule` FROM_INPUT_BYTES with blocks, else FROM_INPUT.

    Raises:
      ValueError: the blocks do not cover every file once (checksums.content_fingerprint).
    """
    by_path: Dict[str, List[Tuple[int, str]]] = {}
    for path, k, hexdigest in blocks or ():
        by_path.setdefault(path, []).append((int(k), hexdigest))

    def fingerprint(path: str, size: int) -> str:
        if blocks is None:
            return sampled_fingerprint(path, size, opener)
        try:
            return content_fingerprint(size, by_path.get(path, []))
        except ValueError as e:
            raise ValueError(f"input file {path}: {e}") from None

    paths = [p for p, _ in files]
    root = os.path.dirname(paths[0]) if len(paths) == 1 else os.path.commonpath(paths) if paths else ""
    entries = [{"name": os.path.relpath(p, root) if root else p, "bytes": int(n), "fingerprint": fingerprint(p, int(n))}
               for p, n in sorted(files)]
    entries.sort(key=lambda e: e["name"])
    return {"fingerprint": _digest(entries), "files": entries, "bytes": sum(e["bytes"] for e in entries),
            "rule": FROM_INPUT if blocks is None else FROM_INPUT_BYTES}


def _without(entry: Dict[str, Any], fields: Sequence[str]) -> Dict[str, Any]:
    return {k: v for k, v in entry.items() if k not in fields}


def data_config(cfg: PipelineConfig) -> Dict[str, Any]:
    """The config fields that decide which rows and which values reach training.

    The input's format, split and health limits (not its path or range size), the label and its
    rule, the dense features and the categorical features' columns, separators, lengths and
    vocabularies. Not the tables' dims, initializers or optimizers, nor anything of training.
    """
    raw = json.loads(cfg.to_json())
    return {
        "input": _without(raw["input"], ("path", "range_mb")),
        "label": raw["label"],
        "label_rule": raw["label_rule"],
        "dense_features": raw["dense_features"],
        "categorical_defaults": {"vocabulary": raw["categorical_defaults"]["vocabulary"]},
        "categorical_features": [_without(f, _MODEL_FIELDS) for f in raw["categorical_features"]],
        "tables": [_without(t, _MODEL_FIELDS) for t in raw["tables"]],
    }


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:32]


def example_gen_input(ledger: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The input identity ExampleGen recorded in its stage of a row ledger; None without one."""
    for stage in (ledger or {}).get("stages", []):
        if stage.get("input_identity"):
            return stage["input_identity"]
    return None


def training_data_identity(cfg: PipelineConfig, ledger: Optional[Dict[str, Any]],
                           fallback: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
    """What identifies a training run's data.

    Args:
      cfg: the run's config (its `data_config`).
      ledger: the row ledger of the examples (ExampleGen's stage holds the input identity).
      fallback: computes the identity from the transformed examples, where the ledger holds no
        input identity (examples from another ExampleGen).

    Returns:
      {"fingerprint", "examples" (what was read, for messages), "files", "bytes", "from"}.
    """
    found = example_gen_input(ledger)
    if found is None:
        return dict(fallback(), **{"from": FROM_EXAMPLES})
    names: List[str] = [f["name"] for f in found["files"]]
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return {"fingerprint": _digest([found["fingerprint"], data_config(cfg)]), "examples": shown,
            "files": len(names), "bytes": found["bytes"], "from": found.get("rule", FROM_INPUT)}
