"""Deterministic generator of Criteo-like click data with a known label model.

Columns: `label`, 13 dense integer counts `I1..I13` (log-normal, some missing, `I2` may be -1 as
in Criteo) and 26 categorical columns `C1..C26` of 8-hex-digit tokens. Token ranks are drawn from
Zipf-like (power-law) distributions over per-feature cardinalities that default to the Criteo
Kaggle ones (from 3 to about 10 million values); some features are multi-hot (tokens joined by
`|`, lists longer than the demo's `max_length` do occur). Cells are missing at Criteo-like rates.

The label is Bernoulli(sigmoid(logit)) with the logit a known function of four dense features and
of the values of the low-cardinality categorical features and one multi-hot feature. Because the
true click probability of every row is known, the generator reports the best achievable AUC on
its own rows (the AUC of the true probability), which a trained model can be held against.

Everything is vectorised with numpy and seeded per chunk, so output is byte-identical for the
same arguments and the generator scales to tens of millions of rows (written chunk by chunk).

CLI: python -m components.example_gen.synthetic_data --rows 20000 --output data/demo/criteo_like.csv
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from components.config.schema import ConfigError
from components.data_io.safe_files import new_file
from components.data_io.checksums import file_sha256
from components.rules.metrics import roc_auc

NUM_DENSE = 13
NUM_CATEGORICAL = 26
# Criteo Kaggle display-advertising cardinalities of C1..C26.
CRITEO_CARDINALITIES = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]  # fmt: skip
MULTI_HOT_SEPARATOR = "|"
DRIFT_MIN_CARDINALITY = 1000  # features this large drift with GeneratorSpec.id_shift; smaller ones stay
CHUNK_ROWS = 100_000


@dataclass
class GeneratorSpec:
    rows: int = 20_000
    seed: int = 1234
    cardinalities: List[int] = field(default_factory=lambda: list(CRITEO_CARDINALITIES))
    zipf_exponent: float = 1.1  # power-law exponent of token ranks (larger: more skew)
    # 0-based categorical index -> max tokens per row (lists have 1..max tokens).
    multi_hot: Dict[int, int] = field(default_factory=lambda: {2: 8, 11: 6, 15: 4, 23: 8})
    categorical_missing_rate: float = 0.05
    dense_missing_rate: float = 0.1
    # Label model: which features carry signal.
    signal_dense: Tuple[int, ...] = (0, 2, 4, 8)
    signal_max_cardinality: int = 700  # categorical features up to this cardinality carry per-value effects
    signal_multi_hot: int = 23  # this multi-hot feature's mean token effect also enters the logit
    signal_hot_ranks: int = 64  # ... counting only its this-many most frequent values
    effect_scale: float = 0.5
    bias: float = -1.4  # about 25-30% positives, as in Criteo
    # Extra columns for the column kinds, sequences and weights, off by default (the
    # demo's columns stay Criteo's): `item_id` (integer IDs 0..item_cardinality-1, for identity
    # columns; IDs >= 1000 are out of range for a 1000-bucket table), `history` (the 1..10 item IDs
    # a user clicked before, '|'-separated, most recent first; the candidate item in it raises the
    # click probability) and `weight` (a positive number per row, for weighted IDs).
    extra_columns: bool = False
    item_cardinality: int = 1200
    # Drifting IDs (daily spans, docs/continuous.md): each categorical feature of at least
    # DRIFT_MIN_CARDINALITY values draws token ranks shifted by id_shift, so its id_shift most frequent
    # values of the unshifted data fade out, every other value becomes more frequent and new values
    # enter the tail. A value's label effect goes with the value (its token), not its rank.
    id_shift: int = 0

    def __post_init__(self) -> None:
        if len(self.cardinalities) != NUM_CATEGORICAL:
            raise ValueError(f"cardinalities: need {NUM_CATEGORICAL} values, got {len(self.cardinalities)}")
        if any(c < 1 for c in self.cardinalities):
            raise ValueError("cardinalities: every cardinality must be at least 1")
        if self.rows < 1:
            raise ValueError("rows: must be at least 1")
        if self.id_shift < 0:
            raise ValueError("id_shift: must be >= 0")
        self.multi_hot = {int(k): int(v) for k, v in self.multi_hot.items()}


def _fmix32(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finaliser: a bijection on uint32, so distinct ranks give distinct tokens."""
    x = x.astype(np.uint32)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x85EBCA6B)
    x ^= x >> np.uint32(13)
    x *= np.uint32(0xC2B2AE35)
    x ^= x >> np.uint32(16)
    return x


def token_of(feature: int, rank: np.ndarray) -> np.ndarray:
    """8-hex-digit token of each rank of a feature (distinct per rank within a feature)."""
    key = (rank.astype(np.uint64) + np.uint64(0x9E3779B9) * np.uint64(feature + 1)) & np.uint64(0xFFFFFFFF)
    h = _fmix32(key.astype(np.uint32))
    # "%08x" of each hash, spelled nibble by nibble in NumPy: np.char.mod("%08x", h) formats in a
    # Python loop and took about half of the demo dataset's generation
    chars = _HEX_DIGITS[(h[:, None] >> _NIBBLE_SHIFTS) & np.uint32(0xF)]
    return chars.view("S8").ravel().astype("U8")


_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", np.uint8)
_NIBBLE_SHIFTS = np.arange(28, -1, -4, dtype=np.uint32)  # the most significant hex digit first


def value_effect(feature: int, rank: np.ndarray, scale: float) -> np.ndarray:
    """Deterministic per-value logit effect: a standard normal from a hash of (feature, rank)."""
    a = _fmix32((rank.astype(np.uint64) * np.uint64(2) + np.uint64(feature * 7919 + 1)).astype(np.uint32))
    b = _fmix32(a ^ np.uint32(0x5BD1E995))
    u1 = (a.astype(np.float64) + 1.0) / 4294967297.0
    u2 = b.astype(np.float64) / 4294967296.0
    return scale * np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def zipf_ranks(rng: np.random.Generator, cardinality: int, size: int, s: float) -> np.ndarray:
    """Ranks in [0, cardinality) with P(rank=k) roughly proportional to (k+1)^-s.

    Inverse CDF of the continuous power law on [1, C+1): O(1) memory even for 10^7 values.
    """
    u = rng.random(size)
    if cardinality == 1:
        return np.zeros(size, dtype=np.int64)
    one_s = 1.0 - s
    hi = (cardinality + 1.0) ** one_s
    x = (1.0 + u * (hi - 1.0)) ** (1.0 / one_s)
    return np.minimum(np.floor(x).astype(np.int64) - 1, cardinality - 1)


def _dense_params(j: int) -> Tuple[float, float]:
    return 0.5 + 0.35 * j, 0.6 + 0.08 * (j % 5)


def generate_chunk(spec: GeneratorSpec, chunk_index: int, n: int) -> Tuple[Dict[str, np.ndarray], np.ndarray]:
    """Columns of one chunk (strings, '' = missing) and the true click probability of each row."""
    rng = np.random.default_rng([spec.seed, chunk_index])
    cols: Dict[str, np.ndarray] = {}
    logit = np.full(n, spec.bias)
    for j in range(NUM_DENSE):
        mu, sd = _dense_params(j)
        raw = np.floor(np.exp(rng.normal(mu, sd, n))).astype(np.int64) - 1  # >= -1, heavy-tailed
        if j != 1:
            raw = np.maximum(raw, 0)
        missing = rng.random(n) < spec.dense_missing_rate
        if j in spec.signal_dense:
            z = (np.log1p(np.maximum(raw, 0)) - mu) / sd
            sign = 1.0 if j % 4 == 0 else -1.0
            logit += np.where(missing, 0.0, sign * 0.45 * z)
        text = raw.astype(str).astype(object)
        text[missing] = ""
        cols[f"I{j + 1}"] = text
    for c in range(NUM_CATEGORICAL):
        card = spec.cardinalities[c]
        missing = rng.random(n) < spec.categorical_missing_rate
        max_len = spec.multi_hot.get(c)
        shift = spec.id_shift if card >= DRIFT_MIN_CARDINALITY else 0
        if max_len is None:
            ranks = zipf_ranks(rng, card, n, spec.zipf_exponent) + shift
            text = token_of(c, ranks).astype(object)
            if card <= spec.signal_max_cardinality:
                logit += np.where(missing, 0.0, value_effect(c, ranks, spec.effect_scale))
        else:
            lengths = rng.integers(1, max_len + 1, n)
            total = int(lengths.sum())
            ranks = zipf_ranks(rng, card, total, spec.zipf_exponent) + shift
            tokens = token_of(c, ranks)
            bounds = np.concatenate([[0], np.cumsum(lengths)])
            text = np.array(
                [MULTI_HOT_SEPARATOR.join(tokens[bounds[i] : bounds[i + 1]]) for i in range(n)], dtype=object
            )
            if c == spec.signal_multi_hot:
                # only the hot values carry signal: a long tail seen once cannot be learned by anyone
                eff = np.where(ranks < spec.signal_hot_ranks, value_effect(c, ranks, 2 * spec.effect_scale), 0.0)
                mean_eff = np.add.reduceat(eff, bounds[:-1]) / lengths
                logit += np.where(missing, 0.0, mean_eff)
        text[missing] = ""
        cols[f"C{c + 1}"] = text
    if spec.extra_columns:
        logit += _extra_columns(spec, chunk_index, n, cols)
    prob = 1.0 / (1.0 + np.exp(-logit))
    return cols, prob


EXTRA_COLUMNS = ("item_id", "history", "weight")
HISTORY_MAX = 10


def _extra_columns(spec: GeneratorSpec, chunk_index: int, n: int, cols: Dict[str, np.ndarray]) -> np.ndarray:
    """`item_id`, `history`, `weight` (GeneratorSpec.extra_columns) into `cols`; returns their logit
    part. Their own random stream, so the other columns are the same with or without them."""
    rng = np.random.default_rng([spec.seed, chunk_index, 11])
    item = zipf_ranks(rng, spec.item_cardinality, n, spec.zipf_exponent)
    lengths = rng.integers(1, HISTORY_MAX + 1, n)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    clicked = zipf_ranks(rng, spec.item_cardinality, int(bounds[-1]), spec.zipf_exponent)
    # half the users clicked the candidate before (somewhere in their history)
    again = rng.random(n) < 0.5
    place = bounds[:-1] + (rng.random(n) * lengths).astype(np.int64)
    clicked[place[again]] = item[again]
    cols["item_id"] = item.astype(str).astype(object)
    cols["history"] = np.array(
        [MULTI_HOT_SEPARATOR.join(clicked[bounds[i] : bounds[i + 1]].astype(str)) for i in range(n)], dtype=object)
    cols["weight"] = np.round(rng.uniform(0.5, 2.0, n), 3).astype(str).astype(object)
    return np.where(item < 1000, value_effect(100, item, spec.effect_scale), 0.0) + np.where(again, 0.8, -0.2)


def column_names(spec: Optional[GeneratorSpec] = None) -> List[str]:
    extra = list(EXTRA_COLUMNS) if spec is not None and spec.extra_columns else []
    return ["label"] + [f"I{j + 1}" for j in range(NUM_DENSE)] + [f"C{c + 1}" for c in range(NUM_CATEGORICAL)] + extra


def write_csv(spec: GeneratorSpec, path: str, log: Optional[callable] = None) -> Dict:
    """Writes `path` (with a header) and `path`.meta.json; returns the metadata.

    Written to a temporary name and renamed, so an interrupted run never leaves a CSV that a later
    step would trust.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    names = column_names(spec)
    tmp = path + ".partial"
    probs, labels = [], []
    start = time.time()
    digest = hashlib.sha256()
    with new_file(tmp) as fh:
        def write(text: str) -> None:
            data = text.encode("utf-8")
            digest.update(data)
            fh.write(data)

        write(",".join(names) + "\n")
        for chunk, first in enumerate(range(0, spec.rows, CHUNK_ROWS)):
            n = min(CHUNK_ROWS, spec.rows - first)
            cols, prob = generate_chunk(spec, chunk, n)
            label_rng = np.random.default_rng([spec.seed, chunk, 7])
            y = (label_rng.random(n) < prob).astype(np.int64)
            probs.append(prob)
            labels.append(y)
            table = [y.astype(str)] + [cols[name] for name in names[1:]]
            write("\n".join(",".join(row) for row in zip(*table)) + "\n")
            if log:
                log(f"generated {first + n}/{spec.rows} rows ({time.time() - start:.1f}s)")
    prob_all, y_all = np.concatenate(probs), np.concatenate(labels)
    meta = {
        "rows": spec.rows,
        "columns": names,
        "positive_rate": float(y_all.mean()),
        "best_achievable_auc": roc_auc(prob_all, y_all),
        "spec": asdict(spec),
        "bytes": os.path.getsize(tmp),
        "sha256": digest.hexdigest(),
    }
    with new_file(tmp + ".meta") as fh:
        fh.write(json.dumps(meta, indent=2, sort_keys=True).encode("utf-8"))
    os.replace(tmp, path)
    os.replace(tmp + ".meta", meta_path(path))
    return meta


def meta_path(csv_path: str) -> str:
    return csv_path + ".meta.json"


GLOB_CHARACTERS = ("*", "?", "[")  # a path holding one is a pattern the input reads, not a file to write


class NotGeneratedError(ConfigError):
    """A file is in the generator's way that the generator did not write: it is never overwritten."""


def generated_meta(path: str) -> Optional[Dict]:
    """The generator's metadata of `path` when the generator wrote the file there, else None.

    The generator wrote `path` when `path.meta.json` is beside it and records the file's content
    (`sha256`; an edit that keeps the size is someone else's file), or, in a metadata file from
    before checksums were recorded, its size (`bytes`; without either, it is trusted on its own).

    Args:
      path: the CSV file.

    Returns:
      The metadata, or None when `path` is missing or someone else's.
    """
    mp = meta_path(path)
    if not (os.path.isfile(path) and os.path.isfile(mp)):
        return None
    try:
        with open(mp, encoding="utf-8") as fh:
            meta = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("bytes", os.path.getsize(path)) != os.path.getsize(path):
        return None
    if "sha256" in meta and meta["sha256"] != file_sha256(path):
        return None
    return meta


def ensure_dataset(path: str, spec: GeneratorSpec) -> Dict:
    """Generates the dataset unless a complete one for the same spec is already there.

    Only a file the generator wrote is ever replaced (`generated_meta`): the demo's and the
    generator's output path may be a user's own data by mistake.

    Args:
      path: the CSV file to write (`path.meta.json` is written beside it).
      spec: what to generate.

    Returns:
      The dataset's metadata.

    Raises:
      NotGeneratedError: something the generator did not write is at `path`, or `path` is a file
        pattern (GLOB_CHARACTERS).
    """
    if any(c in os.path.basename(path) for c in GLOB_CHARACTERS):
        raise NotGeneratedError(
            f"{path} is a file pattern (it holds {', '.join(c for c in GLOB_CHARACTERS if c in os.path.basename(path))}): "
            "the data generator writes one file, and a file of that name would be read as data by every later "
            "run of the pattern; point the generated data (input.path, --output) at a file name, or use `run` to "
            "train on the files it matches")
    meta = generated_meta(path)
    if meta is not None and meta.get("spec") == json.loads(json.dumps(asdict(spec))):
        return meta
    if meta is None and os.path.lexists(path):
        kind = "a directory" if os.path.isdir(path) else "a file"
        raise NotGeneratedError(
            f"{path} is {kind} the data generator did not write (no matching {os.path.basename(meta_path(path))} "
            f"beside it), so it is left as it is; to train on it use `run`, or point the generated data "
            f"(input.path, --output) at a new file")
    return write_csv(spec, path)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--output", required=True, help="CSV file to write (a .meta.json is written beside it)")
    p.add_argument(
        "--max-cardinality", type=int, default=None, help="cap every feature's cardinality (default: Criteo's)"
    )
    p.add_argument("--zipf-exponent", type=float, default=1.1)
    p.add_argument("--extra-columns", action="store_true",
                   help="add item_id, history and weight (configs/features.yaml reads them)")
    p.add_argument("--id-shift", type=int, default=0,
                   help="shift every large feature's token ranks by this much (a later day of drifting IDs)")
    args = p.parse_args(argv)
    cards = list(CRITEO_CARDINALITIES)
    if args.max_cardinality:
        cards = [min(c, args.max_cardinality) for c in cards]
    try:
        spec = GeneratorSpec(rows=args.rows, seed=args.seed, cardinalities=cards, zipf_exponent=args.zipf_exponent,
                             extra_columns=args.extra_columns, id_shift=args.id_shift)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        meta = ensure_dataset(args.output, spec)
    except NotGeneratedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        f"{args.output}: {meta['rows']} rows, positive rate {meta['positive_rate']:.3f}, "
        f"best achievable AUC {meta['best_achievable_auc']:.4f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
