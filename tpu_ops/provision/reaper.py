"""The reaper: delete tpu-ops slices whose run is finished, unknown, dead, or older than a TTL.

The library does not know about Prefect: the caller passes ``run_state(run_id)`` answering True
(the run is live), False (finished) or None (unknown). A run is also dead when the ledger says the
process that provisioned it ran on this host and is gone (``kill -9`` leaves no other trace).
The verdict, in order: older than the TTL → reap; handed to the user by ``tpu-ops provision`` →
keep; owner process gone → reap; run finished or unknown → reap; otherwise keep.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from tpu_ops.accelerators import ACCELERATOR_TYPES
from tpu_ops.errors import TpuOpsError
from tpu_ops.provision import ledger as L
from tpu_ops.provision.naming import billed
from tpu_ops.provision.prices import PriceTable, load
from tpu_ops.provision.providers import ALL_ZONES, Provider, available
from tpu_ops.provision.records import Resource
from tpu_ops.settings import Settings
from tpu_ops.text import human_duration
from tpu_ops.tiers import Tier

RunState = Callable[[str], bool | None]


@dataclass
class ReapedRun:
    """One run's leftovers: why they were (or would be) deleted and what they had cost."""

    run_id: str
    reason: str
    resources: list[Resource]
    age_hours: float
    cost_usd: float
    deleted: bool = False
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["age_hours"] = round(self.age_hours, 4)
        d["cost_usd"] = round(self.cost_usd, 2)
        return d


@dataclass
class ReapReport:
    dry_run: bool
    reaped: list[ReapedRun] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # live runs left alone

    @property
    def cost_usd(self) -> float:
        return sum(r.cost_usd for r in self.reaped)

    def to_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "reaped": [r.to_json() for r in self.reaped],
            "kept": self.kept,
            "cost_usd": round(self.cost_usd, 2),
        }


def resource_cost(r: Resource, table: PriceTable, now: float) -> float:
    """Dollars a node or instance has cost so far: age (from its creation label) x chips x price of its tier.

    Queued resources, groups, templates and policies cost nothing by themselves; their VMs bill.
    """
    acc = ACCELERATOR_TYPES.get(r.accelerator_type)
    if r.kind not in ("node", "instance") or acc is None or r.created_at is None:
        return 0.0
    chips = r.chips if r.chips is not None else acc.chips
    try:
        price = table.price(acc.generation, r.tier)
    except TpuOpsError:
        price = table.price(acc.generation, Tier.ON_DEMAND)
    return max(0.0, now - r.created_at) / 3600.0 * chips * price


def _verdict(
    run_id: str,
    resources: Sequence[Resource],
    settings: Settings,
    run_state: RunState | None,
    ttl_s: float | None,
    now: float,
) -> str | None:
    """Why this run should be reaped, or None to keep it."""
    oldest = min((r.created_at for r in resources if r.created_at), default=None)
    if ttl_s is not None and oldest is not None and now - oldest > ttl_s:
        return f"older than the TTL ({human_duration(now - oldest)} old, TTL {human_duration(ttl_s)})"
    ledger = L.Ledger(settings, run_id)
    if ledger.handed_off():
        return None  # the user holds it (``tpu-ops provision``): only the TTL or a teardown ends it
    if L.owner_alive(ledger.owner()) is False:
        return "the process that provisioned it is gone"
    state = run_state(run_id) if run_state is not None else None
    if state is False:
        return "its run is finished"
    if state is None and run_state is not None:
        return "its run is unknown"
    return None


def reap(
    settings: Settings,
    *,
    run_state: RunState | None = None,
    ttl: timedelta | None = None,
    zones: Sequence[str] | None = None,
    dry_run: bool = False,
    providers: Sequence[Provider] | None = None,
    prices: PriceTable | None = None,
    timeout_s: float = 900.0,
) -> ReapReport:
    """Find tpu-ops slices to reap in ``zones``; delete them unless ``dry_run``; report cost.

    Sweeps every provider (default: each control plane the settings reach), so Compute Engine
    templates and workload policies of a dead run go with its instances. ``zones`` defaults to
    ``settings.tpu_zones``, or every zone if that is empty.

    With no ``run_state`` callable only the TTL and dead local owners count (nothing is reaped
    merely for being unknown).
    """
    table = prices or load(settings)
    now = time.time()
    by_run: dict[str, list[Resource]] = {}
    sweep = list(providers) if providers is not None else available(settings)
    by_name = {p.name: p for p in sweep}
    for provider in sweep:
        for r in provider.resources(zones or settings.tpu_zones or ALL_ZONES):
            if r.run_id:
                by_run.setdefault(r.run_id, []).append(r)
    report = ReapReport(dry_run=dry_run)
    ttl_s = ttl.total_seconds() if ttl is not None else None
    for run_id, resources in sorted(by_run.items()):
        reason = _verdict(run_id, resources, settings, run_state, ttl_s, now)
        if reason is None:
            report.kept.append(run_id)
            continue
        oldest = min((r.created_at for r in resources if r.created_at), default=now)
        cost = sum(resource_cost(r, table, now) for r in resources)
        item = ReapedRun(run_id, reason, resources, (now - oldest) / 3600.0, cost)
        report.reaped.append(item)
        if dry_run:
            continue
        ledger = L.Ledger(settings, run_id)
        # The ledger bills by slice id; a group's instances, templates and policies are parts of one.
        slices = sorted({(r.zone, r.resource_id) for r in resources if billed(run_id, r.kind, r.resource_id)})
        try:
            for zone, rid in slices:
                ledger.append(L.DELETE_REQUESTED, resource_id=rid, zone=zone, by="reaper")
            for name, provider in by_name.items():
                mine = [r for r in resources if r.backend == name]
                if mine:
                    provider.delete(mine, timeout_s)
            for zone, rid in slices:
                ledger.append(L.GONE, resource_id=rid, zone=zone, by="reaper")
            item.deleted = True
        except (TpuOpsError, TimeoutError) as exc:
            item.error = f"{type(exc).__name__}: {exc}"
    return report
