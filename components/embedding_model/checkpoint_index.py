"""A TensorFlow checkpoint's `.index` file read by hand, and row-range reads of saved tensors.

`BundleIndex` says where each tensor saved whole is in the checkpoint's data files, so a table is
read by memory-mapping only its rows; `restore_rows` reads a row range of any saved tensor (whole
or in slices) with `RestoreV2`. Used by layouts.CheckpointTables; nothing here knows about tables.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

import components  # noqa: F401  (selects legacy Keras before TensorFlow loads)
import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import tensor_bundle_pb2

from components.embedding_model.unreadable import UnreadableFile


def restore_rows(prefix: str, key: str, full_shape: List[int], start: int, count: int, dtype=tf.float32) -> np.ndarray:
    """Rows [start, start+count) of a saved tensor, read without loading the rest (RestoreV2 slice).

    Args:
      prefix: the checkpoint's path prefix.
      key: the tensor's checkpoint key.
      full_shape: the saved tensor's shape.
      start: the first row.
      count: the rows to read.
      dtype: the tensor's dtype.

    Returns:
      [count, *full_shape[1:]] of `dtype`.
    """
    spec = " ".join(str(int(d)) for d in full_shape) + f" {int(start)},{int(count)}" + ":-" * (len(full_shape) - 1)
    return tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[key], shape_and_slices=[spec], dtypes=[dtype])[0].numpy()


class BundleIndex:
    """Where each saved tensor's bytes are in a checkpoint's data files, from its `.index` file.

    Hand-written because TensorFlow exposes no Python API for it, and `RestoreV2` slice reads of a
    tensor saved whole read the whole tensor for every slice (tensor_bundle.cc GetSliceValue): 32
    SparseCore shard reads of a stacked table would read the stack 32 times. With the offsets, a
    tensor saved whole is memory-mapped and only the rows wanted are read. The index is a
    TensorFlow table (LevelDB format: blocks of prefix-compressed entries, a block index, a
    48-byte footer) mapping tensor names to `BundleEntryProto`s. Any surprise (a compressed block,
    another format) makes `entry` return None, and the caller falls back to RestoreV2.

    Args:
      prefix: the checkpoint's path prefix (`<prefix>.index`, `<prefix>.data-*`).
    """

    MAGIC = 0xDB4775248B80FB57

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.entries: Dict[str, Any] = {}
        self.num_shards = 1
        self.ok = False
        try:
            with tf.io.gfile.GFile(prefix + ".index", "rb") as fh:
                data = fh.read()
            if int.from_bytes(data[-8:], "little") != self.MAGIC:
                return
            pos = len(data) - 48
            _, pos = self._handle(data, pos)  # metaindex
            index, _ = self._handle(data, pos)
            for _, handle in self._block(data, *index):
                block, _ = self._handle(handle, 0)
                for key, value in self._block(data, *block):
                    if key == b"":
                        header = tensor_bundle_pb2.BundleHeaderProto.FromString(value)
                        if header.endianness != 0:  # big-endian data: leave it to TensorFlow
                            return
                        self.num_shards = header.num_shards or 1
                    else:
                        self.entries[key.decode("utf-8", "replace")] = tensor_bundle_pb2.BundleEntryProto.FromString(value)
            self.ok = True
        except Exception:  # noqa: BLE001  (any parse problem: fall back to TensorFlow's reader)
            self.entries, self.ok = {}, False

    @staticmethod
    def _varint(data: bytes, pos: int) -> Tuple[int, int]:
        result = shift = 0
        while True:
            b = data[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result, pos
            shift += 7

    def _handle(self, data: bytes, pos: int) -> Tuple[Tuple[int, int], int]:
        offset, pos = self._varint(data, pos)
        size, pos = self._varint(data, pos)
        return (offset, size), pos

    def _block(self, data: bytes, offset: int, size: int):
        if data[offset + size] != 0:  # compression type byte after the block: 0 = none
            raise ValueError("compressed index block")
        block = data[offset: offset + size]
        num_restarts = int.from_bytes(block[-4:], "little")
        end = len(block) - 4 - 4 * num_restarts
        pos, key = 0, b""
        while pos < end:
            shared, pos = self._varint(block, pos)
            unshared, pos = self._varint(block, pos)
            vlen, pos = self._varint(block, pos)
            key = key[:shared] + block[pos: pos + unshared]
            pos += unshared
            yield key, block[pos: pos + vlen]
            pos += vlen

    def entry(self, key: str):
        """Where a tensor saved whole as float32 is.

        Args:
          key: the tensor's checkpoint key.

        Returns:
          Its BundleEntryProto, or None (not found, saved in slices, another dtype, or the index
          could not be read).
        """
        e = self.entries.get(key) if self.ok else None
        if e is None or e.slices or e.dtype != tf.float32.as_datatype_enum:
            return None
        return e

    def rows(self, key: str, shape: List[int]) -> Optional[np.ndarray]:
        """A read-only memory map of a whole-saved float32 tensor.

        Args:
          key: the tensor's checkpoint key.
          shape: its [rows, cols].

        Returns:
          A little-endian float32 np.memmap of `shape`, or None (no usable entry, another size,
          or a data file not on the local file system).

        Raises:
          UnreadableFile: the data file ends before the tensor does (cut short: a copy that did not finish).
        """
        e = self.entry(key)
        if e is None or int(np.prod(shape)) * 4 != e.size:
            return None
        path = f"{self.prefix}.data-{e.shard_id:05d}-of-{self.num_shards:05d}"
        if not os.path.exists(path):  # remote file systems: TensorFlow's reader
            return None
        size = os.path.getsize(path)
        if size < e.offset + e.size:
            raise UnreadableFile(
                f"checkpoint data file {path} holds {size} bytes but tensor {key} ends at byte {e.offset + e.size}: "
                "the file is cut short; rerun the step that wrote the checkpoint (a local run: without the cache, "
                "`--no-cache`), or remove it")
        return np.memmap(path, dtype="<f4", mode="r", offset=e.offset, shape=tuple(shape))
