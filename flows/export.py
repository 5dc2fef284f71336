"""Prefect flows ``export_model``, ``approve_model`` and ``deploy_model``: thin wrappers around
:mod:`tpu_ops.export`, each audited, each ending with a digest of the run's chain, a Prefect event
(``tpu-ops.model.exported`` / ``.approved`` / ``.deployed``) and the run's trail as an artifact.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task

from flows.audit import audit_digest, audit_event, emit, publish_trail
from flows.export_steps import run_approve, run_deploy, run_export
from flows.settings import resolve_settings
from tpu_ops.specs.common import GcsUri, RunId
from tpu_ops.specs.jobs import ExportSpec


@task(name="export-artifact")
def export_task(
    spec: ExportSpec, run_id: str, checkpoint_dir: str, manifest: str | None, aws_block: str | None,
    gcp_block: str | None,
) -> dict[str, Any]:  # fmt: skip
    """Package, stream, verify and register (one library call)."""
    return run_export(spec, run_id, checkpoint_dir, manifest, resolve_settings(aws_block, gcp_block))


@flow(name="export_model", log_prints=True)
def export_model(
    spec: ExportSpec,
    run_id: RunId,
    checkpoint_dir: GcsUri | None = None,
    dataset_manifest: GcsUri | None = None,
    aws_credentials_block: str | None = None,
    gcp_credentials_block: str | None = None,
) -> dict[str, Any]:
    """Export a run's final checkpoint as model.tar.gz in S3 and register a SageMaker model package.

    ``checkpoint_dir`` is the training spec's (the run is ``<checkpoint_dir>/<run_id>``); it
    defaults to the export spec's ``checkpoint``.

    Args:
        spec: Where to export and how to register the model package.
        run_id: The run's id (lowercase letters, digits, '-', ≤ 40); the same id adopts or resumes that run.
        checkpoint_dir: The training spec's gs:// checkpoint_dir (the run is <checkpoint_dir>/<run_id>).
        dataset_manifest: gs:// URI of the snapshot manifest the model was trained on (lineage).
        aws_credentials_block: Name of a Prefect AwsCredentials block; empty: the environment's credentials.
        gcp_credentials_block: Name of a Prefect GcpCredentials block; empty: the environment's credentials.
    """
    base = checkpoint_dir or spec.checkpoint
    if not base:
        raise ValueError("checkpoint_dir: give the training checkpoint_dir (or set the export spec's checkpoint)")
    settings = resolve_settings(aws_credentials_block, gcp_credentials_block)
    try:
        result = export_task(spec, run_id, base, dataset_manifest, aws_credentials_block, gcp_credentials_block)
        art = result["artifact"]
        get_run_logger().info("exported %s (%s) as %s", art["uri"], art["sha256"], result["package_arn"])
        emit("model.exported", run_id, {"package_arn": result["package_arn"], "artifact": art["uri"],
                                        "sha256": art["sha256"]})  # fmt: skip
        return result
    finally:
        audit_digest(run_id, settings)
        publish_trail(run_id, settings)


@flow(name="approve_model", log_prints=True)
def approve_model(
    model_package_arn: str, approver: str, reject: bool = False, reason: str = "",
    aws_credentials_block: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Approve (or reject, with a reason) a model package pending manual approval; audited.

    Args:
        model_package_arn: ARN of the SageMaker model package to approve or reject.
        approver: Who approves (recorded in the audit trail).
        reject: Reject instead of approving.
        reason: Why (required to reject; recorded in the audit trail).
        aws_credentials_block: Name of a Prefect AwsCredentials block; empty: the environment's credentials.
    """
    settings = resolve_settings(aws_credentials_block)
    out = run_approve(model_package_arn, approver, reject, reason, settings)
    emit("model.approved", out["run_id"] or "", {"package_arn": out["arn"], "status": out["status"],
                                                 "approver": approver})  # fmt: skip
    publish_trail(out["run_id"] or "", settings)
    return out


@flow(name="deploy_model", log_prints=True)
def deploy_model(
    model_package_arn: str, endpoint: str, instance_type: str = "ml.m5.large", instance_count: int = 1,
    aws_credentials_block: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Create or update a SageMaker endpoint from an APPROVED package; refused (and audited) otherwise.

    Args:
        model_package_arn: ARN of an approved SageMaker model package.
        endpoint: SageMaker endpoint name to create or update.
        instance_type: SageMaker instance type, e.g. ml.m5.large.
        instance_count: Instances behind the endpoint (1 or more).
        aws_credentials_block: Name of a Prefect AwsCredentials block; empty: the environment's credentials.
    """
    settings = resolve_settings(aws_credentials_block)
    out = run_deploy(model_package_arn, endpoint, instance_type, instance_count, settings)
    emit("model.deployed", out["run_id"] or "", {"package_arn": model_package_arn, "endpoint": out["endpoint_arn"]})
    publish_trail(out["run_id"] or "", settings)
    return out


def _check_destination(settings: Any, destination: str) -> None:
    """The export bucket must exist (a pipeline never creates it); ``CheckpointError`` says it does not."""
    from tpu_ops.cloud.session import shared_client
    from tpu_ops.errors import CheckpointError
    from tpu_ops.uris import parse_s3

    bucket = parse_s3(destination).bucket
    try:
        shared_client(settings, "s3").head_bucket(Bucket=bucket)
    except Exception as exc:
        raise CheckpointError(f"export destination bucket {bucket} is not reachable: {exc}") from exc


def export_and_seal(
    spec: ExportSpec,
    run_id: str,
    checkpoint_dir: str,
    manifest: str | None,
    aws_credentials_block: str | None = None,
    gcp_credentials_block: str | None = None,
) -> dict[str, Any] | None:
    """The pipeline's last steps: export the run (if it left a complete checkpoint), then seal its audit
    chain with a digest and publish the trail. None (and an audit record saying why) if nothing to export."""
    from tpu_ops.cloud.clients import storage_client
    from tpu_ops.errors import CheckpointError
    from tpu_ops.export.exporter import find_source, job_subdir
    from tpu_ops.uris import parse_gs

    settings = resolve_settings(aws_credentials_block, gcp_credentials_block)
    run_uri = str(parse_gs(checkpoint_dir).child(run_id))
    try:
        gcs = storage_client(settings)
        try:
            find_source(gcs, run_uri, job_subdir(gcs, run_uri))
            _check_destination(settings, spec.destination)
        except CheckpointError as exc:
            audit_event("model.export_skipped", run_id, params={"run_uri": run_uri, "reason": str(exc)},
                        settings=settings)  # fmt: skip
            get_run_logger().warning("export skipped: %s", exc)
            return None
        result = export_task(spec, run_id, checkpoint_dir, manifest, aws_credentials_block, gcp_credentials_block)
        emit("model.exported", run_id, {"package_arn": result["package_arn"], "artifact": result["artifact"]["uri"],
                                        "sha256": result["artifact"]["sha256"]})  # fmt: skip
        return result
    finally:
        audit_digest(run_id, settings)
        publish_trail(run_id, settings)
