"""A finished run's stored report is read back unchanged, and only a finished one: on fake-gcs-server
alone (no stack), through the real google-cloud-storage client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tpu_ops.train import goodput as G
from tpu_ops.uris import parse_gs


@pytest.fixture(scope="module")
def gcs() -> Iterator[Any]:
    from infra.local.gcs import FakeGcs
    from tpu_ops.cloud.clients import storage_client
    from tpu_ops.settings import Settings

    server = FakeGcs()
    server.start()
    try:
        client = storage_client(Settings(dry_run=True, gcs_endpoint=server.url))
        client.create_bucket("reports")
        yield client
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("outcome", "found"), [("done", True), ("already-done", True), ("running", False), ("failed", False)]
)
def test_only_a_finished_report_is_read_back_exactly_as_stored(gcs: Any, outcome: str, found: bool) -> None:
    doc = {"run_id": "r1", "outcome": outcome, "steps": 4, "final_step": 4, "wall_s": 12.5, "productive_s": 10.0,
           "badput_s": {G.OTHER: 2.5}, "steps_kept": 4, "odd": [1, 2]}  # fmt: skip
    uri = parse_gs(f"gs://reports/{outcome}/_tpu_ops/goodput.json")
    gcs.bucket("reports").blob(uri.prefix).upload_from_string(json.dumps(doc))
    report = G.GoodputReport.finished(gcs, uri)
    if not found:
        assert report is None
        return
    assert report is not None and report.to_json() == doc
    assert (report.run_id, report.wall_s, report.productive_s, report.steps_kept) == ("r1", 12.5, 10.0, 4)


def test_no_report_or_not_a_report_reads_as_none(gcs: Any) -> None:
    assert G.GoodputReport.finished(gcs, parse_gs("gs://reports/none/_tpu_ops/goodput.json")) is None
    uri = parse_gs("gs://reports/list/_tpu_ops/goodput.json")
    gcs.bucket("reports").blob(uri.prefix).upload_from_string(json.dumps(["done"]))
    assert G.GoodputReport.finished(gcs, uri) is None
