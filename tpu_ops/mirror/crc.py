"""CRC32C helpers: GCS's base64 encoding and combining the CRCs of consecutive parts.

Combining lets us verify a composed object (``CRC(a+b)`` from ``CRC(a)``, ``CRC(b)``, ``len(b)``)
without reading it back. The combination is zlib's ``crc32_combine`` with the CRC32C polynomial.
"""

from __future__ import annotations

import base64

_POLY = 0x82F63B78  # CRC32C (Castagnoli), reflected


def to_b64(crc: int) -> str:
    """``crc`` as GCS reports it: base64 of the big-endian 4 bytes."""
    return base64.b64encode(crc.to_bytes(4, "big")).decode()


def from_b64(value: str) -> int:
    """The integer CRC of a base64 big-endian value."""
    raw = base64.b64decode(value)
    if len(raw) != 4:
        raise ValueError(f"not a base64 CRC32C: {value!r}")
    return int.from_bytes(raw, "big")


def _times(mat: list[int], vec: int) -> int:
    out = 0
    i = 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _square(mat: list[int]) -> list[int]:
    return [_times(mat, mat[n]) for n in range(32)]


def combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC32C of ``a + b`` given ``crc1 = CRC(a)``, ``crc2 = CRC(b)`` and ``len2 = len(b)``."""
    if len2 <= 0:
        return crc1
    odd = [_POLY] + [1 << n for n in range(31)]  # operator for one zero bit
    even = _square(odd)  # two zero bits
    odd = _square(even)  # four zero bits
    while True:
        even = _square(odd)  # first pass: one zero byte
        if len2 & 1:
            crc1 = _times(even, crc1)
        len2 >>= 1
        if not len2:
            break
        odd = _square(even)
        if len2 & 1:
            crc1 = _times(odd, crc1)
        len2 >>= 1
        if not len2:
            break
    return crc1 ^ crc2
