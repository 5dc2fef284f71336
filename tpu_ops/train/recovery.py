"""The bookkeeping of one recovery: a preemption opened when a loss is seen, closed once the workers saved.

The supervisor decides (``train.verdict``) and acts (``train.keeper``); what a preemption records —
when it was seen, the step each worker reached, the step the next incarnation resumes from — is here.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import Any

from tpu_ops.agent.job import Job
from tpu_ops.layout import RunLayout
from tpu_ops.provision.records import Slice
from tpu_ops.train import notices
from tpu_ops.train.checkpoints import latest_complete_step
from tpu_ops.train.incarnations import mine, record_allocation
from tpu_ops.train.keeper import Keeper
from tpu_ops.train.layout import list_json, put_json
from tpu_ops.train.runstate import IncarnationState, PreemptionState, RunState

REPORT_S = 5.0  # a stopped worker's agent: kill the trainer, write its exit heartbeat and report


def open_preemption(
    state: RunState, inc: IncarnationState, reason: str, resource_id: str, *, unsupervised: bool,
    lost: int | None = None,
) -> PreemptionState:  # fmt: skip
    """Record the loss of ``resource_id`` (slice ``lost``, None: the whole allocation) now: the incarnation
    ends, the preemption is appended to ``state``, with the lost slice's zone and tier (found unsupervised
    without a slice named, of several: what all share, else "" for unknown)."""
    detected = time.time()
    where = next((s for s in inc.slices if s.index == (lost or 0)), None)
    zone, tier = (where.zone, where.tier) if where is not None else (inc.zone, inc.tier)
    if unsupervised and lost is None and len(inc.slices) > 1:
        zone, tier = (_common([getattr(s, f) for s in inc.slices]) for f in ("zone", "tier"))
    p = PreemptionState(
        len(state.preemptions) + 1,
        inc.number,
        reason,
        resource_id,
        zone,
        tier,
        detected,
        inc.last_seen_at,
        inc.last_step,
        unsupervised,
    )
    p.detect_s = max(0.0, detected - (inc.last_seen_at or detected))
    inc.end, inc.ended_at = "preempted", detected
    state.preemptions.append(p)
    return p


def _common(values: list[str]) -> str:
    return values[0] if len(set(values)) == 1 else ""


def lost_resource(inc: IncarnationState, held: Sequence[str], lost: int | None, unsupervised: bool) -> str:
    """The resource id of slice ``lost`` (None: slice 0) of ``held`` (the keeper's), else of the run state's
    allocation (a supervisor taking over holds none yet); "" when found unsupervised with none named of several."""
    ids = list(held) or [s.resource_id for s in inc.allocation()]
    if unsupervised and lost is None and len(ids) > 1:
        return ""  # the workers' reports or notices came from several slices: which one went is not known
    return ids[lost or 0] if (lost or 0) < len(ids) else inc.queued_resource


def stop_others(
    gcs: Any, layout: RunLayout, job: Job, inc: IncarnationState, slices: Sequence[Slice], lost: int | None,
    reason: str,
) -> tuple[set[tuple[int, int]], float]:  # fmt: skip
    """Several slices: ask every worker to stop at the step in hand (the healthy ones too: ``agent.run``).

    The kept slices' (slice, worker) hosts, and when they are done at the latest: they see the marker at their
    next heartbeat, then have the whole grace to save (and to write their last step records), plus time to
    report; the preemption is closed only after that. ((), 0.0) for a single slice or no slice kept.
    """
    if len(slices) <= 1:
        return set(), 0.0
    put_json(gcs, layout.state(f"stop/{inc.id}.json"), {"slice": lost, "reason": reason})
    if lost is None:  # the whole allocation goes (a stall): nothing is kept to wait for
        return set(), 0.0
    kept = {(i, w) for i, s in enumerate(slices) if i != lost for w in range(s.hosts)}
    return kept, time.time() + 2 * job.heartbeat_s + job.term_grace_s + REPORT_S


def take_over(keeper: Keeper, gcs: Any, layout: RunLayout, inc: IncarnationState, lost: int | None) -> bool:
    """A successor finding slice ``lost`` of ``inc`` gone: hold the allocation as its predecessor did when the
    others still run and their workers have not exited (``Keeper.adopt``), so only that slice is replaced."""
    if lost is None or len(inc.allocation()) < 2:
        return False  # nothing to keep: no need to read the reports
    exited = {int(r.get("slice") or 0) for r in mine(inc, list_json(gcs, layout.workers))}
    return keeper.adopt(inc.allocation(), lost, exited)


def finish_taken_over(keeper: Keeper, gcs: Any, layout: RunLayout, job: Job, state: RunState) -> PreemptionState | None:
    """A predecessor died mid-recovery (its workers asked to stop, the lost slice maybe deleted) before the
    replacement came: hold the slices that still run as it did, so the next allocation keeps them (their agents
    wait for a document listing them in ``kept``, else they exit). Returns the open preemption, for the next
    incarnation to close (its resume step) — the one the predecessor saved with no slice yet, or a new one."""
    p, live = state.preemptions[-1] if state.preemptions else None, state.live
    if p is None or p.resume_step is not None or (live is not None and p.incarnation != live.number - 1):
        return None
    _finish(keeper, gcs, layout, job, state, p)
    return p


def _finish(keeper: Keeper, gcs: Any, layout: RunLayout, job: Job, state: RunState, p: PreemptionState) -> None:
    inc = state.incarnations[p.incarnation]
    ids = [s.resource_id for s in inc.allocation()]
    if keeper.slices or len(ids) < 2 or p.queued_resource not in ids:
        return
    lost = ids.index(p.queued_resource)
    marker = layout.state(f"stop/{inc.id}.json")
    stopped = gcs.bucket(marker.bucket).blob(marker.prefix).exists()  # then the exit reports are the stop's
    exited = () if stopped else {int(r.get("slice") or 0) for r in mine(inc, list_json(gcs, layout.workers))}
    if not keeper.adopt(inc.allocation(), lost, exited):
        return
    kept, until = stop_others(gcs, layout, job, inc, keeper.slices, lost, p.reason)
    hosts = sum(s.hosts for s in keeper.slices)
    notices.wait_for_exit_reports(gcs, layout, inc.id, hosts, [], kept=kept, stopped_until=until)
    keeper.give_back(lost)
    close_preemption(p, inc, gcs, layout)


def close_preemption(p: PreemptionState, inc: IncarnationState, gcs: Any, layout: RunLayout) -> None:
    """After the give-back: the step the workers reached (their exit reports) and the step kept."""
    reports = mine(inc, list_json(gcs, layout.workers))
    reached = [s for s in [inc.last_step, *(r.get("last_step") for r in reports)] if s is not None]
    p.last_step = max(reached, default=None)  # a step saved after them counts once resumed from (resumed_from)
    inc.kept_until = latest_complete_step(gcs, layout.steps_uri)


def ready(
    inc: IncarnationState,
    slices: Sequence[Slice],
    carried: Collection[int],
    preemption: PreemptionState | None,
    reprovision_s: float,
    repaired: Collection[int] = (),
) -> bool:
    """Record the incarnation's allocation as obtained (``carried``: the slices kept from the one before,
    ``repaired``: those Google repaired); True when it was adopted (already known)."""
    adopted = bool(inc.queued_resource)
    record_allocation(inc, slices, carried, repaired)
    if inc.ready_at is None:
        inc.ready_at = time.time()
    if preemption is not None:
        preemption.reprovision_s = reprovision_s
        preemption.resumed_from(inc.resume_step)
    return adopted


def provisioned_event(inc: IncarnationState, s: Slice, adopted: bool) -> dict[str, Any]:
    """The audit payload of an incarnation's slices obtained (slice 0 named)."""
    return {
        "incarnation": inc.number,
        "queued_resource": s.queued_resource,
        "node": s.node,
        "zone": s.zone,
        "tier": s.tier,
        "adopted": adopted,
        "resume_step": inc.resume_step,
        **({"shape": inc.shape} if inc.shape else {}),  # elastic shapes: what it trains on
    }
