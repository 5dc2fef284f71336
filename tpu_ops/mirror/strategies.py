"""How one object is copied S3 → GCS: the units of work, each a type with its own ``run``.

Every unit reads through one checksumming stream (:class:`~tpu_ops.mirror.source.PinnedRead`)
and writes through one writer (:class:`~tpu_ops.mirror.gcs_transport.GcsWriter`):

- :class:`SmallCopy`: an object of at most ``SMALL_MAX`` bytes is read (pinned) into memory and
  uploaded in one multipart request that declares its CRC32C (real GCS rejects a mismatch) and
  carries the provenance metadata;
- :class:`StreamedCopy`: a larger object below ``ranged_min`` streams from one pinned GET (which
  also returns S3's full-object checksum, if any) into one upload request, ``BLOCK`` bytes at a
  time. Splitting a sequential stream into ranged GETs buys nothing but requests. The object is
  created without the CRC32C in its provenance and gets it by a metadata patch once GCS's CRC32C
  matched ours, so an unverified copy is never taken as up to date;
- :class:`PartCopy` + :class:`ComposeParts`: from ``ranged_min`` on (rclone's multi-thread cutoff
  is 256 MiB, gcloud's sliced threshold 150 MiB) ranged parts of ``part_bytes`` (at most 32, the
  compose limit) are copied in parallel into temporary objects, then composed, and the composite
  CRC32C (combined from the parts') is checked against what GCS reports.

Memory per unit is bounded by ``SMALL_MAX`` (or one ``BLOCK`` when streaming). Every stored
object's CRC32C as GCS reports it is compared with ours, because the emulators accept wrong
checksums.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any

from tpu_ops.cloud.translate import google_errors
from tpu_ops.errors import ChecksumMismatchError
from tpu_ops.mirror import crc
from tpu_ops.mirror.gcs_transport import GcsWriter
from tpu_ops.mirror.records import (
    META_CRC32C,
    META_ETAG,
    META_SIZE,
    META_VERSION,
    RESERVED_DIR,
    Copied,
    SourceObject,
)
from tpu_ops.mirror.source import PinnedRead
from tpu_ops.mirror.stream import BLOCK, BytesBody, Fault
from tpu_ops.settings import Settings
from tpu_ops.uris import ObjectUri

log = logging.getLogger(__name__)

MiB = 1024 * 1024
SMALL_MAX = 8 * MiB  # the SDK's single-request upload limit; larger objects are streamed
MAX_PARTS = 32  # GCS compose takes at most 32 sources
RANGED_MIN = 256 * MiB  # default: from this size on, ranged parts are copied in parallel and composed


@dataclass
class CopyContext:
    """Clients and knobs shared by every unit of one mirror run."""

    s3: Any
    gcs: Any  # google.cloud.storage.Client
    source: ObjectUri
    dest: ObjectUri
    settings: Settings
    concurrency: int
    part_bytes: int
    ranged_min: int = RANGED_MIN
    fault: Fault | None = None
    _bucket: Any = field(default=None, repr=False)
    _writer: GcsWriter | None = field(default=None, repr=False)

    @property
    def bucket(self) -> Any:
        if self._bucket is None:
            self._bucket = self.gcs.bucket(self.dest.bucket)
        return self._bucket

    @property
    def writer(self) -> GcsWriter:
        if self._writer is None:
            self._writer = GcsWriter(self.gcs, self.dest.bucket)
        return self._writer

    def read(self, src: SourceObject, rng: tuple[int, int] | None = None, *, block: int | None = None) -> PinnedRead:
        """A pinned, checksummed read of ``src`` (or of the range ``[start, end)``)."""
        return PinnedRead(self.s3, self.source, src, rng, block=block or BLOCK, fault=self.fault)


def part_ranges(size: int, part_bytes: int) -> list[tuple[int, int]]:
    """``[start, end)`` byte ranges for a large object: ``part_bytes`` each, at most ``MAX_PARTS``."""
    step = max(part_bytes, -(-size // MAX_PARTS))
    step = -(-step // (256 * 1024)) * (256 * 1024)
    return [(start, min(start + step, size)) for start in range(0, size, step)]


def provenance(src: SourceObject, crc32c_b64: str) -> dict[str, str]:
    """The custom metadata recording which source version a GCS object is a verified copy of."""
    return {
        META_ETAG: src.etag,
        META_VERSION: src.version_id or "",
        META_SIZE: str(src.size),
        META_CRC32C: crc32c_b64,
    }


def part_name(ctx: CopyContext, src: SourceObject, index: int) -> str:
    """Temporary object holding part ``index`` of ``src``; stable, so a re-run overwrites it."""
    token = hashlib.sha256(f"{src.rel}\0{src.etag}\0{src.version_id}".encode()).hexdigest()[:32]
    return ctx.dest.key(f"{RESERVED_DIR}/parts/{token}/{index:05d}")


def verify_stored(rel: str, stored_size: Any, stored: str | None, size: int, ours: int, what: str = "object") -> None:
    """Compare what GCS reports for a stored object with the size and CRC32C we streamed."""
    if int(stored_size if stored_size is not None else -1) != size or not stored or crc.from_b64(stored) != ours:
        raise ChecksumMismatchError(
            f"{what} {rel!r}: GCS stored {stored_size} bytes with CRC32C {stored}, "
            f"we sent {size} bytes with CRC32C {crc.to_b64(ours)}"
        )


@dataclass(frozen=True, slots=True)
class SmallCopy:
    """An object of at most ``SMALL_MAX`` bytes, read into memory, uploaded with its CRC32C declared."""

    src: SourceObject

    def run(self, ctx: CopyContext) -> Copied:
        read = ctx.read(self.src, block=max(1, self.src.size))
        data = read.read_all()
        ours = crc.to_b64(read.crc)
        stored = ctx.writer.write(ctx.dest.key(self.src.rel), BytesBody(data), provenance(self.src, ours), crc32c=ours)
        verify_stored(self.src.rel, stored.size, stored.crc32c, self.src.size, read.crc)
        return Copied(self.src, ours, 1, read.s3_checked)


@dataclass(frozen=True, slots=True)
class StreamedCopy:
    """A larger object streamed from one pinned GET into one upload, then marked verified."""

    src: SourceObject

    def run(self, ctx: CopyContext) -> Copied:
        name = ctx.dest.key(self.src.rel)
        read = ctx.read(self.src)
        partial = {k: v for k, v in provenance(self.src, "").items() if k != META_CRC32C}
        stored = ctx.writer.write(name, read, partial)
        verify_stored(self.src.rel, stored.size, stored.crc32c, self.src.size, read.crc)
        ours = crc.to_b64(read.crc)
        final = ctx.bucket.blob(name)
        final.metadata = provenance(self.src, ours)
        with google_errors("gcs"):  # of that very generation, whose answer is checked again
            final.patch(if_generation_match=stored.generation, retry=None)
        verify_stored(self.src.rel, final.size, final.crc32c, self.src.size, read.crc)
        return Copied(self.src, ours, 1, read.s3_checked)


@dataclass(frozen=True, slots=True)
class PartCopy:
    """Ranged part ``index`` of a large object, streamed into its own temporary object."""

    src: SourceObject
    index: int
    rng: tuple[int, int]

    def run(self, ctx: CopyContext) -> int:
        """The part's verified CRC32C."""
        read = ctx.read(self.src, self.rng)
        stored = ctx.writer.write(part_name(ctx, self.src, self.index), read, {})
        size = self.rng[1] - self.rng[0]
        verify_stored(self.src.rel, stored.size, stored.crc32c, size, read.crc, f"part {self.index} of")
        return read.crc


@dataclass(frozen=True, slots=True)
class ComposeParts:
    """The verified parts of a large object composed into it; the composite CRC32C checked."""

    src: SourceObject
    ranges: tuple[tuple[int, int], ...]
    crcs: tuple[int, ...]

    def run(self, ctx: CopyContext) -> Copied:
        whole = self.crcs[0]
        for part_crc, (start, end) in zip(self.crcs[1:], self.ranges[1:], strict=True):
            whole = crc.combine(whole, part_crc, end - start)
        ours = crc.to_b64(whole)
        parts = [ctx.bucket.blob(part_name(ctx, self.src, i)) for i in range(len(self.ranges))]
        final = ctx.bucket.blob(ctx.dest.key(self.src.rel))
        final.metadata = provenance(self.src, ours)
        final.content_type = "application/octet-stream"
        with google_errors("gcs"):
            final.compose(parts, retry=None)
        verify_stored(self.src.rel, final.size, final.crc32c, self.src.size, whole, "composed object")
        for p in parts:  # best effort: a leftover part is deleted by the next run
            try:
                with google_errors("gcs"):
                    p.delete(retry=None)
            except Exception as exc:
                log.debug("could not delete part %s: %s", p.name, exc)
        return Copied(self.src, ours, len(parts), False)


Unit = SmallCopy | StreamedCopy | PartCopy | ComposeParts


def units_for(src: SourceObject, ranged_min: int, part_bytes: int) -> list[Unit]:
    """The first units copying ``src``, by size (a large object's ``ComposeParts`` follows its parts)."""
    if src.size <= SMALL_MAX:
        return [SmallCopy(src)]
    if src.size < ranged_min:
        return [StreamedCopy(src)]
    return [PartCopy(src, i, rng) for i, rng in enumerate(part_ranges(src.size, part_bytes))]
