"""The goodput report of a training run, derived from the run's state in GCS (``state.json``).

Written to ``RUN/_tpu_ops/goodput.json`` once the run ends (the contract export and audit read); a
finished run's report is never rewritten. Goodput is computed from first principles:

- **wall** = the run's first supervisor start → the trainer's completion (``DONE``), across every
  supervisor and incarnation;
- **productive** = the time worker 0's trainer spent on steps that were kept (steps ``resume < s ≤
  kept_until`` of each incarnation), from the trainer's own step records carried by heartbeats; never
  a rate times a count;
- every other second falls in one badput category (the ones of Google's ``ml-goodput-measurement``):
  the wall time is cut into segments and each segment goes to the most specific record covering it,
  so productive + badput = wall and goodput ≤ 100% hold by construction (and are checked anyway).

Scheduling goodput (time a slice was held over time it was held or asked for) is reported beside it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tpu_ops.errors import NotFoundError, TpuOpsError
from tpu_ops.train.elastic import chip_goodput, shape_rows
from tpu_ops.train.layout import get_json
from tpu_ops.train.runstate import IncarnationState, PreemptionState, RunState
from tpu_ops.uris import ObjectUri

PRODUCTIVE = "productive"
# Badput categories as ml-goodput-measurement names them (BadputType), plus where ours come from.
TPU_INITIALIZATION = "tpu_initialization"  # the first slice: asked for → ready (queue and boot)
TRAINING_PREP = "training_prep"  # trainer records of kind "prep"
PROGRAM_STARTUP = "program_startup"  # slice ready → the trainer's first record (agent, install, import)
DATA_LOADING = "data_loading"  # trainer records of kind "data"
CHECKPOINT_SAVE = "checkpoint_save"  # saves of kept steps
CHECKPOINT_RESTORE = "checkpoint_restore"  # trainer records of kind "restore"
WASTED_PROGRESS = "wasted_progress_from_disruption"  # steps (and their saves) a preemption threw away
INFRASTRUCTURE_RECOVERY = "infrastructure_recovery_from_disruption"  # last sign of life → next slice ready
OTHER = "other"
BADPUT = (TPU_INITIALIZATION, TRAINING_PREP, PROGRAM_STARTUP, DATA_LOADING, CHECKPOINT_SAVE, CHECKPOINT_RESTORE,
          WASTED_PROGRESS, INFRASTRUCTURE_RECOVERY, OTHER)  # fmt: skip
# When records overlap, the most specific wins (lower index = higher priority).
# A step's record spans its whole iteration, its save included: the save wins that part.
_PRIORITY = (CHECKPOINT_SAVE, PRODUCTIVE, WASTED_PROGRESS, CHECKPOINT_RESTORE, DATA_LOADING, TRAINING_PREP,
             PROGRAM_STARTUP, TPU_INITIALIZATION, INFRASTRUCTURE_RECOVERY)  # fmt: skip
TOLERANCE = 0.01  # productive + badput must equal wall within 1%


class GoodputInvariantError(TpuOpsError):
    """The report broke an invariant (goodput > 100%, or the categories do not add up to the wall time)."""


def _kept(inc: IncarnationState, step: int) -> bool:
    return (inc.resume_step or 0) < step <= (inc.kept_until if inc.kept_until is not None else -1)


def kept_steps(state: RunState) -> dict[int, IncarnationState]:
    """Each kept step and the incarnation that ran it: the steps worker 0 recorded that a later incarnation
    did not throw away, and every step an ended incarnation's committed checkpoint proves, even when its
    records went with a VM deleted before its last heartbeat (the goodput report and the efficiency
    figures count the same steps)."""
    owner: dict[int, IncarnationState] = {}
    for inc in state.incarnations:
        for r in inc.timeline:
            if r[0] == "step" and r[1] is not None and _kept(inc, int(r[1])):
                owner[int(r[1])] = inc
    for inc in state.incarnations:
        if inc.kept_until is not None and inc.end in ("done", "preempted", "moved"):
            for step in range((inc.resume_step or 0) + 1, inc.kept_until + 1):
                owner.setdefault(step, inc)
    return owner


def intervals(state: RunState, end: float) -> list[tuple[str, float, float]]:
    """Every labelled interval of the run (they may overlap; ``categorise`` resolves that)."""
    out: list[tuple[str, float, float]] = []
    for inc in state.incarnations:
        first_record = min((float(r[2]) for r in inc.timeline), default=None)
        if inc.ready_at is not None:
            if inc.number == 0:
                out.append((TPU_INITIALIZATION, inc.requested_at, inc.ready_at))
            out.append((PROGRAM_STARTUP, inc.ready_at, first_record if first_record is not None else
                        (inc.ended_at or end)))  # fmt: skip
        for kind, step, start, stop in inc.timeline:
            s = int(step) if step is not None else None
            if kind == "step" and s is not None:
                label = PRODUCTIVE if _kept(inc, s) else WASTED_PROGRESS
            elif kind == "save" and s is not None:
                label = CHECKPOINT_SAVE if _kept(inc, s) else WASTED_PROGRESS
            else:
                label = {"restore": CHECKPOINT_RESTORE, "data": DATA_LOADING, "prep": TRAINING_PREP,
                         "init": TPU_INITIALIZATION}.get(str(kind), PROGRAM_STARTUP)  # fmt: skip
            out.append((label, float(start), float(stop)))
    for p in state.preemptions:
        inc = state.incarnations[p.incarnation]
        last = max((float(r[3]) for r in inc.timeline), default=inc.ready_at or inc.requested_at)
        nxt = state.incarnations[p.incarnation + 1] if p.incarnation + 1 < len(state.incarnations) else None
        until = nxt.ready_at if nxt is not None and nxt.ready_at is not None else end
        out.append((INFRASTRUCTURE_RECOVERY, last, until))
    return out


def categorise(spans: list[tuple[str, float, float]], start: float, end: float) -> dict[str, float]:
    """Seconds per category over ``[start, end]``: each moment counts once, for the highest-priority
    label covering it, or for ``other``."""
    rank = {label: i for i, label in enumerate(_PRIORITY)}
    events: list[tuple[float, int, int]] = []  # (time, +1/-1, rank)
    for label, a, b in spans:
        a, b = max(a, start), min(b, end)
        if b > a:
            events += [(a, 1, rank[label]), (b, -1, rank[label])]
    events.sort()
    out = dict.fromkeys((PRODUCTIVE, *BADPUT), 0.0)
    active = [0] * len(_PRIORITY)
    t = start
    for when, delta, r in events:
        if when > t:
            top = next((i for i, n in enumerate(active) if n > 0), None)
            out[_PRIORITY[top] if top is not None else OTHER] += when - t
            t = when
        active[r] += delta
    if end > t:
        out[OTHER] += end - t
    return out


@dataclass
class GoodputReport:
    """What the run cost in time and money, and where the time went."""

    run_id: str
    outcome: str  # running | done | failed
    steps: int
    final_step: int | None
    started_at: float
    wall_s: float = 0.0
    categories: dict[str, float] = field(default_factory=dict)
    steps_kept: int = 0
    scheduling_goodput: float | None = None
    incarnations: list[IncarnationState] = field(default_factory=list)
    preemptions: list[PreemptionState] = field(default_factory=list)
    cost: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    efficiency: dict[str, Any] = field(default_factory=dict)  # train.efficiency's figures, when the trainer said
    moves: list[dict[str, Any]] = field(default_factory=list)  # voluntary moves (train.moves), with their overlap
    stored: dict[str, Any] | None = None  # the report as read back from GCS (a finished run's, unchanged)

    @property
    def productive_s(self) -> float:
        return self.categories.get(PRODUCTIVE, 0.0)

    @property
    def goodput(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    def check(self) -> None:
        """``GoodputInvariantError`` unless goodput ≤ 100% and productive + badput = wall (within 1%)."""
        total = sum(self.categories.values())
        if self.productive_s > self.wall_s * (1 + 1e-9) + 1e-6:
            raise GoodputInvariantError(f"productive {self.productive_s:.3f}s > wall {self.wall_s:.3f}s")
        if self.wall_s > 0 and abs(total - self.wall_s) > TOLERANCE * self.wall_s:
            raise GoodputInvariantError(f"categories add up to {total:.3f}s, wall is {self.wall_s:.3f}s")

    @classmethod
    def derive(cls, state: RunState, now: float, cost: dict[str, Any] | None = None) -> GoodputReport:
        """The report of ``state`` (a running run is measured up to ``now``)."""
        end = state.finished_at if state.finished_at is not None else now
        cats = categorise(intervals(state, end), state.started_at, end)
        # Steps a checkpoint proves without their records count as kept; their seconds stay in "other".
        kept = kept_steps(state)
        held = asked = 0.0
        for n, inc in enumerate(state.incarnations):
            stop = inc.ended_at if inc.ended_at is not None else end
            ready = inc.ready_at if inc.ready_at is not None else stop
            if not (n and state.incarnations[n - 1].end == "moved"):  # a move asks while it trains: no wait
                asked += max(0.0, ready - inc.requested_at)
            held += max(0.0, stop - ready)
        report = cls(
            run_id=state.run_id, outcome=state.outcome, steps=state.steps, final_step=state.final_step,
            started_at=state.started_at, wall_s=max(0.0, end - state.started_at), categories=cats,
            steps_kept=len(kept), scheduling_goodput=held / (held + asked) if held + asked > 0 else None,
            incarnations=state.incarnations, preemptions=state.preemptions, cost=dict(cost or {}), error=state.error,
            moves=[{**asdict(m), "overlap_s": round(m.overlap_s, 3)} for m in state.moves],
        )  # fmt: skip
        report.check()
        return report

    @classmethod
    def finished(cls, gcs: Any, uri: ObjectUri) -> GoodputReport | None:
        """A finished run's report at ``uri``, exactly as stored (None unless the run is done)."""
        try:
            doc = get_json(gcs, uri)
        except NotFoundError:
            return None
        return cls.from_json(doc) if isinstance(doc, dict) and doc.get("outcome") in ("done", "already-done") else None

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> GoodputReport:
        """A stored report (``to_json`` gives back exactly ``doc``)."""
        return cls(doc["run_id"], doc["outcome"], doc["steps"], doc.get("final_step"), doc.get("started_at", 0.0),
                   doc.get("wall_s", 0.0), dict(doc.get("badput_s", {}), productive=doc.get("productive_s", 0.0)),
                   doc.get("steps_kept", 0), doc.get("scheduling_goodput"), cost=doc.get("cost", {}),
                   error=doc.get("error", ""), efficiency=doc.get("efficiency", {}), stored=doc)  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        if self.stored is not None:
            return self.stored
        incs = []
        for i in self.incarnations:
            d = asdict(i)
            d.pop("timeline")
            # saves take their part of a step's record, as in the run's own figure, so the slices add up to it
            end = self.started_at + self.wall_s
            spans = [s for s in intervals(_only(i), end) if s[0] in (PRODUCTIVE, CHECKPOINT_SAVE)]
            d["productive_s"] = round(categorise(spans, self.started_at, end)[PRODUCTIVE], 3)
            incs.append(d)
        by_number = {d["number"]: float(d["productive_s"]) for d in incs}
        shapes = shape_rows(self.incarnations, self.started_at + self.wall_s, lambda i: by_number[i.number])
        return {
            "run_id": self.run_id,
            "outcome": self.outcome,
            "steps": self.steps,
            "final_step": self.final_step,
            "steps_kept": self.steps_kept,
            "started_at": self.started_at,
            "wall_s": round(self.wall_s, 3),
            "productive_s": round(self.productive_s, 3),
            "goodput": round(self.goodput, 4),
            "badput_s": {k: round(v, 3) for k, v in self.categories.items() if k != PRODUCTIVE},
            "scheduling_goodput": None if self.scheduling_goodput is None else round(self.scheduling_goodput, 4),
            "recoveries": len(self.preemptions),
            **({"moves": self.moves} if self.moves else {}),  # train.moves: overlap_s, both slices held
            "preemptions": [{**asdict(p), "overhead_s": _overhead(p)} for p in self.preemptions],
            "incarnations": incs,
            "cost": self.cost,
            "error": self.error,
            **({"efficiency": self.efficiency} if self.efficiency else {}),
            **({"shapes": shapes, "chip_goodput": chip_goodput(shapes)} if shapes else {}),  # elastic shapes
        }

    def rows(self) -> list[dict[str, Any]]:
        """One table row per preemption (the Prefect table artifact and the CLI table)."""

        def num(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}"

        return [
            {
                "#": p["number"],
                "reason": p["reason"] + (" (no supervisor running)" if p.get("unsupervised") else ""),
                "slice": f"{p['tier']} {p['zone']} {p['queued_resource']}",
                "steps lost": "-" if p.get("steps_lost") is None else p["steps_lost"],
                "resumed from": "-" if p.get("resume_step") is None else p["resume_step"],
                "detect (s)": num(p.get("detect_s")),
                "delete (s)": num(p.get("delete_s")),
                "re-provision (s)": num(p.get("reprovision_s")),
                "restore (s)": num(p.get("restore_s")),
                "overhead (s)": num(p.get("overhead_s")),
            }
            for p in self.to_json()["preemptions"]
        ]

    def summary(self) -> str:
        from tpu_ops.text import usd_by

        doc = self.to_json()
        usd = usd_by(doc["cost"].get("usd_by_tier", {}))
        return (
            f"run {self.run_id}: {doc['outcome']} at step {doc['final_step']}/{doc['steps']}; "
            f"wall {doc['wall_s']:.1f}s, "
            f"productive {doc['productive_s']:.1f}s, goodput {doc['goodput']:.1%}; {doc['recoveries']} preemption(s)"
            f"{_moves(doc.get('moves') or [])}; "
            f"cost by tier {usd} (total ${float(doc['cost'].get('usd_total', 0)):,.4f})"
        ) + (f"; {line}" if (line := efficiency_line(doc.get("efficiency") or {})) else "")


def _moves(moves: list[dict[str, Any]]) -> str:
    done = [m for m in moves if m.get("phase") == "moved"]
    if not done:
        return ""
    return f", {len(done)} move(s) ({sum(float(m.get('overlap_s') or 0) for m in done):.1f}s with both slices held)"


def _percent(v: float) -> str:
    return f"{v:.2%}" if v >= 1e-4 else f"{v * 100:.2g}%"  # a toy model's MFU is far below 0.01%


def efficiency_line(doc: dict[str, Any]) -> str:
    """One line for ``Efficiency.to_json()`` (train.efficiency); empty when the trainer reported neither figure."""
    parts = []
    if doc.get("usd_per_million_tokens") is not None:
        parts.append(f"${doc['usd_per_million_tokens']:,.4f} per million tokens")
    if doc.get("mfu") is not None:
        parts.append(f"MFU {_percent(doc['mfu'])} of the {doc.get('accelerator', 'slice')} bf16 peak")
        if doc.get("effective_mfu") is not None:
            parts[-1] += f" ({_percent(doc['effective_mfu'])} over the wall time)"
    return ", ".join(parts)


def _overhead(p: PreemptionState) -> float | None:
    """Preemption → first new step (None until the new slice made a step)."""
    if p.restore_s is None:
        return None
    return p.detect_s + p.delete_s + p.reprovision_s + p.restore_s


def _only(inc: IncarnationState) -> RunState:
    return RunState("", 0.0, 0, incarnations=[inc])
