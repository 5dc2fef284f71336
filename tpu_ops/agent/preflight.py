"""Pre-flight on a worker: prove the pinned snapshot is exactly what this worker will read.

Each worker loads the manifest, lists the snapshot's objects once, and compares every row's size
and CRC32C with what GCS reports; it writes a JSON report to ``OUT/worker-<n>.json``. A missing
or different object fails the worker, and so the run, before any training step.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from tpu_ops.agent.metadata import MetadataClient
from tpu_ops.cloud.clients import storage_client
from tpu_ops.cloud.translate import google_errors
from tpu_ops.errors import IntegrityError
from tpu_ops.mirror import manifest as manifests
from tpu_ops.settings import Settings
from tpu_ops.uris import parse_gs


@dataclass
class PreflightReport:
    """What one worker saw."""

    run_id: str
    worker_number: int
    worker_count: int
    node_id: str
    snapshot_id: str
    objects_checked: int
    bytes_checked: int
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems


def check_snapshot(gcs: Any, doc: dict[str, Any]) -> list[str]:
    """Problems found comparing the manifest's rows with the stored objects (empty = exact)."""
    dest = parse_gs(doc["destination"])
    with google_errors("gcs"):
        stored = {
            blob.name: (int(blob.size), blob.crc32c)
            for blob in gcs.list_blobs(dest.bucket, prefix=(dest.prefix + "/") if dest.prefix else None)
        }
    problems = []
    for row in doc["objects"]:
        key = dest.key(row["key"])
        got = stored.get(key)
        if got is None:
            problems.append(f"{row['key']}: missing")
        elif got != (int(row["size"]), row["crc32c"]):
            problems.append(f"{row['key']}: size/crc32c {got} != manifest {(row['size'], row['crc32c'])}")
    return problems


def preflight(settings: Settings, run_id: str, manifest_uri: str, out_uri: str) -> PreflightReport:
    """Verify the snapshot from this worker and write the report; raise ``IntegrityError`` on problems."""
    started = time.monotonic()
    who = MetadataClient(settings).identity()
    gcs = storage_client(settings)
    doc = manifests.load(gcs, manifest_uri)
    problems = check_snapshot(gcs, doc)
    report = PreflightReport(
        run_id=run_id,
        worker_number=who.worker_number,
        worker_count=who.worker_count,
        node_id=who.node_id,
        snapshot_id=doc["snapshot_id"],
        objects_checked=len(doc["objects"]),
        bytes_checked=int(doc["totals"]["bytes"]),
        problems=problems,
        seconds=round(time.monotonic() - started, 3),
    )
    out = parse_gs(out_uri)
    with google_errors("gcs"):
        gcs.bucket(out.bucket).blob(out.key(f"worker-{who.worker_number}.json")).upload_from_string(
            json.dumps(asdict(report), sort_keys=True), content_type="application/json"
        )
    if problems:
        raise IntegrityError(f"worker {who.worker_number}: snapshot {doc['snapshot_id']} differs: {problems[:5]}")
    return report
