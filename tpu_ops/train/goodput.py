"""The goodput report of a training run: productive time over wall time, and what each preemption cost.

Written by the supervisor to ``RUN/_tpu_ops/goodput.json`` (the contract the export/audit side
reads). Per preemption: steps lost, and seconds spent detecting it (last sign of life → noticed),
deleting the dead slice, re-provisioning through the ladder, and restoring (slice up → first new
step). Cost comes from the run's ledger, preempted and deleting time included.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Incarnation:
    """One provisioning of the slice and what its workers did."""

    number: int
    incarnation_id: str
    queued_resource: str
    zone: str
    tier: str
    ready_at: float  # wall clock: provisioning returned the slice
    resume_step: int | None
    first_step: int | None = None
    first_step_at: float | None = None
    last_step: int | None = None
    last_progress_at: float | None = None
    kept_until: int | None = None  # the step the next incarnation resumed from (or the final step)

    def seconds_per_step(self) -> float:
        if self.first_step is None or self.last_step is None or self.last_step <= self.first_step:
            return 0.0
        assert self.first_step_at is not None and self.last_progress_at is not None
        return (self.last_progress_at - self.first_step_at) / (self.last_step - self.first_step)

    def productive_s(self) -> float:
        """Time spent on steps that were kept (a rate measured from heartbeats, times kept steps)."""
        kept = (self.kept_until or 0) - (self.resume_step or 0)
        return max(0, kept) * self.seconds_per_step()


@dataclass
class Preemption:
    """One lost slice: why, and what recovering from it cost."""

    number: int
    reason: str
    queued_resource: str
    zone: str
    tier: str
    detected_at: float
    last_step: int | None
    resume_step: int | None = None
    steps_lost: int | None = None
    detect_s: float = 0.0
    delete_s: float = 0.0
    reprovision_s: float = 0.0
    restore_s: float | None = None

    @property
    def overhead_s(self) -> float | None:
        """Preemption → first new step (None until the new slice made a step)."""
        if self.restore_s is None:
            return None
        return self.detect_s + self.delete_s + self.reprovision_s + self.restore_s


@dataclass
class GoodputReport:
    """What the run cost in time and money, and where the time went."""

    run_id: str
    outcome: str  # done | already-done | failed
    steps: int
    final_step: int | None
    started_at: float
    wall_s: float = 0.0
    incarnations: list[Incarnation] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    cost: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    @property
    def productive_s(self) -> float:
        return sum(i.productive_s() for i in self.incarnations)

    @property
    def goodput(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "outcome": self.outcome,
            "steps": self.steps,
            "final_step": self.final_step,
            "wall_s": round(self.wall_s, 3),
            "productive_s": round(self.productive_s, 3),
            "goodput": round(self.goodput, 4),
            "recoveries": len(self.preemptions),
            "preemptions": [{**asdict(p), "overhead_s": p.overhead_s} for p in self.preemptions],
            "incarnations": [{**asdict(i), "productive_s": round(i.productive_s(), 3)} for i in self.incarnations],
            "cost": self.cost,
            "error": self.error,
        }

    def rows(self) -> list[dict[str, Any]]:
        """One table row per preemption (the Prefect table artifact and the CLI table)."""

        def num(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}"

        return [
            {
                "#": p.number,
                "reason": p.reason,
                "slice": f"{p.tier} {p.zone} {p.queued_resource}",
                "steps lost": "-" if p.steps_lost is None else p.steps_lost,
                "resumed from": "-" if p.resume_step is None else p.resume_step,
                "detect (s)": num(p.detect_s),
                "delete (s)": num(p.delete_s),
                "re-provision (s)": num(p.reprovision_s),
                "restore (s)": num(p.restore_s),
                "overhead (s)": num(p.overhead_s),
            }
            for p in self.preemptions
        ]

    def summary(self) -> str:
        from tpu_ops.text import usd_by

        usd = usd_by(self.cost.get("usd_by_tier", {}))
        return (
            f"run {self.run_id}: {self.outcome} at step {self.final_step}/{self.steps}; wall {self.wall_s:.1f}s, "
            f"productive {self.productive_s:.1f}s, goodput {self.goodput:.1%}; {len(self.preemptions)} preemption(s); "
            f"cost by tier {usd} (total ${float(self.cost.get('usd_total', 0)):,.4f})"
        )
