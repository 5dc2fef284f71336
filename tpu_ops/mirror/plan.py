"""Decide what to copy: a pure function of the source and destination listings.

An object is skipped only when the destination copy carries provenance metadata naming the same
source ETag, version and size, and GCS still reports the CRC32C we verified when we copied it.
Comparing the ETag (not just size or modification time) is what catches a same-size overwrite
of a multipart S3 object, which size/checksum-based sync tools miss.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tpu_ops.mirror.records import DestObject, SourceObject


@dataclass(frozen=True, slots=True)
class Plan:
    """The copy/skip decision for every source object, in listing order."""

    copy: list[SourceObject]
    skip: list[tuple[SourceObject, DestObject]]

    @property
    def bytes_copy(self) -> int:
        return sum(o.size for o in self.copy)

    @property
    def bytes_skip(self) -> int:
        return sum(o.size for o, _ in self.skip)


def up_to_date(src: SourceObject, dst: DestObject | None) -> bool:
    """True when ``dst`` is a verified copy of exactly this source version."""
    return (
        dst is not None
        and dst.src_etag == src.etag
        and dst.src_version == (src.version_id or "")
        and dst.src_size == src.size
        and dst.size == src.size
        and dst.src_crc32c is not None
        and dst.src_crc32c == dst.crc32c
    )


def plan(source: Iterable[SourceObject], dest: Mapping[str, DestObject]) -> Plan:
    """Split ``source`` into objects to copy and objects already mirrored (with their copy)."""
    copy: list[SourceObject] = []
    skip: list[tuple[SourceObject, DestObject]] = []
    for src in source:
        dst = dest.get(src.rel)
        if dst is not None and up_to_date(src, dst):
            skip.append((src, dst))
        else:
            copy.append(src)
    return Plan(copy, skip)
