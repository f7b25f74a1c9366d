"""Checkpoints and SavedModels of an earlier step or run that cannot be read: one line naming the file.

A file cut short (a copy or an upload that did not finish, a full disk) or damaged reaches
TensorFlow's readers as errors that name no file and say nothing of what to do: `IndexError: Read
less bytes than requested` (the reader's OUT_OF_RANGE status through pybind), `DataLossError` (a
checksum that does not match), an `OpError` of unknown code (`not an sstable (bad magic number)`),
an `OSError` or `ValueError` for a SavedModel whose graph does not parse. `reading` turns exactly
those into one line naming the file, what it is and the way out; every other error (a checkpoint of
another model: shapes or objects that do not match) passes through to the caller's own checks.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Type

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import tensorflow as tf


class UnreadableFile(RuntimeError):
    """A checkpoint or SavedModel an earlier step wrote is cut short or damaged; names it and the way out."""


# What TensorFlow's readers say of a file cut short, damaged or partly gone (lower case). Errors of
# the generic types (IndexError, OSError, ValueError, OpError) count only with one of these.
DAMAGE_MARKS = (
    "read less bytes",  # a data file cut short (tensor_bundle.cc)
    "sstable",  # an .index file cut short or overwritten (not an sstable / too short to be an sstable)
    "checksum",  # a tensor's bytes changed
    "unable to read file",  # an .index file that does not parse
    "corrupt",
    "truncated",
    "end of file",
    "no such file",  # a data shard of the checkpoint is gone
    "cannot parse file",  # saved_model.pb cut short
    "error parsing message",
    "0 metagraphs",  # an empty saved_model.pb
)


def is_damage(err: BaseException) -> bool:
    """Whether an error raised while reading a checkpoint or SavedModel says the file is cut short or damaged.

    Args:
      err: the error.

    Returns:
      True for DataLossError and OutOfRangeError, and for IndexError, OSError, ValueError and other
      OpErrors whose message is one of DAMAGE_MARKS; False for everything else (a mismatch of
      shapes or objects, a bug).
    """
    if isinstance(err, (tf.errors.DataLossError, tf.errors.OutOfRangeError)):
        return True
    if not isinstance(err, (IndexError, OSError, ValueError, tf.errors.OpError)):
        return False
    text = str(err).lower()
    return any(mark in text for mark in DAMAGE_MARKS)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    line = text[0] if text else type(err).__name__
    # An op's error starts with the function node it ran in ({{function_node ...}}), which says nothing here.
    if line.startswith("{{function_node") and "}}" in line:
        line = line.split("}}", 1)[1].strip()
    return line[:300]


@contextlib.contextmanager
def reading(path: str, what: str, way_out: str, error: Type[Exception] = UnreadableFile) -> Iterator[None]:
    """Reads inside the block; a damaged file stops it with one line naming `path`.

    Args:
      path: the file read: a checkpoint's prefix, a SavedModel's directory.
      what: what it is, as the message names it ("the Trainer's checkpoint").
      way_out: what to do, as the message ends.
      error: the exception type raised (the exporter's ExportRefused, say).

    Raises:
      `error`: the block raised an error `is_damage` recognises, or an UnreadableFile; the original is chained.
    """
    try:
        yield
    except UnreadableFile as err:  # said already, closer to the file (checkpoint_index.py): the caller's type
        if isinstance(err, error):
            raise
        raise error(str(err)) from err
    except Exception as err:  # noqa: BLE001  (is_damage decides; anything else is raised as it was)
        if not is_damage(err):
            raise
        raise error(f"{what} {path} cannot be read ({_first_line(err)}): it is cut short or damaged; {way_out}") from err
