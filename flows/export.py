"""Prefect flows ``export_model``, ``approve_model`` and ``deploy_model``: thin wrappers around
:mod:`tpu_ops.export.steps`, each audited, each ending with a digest of the run's chain, a Prefect event
(``tpu-ops.model.exported`` / ``.approved`` / ``.deployed``) and the run's trail as an artifact.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.audit import current_actor, emit, publish_trail
from flows.settings import open_run, resolve_settings
from tpu_ops.audit.events import AuditEvent
from tpu_ops.cloud.clients import Clients
from tpu_ops.export import steps
from tpu_ops.run import Run
from tpu_ops.specs.common import GcsUri, RunId
from tpu_ops.specs.jobs import ExportSpec


@task(name="export-artifact", cache_policy=NO_CACHE)
def export_task(spec: ExportSpec, run: Run, manifest: str | None) -> dict[str, Any]:
    """Package, stream, verify and register (one library call)."""
    return steps.export(run, spec, manifest)


@contextmanager
def sealing(run: Run) -> Iterator[None]:
    """Afterwards, whatever happened: the run's chain sealed with a digest, its trail published."""
    try:
        yield
    finally:
        run.audit.digest()
        publish_trail(run)


def _exported(run: Run, result: dict[str, Any]) -> None:
    art = result["artifact"]
    get_run_logger().info("exported %s (%s) as %s", art["uri"], art["sha256"], result["package_arn"])
    emit(AuditEvent.MODEL_EXPORTED, run.id, {"package_arn": result["package_arn"], "artifact": art["uri"],
                                             "sha256": art["sha256"]})  # fmt: skip


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
    run = open_run(run_id, aws_credentials_block, gcp_credentials_block, checkpoint_dir=base)
    with sealing(run):
        result = export_task(spec, run, dataset_manifest)
        _exported(run, result)
        return result


def _released(clients: Clients, event: AuditEvent, out: dict[str, Any], payload: dict[str, Any]) -> None:
    """The Prefect event and the trail artifact of an approval or a deployment (of the package's run)."""
    emit(event, out["run_id"] or "", payload)
    if out["run_id"]:
        publish_trail(Run(out["run_id"], clients.settings, clients=clients, actor=current_actor))


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
    clients = Clients(resolve_settings(aws_credentials_block))
    out = steps.approve(clients, model_package_arn, approver, reject, reason, current_actor)
    _released(clients, AuditEvent.MODEL_APPROVED, out,
              {"package_arn": out["arn"], "status": out["status"], "approver": approver})  # fmt: skip
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
    clients = Clients(resolve_settings(aws_credentials_block))
    out = steps.deploy(clients, model_package_arn, endpoint, instance_type, instance_count, current_actor)
    _released(clients, AuditEvent.MODEL_DEPLOYED, out,
              {"package_arn": model_package_arn, "endpoint": out["endpoint_arn"]})  # fmt: skip
    return out


def export_and_seal(spec: ExportSpec, run: Run, manifest: str | None) -> dict[str, Any] | None:
    """The pipeline's last steps: export the run (if it left a complete checkpoint), then seal its audit
    chain with a digest and publish the trail. None (and an audit record saying why) if nothing to export."""
    with sealing(run):
        skipped = steps.why_not_export(run, spec)
        if skipped:
            get_run_logger().warning("export skipped: %s", skipped)
            return None
        result = export_task(spec, run, manifest)
        _exported(run, result)
        return result
