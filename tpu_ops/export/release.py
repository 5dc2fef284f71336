"""Approval and deployment of exported model packages, each audited in the run's chain, and the
loader behind ``tpu-ops audit lineage``.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from tpu_ops.audit import lineage
from tpu_ops.audit.events import AuditEvent
from tpu_ops.audit.records import DIGEST_CHAIN, Actor
from tpu_ops.audit.trail import AuditTrail
from tpu_ops.audit.verify import parse_record
from tpu_ops.cloud.clients import Clients
from tpu_ops.errors import NotFoundError, PolicyError, SpecError
from tpu_ops.export import registry
from tpu_ops.layout import RunLayout
from tpu_ops.specs.common import RunId


def _chain_of(pkg: registry.Package) -> str:
    if not pkg.run_id:
        raise PolicyError(f"model package {pkg.arn} was not exported by tpu-ops (no run_id in its metadata)")
    return pkg.run_id


def approve(
    sm: Any, trail: AuditTrail, arn: str, approver: str, *, reject: bool = False, reason: str = "",
    actor: Actor | None = None,
) -> registry.Package:  # fmt: skip
    """Approve (or reject, with a reason) a package pending approval; audited either way."""
    registry.check_package_arn(arn)
    if not approver.strip() or len(approver) > 128:
        raise SpecError("--approver must name who approves (1-128 characters)")
    if reject and not reason.strip():
        raise SpecError("a rejection needs --reason")
    pkg = registry.describe(sm, arn)
    chain = _chain_of(pkg)
    status = registry.REJECTED if reject else registry.APPROVED
    event = AuditEvent.MODEL_REJECTED if reject else AuditEvent.MODEL_APPROVED
    params = {"approver": approver, "reason": reason, "previous_status": pkg.status, "status": status}
    subject = {"uri": arn, "kind": "model-package", "sha256": pkg.metadata.get("artifact_sha256")}
    try:
        done = registry.set_approval(sm, pkg, status, approver, reason, datetime.now(UTC).isoformat())
    except PolicyError as exc:
        trail.record(chain, event, actor, params=params, outcome="refused", error=str(exc), subjects=[subject])
        raise
    trail.record(chain, event, actor, params=params, subjects=[subject])
    return done


def deploy(
    sm: Any, trail: AuditTrail, arn: str, endpoint: str, *, role_arn: str, instance_type: str = "ml.m5.large",
    count: int = 1, actor: Actor | None = None,
) -> registry.Deployment:  # fmt: skip
    """Create or update ``endpoint`` from an APPROVED package; anything else is refused (and audited)."""
    registry.check_package_arn(arn)
    registry.check_endpoint_name(endpoint)
    pkg = registry.describe(sm, arn)
    chain = _chain_of(pkg)
    params = {"endpoint": endpoint, "instance_type": instance_type, "instance_count": count, "status": pkg.status}
    subjects: list[dict[str, Any]] = [
        {"uri": arn, "kind": "model-package", "sha256": pkg.metadata.get("artifact_sha256")}
    ]
    try:
        dep = registry.deploy(sm, pkg, endpoint, role_arn, instance_type, count)
    except PolicyError as exc:
        trail.record(
            chain, AuditEvent.MODEL_DEPLOYED, actor, params=params, outcome="refused", error=str(exc), subjects=subjects
        )
        raise
    subjects.append({"uri": dep.endpoint_arn, "kind": "endpoint"})
    params.update(created=dep.created, endpoint_config=dep.endpoint_config, model=dep.model)
    trail.record(
        chain, AuditEvent.MODEL_DEPLOYED, actor, params=params, subjects=subjects, request_ids=list(dep.request_ids)
    )
    return dep


def chain_records(trail: AuditTrail, chain: str, workers: int = 8) -> list[dict[str, Any]]:
    """Every record of ``chain`` in seq order (objects that are not its records are left out: verify names them)."""

    def get(key: str) -> dict[str, Any] | None:
        record, _ = parse_record(trail.store.get_bytes(key))
        return record if record is not None and record.get("chain") == chain else None

    with ThreadPoolExecutor(workers) as pool:
        return [r for r in pool.map(get, trail.store.keys(chain)) if r is not None]


def last_digest(trail: AuditTrail, chain: str) -> dict[str, Any] | None:
    """The newest digest or scheduled seal naming ``chain`` (scanned newest first), as a run digest reads."""
    for key in reversed(trail.store.keys(DIGEST_CHAIN)):
        rec, _ = parse_record(trail.store.get_bytes(key))
        params = (rec or {}).get("params") or {}
        if rec is not None and params.get("chain") == chain:
            return rec
        head = (params.get("heads") or {}).get(chain) if isinstance(params.get("heads"), dict) else None
        if rec is not None and isinstance(head, dict):
            return {**rec, "params": {"chain": chain, "head_seq": head.get("seq"), "head_hash": head.get("hash")}}
    return None


def load_lineage(arn_or_run_id: str, clients: Clients, trail: AuditTrail | None = None) -> dict[str, Any]:
    """The lineage of a model package ARN or a run id (see :mod:`tpu_ops.audit.lineage`): its chain in
    ``trail`` (default: the one ``clients`` reach), SageMaker's package and the run's goodput report."""
    sm, gcs, trail = clients.aws("sagemaker"), clients.gcs(), trail or AuditTrail.of(clients)
    package: dict[str, Any] | None = None
    if arn_or_run_id.startswith("arn:"):
        pkg = registry.describe(sm, registry.check_package_arn(arn_or_run_id))
        run_id = _chain_of(pkg)
        package = {"arn": pkg.arn, "group": pkg.group, "version": pkg.version, "status": pkg.status}
    else:
        from pydantic import TypeAdapter

        try:
            run_id = TypeAdapter(RunId).validate_python(arn_or_run_id)
        except ValueError as exc:
            raise SpecError(f"{arn_or_run_id!r} is neither a model package ARN nor a run id: {exc}") from None
    records = chain_records(trail, run_id)
    if not records:
        raise NotFoundError(f"no audit records for run {run_id} in {trail.store.trail}")
    lin = lineage.build(run_id, records, None, package, last_digest(trail, run_id))
    if package is None and lin["model_package"].get("arn"):
        try:
            pkg = registry.describe(sm, lin["model_package"]["arn"])
            lin["model_package"] = {"arn": pkg.arn, "group": pkg.group, "version": pkg.version, "status": pkg.status}
        except NotFoundError:
            lin["model_package"]["status"] = "not found in SageMaker"
    run_uri = lin["training"]["run_uri"]
    if run_uri:
        goodput = _goodput(gcs, run_uri)
        if goodput:
            lin = lineage.build(run_id, records, goodput, lin["model_package"], last_digest(trail, run_id))
    return lin


def _goodput(gcs: Any, run_uri: str) -> dict[str, Any] | None:
    uri = RunLayout(run_uri).goodput
    blob = gcs.bucket(uri.bucket).get_blob(uri.prefix)
    if blob is None:
        return None
    doc = json.loads(blob.download_as_bytes())
    return doc if isinstance(doc, dict) else None
