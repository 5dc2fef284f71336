"""The cost ledger of a run: what each slice cost, by tier, including time preempted or deleting.

An append-only JSON-lines file per run under ``settings.state_dir/ledger/``. Every process that
touches the run (the flow, teardown, the reaper) appends events; one short line per ``write`` with
``O_APPEND`` keeps concurrent writers from interleaving. Billing follows Cloud TPU: a slice costs
from the moment its node exists (queued resource ACTIVE) until it is gone, preempted or not.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from tpu_ops.layout import check_run_id
from tpu_ops.provision.prices import PriceTable
from tpu_ops.settings import Settings

# Event kinds, in the order a slice lives through them.
OWNER: Final = "owner"  # the process provisioning the run (host, pid): lets the reaper spot a dead one
ATTEMPT: Final = "attempt"
ACTIVE: Final = "active"
PREEMPTED: Final = "preempted"
DELETE_REQUESTED: Final = "delete-requested"
GONE: Final = "gone"
WAITING: Final = "waiting"  # waiting to ask again: every rung tried refused (choose.wait), or queued (choose.queue)
# The slice was handed to the user (``tpu-ops provision`` returned it); it lives until teardown or
# the reaper's TTL, even though the process that provisioned it has exited.
HANDOFF: Final = "handoff"
PHASES: Final = ("running", "preempted", "deleting")


class Ledger:
    """The event log of one run."""

    def __init__(self, settings: Settings, run_id: str) -> None:
        self.run_id = check_run_id(run_id)
        self.path = Path(settings.state_dir) / "ledger" / f"{run_id}.jsonl"

    def append(self, kind: str, **data: Any) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        event = {"t": data.pop("t", time.time()), "kind": kind, "run_id": self.run_id, **data}
        line = (json.dumps(event, sort_keys=True, default=str) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def events(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by a killed writer: skip it, keep the rest
        return out

    def claim(self) -> None:
        """Record this process as the run's owner."""
        self.append(OWNER, host=socket.gethostname(), pid=os.getpid())

    def owner(self) -> dict[str, Any] | None:
        owners = [e for e in self.events() if e["kind"] == OWNER]
        return owners[-1] if owners else None

    def zones(self) -> list[str]:
        """Every zone the run has tried, in first-seen order (teardown looks there)."""
        seen: dict[str, None] = {}
        for e in self.events():
            if e.get("zone"):
                seen.setdefault(e["zone"], None)
        return list(seen)

    def is_open(self, resource_id: str) -> bool:
        """True if the ledger has the resource billing (ACTIVE since its last GONE)."""
        last = [e["kind"] for e in self.events() if e.get("resource_id") == resource_id and e["kind"] in (ACTIVE, GONE)]
        return bool(last) and last[-1] == ACTIVE

    def handed_off(self) -> bool:
        """True if a slice of the run was handed to the user and has not been torn down since."""
        held: set[str] = set()
        for e in self.events():
            rid = e.get("resource_id", "")
            if e["kind"] == HANDOFF:
                held.add(rid)
            elif e["kind"] in (DELETE_REQUESTED, GONE):
                held.discard(rid)
        return bool(held)

    def hand_off(self, resource_id: str) -> None:
        """Record that the caller keeps the slice after this process exits (see ``HANDOFF``)."""
        self.append(HANDOFF, resource_id=resource_id)

    def summary(self, table: PriceTable, now: float | None = None) -> RunCost:
        return summarise(self.run_id, self.events(), table, now)


def owner_alive(owner: dict[str, Any] | None) -> bool | None:
    """True/False if the owner ran on this host (its pid is checked), None if unknowable."""
    if not owner or owner.get("host") != socket.gethostname():
        return None
    try:
        os.kill(int(owner["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (KeyError, TypeError, ValueError):
        return None
    return True


@dataclass
class SliceCost:
    resource_id: str
    zone: str
    tier: str
    chips: int
    generation: str
    hours: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    open: bool = True  # still billing (not confirmed gone)

    @property
    def chip_hours(self) -> float:
        return self.chips * sum(self.hours.values())


@dataclass
class RunCost:
    """Chip-hours and dollars of a run, by tier and by phase."""

    run_id: str
    slices: list[SliceCost]
    chip_hours_by_tier: dict[str, float]
    usd_by_tier: dict[str, float]
    chip_hours_by_phase: dict[str, float]
    usd_total: float
    queue_seconds: float
    open_slices: int
    price_date: str

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "chip_hours_by_tier": {k: round(v, 6) for k, v in self.chip_hours_by_tier.items()},
            "usd_by_tier": {k: round(v, 4) for k, v in self.usd_by_tier.items()},
            "chip_hours_by_phase": {k: round(v, 6) for k, v in self.chip_hours_by_phase.items()},
            "usd_total": round(self.usd_total, 4),
            "queue_seconds": round(self.queue_seconds, 3),
            "open_slices": self.open_slices,
            "price_date": self.price_date,
            "slices": [
                {
                    "resource_id": s.resource_id,
                    "zone": s.zone,
                    "tier": s.tier,
                    "chips": s.chips,
                    "hours": {k: round(v, 6) for k, v in s.hours.items()},
                    "open": s.open,
                }
                for s in self.slices
            ],
        }


def summarise(run_id: str, events: list[dict[str, Any]], table: PriceTable, now: float | None = None) -> RunCost:
    """Fold the events into per-slice phases; an open slice is billed up to ``now``."""
    now = time.time() if now is None else now
    slices: list[SliceCost] = []
    current: dict[str, SliceCost] = {}  # resource id -> its open slice (ids are reused after a recreate)
    marks: dict[str, tuple[str, float]] = {}  # resource -> (current phase, since)
    queue_seconds = 0.0
    for e in sorted(events, key=lambda e: float(e.get("t", 0))):
        kind, t, rid = e.get("kind"), float(e.get("t", 0)), e.get("resource_id", "")
        if kind == ATTEMPT:
            queue_seconds += float(e.get("seconds_waited", 0.0))
            continue
        if kind == ACTIVE and rid not in current:
            current[rid] = SliceCost(
                rid, e.get("zone", ""), e.get("tier", ""), int(e.get("chips", 0)), e.get("generation", "")
            )
            slices.append(current[rid])
            marks[rid] = ("running", t)
            continue
        if rid not in marks:  # (marks and current always hold the same resources)
            continue
        phase, since = marks[rid]
        nxt = {PREEMPTED: "preempted", DELETE_REQUESTED: "deleting"}.get(str(kind))
        # Phases only move forward, so a slice leaves each phase at most once: its hours are set, not summed.
        if nxt in PHASES[PHASES.index(phase) + 1 :]:
            current[rid].hours[phase] = max(0.0, t - since) / 3600.0
            marks[rid] = (str(nxt), t)
        elif kind == GONE:
            current[rid].hours[phase] = max(0.0, t - since) / 3600.0
            current[rid].open = False
            del marks[rid], current[rid]
    for rid, (phase, since) in marks.items():
        current[rid].hours[phase] = max(0.0, now - since) / 3600.0
    by_tier: dict[str, float] = {}
    usd: dict[str, float] = {}
    by_phase = dict.fromkeys(PHASES, 0.0)
    for s in slices:
        by_tier[s.tier] = by_tier.get(s.tier, 0.0) + s.chip_hours
        price = table.price(s.generation, s.tier) if s.generation else 0.0
        usd[s.tier] = usd.get(s.tier, 0.0) + s.chip_hours * price
        for p in PHASES:
            by_phase[p] += s.chips * s.hours[p]
    return RunCost(
        run_id=run_id,
        slices=slices,
        chip_hours_by_tier=by_tier,
        usd_by_tier=usd,
        chip_hours_by_phase=by_phase,
        usd_total=sum(usd.values()),
        queue_seconds=queue_seconds,
        open_slices=sum(1 for s in slices if s.open),
        price_date=table.date,
    )
