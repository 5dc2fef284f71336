"""The Prefect side of the audit trail: who acts (the flow run), Prefect events, the trail as an artifact.

What a run records goes through its :class:`tpu_ops.run.Run` (``run.audit.record(AuditEvent...)``,
``run.audit.digest()``), built once per flow run with the credentials of its blocks; records never
raise into the flow (see :mod:`tpu_ops.audit.recorder`). The actor is the Prefect flow run and
deployment when there is one, and the settings' ``audit_actor`` (else the OS user) as identity.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from tpu_ops.audit.events import AuditEvent, prefect_name
from tpu_ops.audit.records import Actor
from tpu_ops.audit.trail import AuditTrail
from tpu_ops.run import Run
from tpu_ops.settings import Settings

log = logging.getLogger("tpu_ops.audit")


def trail_for(settings: Settings | None = None) -> AuditTrail:
    """The trail written with ``settings``' credentials (for commands that act on no one run)."""
    return AuditTrail.from_settings(settings or Settings())


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


def emit(event: AuditEvent, run_id: str, payload: dict[str, Any] | None = None) -> None:
    """The Prefect event ``tpu-ops.<event>`` about resource ``tpu-ops.run.<run_id>`` (never raises)."""
    try:
        from prefect.events import emit_event

        emit_event(event=prefect_name(event), resource={"prefect.resource.id": f"tpu-ops.run.{run_id}"},
                   payload=payload or {})  # fmt: skip
    except Exception as exc:
        log.warning("could not emit Prefect event %s: %s", prefect_name(event), exc)


def publish_trail(run: Run) -> None:
    """The run's audit chain and lineage as a markdown artifact (``audit-<run_id>``) in the Prefect UI."""
    try:
        from prefect.artifacts import create_markdown_artifact

        from tpu_ops.audit.lineage import render
        from tpu_ops.export.release import chain_records, load_lineage

        records = chain_records(run.trail, run.id)
        rows = ["| seq | time | event | outcome | actor | hash |", "|---|---|---|---|---|---|"]
        for r in records:
            who = r.get("actor", {}).get("flow") or r.get("actor", {}).get("identity", "")
            rows.append(f"| {r['seq']} | {r['time'][:19]} | `{r['event']}` | {r['outcome']} | {who} | "
                        f"`{r['hash'][:12]}` |")  # fmt: skip
        try:
            text = render(load_lineage(run.id, run.clients, run.trail))
        except Exception as exc:
            text = f"(lineage unavailable: {exc})"
        create_markdown_artifact(
            key=f"audit-{run.id}",
            markdown="\n".join([f"# Audit trail of run `{run.id}`", "", "```", text, "```", "", *rows]),
            description=f"audit chain {run.id}: {len(records)} records",
        )
    except Exception as exc:
        log.warning("could not publish the audit trail of run %s: %s", run.id, exc)
