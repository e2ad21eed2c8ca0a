"""Write a Hugging Face safetensors model one tensor at a time, holding no more than that tensor.

`safetensors.torch.save_file` (and so `save_pretrained`) wants a whole shard as a dict of tensors
and builds its bytes in memory. Here the shapes and dtypes are known before any data (every rank
knows the global shapes), so each file's header is written first and each tensor is appended as
it arrives from the gather, then dropped. Files follow the usual layout: `model.safetensors`, or
`model-0000i-of-0000n.safetensors` plus `model.safetensors.index.json` past `max_shard_bytes`.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3

_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


def plan_shards(entries: list[TensorEntry], max_shard_bytes: int) -> list[list[TensorEntry]]:
    """Consecutive entries in files of at most `max_shard_bytes` (a larger tensor gets its own)."""
    shards: list[list[TensorEntry]] = [[]]
    size = 0
    for entry in entries:
        if shards[-1] and size + entry.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += entry.nbytes
    return shards


class StreamingSafetensorsWriter:
    """Append tensors in the planned order; `close` checks every one arrived and writes the index."""

    def __init__(
        self, directory: Path, entries: list[TensorEntry], max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES
    ) -> None:
        self.directory = directory
        self.shards = plan_shards(entries, max_shard_bytes)
        count = len(self.shards)
        self.files = (
            [SINGLE_FILE]
            if count == 1
            else [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]
        )
        self.total_bytes = sum(entry.nbytes for entry in entries)
        self._queue = [(i, entry) for i, shard in enumerate(self.shards) for entry in shard]
        self._next = 0
        self._handle: BinaryIO | None = None
        self._open_shard = -1

    def write(self, name: str, tensor: torch.Tensor) -> None:
        shard, entry = self._queue[self._next]
        if name != entry.name or tuple(tensor.shape) != entry.shape or tensor.dtype != entry.dtype:
            raise ValueError(f"export: got {name} {tuple(tensor.shape)} {tensor.dtype}, expected {entry}")
        if shard != self._open_shard:
            self._start(shard)
        assert self._handle is not None
        data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        self._handle.write(data.numpy().data)
        self._next += 1

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if self._next != len(self._queue):
            raise RuntimeError(f"export: {len(self._queue) - self._next} tensors were never written")
        if len(self.files) > 1:
            weight_map = {e.name: self.files[i] for i, shard in enumerate(self.shards) for e in shard}
            index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
            (self.directory / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True))

    def _start(self, shard: int) -> None:
        if self._handle is not None:
            self._handle.close()
        self._handle = open(self.directory / self.files[shard], "wb")  # noqa: SIM115 (closed in close)
        self._handle.write(_header(self.shards[shard]))
        self._open_shard = shard


def _header(entries: list[TensorEntry]) -> bytes:
    """The length-prefixed JSON header: dtype, shape and byte range of each tensor, in order."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for entry in entries:
        if entry.dtype not in _DTYPES:
            raise ValueError(f"export: {entry.name} has dtype {entry.dtype}, which safetensors lacks")
        header[entry.name] = {
            "dtype": _DTYPES[entry.dtype],
            "shape": list(entry.shape),
            "data_offsets": [offset, offset + entry.nbytes],
        }
        offset += entry.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    return struct.pack("<Q", len(encoded)) + encoded
