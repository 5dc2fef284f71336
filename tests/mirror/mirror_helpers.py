"""Helpers shared by the mirror tests."""

from __future__ import annotations

import json
from typing import Any


def safetensors_bytes(tensors: dict[str, tuple[str, list[int]]], *, fill: int = 0) -> bytes:
    """A valid safetensors file (header + zero-filled data) for ``{name: (dtype, shape)}``."""
    from tpu_ops.mirror.schema import ITEMSIZE

    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = ITEMSIZE[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw + bytes([fill]) * offset
