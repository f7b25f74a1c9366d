"""Continuous training: a run warm-started from the last blessed model, and the drift between them.

The pipeline's LastBlessedModel step hands the Trainer (`base_model`) a pointer to the Trainer
Model of the version served at the push destination (components/model_registry). That Trainer
Model holds everything needed (trainer_module): the final checkpoint, the plan, the manifest (its
`vocabulary_dir` names the previous vocabularies) and, when it has them, the statistics.

Warm start = one training checkpoint in *this* run's model, written before training and restored
by `train` as a resumed run restores its own (so the same restore path serves every platform):
- an embedding row whose token is in both vocabularies of a table (same name, same dim) is the
  previous row of that token; a token new to the table keeps its fresh initial row; the previous
  tokens absent now are counted (and the most frequent listed) as dropped;
- OOV buckets are carried when the table has as many as before (the bucket of a token is
  Fingerprint64(token) % buckets, so the same count means the same tokens share it); hashed tables
  likewise; identity tables keep the IDs both runs hold; a vocabulary file whose lines (+ OOV
  buckets) do not meet its table's rows in the checkpoint stops the run (`check_vocabulary_rows`):
  its rows would go to the neighbouring tokens;
- the table's optimizer slots go with its rows when the previous checkpoint holds them under the
  same name (same optimizer) in one variable per table (layout A: CPU/GPU and TPUEmbedding);
  `continuous.carry_slots: false` keeps every slot fresh (the weights still carry over);
- every other weight (the dense network, its optimizer slots) is carried when its name and shape
  are unchanged; optimizer step counters and hyperparameters stay fresh (this run's config and
  length rule).
The previous tables are read with the exporter's layout reader, so a model trained on any layout
(SparseCore stacks, host partitions) starts this one; only its slots need layout A.

The drift between this run's data and the last blessed model's, which can stop the run before
it trains, is base_model.py's.
"""
from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import numpy as np
import tensorflow as tf
from tfx.utils import io_utils

from components.config.schema import PipelineConfig
from components.contracts import artifacts
from components.contracts.manifest import VocabularyEntry, VocabularyManifest
from components.contracts.plan import EmbeddingPlan
from components.contracts.statistics import EmbeddingStatistics
from components.embedding_model.checkpoint_keys import (CHECKPOINT_ROOT, OBJECT_GRAPH_KEY, SLOT_MARK, VARIABLE_VALUE,
                                                         table_checkpoint_key)
from components.embedding_model.model import RankingModel
from components.embedding_model.restore import open_checkpoint_tables
from components.embedding_model.unreadable import reading
from components.data_io.checksums import file_sha256
from components.config.choices import VocabularyKind

TOKEN_KINDS = ("counted", "list", "file")  # vocabularies whose rows are tokens (manifest kind)
# Kept fresh: optimizer step counters and hyperparameters (this run's config), the save counter.
OPTIMIZER_STATE = ("model/dense_optimizer/", "model/embedding_optimizer/", "model/table_embedding_optimizers/",
                   "save_counter/")
TOP_DROPPED = 5
WORK_PREFIX = ".warm_start_"  # the shards' directory beside the checkpoint, while it is written
# What to do when the last blessed model's checkpoint or vocabulary is cut short or damaged.
RESTORE_PREVIOUS = ("restore that model's files from the run that wrote them, or set continuous.warm_start: false "
                    "to train from scratch")


class WarmStartError(RuntimeError):
    """The last blessed model cannot start this run; says what is missing and the way out."""


@dataclass
class PreviousModel:
    """The last blessed Trainer Model: what a warm start and the drift check read from it.

    Attributes:
      uri: the Model artifact's directory.
      plan: its embedding plan.
      manifest: its preprocessing manifest (`vocabulary_dir`: its vocabularies).
      checkpoint: its final checkpoint's prefix.
      statistics: its training data's statistics, None when it has no copy.
    """

    uri: str
    plan: EmbeddingPlan
    manifest: VocabularyManifest
    checkpoint: str
    statistics: Optional[EmbeddingStatistics]


def previous_model(base_model: str) -> PreviousModel:
    """Reads the last blessed Trainer Model.

    Args:
      base_model: TFX's `fn_args.base_model` (the model's serving directory) or its artifact directory.

    Returns:
      The model's plan, manifest, checkpoint and statistics.

    Raises:
      WarmStartError: the directory holds no plan, manifest or checkpoint.
    """
    uri = base_model.rstrip("/")
    if os.path.basename(uri) == artifacts.SERVING_DIR:
        uri = os.path.dirname(uri)
    way_out = "set continuous.warm_start: false to train from scratch"

    def read(name: str) -> Optional[str]:
        path = os.path.join(uri, name)
        return io_utils.read_string_file(path) if tf.io.gfile.exists(path) else None

    plan_text, manifest_text = read(artifacts.PLAN_FILE), read(artifacts.EMBEDDING_MANIFEST_FILE)
    checkpoint = tf.train.latest_checkpoint(os.path.join(uri, artifacts.CHECKPOINT_DIR))
    if plan_text is None or manifest_text is None or checkpoint is None:
        raise WarmStartError(f"last blessed model {uri}: no plan, manifest or checkpoint (a Trainer Model of this pipeline?); {way_out}")
    stats_text = read(artifacts.EMBEDDING_STATISTICS_FILE)
    return PreviousModel(
        uri=uri,
        plan=EmbeddingPlan.from_json(plan_text, os.path.join(uri, artifacts.PLAN_FILE)),
        manifest=VocabularyManifest.from_json(manifest_text, os.path.join(uri, artifacts.EMBEDDING_MANIFEST_FILE)),
        checkpoint=checkpoint,
        statistics=EmbeddingStatistics.from_json(stats_text, artifacts.EMBEDDING_STATISTICS_FILE) if stats_text else None,
    )


# ---- vocabularies ---------------------------------------------------------------------------------


def read_lines(path: str) -> List[bytes]:
    """The lines of a file on any filesystem tf.io.gfile reads, as bytes without their newlines."""
    with tf.io.gfile.GFile(path, "rb") as fh:
        data = fh.read()
    return data.split(b"\n")[:-1] if data else []


def table_tokens(manifest: VocabularyManifest, table: str) -> Optional[List[bytes]]:
    """A table's vocabulary tokens, line i being row i.

    Args:
      manifest: the manifest that names the vocabulary.
      table: the vocabulary's table.

    Returns:
      The tokens, None for hashed and identity tables (no tokens).

    Raises:
      WarmStartError: the vocabulary file is gone.
    """
    entry = manifest.vocabulary(table)
    if entry.kind not in TOKEN_KINDS:
        return None
    path = os.path.join(manifest.vocabulary_dir, entry.file)
    if not tf.io.gfile.exists(path):
        raise WarmStartError(f"vocabulary of table {table!r} is gone: {path}; the last blessed model's preprocessing "
                             "output must stay readable for a warm start (or set continuous.warm_start: false)")
    return read_lines(path)


def table_counts(manifest: VocabularyManifest, table: str) -> Optional[Dict[bytes, float]]:
    """The train-split count of each token of a table's vocabulary.

    Args:
      manifest: the manifest that names the vocabulary.
      table: the vocabulary's table.

    Returns:
      {token: count} from its `<count> <token>` lines, None for a vocabulary without tokens or counts.
    """
    entry = manifest.vocabulary(table)
    path = os.path.join(manifest.vocabulary_dir, entry.counts_file)
    if entry.kind not in TOKEN_KINDS or not tf.io.gfile.exists(path):
        return None
    out: Dict[bytes, float] = {}
    for line in read_lines(path):
        count, _, token = line.partition(b" ")
        out[token] = float(count)
    return out


@dataclass
class RowMap:
    """Rows of this run's table taken from the previous one: new[i] <- old[i].

    Attributes:
      new: int64 row IDs in this run's table, shape [n].
      old: int64 row IDs in the previous table, shape [n].
      report: what carried over (tokens carried, new and dropped; OOV buckets).
    """

    new: np.ndarray
    old: np.ndarray
    report: Dict[str, Any]


def row_map(old: VocabularyEntry, old_tokens: Optional[List[bytes]], new: VocabularyEntry,
            new_tokens: Optional[List[bytes]]) -> RowMap:
    """Which rows carry over between two vocabularies of one table (module docstring's rules).

    Args:
      old: the previous vocabulary's entry.
      old_tokens: its tokens (None without tokens).
      new: this run's vocabulary's entry.
      new_tokens: its tokens (None without tokens).

    Returns:
      The row map and its report.
    """
    new_rows: List[int] = []
    old_rows: List[int] = []
    report: Dict[str, Any] = {"kind": new.kind, "rows": new.rows, "previous_rows": old.rows}
    if new.kind in TOKEN_KINDS and old.kind in TOKEN_KINDS:
        index = {t: i for i, t in enumerate(old_tokens)}
        for i, t in enumerate(new_tokens):
            j = index.get(t)
            if j is not None:
                new_rows.append(i)
                old_rows.append(j)
        carried = len(new_rows)
        present = set(new_tokens)
        dropped = [t for t in old_tokens if t not in present]  # most frequent first (vocabulary order)
        report.update(tokens_carried=carried, tokens_new=len(new_tokens) - carried, tokens_dropped=len(dropped),
                      dropped_examples=[t.decode("utf-8", "replace") for t in dropped[:TOP_DROPPED]])
    elif new.kind == old.kind == VocabularyKind.IDENTITY:
        n = min(old.size, new.size)
        new_rows, old_rows = list(range(n)), list(range(n))
        report.update(ids_carried=n)
    elif new.kind != old.kind:
        report.update(fresh=f"vocabulary kind changed from {old.kind} to {new.kind}")
    same_family = (new.kind in TOKEN_KINDS and old.kind in TOKEN_KINDS) or new.kind == old.kind
    if same_family and (new.num_oov_buckets or old.num_oov_buckets):
        if new.num_oov_buckets == old.num_oov_buckets:
            new_rows += [new.size + b for b in range(new.num_oov_buckets)]
            old_rows += [old.size + b for b in range(old.num_oov_buckets)]
            report["oov_buckets"] = f"{new.num_oov_buckets} carried"
        else:
            report["oov_buckets"] = f"fresh: {old.num_oov_buckets} buckets before, {new.num_oov_buckets} now"
    report["rows_carried"] = len(new_rows)
    return RowMap(np.asarray(new_rows, np.int64), np.asarray(old_rows, np.int64), report)


# ---- the warm-start checkpoint -------------------------------------------------------------------


def table_key_prefixes(plan: EmbeddingPlan) -> Dict[str, str]:
    """Each table's variable's object path in a training checkpoint.

    Args:
      plan: the embedding plan (tables and placements).

    Returns:
      {table: object path}; a table's slots hang under it (`.OPTIMIZER_SLOT/...`).
    """
    return {t: table_checkpoint_key(t, p.placement)[: -len(VARIABLE_VALUE)] for t, p in plan.tables.items()}


def warm_start_checkpoint(prev: PreviousModel, cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest,
                          fresh: RankingModel, out_prefix: str) -> Dict[str, Any]:
    """Writes at `out_prefix` a training checkpoint of `fresh` (this run's model, built, its
    optimizer slots created, on the host) holding the previous model's weights where they carry
    over (module docstring). Returns the carry-over report. One table (and its slots) is in memory
    at a time: each is written as its own checkpoint shard, and the shards are merged.

    Args:
      prev: the last blessed model.
      cfg: the pipeline config (`continuous.carry_slots`).
      plan: this run's embedding plan.
      manifest: this run's manifest.
      fresh: this run's model, built, its optimizer slots created, on the host.
      out_prefix: where the checkpoint is written.

    Returns:
      The carry-over report: per table, the dense weights, and rows carried out of all rows.
    """
    out_dir = os.path.dirname(out_prefix)
    tf.io.gfile.makedirs(out_dir)
    # The shards are written beside the checkpoint, not under $TMPDIR: MergeV2Checkpoints renames
    # them into place, which fails across filesystems ("Invalid cross-device link" where /tmp is a
    # tmpfs). Removed on success and on failure alike.
    work = os.path.join(out_dir, f"{WORK_PREFIX}{uuid.uuid4().hex}")
    tf.io.gfile.makedirs(work)
    try:
        shards, report = _carried_shards(prev, cfg, plan, manifest, fresh, work)
        tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=shards, destination_prefix=out_prefix, delete_old_dirs=True)
    finally:
        if tf.io.gfile.exists(work):
            tf.io.gfile.rmtree(work)
    totals = [t for t in report["tables"].values()]
    report["rows_carried"] = int(sum(t.get("rows_carried", 0) for t in totals))
    report["rows"] = int(sum(t["rows"] for t in totals))
    return report


def _carried_shards(prev: PreviousModel, cfg: PipelineConfig, plan: EmbeddingPlan, manifest: VocabularyManifest,
                    fresh: RankingModel, work: str) -> Tuple[List[str], Dict[str, Any]]:
    """The warm-start checkpoint's shards under `work`, one per table (and one for the rest), and
    the carry-over report (warm_start_checkpoint)."""
    # `save`, not `write`: the trainer's checkpoint object has a save counter to bind too.
    fresh_prefix = tf.train.Checkpoint(**{CHECKPOINT_ROOT: fresh}).save(os.path.join(work, "fresh"))
    new_reader = tf.train.load_checkpoint(fresh_prefix)
    with _reading_previous(prev):
        old_reader = tf.train.load_checkpoint(prev.checkpoint)
        old_tables = open_checkpoint_tables(prev.checkpoint, prev.plan, way_out=RESTORE_PREVIOUS)
    new_shapes, new_dtypes = new_reader.get_variable_to_shape_map(), new_reader.get_variable_to_dtype_map()
    old_shapes = old_reader.get_variable_to_shape_map()
    new_prefixes, old_prefixes = table_key_prefixes(plan), table_key_prefixes(prev.plan)

    groups: Dict[str, List[str]] = {}  # table ("" for the rest) -> its keys
    for key in sorted(new_shapes):
        table = next((t for t, p in new_prefixes.items() if key.startswith(p + "/")), "")
        groups.setdefault(table, []).append(key)

    report: Dict[str, Any] = {"from_model": prev.uri, "from_checkpoint": prev.checkpoint, "tables": {}}
    shards: List[str] = []
    for table, keys in sorted(groups.items()):
        values: Dict[str, np.ndarray] = {}
        with _reading_previous(prev):  # the previous checkpoint's values are read here
            if table:
                values, report["tables"][table] = _carry_table(table, keys, prev, manifest, plan, new_reader, old_reader,
                                                             old_shapes, old_tables, new_prefixes[table],
                                                             old_prefixes.get(table), carry_slots=cfg.continuous.carry_slots)
            else:
                values, report["dense"] = _carry_rest(keys, new_reader, old_reader, old_shapes, cfg.continuous.carry_slots)
        shard = os.path.join(work, f"shard_{len(shards)}")
        names = sorted(values)
        tf.raw_ops.SaveV2(prefix=shard, tensor_names=names, shape_and_slices=[""] * len(names),
                          tensors=[tf.constant(values[n], dtype=new_dtypes[n]) for n in names])
        shards.append(shard)
        del values
    return shards, report


def _reading_previous(prev: PreviousModel):
    """Reads of the last blessed model's checkpoint: one that is cut short or damaged stops the run
    with WarmStartError naming it (unreadable.py)."""
    return reading(prev.checkpoint, f"the last blessed model's checkpoint (model {prev.uri})", RESTORE_PREVIOUS,
                   WarmStartError)


def check_vocabulary_rows(manifest: VocabularyManifest, table: str, tokens: List[bytes], rows: int, whose: str,
                          held_by: str, way_out: str = RESTORE_PREVIOUS) -> None:
    """Refuses a vocabulary file that is not the one its model's rows follow.

    Row i of a token table is line i of its vocabulary file and the OOV buckets follow
    (planning.sizing.table_rows): a file a line short (cut short, edited, another run's) would
    carry every row to its neighbour's token without a word, and so would the same lines in
    another order. The file's content is checked against the SHA-256 its manifest records (a
    manifest from before it was recorded: its lines against the rows only).

    Args:
      manifest: the manifest naming the file.
      table: the vocabulary's table.
      tokens: the file's lines (`table_tokens`).
      rows: the table's rows in that model.
      whose: whose vocabulary this is, as the message names it ("the last blessed model's").
      held_by: what holds the rows, as the message names it ("checkpoint <prefix>").
      way_out: what to do, as the message ends.

    Raises:
      WarmStartError: the content is not the recorded one, or lines + OOV buckets != rows; one line
        naming the file, what differs and the way out.
    """
    entry = manifest.vocabulary(table)
    path = os.path.join(manifest.vocabulary_dir, entry.file)
    if len(tokens) + entry.num_oov_buckets == rows:
        if entry.sha256 and file_sha256(path, lambda p: tf.io.gfile.GFile(p, "rb")) != entry.sha256:
            raise WarmStartError(
                f"vocabulary file {path} ({whose}, table {table!r}) has the lines {held_by} holds rows for, but "
                f"not the bytes preprocessing wrote: its SHA-256 differs from the one its manifest records "
                f"({entry.sha256[:12]}...), so it was edited, reordered or replaced, and its rows would carry to "
                f"the wrong tokens; {way_out}")
        return
    raise WarmStartError(
        f"vocabulary file {path} ({whose}, table {table!r}) has {len(tokens)} lines but {held_by} holds "
        f"{rows} rows for it ({rows - entry.num_oov_buckets} tokens + {entry.num_oov_buckets} OOV buckets): the file "
        f"is cut short or not the one the model was trained with, and its rows would carry to the wrong tokens; "
        f"{way_out}")


def _carry_table(table, keys, prev, manifest, plan, new_reader, old_reader, old_shapes, old_tables, new_prefix, old_prefix,
                 carry_slots=True):
    values = {k: new_reader.get_tensor(k) for k in keys}
    # rows follow the table's vocabulary (a wide table's is its deep table's)
    vocab = plan.vocabulary_table(table)
    new_entry, rows, dim = manifest.vocabulary(vocab), plan.tables[table].rows, plan.tables[table].dim
    old_vocab = prev.plan.vocabulary_table(table) if table in prev.plan.tables else None
    if old_vocab is None or old_vocab not in prev.manifest.vocabularies:
        return values, {"rows": rows, "rows_carried": 0, "fresh": "table new in this run"}
    old_plan_table, old_entry = prev.plan.tables[table], prev.manifest.vocabulary(old_vocab)
    if old_plan_table.dim != dim:
        return values, {"rows": rows, "rows_carried": 0, "fresh": f"dim changed from {old_plan_table.dim} to {dim}"}
    old_tokens, new_tokens = table_tokens(prev.manifest, old_vocab), table_tokens(manifest, vocab)
    if old_tokens is not None:  # the rows of the previous checkpoint's table, as its reader finds them
        check_vocabulary_rows(prev.manifest, old_vocab, old_tokens, int(old_tables.sources[table].rows),
                              "the last blessed model's", f"its checkpoint {prev.checkpoint}")
    if new_tokens is not None:  # this run's model's rows
        check_vocabulary_rows(manifest, vocab, new_tokens, rows, "this run's", "this run's embedding plan",
                              "rerun preprocessing (a local run: without the cache, `--no-cache`)")
    mapping = row_map(old_entry, old_tokens, new_entry, new_tokens)
    report = dict(mapping.report, slots_carried=[], slots_fresh=[])
    for key in keys:
        suffix = key[len(new_prefix):]
        if suffix == VARIABLE_VALUE:
            old = old_tables.read(table)
        else:
            old_key = (old_prefix or "") + suffix
            slot = suffix.split("/")[-3] if suffix.count("/") >= 3 else suffix
            if not carry_slots or old_prefix is None or old_shapes.get(old_key) != [old_entry.rows, dim]:
                report["slots_fresh"].append(slot)
                continue
            old = old_reader.get_tensor(old_key)
            report["slots_carried"].append(slot)
        if len(mapping.new):
            values[key][mapping.new] = old[mapping.old]
        del old
    return values, report


def _carry_rest(keys, new_reader, old_reader, old_shapes, carry_slots=True):
    """Everything but the tables: the dense network's weights and their optimizer slots carried
    where name and shape are unchanged; optimizer counters and hyperparameters fresh."""
    values: Dict[str, np.ndarray] = {}
    report: Dict[str, Any] = {"weights_carried": 0, "slots_carried": 0, "slots_fresh": 0, "weights_fresh": []}
    for key in keys:
        value = new_reader.get_tensor(key)
        if key != OBJECT_GRAPH_KEY and not key.startswith(OPTIMIZER_STATE):
            slot = SLOT_MARK in key
            if (carry_slots or not slot) and old_shapes.get(key) == list(np.shape(value)):
                value = old_reader.get_tensor(key)
                report["slots_carried" if slot else "weights_carried"] += 1
            elif slot:
                report["slots_fresh"] += 1
            else:
                report["weights_fresh"].append(key.replace(VARIABLE_VALUE, ""))
        values[key] = value
    return values, report


# ---- drift ----------------------------------------------------------------------------------------
