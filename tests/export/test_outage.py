"""S3 goes away for real (a TCP proxy in front of moto is cut) in the middle of an export, and
while audit records are written: nothing half-done is left, nothing is lost, nothing is out of order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from export_helpers import make_run
from tcp_proxy import TcpProxy

from tpu_ops.cloud.clients import boto3_client

MiB = 1 << 20


@pytest.fixture
def proxy(local_stack: Any) -> Any:
    with TcpProxy(urlsplit(local_stack.aws_endpoint).port or 0) as p:
        yield p


def _through(settings: Any, proxy: TcpProxy) -> Any:
    return settings.model_copy(update={"aws_endpoint_url": proxy.url, "retry_attempts": 1})


def test_s3_down_mid_export_leaves_nothing_half_done_and_audits_the_failure(
    local_stack: Any, env_on_stack: Any, tmp_path: Path, proxy: TcpProxy
) -> None:
    from tpu_ops.export.release import chain_records
    from tpu_ops.export.steps import export
    from tpu_ops.run import Run

    run = make_run(local_stack, tmp_path, big=12 * MiB)  # 12 MiB of incompressible state: two parts
    spec = _spec(run)
    via_proxy = _through(run.settings, proxy)
    direct_s3, direct_sm = boto3_client(run.settings, "s3"), boto3_client(run.settings, "sagemaker")
    bucket, key = run.destination.split("/")[2], f"fraud/{run.run_id}/model.tar.gz"

    proxy.cut_after(10 * MiB)  # the first 8 MiB part gets through, the second does not
    this = Run.open(run.run_id, via_proxy, checkpoint_dir=run.checkpoint_dir)
    with pytest.raises(Exception) as failed:
        export(this, spec, None)
    assert proxy.tripped.is_set(), failed.value
    trail = this.trail
    assert trail.spool.pending() == 1  # the failure record waits locally
    with pytest.raises(Exception) as gone:
        direct_s3.head_object(Bucket=bucket, Key=key)
    assert gone.value.response["Error"]["Code"] in ("404", "NoSuchKey")  # type: ignore[attr-defined]
    groups = direct_sm.list_model_package_groups()["ModelPackageGroupSummaryList"]
    if any(g["ModelPackageGroupName"] == run.group for g in groups):
        assert not direct_sm.list_model_packages(ModelPackageGroupName=run.group)["ModelPackageSummaryList"]

    proxy.up()
    assert trail.flush() == 1 and trail.spool.pending() == 0
    failed = [r for r in chain_records(trail, run.run_id) if r["event"] == "model.exported"]
    assert [r["outcome"] for r in failed] == ["failure"]
    assert failed[0]["params"]["run_uri"] == run.run_uri and failed[0]["error"]

    again = export(this, spec, None)  # S3 is back: a clean export
    assert not again["artifact"]["adopted"] and again["artifact"]["parts"] == 2
    body = direct_s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    import hashlib

    assert hashlib.sha256(body).hexdigest() == again["artifact"]["sha256"]
    assert len(direct_sm.list_model_packages(ModelPackageGroupName=run.group)["ModelPackageSummaryList"]) == 1


def test_records_spooled_while_s3_is_down_arrive_in_order_without_a_gap(
    local_stack: Any, env_on_stack: Any, tmp_path: Path, proxy: TcpProxy
) -> None:
    from tpu_ops.audit.events import AuditEvent
    from tpu_ops.audit.verify import items_from_objects, verify
    from tpu_ops.run import Run
    from tpu_ops.settings import Settings

    audit = Run("run-o", _through(Settings(), proxy)).audit
    assert audit.record(AuditEvent.SLICE_PROVISIONED, params={"n": 0})
    proxy.down()
    for n in (1, 2, 3):  # S3 is down: never raises, spools
        assert audit.record(AuditEvent.SLICE_PREEMPTED, params={"n": n}) is None
    trail = audit.trail
    assert trail.spool.pending() == 3
    proxy.up()
    rec = audit.record(AuditEvent.SLICE_RECOVERED, params={"n": 4})  # drains the spool first
    assert rec is not None and rec["seq"] == 5
    chain = [json.loads(b) for k, b in trail.store.read_all() if "/run-o/" in k]
    assert [(r["seq"], r["params"]["n"]) for r in chain] == [(i, i - 1) for i in range(1, 6)]
    assert verify(items_from_objects(trail.store.read_all())).ok


def _spec(run: Any) -> Any:
    from tpu_ops.specs import ExportSpec

    return ExportSpec(destination=run.destination, model_package_group=run.group, checkpoint=run.checkpoint_dir)
