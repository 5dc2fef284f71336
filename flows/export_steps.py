"""The steps behind ``export_model``, ``approve_model`` and ``deploy_model``, without Prefect.

The flows call these (one task = one call), and so does the CLI's ``--no-flow`` path, which then
starts without importing Prefect at all. Each audits what it did, failures included.
"""

from __future__ import annotations

from typing import Any

from flows.audit import audit_digest, audit_event, current_actor, trail_for
from tpu_ops.cloud.clients import storage_client
from tpu_ops.cloud.session import shared_client
from tpu_ops.export import registry, release
from tpu_ops.export.exporter import export_run, failure_text
from tpu_ops.specs.jobs import ExportSpec
from tpu_ops.uris import parse_gs


def run_export(
    spec: ExportSpec, run_id: str, checkpoint_dir: str, manifest: str | None, settings: Any
) -> dict[str, Any]:
    """Export ``run_id`` (RUN = ``checkpoint_dir/run_id``); a failure is audited, then re-raised."""
    trail = trail_for(settings)
    run_uri = str(parse_gs(checkpoint_dir).child(run_id))
    try:
        result = export_run(
            spec, run_uri, run_id, gcs=storage_client(settings), s3=shared_client(settings, "s3"),
            sm=shared_client(settings, "sagemaker"), trail=trail, actor=current_actor(trail), manifest_uri=manifest,
        )  # fmt: skip
    except Exception as exc:
        audit_event("model.exported", run_id, params={"run_uri": run_uri, "destination": spec.destination},
                    outcome="failure", error=failure_text(exc), settings=settings)  # fmt: skip
        raise
    return result.to_json()


def run_approve(arn: str, approver: str, reject: bool, reason: str, settings: Any) -> dict[str, Any]:
    """Approve or reject ``arn`` (audited), then seal the run's chain with a digest."""
    trail = trail_for(settings)
    sm = shared_client(settings, "sagemaker")
    run_id = _run_of(sm, arn)
    try:
        pkg = release.approve(sm, trail, arn, approver, reject=reject, reason=reason, actor=current_actor(trail))
    finally:
        if run_id:
            audit_digest(run_id, settings)
    return {"arn": pkg.arn, "status": pkg.status, "run_id": run_id, "approver": approver}


def run_deploy(arn: str, endpoint: str, instance_type: str, count: int, settings: Any) -> dict[str, Any]:
    """Deploy an approved ``arn`` on ``endpoint`` (refused and audited otherwise), then seal with a digest."""
    trail = trail_for(settings)
    sm = shared_client(settings, "sagemaker")
    run_id = _run_of(sm, arn)
    try:
        dep = release.deploy(sm, trail, arn, endpoint, role_arn=settings.sagemaker_role_arn,
                             instance_type=instance_type, count=count, actor=current_actor(trail))  # fmt: skip
    finally:
        if run_id:
            audit_digest(run_id, settings)
    return {"arn": arn, "run_id": run_id, "endpoint": dep.endpoint, "endpoint_arn": dep.endpoint_arn,
            "created": dep.created, "model": dep.model}  # fmt: skip


def _run_of(sm: Any, arn: str) -> str | None:
    try:
        return registry.describe(sm, registry.check_package_arn(arn)).run_id
    except Exception:
        return None  # the library call reports what is wrong with the ARN
