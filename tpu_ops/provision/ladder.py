"""The capacity ladder: rung by rung, zone by zone, one slice request per attempt.

``provision`` refuses an over-budget request before any cloud call, adopts what an earlier process
created for the same run id, and otherwise walks the plan: each attempt asks the spec's provider
(Cloud TPU API or Compute Engine, :mod:`tpu_ops.provision.providers`) for a slice named
``{run_id}-a{n}`` (checking first that it does not exist, so a retried create never makes a
second one), waits for it to run with backoff within the queue timeout and the overall timeout,
and moves on at failure, stockout, quota or timeout after deleting what it abandons. A slice that
came up partly is not obtained: deleted whole, its hold in the ledger (:mod:`.partial`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tpu_ops.cloud import retry
from tpu_ops.cloud.clients import Clients
from tpu_ops.errors import (
    AlreadyExistsError,
    CapacityError,
    CloudError,
    ProvisioningError,
    QuotaError,
    TpuOpsError,
    TransientError,
)
from tpu_ops.layout import check_run_id
from tpu_ops.polling import poll
from tpu_ops.provision import calendar, partial, ranking
from tpu_ops.provision import ledger as L
from tpu_ops.provision.choose import Choice
from tpu_ops.provision.cost import check_budget
from tpu_ops.provision.naming import SLICE_STRIDE, attempt_of, resource_id, slice_of
from tpu_ops.provision.prices import PriceTable, load
from tpu_ops.provision.providers import Phase, Provider, SliceRecord, SliceRequest, SliceState, for_spec
from tpu_ops.provision.records import Attempt, Outcome, Slice
from tpu_ops.provision.steps import Step, obtained, plan, slice_request
from tpu_ops.settings import Settings
from tpu_ops.specs.slice import ProvisionSpec
from tpu_ops.tiers import Tier

__all__ = ["Step", "plan", "provision", "recover", "request"]  # Step and plan live in .steps


def provision(
    spec: ProvisionSpec,
    run_id: str,
    settings: Settings,
    *,
    provider: Provider | None = None,
    prices: PriceTable | None = None,
    recreate: bool = True,
    metadata: dict[str, str] | None = None,
    on_attempt: Callable[[Attempt], None] | None = None,
    progress: Callable[[], int | None] | None = None,
    clients: Clients | None = None,
    slice_index: int = 0,
) -> Slice:
    """Get one slice for ``run_id`` through the ladder, or raise.

    Raises ``BudgetError`` before any cloud call (before a client is even built) when the
    worst-case estimate exceeds the budget, ``ProvisioningError`` (with every attempt) when no
    rung produced a slice. A dead slice of the run (preempted, suspended, a host stopped) is
    deleted whole; it is replaced when ``recreate`` is true, otherwise ``ProvisioningError`` says so.
    ``provider`` defaults to the spec's backend (``slice.backend``). With ``choose`` in the spec
    (``ladder: auto``) the attempts are ranked by expected $ per kept step at every walk, with the
    steps ``progress()`` says are kept and the time left (:mod:`tpu_ops.provision.ranking`).
    ``clients`` are the run's (built from ``settings`` when not given). ``slice_index``: which slice of a
    multislice allocation (``provision.allocation``) this walk obtains; its ids are its own.
    """
    check_run_id(run_id)
    table = prices or load(settings)
    check_budget(spec, table)
    clients = clients or Clients(settings)
    provider = provider or for_spec(spec, settings, clients)
    ledger = L.Ledger(settings, run_id)
    ledger.claim()
    walk = _Ladder(spec, run_id, settings, provider, ledger, recreate, metadata or {}, on_attempt, slice_index)
    if spec.choose is not None:
        read = getattr(provider, "reservation_document", None)  # the fleet view's source
        walk.rank = lambda steps: ranking.apply(spec, steps, clients, run_id, ledger, table, progress, read=read)
    return walk.run()


def request(
    spec: ProvisionSpec, run_id: str, settings: Settings, number: int, *, provider: Provider,
    metadata: dict[str, str], on_attempt: Callable[[Attempt], None] | None = None,
) -> Slice | None:  # fmt: skip
    """One attempt at the planned step ``number`` alone, beside the run's live slice (a move, docs/moves.md):
    no survey (the live slice is not adopted), no other rung; None when refused (recorded as the ladder does)."""
    ledger = L.Ledger(settings, run_id)
    walk = _Ladder(spec, run_id, settings, provider, ledger, True, metadata, on_attempt)
    return walk._attempt(next(s for s in walk.steps if s.number == number))


def recover(spec: ProvisionSpec, run_id: str, settings: Settings, **kw: Any) -> Slice:
    """The live slice, or a new one (``provision`` with ``recreate=True``). The supervisor does not call
    this: it acquires and releases through :class:`tpu_ops.provision.lease.SliceLease`."""
    return provision(spec, run_id, settings, recreate=True, **kw)


class _Ladder:
    def __init__(
        self,
        spec: ProvisionSpec,
        run_id: str,
        settings: Settings,
        provider: Provider,
        ledger: L.Ledger,
        recreate: bool,
        metadata: dict[str, str],
        on_attempt: Callable[[Attempt], None] | None,
        slice_index: int = 0,
    ) -> None:
        self.index = slice_index
        self.spec, self.run_id, self.settings, self.provider = spec, run_id, settings, provider
        self.ledger, self.recreate, self.metadata, self.on_attempt = ledger, recreate, metadata, on_attempt
        self.deadline = time.monotonic() + spec.overall_timeout.total_seconds()
        self.steps = plan(spec)
        self.attempts: list[Attempt] = []
        # The choice (``choose``): called at each walk, it orders the steps and may say to try only
        # the first few, then wait and walk again (``choose.wait``).
        self.rank: Callable[[list[Step]], tuple[list[Step], Choice | None]] | None = None
        self.hold = partial.Hold()  # the current attempt's hosts up while the slice is not whole

    # -- the walk ------------------------------------------------------------------------------
    def run(self) -> Slice:
        adopted, resume_at = self._survey()
        if adopted is not None:
            return adopted
        choice = self._ranked()
        # Resume at the attempt an earlier process was waiting on (by its place: a ranked plan is not in number order).
        start = next((i for i, s in enumerate(self.steps) if s.number == resume_at), 0)
        while True:
            hold = self._hold(choice, start)
            for step in self.steps[start : hold[0] if hold else None]:
                if time.monotonic() >= self.deadline:
                    rid = resource_id(self.run_id, step.number, self.index)
                    why = "overall timeout reached before this attempt"
                    att = Attempt(step.number, step.tier, step.zone, rid, Outcome.TIMEOUT, 0.0, why, step.reservation)
                    self._record(att)
                    continue
                result = self._attempt(step)
                if result is not None:
                    return result
            if hold is None:
                break
            # Every rung tried before waiting refused (choose.wait), or none tried: queued for a full
            # reservation (choose.queue).
            self.ledger.append(L.WAITING, seconds=hold[1], t=time.time())
            time.sleep(hold[1])
            choice, start = self._ranked(), 0
        lines = "\n  ".join(a.describe() for a in self.attempts)
        raise ProvisioningError(
            f"no slice of {self.spec.slice.accelerator_type} for run {self.run_id} on {self.provider.name}: every "
            f"rung failed ({len(self.attempts)} attempts):\n  {lines}",
            self.attempts,
        )

    def _ranked(self) -> Choice | None:
        """Rank the planned steps again (``choose``): the order, and whether to wait before some."""
        if self.rank is None:
            return None
        self.steps, choice = self.rank(plan(self.spec))
        return choice

    def _hold(self, choice: Choice | None, start: int) -> tuple[int, float] | None:
        """Where this walk stops to wait, and for how long (``choose.wait``; ``choose.queue``: before the first
        rung); None: it tries every rung."""
        if choice is None or choice.try_now is None or choice.wait_s is None:
            return None
        if start >= choice.try_now and (start > 0 or choice.try_now > 0):  # resuming past where it would wait
            return None
        if time.monotonic() + choice.wait_s >= self.deadline:
            return None  # the overall timeout leaves no time to wait
        return choice.try_now, choice.wait_s

    def _zones(self) -> list[str]:
        return list(dict.fromkeys(s.zone for s in self.steps))

    def _survey(self) -> tuple[Slice | None, int]:
        """Adopt a live slice of this run; clean dead ones; find a queued request to resume."""
        waiting: list[tuple[int, SliceRecord]] = []
        for rec in self.provider.slices(self._zones(), self.run_id):
            if (slice_of(self.run_id, rec.slice_id) or 0) != self.index:
                continue  # another slice of the allocation: its own walk's
            n = (attempt_of(self.run_id, rec.slice_id) or 0) % SLICE_STRIDE
            if rec.state in SliceState.RUNNING:
                want = self.spec.slice.accelerator_type
                if rec.accelerator_type and rec.accelerator_type != want:
                    raise ProvisioningError(
                        f"run {self.run_id} already has a {rec.accelerator_type} slice ({rec.slice_id} in "
                        f"{rec.zone}), not {want}; tear it down first (`tpu-ops teardown {self.run_id}`)"
                    )
                step = next((s for s in self.steps if s.number == n), None)
                att = Attempt(
                    n,
                    rec.tier,
                    rec.zone,
                    rec.slice_id,
                    Outcome.ADOPTED,
                    0.0,
                    f"{rec.raw_state} already",
                    step.reservation if step else "",
                )
                self._record(att)
                return self._slice(rec), 0
            if rec.state in SliceState.PENDING:
                waiting.append((n, rec))
            elif rec.state in SliceState.LOST:
                self._dead(rec)
            elif rec.state == Phase.FAILED:  # never granted: nothing to recreate, just clean up
                self.provider.delete_slice(rec.zone, rec.slice_id, self._remaining())
        if not waiting:
            return None, 0
        # Keep waiting on the furthest request an earlier process made; drop any older ones so a
        # run never ends up holding two slices.
        waiting.sort(key=lambda t: t[0])
        for _, rec in waiting[:-1]:
            self._abandon(rec.zone, rec.slice_id)
        return None, waiting[-1][0]

    def _dead(self, rec: SliceRecord) -> None:
        """A slice of the run that was granted and then lost (preempted, suspended, host stopped)."""
        now = time.time()
        self.ledger.append(
            L.PREEMPTED, resource_id=rec.slice_id, zone=rec.zone, state=rec.raw_state, node_state=rec.detail, t=now
        )
        self.ledger.append(L.DELETE_REQUESTED, resource_id=rec.slice_id, zone=rec.zone)
        self.provider.delete_slice(rec.zone, rec.slice_id, self._remaining())
        self.ledger.append(L.GONE, resource_id=rec.slice_id, zone=rec.zone)
        if not self.recreate:
            raise ProvisioningError(
                f"run {self.run_id}: slice {rec.slice_id} in {rec.zone} was {rec.raw_state}"
                f"{' (' + rec.detail + ')' if rec.detail and rec.detail != rec.raw_state else ''}; deleted it. "
                "Pass recreate=True to get a new one.",
                self.attempts,
            )

    # -- one attempt -----------------------------------------------------------------------------
    def _attempt(self, step: Step) -> Slice | None:
        rid = resource_id(self.run_id, step.number, self.index)
        t0 = time.monotonic()
        rec: SliceRecord | None = None
        opens_in = 0.0  # a calendar window not open yet: how long the wait may add
        self.hold = partial.Hold()
        try:
            if step.tier == Tier.CALENDAR:
                gate = calendar.step_gate(
                    self.provider, self.spec, step.zone, step.reservation, step.number, self.deadline, self.ledger
                )
                if not gate.go:  # not waited on: late, ended, declined or failed by Google
                    att = Attempt(
                        step.number, step.tier, step.zone, rid, gate.outcome, 0.0, gate.reason, step.reservation
                    )
                    self._record(att)
                    return None
                opens_in = gate.wait_s
            existing = self.provider.describe(step.zone, rid)
            if existing is not None and existing.state in SliceState.TERMINAL:
                self.provider.delete_slice(step.zone, rid, self._remaining())
                existing = None
            if existing is None:
                self._create(step, rid)
            outcome, detail, rec = self._wait(step, rid, t0 + opens_in)
        except QuotaError as exc:
            outcome, detail = Outcome.QUOTA, _short(exc)
        except CapacityError as exc:
            outcome, detail = Outcome.STOCKOUT, _short(exc)
        except (CloudError, TpuOpsError, TimeoutError) as exc:
            outcome, detail = Outcome.ERROR, f"{type(exc).__name__}: {_short(exc)}"
        waited = time.monotonic() - t0
        if outcome != Outcome.ACTIVE and self.hold:  # some hosts came up, never all: not obtained
            detail = partial.release(
                self.hold,
                ledger=self.ledger,
                provider=self.provider,
                zone=step.zone,
                slice_id=rid,
                tier=step.tier,
                accelerator=self.spec.slice.accelerator,
                why=detail,
                timeout_s=self._remaining(),
            )
            outcome = Outcome.PARTIAL
        self._record(Attempt(step.number, step.tier, step.zone, rid, outcome, waited, detail, step.reservation))
        if outcome == Outcome.ACTIVE and rec is not None:
            return self._slice(rec, since=self.hold.since or None)
        if outcome != Outcome.PARTIAL:
            self._abandon(step.zone, rid)
        return None

    def request(self, step: Step, rid: str) -> SliceRequest:
        """What this step asks the provider for."""
        slices = self.spec.slice.slices if self.provider.multislice_request else 1
        return slice_request(self.spec, self.run_id, step, rid, self.metadata, slices)

    def _create(self, step: Step, rid: str) -> None:
        """Create the slice once: a retry first checks that the last try did not land."""
        req = self.request(step, rid)
        for attempt in retry.policy(self.settings):
            with attempt:
                if attempt.retry_state.attempt_number > 1 and self.provider.describe(step.zone, rid) is not None:
                    return  # an earlier try was created after all
                try:
                    self.provider.create(req)
                except AlreadyExistsError:
                    return  # it landed on an earlier try (or another process made it): adopt it

    def _wait(self, step: Step, rid: str, t0: float) -> tuple[str, str, SliceRecord | None]:
        # The server fails the request at validUntil; allow it a few polls to say so.
        grace = max(5 * self.settings.poll_interval_s, 2.0)
        until = min(self.deadline, t0 + self.spec.queue_timeout.total_seconds() + grace)
        last: list[SliceRecord | None] = [None]

        def check() -> tuple[str, str, SliceRecord | None] | None:
            try:
                rec = last[0] = self.provider.describe(step.zone, rid)
            except TransientError:
                return None  # retries used up for this poll; the next poll tries again
            if step.tier == Tier.CALENDAR and (rec is None or rec.state not in SliceState.RUNNING):
                # Google may decline the request, or fail it at the window, while we wait for it
                no = calendar.recheck(self.provider, step.zone, step.reservation, self.ledger, step.number)
                if no is not None:
                    return no.outcome, no.reason, None
            self.hold.see(rec)
            return None if rec is None else self._settled(rec)

        try:
            return poll(check, timeout_s=until - time.monotonic(), interval_s=self.settings.poll_interval_s)
        except TimeoutError:
            why = "overall timeout" if until >= self.deadline - 1e-6 else "validUntilDuration"
            state = last[0].raw_state if last[0] else "not visible"
            return Outcome.TIMEOUT, f"still {state} at the {why}", None

    @staticmethod
    def _settled(rec: SliceRecord) -> tuple[str, str, SliceRecord | None] | None:
        """The outcome once a request left the queue for good; None while it still waits."""
        if rec.state in SliceState.RUNNING:
            return Outcome.ACTIVE, "", rec
        if rec.state == Phase.FAILED:
            return (Outcome.STOCKOUT if rec.stockout else Outcome.FAILED), rec.detail or "FAILED", None
        if rec.state in SliceState.LOST:
            return Outcome.SUSPENDED, rec.detail or rec.raw_state, None
        if rec.state == Phase.DELETING:
            return Outcome.ERROR, "deleted by someone else while waiting", None
        return None

    def _abandon(self, zone: str, rid: str) -> None:
        """Ask for deletion of a slice we are leaving behind (it might still be granted later)."""
        try:
            if self.provider.abandon(zone, rid):
                self.ledger.append(L.DELETE_REQUESTED, resource_id=rid, zone=zone)
        except TpuOpsError:
            pass  # teardown and the reaper find it by its labels and id

    # -- results -------------------------------------------------------------------------------
    def _record(self, attempt: Attempt) -> None:
        self.attempts.append(attempt)
        self.ledger.append(L.ATTEMPT, **dict(attempt.__dict__), backend=self.provider.name)
        if self.on_attempt is not None:
            self.on_attempt(attempt)

    def _slice(self, rec: SliceRecord, since: float | None = None) -> Slice:
        """The slice handed out; billed from ``since`` (its first host up, if it came up host by host)."""
        return obtained(self.spec, self.run_id, rec, self.ledger, self.provider.name, tuple(self.attempts), since)

    def _remaining(self) -> float:
        return max(30.0, float(self.deadline - time.monotonic()))


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
