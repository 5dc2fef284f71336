"""The pre-flight agent on a worker (fake metadata server, fake-gcs-server, the agent's stdlib GCS
client): an exact snapshot passes from object metadata alone; a worker that sees a different object
fails, and its report says which."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infra.local.metadata import MetadataServer, tpu_vm_values
from tpu_ops.agent.gcs import Gcs
from tpu_ops.agent.metadata import Metadata
from tpu_ops.agent.preflight import SnapshotMismatch, preflight
from tpu_ops.errors import IntegrityError
from tpu_ops.layout import RunLayout
from tpu_ops.mirror.engine import make_clients, mirror
from tpu_ops.runs import collect_reports
from tpu_ops.specs.jobs import MirrorSpec

NODE = {"name": "projects/p/locations/us-central2-b/nodes/n1", "id": "12345678",
        "networkEndpoints": [{"ipAddress": "10.0.0.1"}, {"ipAddress": "10.0.0.2"}]}  # fmt: skip


_SERVERS: list[MetadataServer] = []


@pytest.fixture(autouse=True)
def _stop_metadata_servers() -> Any:
    yield
    while _SERVERS:
        _SERVERS.pop().stop()


def _worker(settings: Any, number: int) -> Any:
    """(GCS client, identity) as worker ``number`` of NODE sees them: its own metadata server and token."""
    md = MetadataServer(tpu_vm_values(NODE, "p", "us-central2-b", number)).start()
    _SERVERS.append(md)
    meta = Metadata(md.host)
    return Gcs.from_env({"STORAGE_EMULATOR_HOST": settings.gcs_endpoint}, meta), meta.identity()


def test_a_worker_whose_snapshot_differs_fails_and_says_which(stack: Any) -> None:
    settings = stack.settings()
    s3, gcs = make_clients(settings, 2)
    s3.create_bucket(Bucket="pf-src")
    gcs.create_bucket("pf-dst")
    for i in range(3):
        s3.put_object(Bucket="pf-src", Key=f"d/{i}.bin", Body=bytes([i]) * (100 + i))
    snap = mirror(MirrorSpec(source="s3://pf-src/d", destination="gs://pf-dst/d"), settings, clients=(s3, gcs))
    out = str(RunLayout.of("gs://pf-dst/ckpt", "run-pf").state("preflight"))

    report = preflight(*_worker(settings, 0), "run-pf", snap.manifest_uri, out)
    assert report.ok and report.objects_checked == 3

    gcs.bucket("pf-dst").blob("d/1.bin").upload_from_string(b"\x01" * 101 + b"!")  # one object changes
    with pytest.raises(SnapshotMismatch, match=r"worker 1: snapshot .* differs"):
        preflight(*_worker(settings, 1), "run-pf", snap.manifest_uri, out)
    stored = json.loads(gcs.bucket("pf-dst").blob("ckpt/run-pf/_tpu_ops/preflight/worker-1.json").download_as_bytes())
    assert [p.split(":")[0] for p in stored["problems"]] == ["1.bin"]
    assert set(stored["generations"]) == {"0.bin", "1.bin", "2.bin"}  # from object metadata, nothing downloaded
    with pytest.raises(IntegrityError, match=r"workers \[1\] found the snapshot differs"):
        collect_reports(gcs, out, expected=2, timeout_s=10)
