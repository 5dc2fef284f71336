"""Typed records passed between the mirror's stages (listing → plan → validate → copy → manifest)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tpu_ops.layout import STATE_DIR

# Everything tpu-ops writes besides the mirrored objects lives under this folder of the
# destination prefix (manifests, snapshot names, temporary parts); source keys there are refused.
RESERVED_DIR = STATE_DIR

# GCS custom-metadata keys recording where each mirrored object came from.
META_ETAG = "tpu-ops-src-etag"
META_VERSION = "tpu-ops-src-version"
META_SIZE = "tpu-ops-src-size"
META_CRC32C = "tpu-ops-crc32c"


@dataclass(frozen=True, slots=True)
class SourceObject:
    """One listed S3 object: the exact version the snapshot pins."""

    rel: str  # key relative to the source prefix (checked by ``uris.check_key``)
    size: int
    etag: str  # without quotes; multipart ETags end in ``-N``
    version_id: str | None  # None when the bucket is unversioned: reads are pinned with If-Match


@dataclass(frozen=True, slots=True)
class DestObject:
    """One listed GCS object with the provenance metadata a previous mirror left on it."""

    rel: str
    size: int
    crc32c: str  # base64, as GCS reports it
    src_etag: str | None
    src_version: str | None
    src_size: int | None
    src_crc32c: str | None  # the CRC32C we computed while copying (base64)


@dataclass(frozen=True, slots=True)
class Copied:
    """A verified copy: our streamed CRC32C matched what GCS reports for the stored object."""

    source: SourceObject
    crc32c: str  # base64 big-endian, the GCS convention
    parts: int
    s3_checksum_checked: bool


@dataclass(frozen=True, slots=True)
class Progress:
    """A progress report; ``phase`` is one of list, plan, validate, copy, commit, done."""

    phase: str
    objects_done: int = 0
    objects_total: int = 0
    bytes_done: int = 0
    bytes_total: int = 0


@dataclass(frozen=True, slots=True)
class MirrorResult:
    """What a mirror run did. ``manifest_uri`` is what later steps pin."""

    snapshot_id: str
    manifest_uri: str
    snapshot_name: str | None
    source: str
    destination: str
    source_versioned: bool
    objects_total: int
    bytes_total: int
    objects_copied: int
    bytes_copied: int
    objects_skipped: int
    bytes_skipped: int
    shards_validated: int
    schema_file: str | None  # None when the source declares no schema
    objects_s3_checksum_verified: int = 0  # copies also checked against S3's full-object checksum
    engine: str = "local"  # who copied: local or sts (the snapshot itself does not say)
    timings_s: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)
