"""The capacity ladder: rung by rung, zone by zone, one queued resource per attempt.

``provision`` refuses an over-budget request before any cloud call, adopts what an earlier process
created for the same run id, and otherwise walks the plan: each attempt creates a queued resource
named ``{run_id}-a{n}`` (checking first that it does not exist, so a retried create never makes a
second one), waits for ACTIVE with backoff within ``validUntilDuration`` and the overall timeout,
and moves on at FAILED, stockout, quota or timeout after force-deleting what it abandons.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tpu_ops.cloud import retry
from tpu_ops.cloud.tpu import (
    NodeRecord,
    NodeState,
    QrState,
    QueuedResourceRecord,
    QueuedResourceRequest,
    TpuApi,
)
from tpu_ops.errors import (
    AlreadyExistsError,
    CapacityError,
    CloudError,
    ProvisioningError,
    QuotaError,
    TpuOpsError,
    TransientError,
)
from tpu_ops.polling import poll
from tpu_ops.provision import ledger as L
from tpu_ops.provision.cost import check_budget
from tpu_ops.provision.naming import attempt_of, belongs_to, check_run_id, resource_id, run_labels
from tpu_ops.provision.prices import PriceTable, load
from tpu_ops.provision.records import Attempt, Outcome, Slice
from tpu_ops.provision.teardown import delete_and_confirm, teardown
from tpu_ops.settings import Settings
from tpu_ops.specs.slice import ProvisionSpec
from tpu_ops.tiers import Tier


@dataclass(frozen=True)
class Step:
    """One planned attempt: attempt number, tier, zone, reservation name (if any)."""

    number: int
    tier: Tier
    zone: str
    reservation: str = ""


def plan(spec: ProvisionSpec) -> list[Step]:
    """The attempts in order: each rung over its zones (a reservation lives in one zone)."""
    steps: list[Step] = []
    for rung in spec.ladder:
        if rung.kind == Tier.RESERVATION:
            assert rung.zone is not None and rung.name is not None  # the rung checked both
            steps.append(Step(len(steps) + 1, Tier.RESERVATION, rung.zone, rung.name))
        else:
            for zone in spec.slice.zones:
                steps.append(Step(len(steps) + 1, rung.kind, zone))
    return steps


def provision(
    spec: ProvisionSpec,
    run_id: str,
    settings: Settings,
    *,
    api: TpuApi | None = None,
    prices: PriceTable | None = None,
    recreate: bool = True,
    metadata: dict[str, str] | None = None,
    on_attempt: Callable[[Attempt], None] | None = None,
) -> Slice:
    """Get one slice for ``run_id`` through the ladder, or raise.

    Raises ``BudgetError`` before any cloud call when the worst-case estimate exceeds the budget,
    ``ProvisioningError`` (with every attempt) when no rung produced a slice. A dead slice of the
    run (preempted node, SUSPENDED/FAILED queued resource) is force-deleted; it is replaced when
    ``recreate`` is true, otherwise ``ProvisioningError`` says so.
    """
    check_run_id(run_id)
    check_budget(spec, prices or load(settings))
    api = api or TpuApi(settings)
    ledger = L.Ledger(settings, run_id)
    ledger.claim()
    return _Ladder(spec, run_id, settings, api, ledger, recreate, metadata or {}, on_attempt).run()


def recover(spec: ProvisionSpec, run_id: str, settings: Settings, **kw: Any) -> Slice:
    """What the training supervisor calls after a preemption: the live slice, or a new one."""
    return provision(spec, run_id, settings, recreate=True, **kw)


class _Ladder:
    def __init__(
        self,
        spec: ProvisionSpec,
        run_id: str,
        settings: Settings,
        api: TpuApi,
        ledger: L.Ledger,
        recreate: bool,
        metadata: dict[str, str],
        on_attempt: Callable[[Attempt], None] | None,
    ) -> None:
        self.spec, self.run_id, self.settings, self.api = spec, run_id, settings, api
        self.ledger, self.recreate, self.metadata, self.on_attempt = ledger, recreate, metadata, on_attempt
        self.deadline = time.monotonic() + spec.overall_timeout.total_seconds()
        self.steps = plan(spec)
        self.attempts: list[Attempt] = []

    # -- the walk ------------------------------------------------------------------------------
    def run(self) -> Slice:
        adopted, resume_at = self._survey()
        if adopted is not None:
            return adopted
        for step in self.steps:
            if step.number < resume_at:
                continue
            if time.monotonic() >= self.deadline:
                self._record(Attempt(step.number, step.tier, step.zone, resource_id(self.run_id, step.number),
                                     Outcome.TIMEOUT, 0.0, "overall timeout reached before this attempt",
                                     step.reservation))  # fmt: skip
                continue
            result = self._attempt(step)
            if result is not None:
                return result
        lines = "\n  ".join(a.describe() for a in self.attempts)
        raise ProvisioningError(
            f"no slice of {self.spec.slice.accelerator_type} for run {self.run_id}: every rung failed "
            f"({len(self.attempts)} attempts):\n  {lines}",
            self.attempts,
        )

    def _zones(self) -> list[str]:
        return list(dict.fromkeys(s.zone for s in self.steps))

    def _survey(self) -> tuple[Slice | None, int]:
        """Adopt a live slice of this run; clean dead ones; find a queued request to resume."""
        waiting: list[tuple[int, QueuedResourceRecord]] = []
        for zone in self._zones():
            for qr in self.api.list_queued_resources(zone):
                if not belongs_to(self.run_id, qr.qr_id, dict(qr.labels)):
                    continue
                n = attempt_of(self.run_id, qr.qr_id) or 0
                if qr.state in QrState.ACTIVE:
                    node = self.api.find_node(qr.zone, qr.node_id)
                    if node is not None and node.state in NodeState.READY:
                        want = self.spec.slice.accelerator_type
                        if node.accelerator_type and node.accelerator_type != want:
                            raise ProvisioningError(
                                f"run {self.run_id} already has a {node.accelerator_type} slice ({qr.qr_id} in "
                                f"{qr.zone}), not {want}; tear it down first (`tpu-ops teardown {self.run_id}`)"
                            )
                        step = next((s for s in self.steps if s.number == n), None)
                        att = Attempt(n, qr.tier, qr.zone, qr.qr_id, Outcome.ADOPTED, 0.0, "ACTIVE already",
                                      step.reservation if step else "")  # fmt: skip
                        self._record(att)
                        return self._slice(qr, node), 0
                    if node is not None and node.state in NodeState.PENDING:
                        waiting.append((n, qr))
                        continue
                    self._dead(qr, node)
                elif qr.state in QrState.SUSPENDED:
                    self._dead(qr, None)
                elif qr.state in QrState.FAILED:  # never granted: nothing to recreate, just clean up
                    delete_and_confirm(self.api, self.settings, qr.zone, qr.qr_id, "", self._remaining())
                elif qr.state in QrState.WAITING:
                    waiting.append((n, qr))
        if not waiting:
            return None, 0
        # Keep waiting on the furthest request an earlier process made; drop any older ones so a
        # run never ends up holding two slices.
        waiting.sort(key=lambda t: t[0])
        for _, qr in waiting[:-1]:
            self._abandon(qr.zone, qr.qr_id)
        return None, waiting[-1][0]

    def _dead(self, qr: QueuedResourceRecord, node: NodeRecord | None) -> None:
        """A slice of the run that was granted and then lost (preempted node, SUSPENDED request)."""
        now = time.time()
        self.ledger.append(L.PREEMPTED, resource_id=qr.qr_id, zone=qr.zone, state=qr.state,
                           node_state=node.state if node else "", t=now)  # fmt: skip
        self.ledger.append(L.DELETE_REQUESTED, resource_id=qr.qr_id, zone=qr.zone)
        delete_and_confirm(self.api, self.settings, qr.zone, qr.qr_id, qr.node_id, self._remaining())
        self.ledger.append(L.GONE, resource_id=qr.qr_id, zone=qr.zone)
        if not self.recreate:
            raise ProvisioningError(
                f"run {self.run_id}: slice {qr.qr_id} in {qr.zone} was {qr.state}"
                f"{' (node ' + node.state + ')' if node else ''}; deleted it. Pass recreate=True to get a new one.",
                self.attempts,
            )

    # -- one attempt -----------------------------------------------------------------------------
    def _attempt(self, step: Step) -> Slice | None:
        rid = resource_id(self.run_id, step.number)
        t0 = time.monotonic()
        op: Any = None
        try:
            existing = self.api.find_queued_resource(step.zone, rid)
            if existing is not None and (existing.state in QrState.DEAD or existing.state in QrState.DELETING):
                delete_and_confirm(self.api, self.settings, step.zone, rid, existing.node_id, self._remaining())
                existing = None
            if existing is None:
                op = self._create(step, rid)
            outcome, detail, qr, node = self._wait(step, rid, op, t0)
        except QuotaError as exc:
            outcome, detail, qr, node = Outcome.QUOTA, _short(exc), None, None
        except CapacityError as exc:
            outcome, detail, qr, node = Outcome.STOCKOUT, _short(exc), None, None
        except (CloudError, TpuOpsError, TimeoutError) as exc:
            outcome, detail, qr, node = Outcome.ERROR, f"{type(exc).__name__}: {_short(exc)}", None, None
        waited = time.monotonic() - t0
        self._record(Attempt(step.number, step.tier, step.zone, rid, outcome, waited, detail, step.reservation))
        if outcome == Outcome.ACTIVE and qr is not None and node is not None:
            return self._slice(qr, node)
        self._abandon(step.zone, rid)
        return None

    def _create(self, step: Step, rid: str) -> Any:
        """Create the queued resource once: a retry first checks that the last try did not land."""
        req = QueuedResourceRequest(
            qr_id=rid,
            node_id=rid,
            accelerator_type=self.spec.slice.accelerator_type,
            runtime_version=self.spec.slice.runtime,
            tier=step.tier,
            valid_until_s=int(self.spec.queue_timeout.total_seconds()),
            labels={**self.spec.slice.labels, **run_labels(self.run_id, step.tier, step.number)},
            reservation=step.reservation,
            network=self.spec.slice.network,
            service_account=self.spec.slice.service_account,
            metadata=self.metadata,
        )
        request_id = str(uuid.uuid4())  # the same id on every retry: the API dedupes it too
        op: Any = None
        for attempt in retry.policy(self.settings):
            with attempt:
                if attempt.retry_state.attempt_number > 1 and self.api.find_queued_resource(step.zone, rid):
                    return op  # an earlier try was created after all
                try:
                    op = self.api.create_queued_resource(step.zone, req, request_id)
                except AlreadyExistsError:
                    return None  # it landed on an earlier try (or another process made it): adopt it
        return op

    def _wait(
        self, step: Step, rid: str, op: Any, t0: float
    ) -> tuple[str, str, QueuedResourceRecord | None, NodeRecord | None]:
        # The server fails the request at validUntil; allow it a few polls to say so.
        grace = max(5 * self.settings.poll_interval_s, 2.0)
        until = min(self.deadline, t0 + self.spec.queue_timeout.total_seconds() + grace)
        last: list[QueuedResourceRecord | None] = [None]

        def check() -> tuple[str, str, QueuedResourceRecord | None, NodeRecord | None] | None:
            qr = last[0] = self._poll_qr(step.zone, rid)
            if qr is None and op is not None:
                err = self.api.operation_error(op, step.zone, step.tier)
                if err is not None:
                    raise err
            return None if qr is None else self._settled(step, qr)

        try:
            return poll(check, timeout_s=until - time.monotonic(), interval_s=self.settings.poll_interval_s)
        except TimeoutError:
            why = "overall timeout" if until >= self.deadline - 1e-6 else "validUntilDuration"
            state = last[0].state if last[0] else "not visible"
            return Outcome.TIMEOUT, f"still {state} at the {why}", None, None

    def _settled(
        self, step: Step, qr: QueuedResourceRecord
    ) -> tuple[str, str, QueuedResourceRecord | None, NodeRecord | None] | None:
        """The outcome once a request left the queue for good; None while it still waits."""
        if qr.state in QrState.ACTIVE:
            node = self.api.find_node(step.zone, qr.node_id)
            if node is not None and node.state in NodeState.READY:
                return Outcome.ACTIVE, "", qr, node
            if node is None or node.state in NodeState.DEAD:
                return Outcome.SUSPENDED, f"node {node.state if node else 'missing'} at ACTIVE", None, None
        elif qr.state in QrState.FAILED:
            stock = any(w in qr.detail.lower() for w in ("capacity", "exhausted", "stockout"))
            return (Outcome.STOCKOUT if stock else Outcome.FAILED), qr.detail or "FAILED", None, None
        elif qr.state in QrState.SUSPENDED:
            return Outcome.SUSPENDED, qr.state, None, None
        elif qr.state in QrState.DELETING:
            return Outcome.ERROR, "deleted by someone else while waiting", None, None
        return None

    def _poll_qr(self, zone: str, rid: str) -> QueuedResourceRecord | None:
        try:
            return self.api.find_queued_resource(zone, rid)
        except TransientError:
            return None  # retries used up for this poll; the next poll tries again

    def _abandon(self, zone: str, rid: str) -> None:
        """Force-delete a request we are leaving behind (it might still be granted later)."""
        try:
            if self.api.delete_queued_resource(zone, rid, force=True):
                self.ledger.append(L.DELETE_REQUESTED, resource_id=rid, zone=zone)
        except TpuOpsError:
            pass  # teardown and the reaper find it by its labels and id

    # -- results -------------------------------------------------------------------------------
    def _record(self, attempt: Attempt) -> None:
        self.attempts.append(attempt)
        self.ledger.append(L.ATTEMPT, **dict(attempt.__dict__))
        if self.on_attempt is not None:
            self.on_attempt(attempt)

    def _slice(self, qr: QueuedResourceRecord, node: NodeRecord) -> Slice:
        acc = self.spec.slice.accelerator
        if not self.ledger.is_open(qr.qr_id):
            self.ledger.append(L.ACTIVE, resource_id=qr.qr_id, zone=qr.zone, tier=qr.tier, chips=acc.chips,
                               generation=acc.generation, accelerator_type=acc.name)  # fmt: skip
        return Slice(
            run_id=self.run_id,
            queued_resource=qr.qr_id,
            node=node.node_id,
            zone=qr.zone,
            tier=qr.tier,
            accelerator_type=node.accelerator_type or acc.name,
            chips=acc.chips,
            hosts=node.hosts or acc.hosts,
            endpoints=node.endpoints,
            attempts=tuple(self.attempts),
            created_at=node.create_time,
        )

    def _remaining(self) -> float:
        return max(30.0, float(self.deadline - time.monotonic()))


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


@contextmanager
def slice_for(spec: ProvisionSpec, run_id: str, settings: Settings, **kw: Any) -> Iterator[Slice]:
    """Provision a slice for the body and tear it down afterwards, whatever happens.

    Teardown also runs when provisioning itself fails half-way (an abandoned request may linger).
    """
    api = kw.pop("api", None) or TpuApi(settings)
    try:
        yield provision(spec, run_id, settings, api=api, **kw)
    finally:
        teardown(run_id, settings, zones=list(spec.slice.zones), api=api)
