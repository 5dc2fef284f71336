"""Export end to end on the emulated clouds: artifact + package metadata + audit head, approval,
deployment, lineage; a repeated export never overwrites; an unapproved package is never deployed."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from export_helpers import MANIFEST, make_run

from flows.cli import main
from tpu_ops.cloud.clients import boto3_client


def _export(run: Any, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["export", "--spec", str(run.spec_file), "--run-id", run.run_id, "--no-flow", "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def _records(settings: Any, chain: str) -> list[dict[str, Any]]:
    from flows.audit import trail_for
    from tpu_ops.export.release import chain_records

    return chain_records(trail_for(settings), chain)


def test_export_approve_deploy_and_lineage(
    local_stack: Any, env_on_stack: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(local_stack, tmp_path)
    result = _export(run, capsys)
    s3, sm = boto3_client(run.settings, "s3"), boto3_client(run.settings, "sagemaker")
    art = result["artifact"]
    body = s3.get_object(Bucket=art["bucket"], Key=art["key"])["Body"].read()
    assert art["key"] == f"fraud/{run.run_id}/model.tar.gz"
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        assert sorted(tar.getnames()) == ["_CHECKPOINT_METADATA", "commit_success.txt", "state/array.bin",
                                          "state/commit_success.txt"]  # fmt: skip
        assert json.load(tar.extractfile("_CHECKPOINT_METADATA")) == {"step": 200}  # type: ignore[arg-type]

    pkg = sm.describe_model_package(ModelPackageName=result["package_arn"])
    meta = pkg["CustomerMetadataProperties"]
    assert pkg["ModelApprovalStatus"] == "PendingManualApproval"
    assert pkg["ModelPackageGroupName"] == run.group
    assert meta["artifact_sha256"] == hashlib.sha256(body).hexdigest()
    assert meta["snapshot_id"] == MANIFEST["snapshot_id"] and meta["manifest_uri"] == run.manifest_uri
    assert meta["run_id"] == run.run_id and meta["checkpoint_step"] == "200"
    assert meta["artifact_uri"] == f"{run.destination}/{run.run_id}/model.tar.gz"
    chain = _records(run.settings, run.run_id)
    head = chain[int(meta["audit_seq"]) - 1]
    assert head["hash"] == meta["audit_head"] and head["event"] == "model.artifact_uploaded"
    assert {"uri": art["uri"], "kind": "artifact", "sha256": meta["artifact_sha256"], "crc32c": art["crc32c"],
            "size": len(body), "version": art["version_id"]} in head["subjects"]  # fmt: skip

    arn = result["package_arn"]
    assert main(["approve", arn, "--approver", "alice", "--reason", "eval ok", "--no-flow"]) == 0
    assert sm.describe_model_package(ModelPackageName=arn)["ModelApprovalStatus"] == "Approved"
    assert main(["deploy", arn, "--endpoint", "fraud-prod", "--no-flow"]) == 0
    assert sm.describe_endpoint(EndpointName="fraud-prod")["EndpointStatus"]
    capsys.readouterr()

    assert main(["audit", "lineage", arn]) == 0
    text = capsys.readouterr().out
    for want in (f"dataset snapshot  {MANIFEST['snapshot_id']}", f"training run  {run.run_id}", "preemptions: 1",
                 "reason=node PREEMPTED", "steps_lost=50, overhead_s=36.1", f"{run.run_uri}/200 (checkpoint, step 200)",
                 meta["artifact_sha256"], arn,
                 "model.approved  by alice", "endpoint      fraud-prod"):  # fmt: skip
        assert want in text, (want, text)
    assert main(["audit", "lineage", run.run_id, "--json"]) == 0
    lin = json.loads(capsys.readouterr().out)
    assert lin["model_package"]["status"] == "Approved" and lin["endpoints"][0]["endpoint"] == "fraud-prod"
    assert lin["training"]["final_step"] == 200 and lin["artifact"]["sha256"] == meta["artifact_sha256"]
    events = [r["event"] for r in _records(run.settings, run.run_id)]
    assert events == ["model.artifact_uploaded", "model.exported", "model.approved", "model.deployed"]
    assert main(["audit", "verify"]) == 0


def test_second_export_never_overwrites(
    local_stack: Any, env_on_stack: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(local_stack, tmp_path)
    first = _export(run, capsys)
    s3 = boto3_client(run.settings, "s3")
    art = first["artifact"]
    # The checkpoint changes under the same run (it must not be re-packaged over the first artifact).
    from tpu_ops.cloud.clients import storage_client

    bucket = run.checkpoint_dir.split("/")[2]
    storage_client(run.settings).bucket(bucket).blob(f"runs/{run.run_id}/200/state/array.bin").upload_from_string(b"x")
    second = _export(run, capsys)
    assert second["artifact"]["adopted"] and not second["package_created"]
    assert second["package_arn"] == first["package_arn"]
    assert second["artifact"]["sha256"] == art["sha256"]
    versions = s3.list_object_versions(Bucket=art["bucket"], Prefix=art["key"]).get("Versions", [])
    assert len(versions) == 1
    from tpu_ops.errors import AlreadyExistsError
    from tpu_ops.export.artifact import MultipartSink

    sink = MultipartSink(s3, art["bucket"], art["key"], {})
    sink.write(b"not the model")
    with pytest.raises(AlreadyExistsError):
        sink.complete()
    assert s3.head_object(Bucket=art["bucket"], Key=art["key"])["ContentLength"] == art["size"]


def test_deploying_an_unapproved_package_is_refused(
    local_stack: Any, env_on_stack: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(local_stack, tmp_path)
    arn = _export(run, capsys)["package_arn"]
    assert main(["deploy", arn, "--endpoint", "fraud-unapproved", "--no-flow"]) == 1
    assert "only an Approved package may be deployed" in capsys.readouterr().err
    assert main(["approve", arn, "--approver", "bob", "--reject", "--reason", "bias eval failed", "--no-flow"]) == 0
    assert main(["deploy", arn, "--endpoint", "fraud-unapproved", "--no-flow"]) == 1
    assert "is Rejected" in capsys.readouterr().err
    sm = boto3_client(run.settings, "sagemaker")
    assert not sm.list_endpoints()["Endpoints"] or all(
        e["EndpointName"] != "fraud-unapproved" for e in sm.list_endpoints()["Endpoints"]
    )
    refused = [r for r in _records(run.settings, run.run_id) if r["event"] == "model.deployed"]
    assert [r["outcome"] for r in refused] == ["refused", "refused"]
    assert main(["approve", arn, "--approver", "bob", "--reject", "--no-flow"]) == 2  # a rejection needs a reason
