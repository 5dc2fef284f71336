"""The snapshot manifest: written last, it is what commits a mirror run.

Where: ``gs://BUCKET/PREFIX/_tpu_ops/manifests/<snapshot_id>.json``; with a snapshot name, also
a pointer ``gs://BUCKET/PREFIX/_tpu_ops/snapshots/<name>.json`` (``{"snapshot_id", "manifest"}``)
written after it. A snapshot name is immutable: reusing it for different content is refused.

Format (JSON, ``"format": "tpu-ops.mirror.manifest/1"``)::

    {"format": ..., "snapshot_id": "ds-<24 hex>", "content_sha256": "<64 hex>",
     "name": "daily-2026-11-21" | null, "source": "s3://...", "destination": "gs://...",
     "source_versioned": true, "created_at": "2026-11-21T23:00:00Z",
     "totals": {"objects": 204, "bytes": 478150656},
     "objects": [{"key": "shards/a.safetensors", "size": 1048576, "crc32c": "<base64>",
                  "source_etag": "...", "source_version": "..." | null}, ...]}   # sorted by key

``key`` is relative to ``destination`` (and to ``source``). The snapshot id is derived from the
content only — the sorted (key, size, crc32c, source_etag, source_version) rows — so mirroring
identical content yields the same id and the same manifest path, whatever the name or time.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from tpu_ops.cloud.translate import google_errors
from tpu_ops.errors import AlreadyExistsError, PolicyError, SpecError
from tpu_ops.mirror.records import RESERVED_DIR
from tpu_ops.uris import ObjectUri

FORMAT = "tpu-ops.mirror.manifest/1"


def entry(key: str, size: int, crc32c: str, etag: str, version: str | None) -> dict[str, Any]:
    """One manifest row."""
    return {"key": key, "size": size, "crc32c": crc32c, "source_etag": etag, "source_version": version}


def content_hash(entries: Iterable[dict[str, Any]]) -> str:
    """SHA-256 over the canonical rows, sorted by key."""
    h = hashlib.sha256(FORMAT.encode() + b"\n")
    for e in sorted(entries, key=lambda e: str(e["key"])):
        row = [e["key"], e["size"], e["crc32c"], e["source_etag"], e["source_version"]]
        h.update(json.dumps(row, separators=(",", ":"), ensure_ascii=False).encode() + b"\n")
    return h.hexdigest()


def build(
    entries: list[dict[str, Any]], *, source: str, destination: str, versioned: bool, name: str | None
) -> dict[str, Any]:
    """The manifest document for ``entries``."""
    digest = content_hash(entries)
    rows = sorted(entries, key=lambda e: str(e["key"]))
    return {
        "format": FORMAT,
        "snapshot_id": "ds-" + digest[:24],
        "content_sha256": digest,
        "name": name,
        "source": source,
        "destination": destination,
        "source_versioned": versioned,
        "created_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "totals": {"objects": len(rows), "bytes": sum(int(e["size"]) for e in rows)},
        "objects": rows,
    }


def manifest_key(dest: ObjectUri, snapshot_id: str) -> str:
    return dest.key(f"{RESERVED_DIR}/manifests/{snapshot_id}.json")


def pointer_key(dest: ObjectUri, name: str) -> str:
    return dest.key(f"{RESERVED_DIR}/snapshots/{name}.json")


def _create(bucket: Any, key: str, body: bytes) -> bool:
    """Create ``key`` unless it exists; True if we wrote it."""
    blob = bucket.blob(key)
    try:
        with google_errors("gcs"):
            blob.upload_from_string(body, content_type="application/json", if_generation_match=0)
    except AlreadyExistsError:
        return False
    except Exception as exc:
        if getattr(exc, "status", None) == 412:
            return False
        raise
    return True


def commit(gcs: Any, dest: ObjectUri, doc: dict[str, Any]) -> str:
    """Write the manifest (create-only: same id ⇒ same content) and the name pointer; return its URI."""
    bucket = gcs.bucket(dest.bucket)
    key = manifest_key(dest, doc["snapshot_id"])
    _create(bucket, key, json.dumps(doc, indent=1, ensure_ascii=False).encode())
    uri = f"gs://{dest.bucket}/{key}"
    if doc.get("name"):
        pkey = pointer_key(dest, doc["name"])
        pointer = {"snapshot_id": doc["snapshot_id"], "manifest": uri}
        if not _create(bucket, pkey, json.dumps(pointer).encode()):
            with google_errors("gcs"):
                existing = json.loads(bucket.blob(pkey).download_as_bytes())
            if existing.get("snapshot_id") != doc["snapshot_id"]:
                raise PolicyError(
                    f"snapshot name {doc['name']!r} already names {existing.get('snapshot_id')} "
                    f"({existing.get('manifest')}); snapshot names are immutable, choose another"
                )
    return uri


def load(gcs: Any, uri: str) -> dict[str, Any]:
    """Read a manifest by its ``gs://`` URI."""
    from tpu_ops.specs.loader import MANIFEST_LIMITS, parse_document
    from tpu_ops.uris import parse_gs

    parsed = parse_gs(uri)
    with google_errors("gcs"):  # never more than the limit (+1 byte, to tell "too large") comes down
        raw = gcs.bucket(parsed.bucket).blob(parsed.prefix).download_as_bytes(end=MANIFEST_LIMITS.max_bytes)
    doc = parse_document(raw, uri, "json", MANIFEST_LIMITS)
    if not isinstance(doc, dict):
        raise SpecError(f"{uri}: not a manifest (a JSON object)")
    return doc
