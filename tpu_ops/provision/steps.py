"""The ladder's plan and what one step asks for and hands out.

``plan`` lays the rungs over their zones; ``slice_request`` is one step's request to the provider;
``obtained`` records a slice that came up (opened in the ledger, billed from its first host up) and
describes it to the caller.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tpu_ops.provision import ledger as L
from tpu_ops.provision.naming import run_labels
from tpu_ops.provision.providers import SliceRecord, SliceRequest
from tpu_ops.provision.records import Attempt, Slice
from tpu_ops.specs.slice import ProvisionSpec
from tpu_ops.tiers import Tier


@dataclass(frozen=True)
class Step:
    """One planned attempt: attempt number, tier, zone, reservation name (if any), run-time bound."""

    number: int
    tier: Tier
    zone: str
    reservation: str = ""
    max_run_duration_s: int | None = None


def plan(spec: ProvisionSpec) -> list[Step]:
    """The attempts in order: each rung over its zones (a reservation lives in one zone)."""
    steps: list[Step] = []
    for rung in spec.ladder:
        bound = int(rung.max_run_duration.total_seconds()) if rung.max_run_duration is not None else None
        if rung.kind in (Tier.RESERVATION, Tier.CALENDAR):
            assert rung.zone is not None and rung.name is not None  # the rung checked both
            steps.append(Step(len(steps) + 1, rung.kind, rung.zone, rung.name, bound))
        else:
            for zone in spec.slice.zones:
                steps.append(Step(len(steps) + 1, rung.kind, zone, max_run_duration_s=bound))
    return steps


def slice_request(
    spec: ProvisionSpec, run_id: str, step: Step, rid: str, metadata: dict[str, str], slices: int = 1
) -> SliceRequest:
    """What ``step`` asks the provider for: slice ``rid`` of ``run_id`` (``slices`` of them in one request on a
    plane that grants a multislice whole), labelled with the run, tier and attempt."""
    sl = spec.slice
    return SliceRequest(
        run_id=run_id,
        attempt=step.number,
        slice_id=rid,
        zone=step.zone,
        region=sl.region,
        tier=step.tier,
        accelerator=sl.accelerator,
        runtime_version=sl.runtime,
        valid_until_s=int(spec.queue_timeout.total_seconds()),
        labels={**sl.labels, **run_labels(run_id, step.tier, step.number)},
        reservation=step.reservation,
        network=sl.network,
        service_account=sl.service_account,
        metadata=metadata,
        max_run_duration_s=step.max_run_duration_s,
        slices=slices,
    )


def obtained(
    spec: ProvisionSpec,
    run_id: str,
    rec: SliceRecord,
    ledger: L.Ledger,
    backend: str,
    attempts: tuple[Attempt, ...],
    since: float | None = None,
) -> Slice:
    """The slice ``rec`` handed out, opened in the ledger (once) from ``since`` or now; a multislice request's
    slices (``rec.parts``) each opened and billed as its own slice."""
    acc = spec.slice.accelerator
    parts = tuple(obtained(spec, run_id, p, ledger, backend, attempts, since) for p in rec.parts)
    if not parts and not ledger.is_open(rec.slice_id):
        ledger.append(
            L.ACTIVE,
            resource_id=rec.slice_id,
            zone=rec.zone,
            tier=rec.tier,
            chips=acc.chips,
            generation=acc.generation,
            accelerator_type=acc.name,
            backend=backend,
            t=since or time.time(),
        )
    return Slice(
        run_id=run_id,
        queued_resource=rec.slice_id,
        node=rec.slice_id,
        zone=rec.zone,
        tier=rec.tier,
        accelerator_type=rec.accelerator_type or acc.name,
        chips=acc.chips * max(1, len(parts)),
        hosts=len(rec.hosts) or acc.hosts,
        endpoints=rec.endpoints,
        attempts=attempts,
        created_at=rec.created_at,
        backend=backend,
        host_names=tuple(h.name for h in sorted(rec.hosts, key=lambda h: h.index)),
        parts=parts,
    )
