"""The model registry kept at the push destination: which model is served there, and how it was made.

The pipeline's last blessed model (the gate's reference and the Trainer's warm start) is read from
here by a container step (`LastBlessedModel`), not from ML Metadata: the same code decides on the
local LocalDagRunner, open-source Kubeflow Pipelines (whose backend runs no resolver executors) and
Vertex AI Pipelines, and the answer is about what is actually served, whichever pipeline,
compilation or metadata store pushed it.

Layout of the push destination (the Pusher's filesystem `base_directory`):

    <serving_dir>/<version>/                 a pushed SavedModel; TF Serving loads the newest
                                             version directory (names that are integers)
    <serving_dir>/_registry/<version>.json   its registry entry (TF Serving ignores the folder:
                                             its name is no integer)

Push order (`push`): a new version directory (after every version and entry there), then every
file of the model except `saved_model.pb` (never overwriting a file), then the entry is
written (whole: a temporary name, then a rename), then `saved_model.pb` (also under a temporary
name, then renamed), the file TF Serving and TFX's own Pusher treat as "this version is complete".
With an export's `store/` (export.store), it is copied into the version and its delta against the
served version's row files written there (`store/delta/`) before the entry, so before
`saved_model.pb` too. So a version TF Serving can load has its entry, unless something other than this pipeline's Pusher
wrote it, and a push cut short leaves a version nothing loads. A push that fails with an error
takes its entry and its version directory back out (`_withdraw`): only a process killed mid-push
leaves such a version, which the lookup skips.

Lookup (`lookup`): the served model is the newest version directory that holds `saved_model.pb`.
- no such version, no entry: nothing pushed yet (a first run); found nothing.
- the newest servable version has a valid entry: found.
- it has no entry, or an entry that cannot be read (half-written, not this format, a field of the
  wrong type), or a child's name TF Serving reads as a version and this registry cannot (`0042`):
  RegistryError, one line naming the path and the way out. The gate cannot compare with a model it knows nothing
  about, and nothing is pushed on a guess.
- entries whose version directory is gone (deleted) or has no `saved_model.pb` (a push that did
  not finish): skipped, each with its reason in the result.
- the found entry's Trainer model directory is gone: found (the gate compares with the served
  model), but no warm start: `warm_start_model` is None, with the reason.

Only the file system is used (TensorFlow's gfile through TFX's `fileio`, so gs:// works too).
"""
from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from components.contracts.artifacts import STORE_DIR

REGISTRY_DIR = "_registry"
ENTRY_FORMAT = 1
SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")  # what makes a version loadable
LOOKUP_FILE = "last_blessed.json"  # inside the LastBlessedModel output artifact
# Every entry has these (the rest is information for people and later runs).
REQUIRED_KEYS = ("format", "version", "serving_model", "trainer_model", "eval_auc", "pipeline", "run", "pushed_at")


class RegistryError(RuntimeError):
    """The push destination's registry cannot say which model is served; names the path and the way out."""


def _fileio():
    """TFX's file I/O: TensorFlow's file systems (local, gs://, ...)."""
    # lazy: it loads TensorFlow; the run summary reads the registry on the command line's path
    from tfx.dsl.io import fileio

    return fileio


def registry_dir(serving_dir: str) -> str:
    """Gives the folder of a push destination's registry entries.

    Args:
      serving_dir: the push destination.

    Returns:
      `<serving_dir>/_registry`.
    """
    return os.path.join(serving_dir, REGISTRY_DIR)


def entry_path(serving_dir: str, version: str) -> str:
    """Gives the path of a version's registry entry.

    Args:
      serving_dir: the push destination.
      version: the version's directory name.

    Returns:
      `<serving_dir>/_registry/<version>.json`.
    """
    return os.path.join(registry_dir(serving_dir), f"{version}.json")


def _children(path: str) -> List[str]:
    fio = _fileio()
    if not fio.isdir(path):
        return []
    return [c.rstrip("/") for c in fio.listdir(path)]


def _version_name(name: str) -> Optional[int]:
    """The version a directory or entry name stands for: plain ASCII digits in canonical form only
    (`0042` or a non-ASCII digit is no version of ours: TF Serving would read `0042` as 42, whose
    directory is another name), None otherwise."""
    if name.isascii() and name.isdigit() and str(int(name)) == name:
        return int(name)
    return None


def versions(serving_dir: str) -> List[int]:
    """Lists the version directories at a push destination, oldest first.

    Args:
      serving_dir: the push destination.

    Returns:
      The versions: children whose names are canonical integers, as TF Serving reads them.
    """
    return sorted(v for v in map(_version_name, _children(serving_dir)) if v is not None)


def odd_names(serving_dir: str) -> List[str]:
    """Lists children TF Serving may read as versions but this registry cannot (`0042`); lookup refuses them.

    Args:
      serving_dir: the push destination.

    Returns:
      Their names, sorted.
    """
    return sorted(c for c in _children(serving_dir)
                  if c.isascii() and c.isdigit() and _version_name(c) is None)


def is_servable(version_dir: str) -> bool:
    """Tells whether a version directory holds a complete SavedModel.

    Args:
      version_dir: `<serving_dir>/<version>`.

    Returns:
      True when it holds `saved_model.pb` or `saved_model.pbtxt`.
    """
    fio = _fileio()
    return any(fio.exists(os.path.join(version_dir, f)) for f in SAVED_MODEL_FILES)


def servable_versions(serving_dir: str, on_disk: List[int]) -> List[int]:
    """Of the version directories `on_disk` (`versions`), those TF Serving loads, oldest first."""
    return [v for v in on_disk if is_servable(os.path.join(serving_dir, str(v)))]


def entry_versions(serving_dir: str) -> List[int]:
    """Lists the versions that have an entry file, oldest first.

    Args:
      serving_dir: the push destination.

    Returns:
      The versions, as ints.
    """
    out = []
    for c in _children(registry_dir(serving_dir)):
        stem, ext = os.path.splitext(c)
        if ext == ".json" and _version_name(stem) is not None:
            out.append(int(stem))
    return sorted(out)


def read_entry(serving_dir: str, version: int) -> Dict[str, Any]:
    """Reads and checks a version's registry entry.

    Args:
      serving_dir: the push destination.
      version: the version.

    Returns:
      The entry, with every key of `REQUIRED_KEYS` of the right type.

    Raises:
      RegistryError: the entry is missing, half-written, of another format, names another
        version, or has a field of the wrong type (the message names the file).
    """
    path = entry_path(serving_dir, str(version))
    fio = _fileio()
    if not fio.exists(path):
        raise RegistryError(f"{path}: no registry entry")
    with fio.open(path, "r") as fh:
        text = fh.read()
    try:
        entry = json.loads(text)
    except ValueError as e:
        raise RegistryError(f"{path}: not valid JSON ({e}; {len(text)} bytes): a half-written entry") from None
    if not isinstance(entry, dict):
        raise RegistryError(f"{path}: not a registry entry (a JSON {type(entry).__name__}, not an object)")
    missing = [k for k in REQUIRED_KEYS if k not in entry]
    if missing:
        raise RegistryError(f"{path}: incomplete registry entry, missing {', '.join(missing)}")
    if entry["format"] != ENTRY_FORMAT:
        raise RegistryError(f"{path}: registry entry format {entry['format']!r}; this version reads format {ENTRY_FORMAT}")
    if str(entry["version"]) != str(version):
        raise RegistryError(f"{path}: says version {entry['version']!r}, but its file name says {version}")
    for key, kinds, what in (("run", (dict,), "an object"), ("trainer_model", (str,), "a path"),
                             ("serving_model", (str,), "a path"), ("pipeline", (str,), "a name"),
                             ("eval_auc", (int, float), "a number")):
        if not isinstance(entry[key], kinds) or isinstance(entry[key], bool):
            raise RegistryError(f"{path}: {key} is {entry[key]!r}, not {what}")
    return entry


@dataclass
class Lookup:
    """What the push destination serves, as the gate and the warm start need it (`lookup` builds it).

    Attributes:
      serving_dir: the push destination.
      found: whether a servable version with a valid entry was found.
      note: one line saying what was found, for the logs.
      version: the served version's name, or None.
      served_model: `<serving_dir>/<version>`, the SavedModel TF Serving loads, or None.
      entry: the served version's registry entry, or None.
      warm_start_model: the Trainer model to warm-start from; None when none is usable.
      warm_start_note: why there is no warm start although a model is served, or None.
      skipped: entries and version directories passed over, each `{path, reason}`.
    """

    serving_dir: str
    found: bool
    note: str
    version: Optional[str] = None
    served_model: Optional[str] = None  # <serving_dir>/<version>: the SavedModel TF Serving loads
    entry: Optional[Dict[str, Any]] = None
    warm_start_model: Optional[str] = None  # the Trainer model to warm-start from (None: none usable)
    warm_start_note: Optional[str] = None
    skipped: List[Dict[str, str]] = field(default_factory=list)  # [{path, reason}]

    def to_dict(self) -> Dict[str, Any]:
        """Gives the lookup as a JSON-ready dict, the form `last_blessed.json` holds."""
        return {k: getattr(self, k) for k in (
            "serving_dir", "found", "note", "version", "served_model", "entry", "warm_start_model",
            "warm_start_note", "skipped")}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Lookup":
        """Rebuilds a lookup from `to_dict`'s form.

        Args:
          d: the dict; keys it lacks are None (`skipped`: empty).

        Returns:
          The lookup.
        """
        return cls(**{k: d.get(k) for k in (
            "serving_dir", "found", "note", "version", "served_model", "entry", "warm_start_model",
            "warm_start_note")}, skipped=list(d.get("skipped") or []))


def lookup(serving_dir: str) -> Lookup:
    """Finds the served model at a push destination and its registry entry (the module docstring gives the rules).

    Args:
      serving_dir: the push destination.

    Returns:
      The lookup: `found` False when nothing servable was pushed yet; `warm_start_model` None
      (with `warm_start_note`) when the entry's Trainer model is gone; entries skipped, with reasons.

    Raises:
      RegistryError: the served version has no readable entry, or a child's name TF Serving
        reads as a version and this registry cannot (`0042`).
    """
    fio = _fileio()
    serving_dir = serving_dir.rstrip("/")
    reg = registry_dir(serving_dir)
    _refuse_odd_names(serving_dir)
    on_disk = versions(serving_dir)
    servable = servable_versions(serving_dir, on_disk)
    newest = servable[-1] if servable else None
    skipped = _skipped_versions(serving_dir, on_disk, servable, newest)
    if newest is None:
        if not fio.isdir(reg) and not on_disk:
            note = f"no model pushed to {serving_dir} yet (no registry at {reg}): nothing to compare with"
        else:
            note = f"no servable model at {serving_dir}: nothing to compare with"
        return Lookup(serving_dir, False, note, skipped=skipped)
    vdir = os.path.join(serving_dir, str(newest))
    entry = _served_entry(serving_dir, newest)
    warm, warm_note = entry["trainer_model"], None
    if not warm or not fio.isdir(warm):
        warm_note = (f"the Trainer model {warm!r} of the served version {newest} is gone (deleted with its pipeline "
                     "root?): no warm start, trained from scratch; the gate still compares with the served model")
        warm = None
    return Lookup(serving_dir, True, f"version {newest} of {serving_dir}, pushed by run {entry['run'].get('id')!r} "
                  f"of pipeline {entry['pipeline']!r}", version=str(newest), served_model=vdir, entry=entry,
                  warm_start_model=warm, warm_start_note=warm_note, skipped=skipped)


def _refuse_odd_names(serving_dir: str) -> None:
    """Raises RegistryError when a child's name TF Serving reads as a version and this registry cannot (`0042`)."""
    odd = odd_names(serving_dir)
    if odd:
        raise RegistryError(
            f"{serving_dir}: {', '.join(odd)}: TF Serving reads such names as versions, this registry does not; "
            f"rename each to its number without leading zeros (with its registry entry) or move it out of {serving_dir}")


def _skipped_versions(
    serving_dir: str, on_disk: List[int], servable: List[int], newest: Optional[int]
) -> List[Dict[str, str]]:
    """The entries newer than the served version and the unfinished versions without an entry, each `{path, reason}`."""
    fio = _fileio()
    skipped: List[Dict[str, str]] = []
    for v in reversed(entry_versions(serving_dir)):
        if newest is not None and v <= newest:
            continue  # older than the served version: history, not skipped
        vdir = os.path.join(serving_dir, str(v))
        why = ("its model directory was deleted" if v not in on_disk
               else "its model directory has no saved_model.pb (a push that did not finish)")
        skipped.append({"path": entry_path(serving_dir, str(v)),
                        "reason": f"{why}: {vdir} is not served; skipped"})
    for v in on_disk:
        if v not in servable and not fio.exists(entry_path(serving_dir, str(v))):
            skipped.append({"path": os.path.join(serving_dir, str(v)),
                            "reason": "no saved_model.pb and no registry entry (a push that did not finish): "
                                      "not served; skipped"})
    return skipped


def _served_entry(serving_dir: str, newest: int) -> Dict[str, Any]:
    """The served version's entry; RegistryError, with the way out, when it is missing or unreadable."""
    vdir = os.path.join(serving_dir, str(newest))
    path = entry_path(serving_dir, str(newest))
    way_out = (f"if {vdir} is this pipeline's model, its push did not finish: delete {vdir} (and {path}) so the "
               f"version before it is served again, then rerun; a model another tool pushed must be moved out of "
               f"{serving_dir}, or push this pipeline to an empty destination (kubeflow.serving_dir)")
    if not _fileio().exists(path):
        raise RegistryError(
            f"{vdir} is served (the newest version with saved_model.pb) but has no registry entry {path}: "
            f"the gate cannot compare with a model it knows nothing about; {way_out}")
    try:
        return read_entry(serving_dir, newest)
    except RegistryError as e:
        raise RegistryError(f"{e}; {vdir} is served but cannot be described; {way_out}") from None


def history(serving_dir: str) -> List[Dict[str, Any]]:
    """Lists every version and entry at a push destination with its state, newest first.

    Args:
      serving_dir: the push destination.

    Returns:
      One dict per version: `version`, `model`, `on_disk`, `servable`, `state` (`served`,
      `history`, `deleted` or `unfinished`), and `entry`, or `error` when it cannot be read.
    """
    serving_dir = serving_dir.rstrip("/")
    on_disk = set(versions(serving_dir))
    rows = []
    for v in sorted(set(entry_versions(serving_dir)) | on_disk, reverse=True):
        vdir = os.path.join(serving_dir, str(v))
        row: Dict[str, Any] = {"version": v, "model": vdir, "on_disk": v in on_disk,
                               "servable": v in on_disk and is_servable(vdir)}
        try:
            row["entry"] = read_entry(serving_dir, v)
        except RegistryError as e:
            row["error"] = str(e)
        rows.append(row)
    newest = next((r for r in rows if r["servable"]), None)
    for r in rows:
        if not r["on_disk"]:
            r["state"] = "deleted"
        elif not r["servable"]:
            r["state"] = "unfinished"
        else:
            r["state"] = "served" if r is newest else "history"
    return rows


def next_version(serving_dir: str, now: Optional[float] = None) -> int:
    """Chooses a version after every existing one.

    That is the push time in seconds (TFX's UNIX_TIMESTAMP rule), or one more than the newest
    version or entry when that is later: with two pushes in one second, TFX's Pusher would skip
    the copy and still report the second model as pushed.

    Args:
      serving_dir: the push destination.
      now: the push time in seconds since the epoch; None is the current time.

    Returns:
      The new version.
    """
    latest = max(versions(serving_dir) + entry_versions(serving_dir), default=0)
    return max(int(time.time() if now is None else now), latest + 1)


def _write_whole(path: str, text: str) -> None:
    """`text` at `path`, appearing whole or not at all (a temporary name, then a rename)."""
    fio = _fileio()
    fio.makedirs(os.path.dirname(path))
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex[:8]}")
    with fio.open(tmp, "w") as fh:
        fh.write(text)
    fio.rename(tmp, path, overwrite=False)


def _copy_tree(src: str, dst: str, skip_top: Tuple[str, ...]) -> None:
    """Every file under `src` into `dst` (which exists), but the top-level files named in `skip_top`.
    By hand: TFX's io_utils.copy_dir first deletes an existing destination, which would undo the
    version claim `push` made with mkdir."""
    fio = _fileio()
    for root, _, files in fio.walk(src):
        rel = os.path.relpath(root, src)
        target = dst if rel == "." else os.path.join(dst, rel)
        fio.makedirs(target)
        for name in files:
            if rel == "." and name in skip_top:
                continue
            fio.copy(os.path.join(root, name), os.path.join(target, name), overwrite=False)


def _claim(serving_dir: str, now: Optional[float]) -> Tuple[int, str]:
    """A new, empty version directory. TensorFlow's file systems offer no atomic create-if-absent
    (gfile.mkdir succeeds on an existing directory, GCS has no directories), so this checks and then
    creates: two pushes to one destination in the same instant are not serialised (one run at a
    time per destination, e.g. KFP's max_concurrency 1 for a recurring run); copies never overwrite."""
    fio = _fileio()
    version = next_version(serving_dir, now)
    vdir = os.path.join(serving_dir, str(version))
    if fio.exists(vdir):
        raise RegistryError(f"{vdir} appeared while this push chose it: another push is under way at {serving_dir}; "
                            "rerun this one after it")
    fio.makedirs(vdir)
    return version, vdir


STORE_ROWS, STORE_DELTA = "rows", "delta"  # under artifacts.STORE_DIR


def _served_dir(serving_dir: str) -> Optional[str]:
    """The newest servable version directory (what `lookup` serves), or None."""
    servable = servable_versions(serving_dir, versions(serving_dir))
    return os.path.join(serving_dir, str(servable[-1])) if servable else None


def _push_store(store_dir: str, vdir: str, previous: Optional[str], beam_args: Optional[List[str]]) -> Dict[str, Any]:
    """Copies an export's `store/` into the version, then writes its delta against the served
    version's row files (row_delta.py) beside them; the entry's `store` section."""
    # The registry's importers (the summary; the runner, before it quiets TensorFlow's logs) must
    # not load TensorFlow, which the row files do.
    # lazy: TensorFlow only for a push with a store
    from components.data_io import row_delta, row_files, row_files_beam

    target = os.path.join(vdir, STORE_DIR)
    _fileio().makedirs(target)
    _copy_tree(store_dir, target, ())
    rows = row_files.read_manifest(os.path.join(target, STORE_ROWS))
    base = os.path.join(previous, STORE_DIR, STORE_ROWS) if previous else None
    if base is None or not _fileio().exists(os.path.join(base, row_files.ROWS_MANIFEST_FILE)):
        return {"rows": rows["rows"], "row_file_bytes": rows["bytes"], "delta": None,
                "delta_reason": "no row files in the served version: load the full rows"}
    try:
        d = row_delta.write_delta(base, os.path.join(target, STORE_ROWS), os.path.join(target, STORE_DELTA),
                                  run=row_files_beam.delta_runner(beam_args) if beam_args is not None else None)
    except row_delta.NoDelta as e:
        return {"rows": rows["rows"], "row_file_bytes": rows["bytes"], "delta": None, "delta_reason": str(e)}
    return {"rows": rows["rows"], "row_file_bytes": rows["bytes"], "delta": {
        "base_version": os.path.basename(previous.rstrip("/")), "bytes": d["bytes"], "bytes_vs_full": d["bytes_vs_full"],
        "tables": {n: {k: t[k] for k in ("changed", "new", "deleted", "unchanged")} for n, t in d["tables"].items()}}}


def push(model_dir: str, serving_dir: str, entry: Dict[str, Any], now: Optional[float] = None,
         store_dir: Optional[str] = None, store_beam_args: Optional[List[str]] = None) -> Dict[str, Any]:
    """Copies a SavedModel to a new version at a push destination and registers it.

    The module docstring gives the order of the writes.

    Args:
      model_dir: the SavedModel to push.
      serving_dir: the push destination.
      entry: the entry's fields, all but `format`, `version`, `serving_model` and `pushed_at`.
      now: the push time in seconds since the epoch; None is the current time.
      store_dir: the export's `store/` (row files and dense model), pushed into the version as
        `store/` with `store/delta/` against the served version's row files, before the entry and
        `saved_model.pb`; None: none.
      store_beam_args: Beam options to write the delta with (one shard pair per work item); None:
        in this process.

    Returns:
      The entry written.

    Raises:
      RegistryError: `model_dir` has no saved_model.pb, or another push claimed the version.
      ValueError: `entry` lacks a required field.
    """
    fio = _fileio()
    serving_dir = serving_dir.rstrip("/")
    present = [f for f in SAVED_MODEL_FILES if fio.exists(os.path.join(model_dir, f))]
    if not present:
        raise RegistryError(f"{model_dir}: no saved_model.pb; nothing to push")
    missing = [k for k in REQUIRED_KEYS if k not in entry and k not in ("format", "version", "serving_model", "pushed_at")]
    if missing:
        raise ValueError(f"registry entry without {', '.join(missing)}")
    previous = _served_dir(serving_dir) if store_dir else None
    version, vdir = _claim(serving_dir, now)
    full = dict(entry, format=ENTRY_FORMAT, version=str(version), serving_model=vdir,
                pushed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now if now is not None else time.time())))
    try:
        _copy_tree(model_dir, vdir, SAVED_MODEL_FILES)
        if store_dir:
            full["store"] = _push_store(store_dir, vdir, previous, store_beam_args)
        _write_whole(entry_path(serving_dir, str(version)), json.dumps(full, indent=2, sort_keys=True))
        for name in present:  # last, each whole: the version becomes loadable only now
            tmp = os.path.join(vdir, f".{name}.tmp-{uuid.uuid4().hex[:8]}")
            fio.copy(os.path.join(model_dir, name), tmp, overwrite=False)
            fio.rename(tmp, os.path.join(vdir, name), overwrite=False)
    except BaseException:
        _withdraw(serving_dir, version)
        raise
    return full


def _withdraw(serving_dir: str, version: int) -> None:
    """Takes a push that failed back out, entry first, so that no version it began stays registered
    (best effort: a process killed mid-push leaves a version without saved_model.pb, which the
    lookup skips)."""
    fio = _fileio()
    for path in (entry_path(serving_dir, str(version)), os.path.join(serving_dir, str(version))):
        try:
            if fio.isdir(path):
                fio.rmtree(path)
            elif fio.exists(path):
                fio.remove(path)
        except Exception:  # noqa: BLE001  (the push's own error is what the run reports)
            logging.warning("could not remove %s after a failed push", path)


def write_lookup(artifact_dir: str, found: Lookup) -> None:
    """Writes a lookup into a LastBlessedModel artifact, whole or not at all.

    Args:
      artifact_dir: the artifact's directory.
      found: the lookup, written as `last_blessed.json`.
    """
    _write_whole(os.path.join(artifact_dir, LOOKUP_FILE), json.dumps(found.to_dict(), indent=2, sort_keys=True))


def read_lookup(path: str) -> Optional[Lookup]:
    """Reads the lookup a LastBlessedModel artifact holds.

    Args:
      path: the artifact's directory, or TFX's serving path inside it (as a Trainer's
        `base_model` is given).

    Returns:
      The lookup, or None when `path` is no such artifact.
    """
    fio = _fileio()
    path = path.rstrip("/")
    for d in (path, os.path.dirname(path)):
        f = os.path.join(d, LOOKUP_FILE)
        if fio.exists(f):
            with fio.open(f, "r") as fh:
                return Lookup.from_dict(json.loads(fh.read()))
    return None
