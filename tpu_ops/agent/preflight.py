"""Pre-flight on a worker: prove the pinned snapshot is exactly what this worker will read. Standard library only.

Each worker loads the manifest, lists the snapshot's objects once, and compares every row's size
and CRC32C (and generation, when the manifest records one) with the object metadata GCS reports:
GCS computes CRC32C server-side, so nothing is downloaded. It writes a JSON report (with each
object's generation) to ``OUT/worker-<n>.json``. A missing or different object fails the worker,
and so the run, before any training step.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from tpu_ops.agent.gcs import Gcs, join, split_gs
from tpu_ops.agent.metadata import WorkerIdentity

MAX_MANIFEST_BYTES = 256 * 1024 * 1024


class SnapshotMismatch(Exception):
    """The stored snapshot differs from its manifest (the message names the first few objects)."""


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
    generations: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def load_manifest(gcs: Gcs, uri: str) -> dict[str, Any]:
    bucket, key = split_gs(uri)
    raw = gcs.read(bucket, key)
    if len(raw) > MAX_MANIFEST_BYTES:
        raise SnapshotMismatch(f"{uri}: manifest larger than {MAX_MANIFEST_BYTES} bytes")
    doc = json.loads(raw)
    if not isinstance(doc, dict) or not isinstance(doc.get("objects"), list) or "destination" not in doc:
        raise SnapshotMismatch(f"{uri}: not a snapshot manifest")
    return doc


def check_snapshot(gcs: Gcs, doc: dict[str, Any]) -> tuple[list[str], dict[str, int]]:
    """Problems found comparing the manifest's rows with the stored objects (empty = exact), and the
    generation of every object checked."""
    bucket, prefix = split_gs(doc["destination"])
    stored = {item["name"]: item for item in gcs.list_objects(bucket, prefix + "/" if prefix else "")}
    problems, generations = [], {}
    for row in doc["objects"]:
        key = join(prefix, row["key"]) if prefix else row["key"]
        got = stored.get(key)
        if got is None:
            problems.append(f"{row['key']}: missing")
            continue
        generations[row["key"]] = int(got.get("generation") or 0)
        have = (int(got.get("size", -1)), got.get("crc32c"))
        want = (int(row["size"]), row["crc32c"])
        if have != want:
            problems.append(f"{row['key']}: size/crc32c {have} != manifest {want}")
        elif row.get("generation") is not None and int(row["generation"]) != generations[row["key"]]:
            problems.append(f"{row['key']}: generation {generations[row['key']]} != manifest {row['generation']}")
    return problems, generations


def preflight(
    gcs: Gcs, who: WorkerIdentity, run_id: str, manifest_uri: str, out_uri: str, host: str = ""
) -> PreflightReport:
    """Verify the snapshot from this worker and write the report; raise ``SnapshotMismatch`` on problems."""
    started = time.monotonic()
    doc = load_manifest(gcs, manifest_uri)
    problems, generations = check_snapshot(gcs, doc)
    report = PreflightReport(
        run_id=run_id, worker_number=who.worker_number, worker_count=who.worker_count, node_id=who.node_id,
        snapshot_id=str(doc.get("snapshot_id", "")), objects_checked=len(doc["objects"]),
        bytes_checked=int((doc.get("totals") or {}).get("bytes", 0)), problems=problems,
        seconds=round(time.monotonic() - started, 3), generations=generations,
    )  # fmt: skip
    bucket, key = split_gs(out_uri)
    gcs.write_json(bucket, join(key, f"{host or f'worker-{who.worker_number}'}.json"), asdict(report))
    if problems:
        raise SnapshotMismatch(f"worker {who.worker_number}: snapshot {report.snapshot_id} differs: {problems[:5]}")
    return report
