"""The bookkeeping of one recovery: a preemption opened when a loss is seen, closed once the workers saved.

The supervisor decides (``train.verdict``) and acts (``train.keeper``); what a preemption records —
when it was seen, the step each worker reached, the step the next incarnation resumes from — is here.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import Any

from tpu_ops.layout import RunLayout
from tpu_ops.provision.records import Slice
from tpu_ops.train.checkpoints import latest_complete_step
from tpu_ops.train.incarnations import mine, record_allocation
from tpu_ops.train.layout import list_json
from tpu_ops.train.runstate import IncarnationState, PreemptionState, RunState


def open_preemption(
    state: RunState, inc: IncarnationState, reason: str, resource_id: str, *, unsupervised: bool
) -> PreemptionState:
    """Record the loss of ``resource_id`` now: the incarnation ends, the preemption is appended to ``state``."""
    detected = time.time()
    p = PreemptionState(
        len(state.preemptions) + 1,
        inc.number,
        reason,
        resource_id,
        inc.zone,
        inc.tier,
        detected,
        inc.last_seen_at,
        inc.last_step,
        unsupervised,
    )
    p.detect_s = max(0.0, detected - (inc.last_seen_at or detected))
    inc.end, inc.ended_at = "preempted", detected
    state.preemptions.append(p)
    return p


def close_preemption(p: PreemptionState, inc: IncarnationState, gcs: Any, layout: RunLayout) -> None:
    """After the give-back: the step the workers reached (their exit reports) and the step kept."""
    reports = mine(inc, list_json(gcs, layout.workers))
    reached = [s for s in [inc.last_step, *(r.get("last_step") for r in reports)] if s is not None]
    p.last_step = max(reached, default=None)
    inc.kept_until = latest_complete_step(gcs, layout.steps_uri)


def ready(
    inc: IncarnationState,
    slices: Sequence[Slice],
    carried: Collection[int],
    preemption: PreemptionState | None,
    reprovision_s: float,
) -> bool:
    """Record the incarnation's allocation as obtained (``carried``: the slices kept from the one before);
    True when it was adopted (already known)."""
    adopted = bool(inc.queued_resource)
    record_allocation(inc, slices, carried)
    if inc.ready_at is None:
        inc.ready_at = time.time()
    if preemption is not None:
        preemption.reprovision_s = reprovision_s
        preemption.resume_step = inc.resume_step
        preemption.steps_lost = max(0, (preemption.last_step or 0) - (inc.resume_step or 0))
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
