"""Typed records the provisioning layer hands out: attempts, slices, teardown and reap reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Final


class Outcome:
    """What became of one attempt on the ladder."""

    ACTIVE: Final = "active"  # this attempt produced the slice
    ADOPTED: Final = "adopted"  # an earlier process's slice for the same run id
    FAILED: Final = "failed"  # the queued resource went FAILED
    STOCKOUT: Final = "stockout"  # no capacity (ResourceExhausted)
    QUOTA: Final = "quota"
    TIMEOUT: Final = "timeout"  # not ACTIVE within validUntilDuration (or the overall timeout)
    SUSPENDED: Final = "suspended"
    ERROR: Final = "error"  # a non-capacity API error (bad request, permission, retries used up)
    PARTIAL: Final = "partial"  # some hosts came up, never all within the queue timeout: deleted whole
    MOVED_ON: Final = frozenset({FAILED, STOCKOUT, QUOTA, TIMEOUT, SUSPENDED, ERROR, PARTIAL})
    # the cloud said no: no capacity (or not for every host), no quota left
    REFUSED: Final = frozenset({STOCKOUT, QUOTA, PARTIAL})

    @staticmethod
    def audit_outcome(outcome: str) -> str:
        """The audit trail's word for an attempt's outcome: success (it got the slice), refused, failure."""
        if outcome in (Outcome.ACTIVE, Outcome.ADOPTED):
            return "success"
        return "refused" if outcome in Outcome.REFUSED else "failure"


@dataclass(frozen=True)
class Attempt:
    """One queued-resource attempt: which rung and zone, what happened, how long it waited."""

    number: int
    tier: str
    zone: str
    resource_id: str
    outcome: str
    seconds_waited: float
    detail: str = ""
    reservation: str = ""

    def describe(self) -> str:
        named = "calendar reservation" if self.tier == "calendar" else "reservation"
        rung = f"{named} {self.reservation}" if self.reservation else self.tier
        extra = f": {self.detail}" if self.detail else ""
        where = f"#{self.number} {rung} in {self.zone} ({self.resource_id})"
        return f"{where} {self.outcome} after {self.seconds_waited:.1f}s{extra}"


@dataclass(frozen=True)
class Slice:
    """A provisioned slice: what it is, where, on which tier, and how it was obtained.

    ``queued_resource`` is the slice's id on either control plane (the queued resource, the
    instance or the instance group); ``node`` the TPU node or the group.
    """

    run_id: str
    queued_resource: str
    node: str
    zone: str
    tier: str
    accelerator_type: str
    chips: int
    hosts: int
    endpoints: tuple[str, ...]
    attempts: tuple[Attempt, ...] = ()
    created_at: float | None = None
    backend: str = "tpu-api"
    host_names: tuple[str, ...] = ()
    parts: tuple[Slice, ...] = ()  # one request for every slice (the TPU API's multislice): each slice

    @property
    def slice_id(self) -> str:
        return self.queued_resource

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["endpoints"] = list(self.endpoints)
        d["host_names"] = list(self.host_names)
        d["attempts"] = [asdict(a) for a in self.attempts]
        return d


@dataclass(frozen=True)
class Resource:
    """One cloud resource of a slice, as teardown and the reaper see it.

    ``kind`` is ``queued-resource`` or ``node`` (Cloud TPU API); ``instance``, ``instance-group``,
    ``instance-template`` or ``workload-policy`` (Compute Engine). ``zone`` is a region for a workload
    policy and ``global`` for a template. ``chips`` is set where one resource bills part of a slice.
    """

    kind: str
    zone: str
    resource_id: str
    run_id: str | None
    state: str
    tier: str
    accelerator_type: str
    created_at: float | None
    backend: str = "tpu-api"
    chips: int | None = None


@dataclass
class TeardownReport:
    """What teardown deleted and whether it confirmed everything gone."""

    run_id: str
    deleted: list[Resource] = field(default_factory=list)
    confirmed_gone: bool = False
    seconds: float = 0.0

    def describe(self) -> str:
        """What teardown did, in words that stay true when there was nothing left to delete."""
        if not self.deleted:
            return "nothing of the run was left to delete" if self.confirmed_gone else "nothing deleted"
        gone = ", confirmed gone" if self.confirmed_gone else ", not yet confirmed gone"
        return f"{len(self.deleted)} resource{'s' if len(self.deleted) != 1 else ''} deleted{gone}"

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "deleted": [asdict(r) for r in self.deleted],
            "confirmed_gone": self.confirmed_gone,
            "seconds": round(self.seconds, 3),
        }
