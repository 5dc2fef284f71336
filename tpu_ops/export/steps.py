"""The audited use cases behind ``export_model``, ``approve_model`` and ``deploy_model``, without Prefect.

The flows call these (one task = one call), and so does the CLI's ``--no-flow`` path, which then
starts without importing Prefect at all. Each audits what it did, failures included, in the run's
chain and with the run's credentials (its :class:`tpu_ops.run.Run`, or the ``Clients`` it is given).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tpu_ops.audit.events import AuditEvent
from tpu_ops.audit.recorder import ActorOf, RunAudit, before_start
from tpu_ops.audit.trail import AuditTrail
from tpu_ops.cloud.clients import Clients
from tpu_ops.errors import CheckpointError
from tpu_ops.export import registry, release
from tpu_ops.export.exporter import export_run, failure_text, find_source, job_subdir
from tpu_ops.run import Run
from tpu_ops.specs.jobs import ExportSpec
from tpu_ops.uris import parse_s3


def export(run: Run, spec: ExportSpec, manifest: str | None) -> dict[str, Any]:
    """Export ``run`` (its checkpoint location known); a failure is audited, then re-raised."""
    c = run.clients
    try:
        result = export_run(
            spec, run.run_uri, run.id, gcs=c.gcs(), s3=c.aws("s3"), sm=c.aws("sagemaker"), trail=run.trail,
            actor=run.audit.actor(), manifest_uri=manifest,
        )  # fmt: skip
    except Exception as exc:
        run.audit.record(AuditEvent.MODEL_EXPORTED, params={"run_uri": run.run_uri, "destination": spec.destination},
                         outcome="failure", error=failure_text(exc), before_start=before_start(exc))  # fmt: skip
        raise
    return result.to_json()


def why_not_export(run: Run, spec: ExportSpec) -> str | None:
    """Why ``run`` cannot be exported now (no complete checkpoint; the destination bucket, which a pipeline
    never creates, unreachable), audited as ``model.export_skipped``; None if it can be."""
    gcs = run.clients.gcs()
    bucket = parse_s3(spec.destination).bucket
    try:
        find_source(gcs, run.run_uri, job_subdir(gcs, run.run_uri))
        try:
            run.clients.aws("s3").head_bucket(Bucket=bucket)
        except Exception as exc:
            raise CheckpointError(f"export destination bucket {bucket} is not reachable: {exc}") from exc
    except CheckpointError as exc:
        run.audit.record(AuditEvent.MODEL_EXPORT_SKIPPED, params={"run_uri": run.run_uri, "reason": str(exc)})
        return str(exc)
    return None


@contextmanager
def _on_package(clients: Clients, arn: str, actor: ActorOf | None) -> Iterator[tuple[AuditTrail, Any, str | None]]:
    """The trail, SageMaker and the package's run id for one step on a package; the run's chain is
    sealed with a digest afterwards, whatever happened."""
    trail, sm = AuditTrail.of(clients), clients.aws("sagemaker")
    run_id = _run_of(sm, arn)
    try:
        yield trail, sm, run_id
    finally:
        if run_id:
            RunAudit(trail, run_id, actor).digest()


def approve(
    clients: Clients, arn: str, approver: str, reject: bool, reason: str, actor: ActorOf | None = None
) -> dict[str, Any]:
    """Approve or reject ``arn`` (audited), then seal the run's chain with a digest."""
    with _on_package(clients, arn, actor) as (trail, sm, run_id):
        who = actor(trail) if actor else None
        pkg = release.approve(sm, trail, arn, approver, reject=reject, reason=reason, actor=who)
    return {"arn": pkg.arn, "status": pkg.status, "run_id": run_id, "approver": approver}


def deploy(
    clients: Clients, arn: str, endpoint: str, instance_type: str, count: int, actor: ActorOf | None = None
) -> dict[str, Any]:
    """Deploy an approved ``arn`` on ``endpoint`` (refused and audited otherwise), then seal with a digest."""
    with _on_package(clients, arn, actor) as (trail, sm, run_id):
        who = actor(trail) if actor else None
        dep = release.deploy(sm, trail, arn, endpoint, role_arn=clients.settings.sagemaker_role_arn,
                             instance_type=instance_type, count=count, actor=who)  # fmt: skip
    return {"arn": arn, "run_id": run_id, "endpoint": dep.endpoint, "endpoint_arn": dep.endpoint_arn,
            "created": dep.created, "model": dep.model}  # fmt: skip


def _run_of(sm: Any, arn: str) -> str | None:
    try:
        return registry.describe(sm, registry.check_package_arn(arn)).run_id
    except Exception:
        return None  # the library call reports what is wrong with the ARN
