"""The reaper as a Prefect flow, and how it asks Prefect whether a tpu-ops run is still live.

A run is live while any flow run tagged ``tpu-ops-run:<run_id>`` is not in a final state;
finished when all of them are final; unknown when there are none.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from flows.audit import current_actor
from flows.provision import run_tag
from flows.settings import resolve_settings
from tpu_ops.audit.events import AuditEvent
from tpu_ops.cloud.clients import Clients
from tpu_ops.provision.reaper import ReapReport, reap
from tpu_ops.run import Run


def prefect_run_state(run_id: str) -> bool | None:
    """True if a flow run of ``run_id`` is live, False if all are final, None if there are none."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
    from prefect.client.schemas.sorting import FlowRunSort

    tagged = FlowRunFilter(tags=FlowRunFilterTags(all_=[run_tag(run_id)]))
    with get_client(sync_client=True) as client:
        # The server refuses a filter without an explicit sort and limit (422), which the guard
        # below would turn into "live" for every run: say both.
        runs = client.read_flow_runs(flow_run_filter=tagged, sort=FlowRunSort.START_TIME_DESC, limit=200)
    if not runs:
        return None
    return any(r.state is None or not r.state.is_final() for r in runs)


def guarded(judge: Callable[[str], bool | None]) -> Callable[[str], bool | None]:
    """``judge`` that answers "live" when Prefect cannot be asked: an outage must not reap live runs."""

    def ask(run_id: str) -> bool | None:
        try:
            return judge(run_id)
        except Exception as exc:
            print(f"reaper: cannot ask Prefect about run {run_id} ({type(exc).__name__}: {exc}); keeping it")
            return True

    return ask


def reap_once(
    *, dry_run: bool = False, ttl: timedelta | None = None, zones: list[str] | None = None, use_prefect: bool = True
) -> ReapReport:
    """One pass of the reaper with Prefect as the judge of which runs are live."""
    settings = resolve_settings()
    report = reap(settings, run_state=guarded(prefect_run_state) if use_prefect else None, ttl=ttl, dry_run=dry_run,
                  zones=zones or None)  # fmt: skip
    if not dry_run:
        clients = Clients(settings)
        for r in report.reaped:
            _audit_reaped(clients, r)
    return report


def _audit_reaped(clients: Clients, r: Any) -> None:
    """One record in the reaped run's chain (and a digest sealing it): what went, why, what it cost."""
    if not r.run_id:
        return
    params = {"reason": r.reason, "age_hours": round(r.age_hours, 3), "cost_usd": round(r.cost_usd, 2)}
    subjects = [{"uri": f"tpu://{x.zone}/{x.resource_id}", "kind": x.kind} for x in r.resources]
    run = Run(r.run_id, clients.settings, clients=clients, actor=current_actor)
    run.audit.record(AuditEvent.RUN_REAPED, params=params, subjects=subjects,
                     outcome="success" if r.deleted else "failure", error=r.error or None)  # fmt: skip
    run.audit.digest()


@flow(name="reap-tpu-slices", log_prints=True)
def reap_tpu_slices(
    dry_run: bool = False, ttl_hours: float | None = 72.0, zones: list[str] | None = None
) -> dict[str, Any]:
    """Delete tpu-ops slices whose run is finished, unknown, dead, or older than ``ttl_hours``.

    Args:
        dry_run: Only report what would be deleted.
        ttl_hours: Delete any tpu-ops slice older than this many hours, live or not; empty: no limit.
        zones: Zones to sweep, e.g. us-central2-b; empty: every zone the TPU API lists.
    """
    logger = get_run_logger()
    report = reap_once(dry_run=dry_run, ttl=timedelta(hours=ttl_hours) if ttl_hours else None, zones=zones)
    for r in report.reaped:
        verb = "would delete" if dry_run else ("deleted" if r.deleted else "FAILED to delete")
        logger.info("%s run %s (%s): %d resources, ~$%.2f", verb, r.run_id, r.reason, len(r.resources), r.cost_usd)
    if report.reaped:
        create_table_artifact(
            [
                {
                    "run": r.run_id,
                    "reason": r.reason,
                    "resources": len(r.resources),
                    "age (h)": f"{r.age_hours:.2f}",
                    "cost ($)": f"{r.cost_usd:.2f}",
                    "deleted": r.deleted,
                    "error": r.error,
                }
                for r in report.reaped
            ],
            description="reaped TPU slices",
        )
    return report.to_json()
