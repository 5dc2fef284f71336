"""The thin Prefect-side audit helper every flow step calls.

    audit_event("slice.provisioned", run_id, params={...}, subjects=[...], request_ids=[...])
    audit_digest(run_id)            # at the end of each flow run: a KMS-signed digest of the chain head

Neither ever raises into the caller: a record that cannot reach S3 is spooled locally and sent,
in order, by the next call that can (see ``tpu_ops.audit``). The actor is the Prefect flow run and
deployment when there is one, and the settings' ``audit_actor`` (else the OS user) as identity.
"""

from __future__ import annotations

import getpass
import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tpu_ops.audit.records import Actor
from tpu_ops.audit.trail import AuditTrail
from tpu_ops.settings import Settings

log = logging.getLogger("tpu_ops.audit")
_trails: dict[tuple[str, ...], AuditTrail] = {}
_lock = threading.Lock()


def trail_for(settings: Settings | None = None) -> AuditTrail:
    """The process's trail for these settings (clients are built once per trail location)."""
    s = settings or Settings()
    key = (s.audit_uri, str(s.aws_endpoint_url), str(s.audit_spool_path), str(s.audit_kms_key_id))
    with _lock:
        if key not in _trails:
            if not s.audit_actor:
                s = s.model_copy(update={"audit_actor": _os_user()})
            _trails[key] = AuditTrail.from_settings(s)
        return _trails[key]


def _os_user() -> str:
    try:
        return f"user:{getpass.getuser()}"
    except Exception:
        return "tpu-ops"


def current_actor(trail: AuditTrail) -> Actor:
    """The identity plus the current Prefect flow run and deployment, when inside one."""
    flow: dict[str, str | None] = {}
    if "prefect" not in sys.modules:  # no flow run without Prefect loaded; importing it costs seconds
        return trail.actor()
    try:
        from prefect.runtime import deployment, flow_run

        if flow_run.id:
            flow = {"flow": flow_run.flow_name, "flow_run": str(flow_run.id), "deployment": deployment.name}
    except Exception:  # noqa: S110 - outside Prefect there is no flow run to name
        pass
    return trail.actor(**flow)


def audit_event(
    event: str,
    run_id: str,
    *,
    params: dict[str, Any] | None = None,
    outcome: str = "success",
    subjects: list[dict[str, Any]] | None = None,
    request_ids: list[str] | None = None,
    links: list[dict[str, Any]] | None = None,
    error: str | None = None,
    settings: Settings | None = None,
) -> dict[str, Any] | None:
    """Append one record to ``run_id``'s chain; returns it, or None if spooled or failed (never raises)."""
    try:
        trail = trail_for(settings)
        written = trail.record(
            run_id, event, current_actor(trail), params=params, outcome=outcome, subjects=subjects,
            request_ids=request_ids, links=links, error=error,
        )  # fmt: skip
        if written.spooled:
            log.warning("audit: %s for run %s spooled to %s (S3 unreachable, or an earlier record of the run waits "
                        "there)", event, run_id, trail.spool.path)  # fmt: skip
        return written.record
    except Exception as exc:
        log.warning("audit: could not record %s for run %s: %s", event, run_id, exc)
        return None


@contextmanager
def audited(
    event: str, run_id: str, *, params: dict[str, Any] | None = None, settings: Settings | None = None
) -> Iterator[dict[str, Any]]:
    """Audit the block as ``event``: success, or failure with the error (re-raised). The block may
    add ``params``, ``subjects`` and ``request_ids`` to the dict it is given."""
    extra: dict[str, Any] = {"params": dict(params or {}), "subjects": [], "request_ids": []}
    try:
        yield extra
    except BaseException as exc:
        audit_event(event, run_id, params=extra["params"], outcome="failure", error=f"{type(exc).__name__}: {exc}",
                    subjects=extra["subjects"], request_ids=extra["request_ids"], settings=settings)  # fmt: skip
        raise
    audit_event(event, run_id, params=extra["params"], subjects=extra["subjects"], request_ids=extra["request_ids"],
                settings=settings)  # fmt: skip


def audit_digest(run_id: str, settings: Settings | None = None) -> dict[str, Any] | None:
    """Seal ``run_id``'s chain head with a signed digest (spooled if S3 is down; never raises)."""
    try:
        trail = trail_for(settings)
        written = trail.digest(run_id, current_actor(trail))
        if written.spooled:
            log.warning("audit: S3 unreachable, digest of run %s spooled", run_id)
        return written.record
    except Exception as exc:
        log.warning("audit: could not seal run %s: %s", run_id, exc)
        return None


def emit(event: str, run_id: str, payload: dict[str, Any] | None = None) -> None:
    """A Prefect event ``tpu-ops.<event>`` about resource ``tpu-ops.run.<run_id>`` (never raises)."""
    try:
        from prefect.events import emit_event

        emit_event(event=f"tpu-ops.{event}", resource={"prefect.resource.id": f"tpu-ops.run.{run_id}"},
                   payload=payload or {})  # fmt: skip
    except Exception as exc:
        log.warning("could not emit Prefect event tpu-ops.%s: %s", event, exc)


def publish_trail(run_id: str, settings: Settings | None = None) -> None:
    """The run's audit chain and lineage as a markdown artifact (``audit-<run_id>``) in the Prefect UI."""
    try:
        from prefect.artifacts import create_markdown_artifact

        from tpu_ops.audit.lineage import render
        from tpu_ops.cloud.clients import storage_client
        from tpu_ops.cloud.session import shared_client
        from tpu_ops.export.release import chain_records, load_lineage

        s = settings or Settings()
        trail = trail_for(s)
        records = chain_records(trail, run_id)
        rows = ["| seq | time | event | outcome | actor | hash |", "|---|---|---|---|---|---|"]
        for r in records:
            who = r.get("actor", {}).get("flow") or r.get("actor", {}).get("identity", "")
            rows.append(f"| {r['seq']} | {r['time'][:19]} | `{r['event']}` | {r['outcome']} | {who} | "
                        f"`{r['hash'][:12]}` |")  # fmt: skip
        try:
            text = render(load_lineage(run_id, sm=shared_client(s, "sagemaker"), gcs=storage_client(s), trail=trail))
        except Exception as exc:
            text = f"(lineage unavailable: {exc})"
        create_markdown_artifact(
            key=f"audit-{run_id}",
            markdown="\n".join([f"# Audit trail of run `{run_id}`", "", "```", text, "```", "", *rows]),
            description=f"audit chain {run_id}: {len(records)} records",
        )
    except Exception as exc:
        log.warning("could not publish the audit trail of run %s: %s", run_id, exc)
