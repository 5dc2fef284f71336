"""Guaranteed teardown: force-delete a run's queued resources and nodes and confirm they are gone.

``teardown`` is safe to call any number of times, from any process; ``ladder.slice_for`` is the
context manager that always calls it, whether the body returns, raises or is interrupted.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from tpu_ops.cloud.tpu import NodeState, QrState, TpuApi
from tpu_ops.errors import TpuOpsError, TransientError
from tpu_ops.polling import poll
from tpu_ops.provision import ledger as L
from tpu_ops.provision.naming import TIER_LABEL, belongs_to, check_run_id, created_at, run_of
from tpu_ops.provision.records import Resource, TeardownReport
from tpu_ops.settings import Settings
from tpu_ops.tiers import Tier

ALL_ZONES = ("-",)


def find_resources(api: TpuApi, zones: Sequence[str] = ALL_ZONES, run_id: str | None = None) -> list[Resource]:
    """Queued resources and nodes in ``zones`` that tpu-ops manages (of ``run_id`` if given)."""
    found: dict[tuple[str, str, str], Resource] = {}
    for zone in zones:
        candidates = [
            ("queued-resource", qr.zone, qr.qr_id, dict(qr.labels), qr.state, qr.tier, qr.accelerator_type,
             qr.create_time)
            for qr in api.list_queued_resources(zone)
        ] + [
            ("node", n.zone, n.node_id, dict(n.labels), n.state,
             dict(n.labels).get(TIER_LABEL) or (Tier.SPOT if n.spot else Tier.ON_DEMAND), n.accelerator_type,
             n.create_time)
            for n in api.list_nodes(zone)
        ]  # fmt: skip
        for kind, z, rid, labels, state, tier, accel, created in candidates:
            owner = run_of(rid, labels)
            mine = belongs_to(run_id, rid, labels) if run_id is not None else owner is not None
            if mine:
                resource = Resource(kind, z, rid, owner or run_id, state, tier, accel, created_at(labels) or created)
                found.setdefault((kind, z, rid), resource)
    return list(found.values())


def delete_resources(api: TpuApi, resources: Sequence[Resource]) -> list[Resource]:
    """Ask for deletion of each (queued resources with force, which takes their nodes too)."""
    asked: list[Resource] = []
    for r in sorted(resources, key=lambda r: r.kind != "queued-resource"):
        if r.state in QrState.DELETING or r.state in NodeState.GOING:
            asked.append(r)  # already going; still confirm it is gone
            continue
        try:
            if r.kind == "queued-resource":
                api.delete_queued_resource(r.zone, r.resource_id, force=True)
            else:
                api.delete_node(r.zone, r.resource_id)
        except TpuOpsError:
            # A node whose queued resource is being deleted may refuse a direct delete; the
            # confirm loop below asks again.
            pass
        asked.append(r)
    return asked


def confirm_gone(api: TpuApi, settings: Settings, resources: Sequence[Resource], timeout_s: float) -> None:
    """Wait until every resource answers NotFound, re-asking for deletion of any that linger."""
    pending = {(r.kind, r.zone, r.resource_id): r for r in resources}

    def check() -> bool | None:
        for key, r in list(pending.items()):
            try:
                if r.kind == "queued-resource":
                    cur: Any = api.find_queued_resource(r.zone, r.resource_id)
                    going = cur is not None and cur.state in QrState.DELETING
                else:
                    cur = api.find_node(r.zone, r.resource_id)
                    going = cur is not None and cur.state in NodeState.GOING
            except TransientError:
                continue
            if cur is None:
                del pending[key]
            elif not going:
                delete_resources(api, [r])
        return True if not pending else None

    poll(check, timeout_s=timeout_s, interval_s=settings.poll_interval_s, what=f"deletion of {sorted(pending)}")


def delete_and_confirm(api: TpuApi, settings: Settings, zone: str, qr_id: str, node_id: str, timeout_s: float) -> None:
    """Force-delete one queued resource (and its node) and wait until both are gone."""
    items = [Resource("queued-resource", zone, qr_id, None, "", "", "", None)]
    if node_id:
        items.append(Resource("node", zone, node_id, None, "", "", "", None))
    delete_resources(api, items)
    confirm_gone(api, settings, items, timeout_s)


def teardown(
    run_id: str,
    settings: Settings,
    *,
    zones: Sequence[str] | None = None,
    api: TpuApi | None = None,
    timeout_s: float = 900.0,
) -> TeardownReport:
    """Force-delete every queued resource and node of ``run_id`` and confirm they are gone.

    Looks in ``zones`` (default: the zones in the run's ledger and ``settings.tpu_zones``, or every
    zone, ``locations/-``, when neither names one). Raises ``TimeoutError`` if something
    is still there after ``timeout_s``; calling again picks up where it left off.
    """
    check_run_id(run_id)
    t0 = time.monotonic()
    api = api or TpuApi(settings)
    ledger = L.Ledger(settings, run_id)
    if not zones:
        # Where the run has been (its ledger) plus the configured zones; every zone if none known.
        zones = list(dict.fromkeys([*ledger.zones(), *settings.tpu_zones])) or list(ALL_ZONES)
    found = find_resources(api, zones, run_id)
    report = TeardownReport(run_id)
    if found:
        report.deleted = delete_resources(api, found)
        for r in found:
            if r.kind == "queued-resource":
                ledger.append(L.DELETE_REQUESTED, resource_id=r.resource_id, zone=r.zone)
        confirm_gone(api, settings, found, timeout_s)
        for r in found:  # a node made outside a queued resource bills under its own id
            ledger.append(L.GONE, resource_id=r.resource_id, zone=r.zone)
    report.confirmed_gone = True
    report.seconds = time.monotonic() - t0
    return report
