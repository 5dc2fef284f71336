"""List the source once (pinning versions or ETags) and the destination once (with metadata).

The source listing is the snapshot: every later read names the listed ``VersionId`` (versioned
bucket) or sends ``If-Match: <listed ETag>`` (unversioned), so an object overwritten during the
run is either read as listed or detected, never mixed in. The destination listing carries each
object's custom metadata, so deciding that nothing changed needs no per-object request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpu_ops.cloud.translate import aws_errors, google_errors
from tpu_ops.errors import PolicyError
from tpu_ops.mirror.records import (
    META_CRC32C,
    META_ETAG,
    META_SIZE,
    META_VERSION,
    RESERVED_DIR,
    DestObject,
    SourceObject,
)
from tpu_ops.uris import ObjectUri, check_key

PARTS_DIR = f"{RESERVED_DIR}/parts/"
_GCS_FIELDS = "items(name,size,crc32c,metadata),nextPageToken"


@dataclass(frozen=True, slots=True)
class SourceListing:
    """The pinned source: its objects and whether reads pin a version or an ETag."""

    versioned: bool
    objects: list[SourceObject]


@dataclass(frozen=True, slots=True)
class DestListing:
    """Mirrored objects by relative key, and leftover temporary parts from interrupted runs."""

    objects: dict[str, DestObject]
    stale_parts: list[str]  # full object names


def _refuse(bad: list[str]) -> None:
    if bad:
        shown = "; ".join(bad[:20]) + (f"; ... and {len(bad) - 20} more" if len(bad) > 20 else "")
        raise PolicyError(f"refusing to mirror {len(bad)} unsafe source key(s): {shown}")


def _rel(uri: ObjectUri, key: str, bad: list[str]) -> str | None:
    """The checked relative key, or None to skip it (folder markers); unsafe keys go to ``bad``."""
    try:
        rel = uri.relative(key)
        if not rel or rel.endswith("/"):
            return None  # "folder" placeholder objects carry no data
        check_key(rel)
        if rel == RESERVED_DIR or rel.startswith(RESERVED_DIR + "/"):
            raise PolicyError(f"object key {key!r} is under the reserved folder {RESERVED_DIR}/")
    except PolicyError as exc:
        bad.append(str(exc))
        return None
    return rel


def list_source(s3: Any, uri: ObjectUri) -> SourceListing:
    """List ``uri`` once. Unsafe keys (``..``/``.`` segments, control characters) are all refused."""
    prefix = uri.prefix + "/" if uri.prefix else ""
    with aws_errors("s3"):
        versioned = s3.get_bucket_versioning(Bucket=uri.bucket).get("Status") in ("Enabled", "Suspended")
        objects: list[SourceObject] = []
        bad: list[str] = []
        if versioned:
            for page in s3.get_paginator("list_object_versions").paginate(Bucket=uri.bucket, Prefix=prefix):
                for v in page.get("Versions", ()):
                    if not v.get("IsLatest"):
                        continue
                    rel = _rel(uri, v["Key"], bad)
                    if rel is not None:
                        objects.append(SourceObject(rel, int(v["Size"]), v["ETag"].strip('"'), v["VersionId"]))
        else:
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=uri.bucket, Prefix=prefix):
                for o in page.get("Contents", ()):
                    rel = _rel(uri, o["Key"], bad)
                    if rel is not None:
                        objects.append(SourceObject(rel, int(o["Size"]), o["ETag"].strip('"'), None))
    _refuse(bad)
    return SourceListing(versioned, objects)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def list_dest(gcs: Any, uri: ObjectUri) -> DestListing:
    """List ``uri`` once, with the provenance metadata of every object."""
    prefix = uri.prefix + "/" if uri.prefix else ""
    objects: dict[str, DestObject] = {}
    stale: list[str] = []
    with google_errors("gcs"):
        for blob in gcs.list_blobs(uri.bucket, prefix=prefix, fields=_GCS_FIELDS):
            rel = blob.name[len(prefix) :]
            if rel.startswith(PARTS_DIR):
                stale.append(blob.name)
                continue
            if rel.startswith(RESERVED_DIR + "/"):
                continue
            meta = blob.metadata or {}
            objects[rel] = DestObject(
                rel=rel,
                size=int(blob.size or 0),
                crc32c=blob.crc32c or "",
                src_etag=meta.get(META_ETAG),
                src_version=meta.get(META_VERSION),
                src_size=_int(meta.get(META_SIZE)),
                src_crc32c=meta.get(META_CRC32C),
            )
    return DestListing(objects, stale)
