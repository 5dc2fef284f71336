"""Issue #19, point 8: a run without a dataset manifest exports (lineage says so); a re-export reports
the package's real approval status; a cut upload ends in a one-line error, not a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from export_helpers import make_run
from tcp_proxy import TcpProxy

from flows.cli import main
from tpu_ops.cloud.clients import boto3_client, storage_client

MiB = 1 << 20


def _export(run: Any, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["export", "--spec", str(run.spec_file), "--run-id", run.run_id, "--no-flow", *extra])
    out, err = capsys.readouterr()
    return rc, out, err


def test_a_run_without_a_dataset_manifest_exports_and_lineage_says_so(
    local_stack: Any, env_on_stack: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(local_stack, tmp_path)
    bucket = run.checkpoint_dir.split("/")[2]
    job = {"run_id": run.run_id}  # the train spec had no dataset_manifest
    storage_client(run.settings).bucket(bucket).blob(f"runs/{run.run_id}/_tpu_ops/job.json").upload_from_string(
        json.dumps(job)
    )
    rc, out, err = _export(run, capsys, "--json")
    assert rc == 0, err
    result = json.loads(out)
    assert result["manifest_uri"] is None
    meta = boto3_client(run.settings, "sagemaker").describe_model_package(ModelPackageName=result["package_arn"])[
        "CustomerMetadataProperties"
    ]
    assert "manifest_uri" not in meta and meta["dataset"] == "none recorded (no dataset_manifest)"
    assert main(["audit", "lineage", run.run_id]) == 0
    assert "dataset           none recorded: the run's train spec had no dataset_manifest" in capsys.readouterr().out


def test_a_re_export_reports_the_real_approval_status(
    local_stack: Any, env_on_stack: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(local_stack, tmp_path)
    rc, out, _ = _export(run, capsys, "--json")
    arn = json.loads(out)["package_arn"]
    assert json.loads(out)["package_status"] == "PendingManualApproval"
    assert main(["approve", arn, "--approver", "alice", "--reason", "ok", "--no-flow"]) == 0
    rc, out, err = _export(run, capsys)
    assert rc == 0, err
    assert f"model package {arn} already registered (Approved)" in out and "PendingManualApproval" not in out, out


def test_a_cut_upload_is_a_one_line_error(
    local_stack: Any, env_on_stack: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(local_stack, tmp_path, big=12 * MiB)
    with TcpProxy(urlsplit(local_stack.aws_endpoint).port or 0) as proxy:
        env_on_stack.setenv("TPU_OPS_AWS_ENDPOINT_URL", proxy.url)
        env_on_stack.setenv("TPU_OPS_RETRY_ATTEMPTS", "1")
        proxy.cut_after(10 * MiB)
        rc, _, err = _export(run, capsys)
        assert proxy.tripped.is_set()
    assert rc == 1
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err  # (audit warnings about the spool may precede it)
    assert "s3" in errors[0].lower(), err


def test_a_garbage_object_and_a_torn_spool_line_block_no_export(
    local_stack: Any, env_on_stack: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.audit import trail_for
    from tpu_ops.settings import Settings

    a, b = make_run(local_stack, tmp_path), make_run(local_stack, tmp_path)
    trail = trail_for(Settings())
    trail.store.s3.put_object(Bucket=trail.store.trail.bucket, Key=trail.store.key(a.run_id, 1), Body=b"\xff{torn")
    trail.spool.path.parent.mkdir(parents=True, exist_ok=True)
    trail.spool.path.write_bytes(b'{"kind": "record", "event": {"chain": "x"')  # a crash mid-append
    for run in (a, b):
        rc, out, err = _export(run, capsys, "--json")
        assert rc == 0 and "Traceback" not in err, err
        assert json.loads(out)["package_created"]
    assert trail.spool.pending() == 0 and trail.spool.quarantine_path.exists()
