"""A voluntary move at a checkpoint, make-before-break (docs/moves.md).

At each newly committed checkpoint, and ``choose.move_every`` after its last ranking, a run with
``choose`` (and ``choose.move``, the default) ranks its remaining work as a re-walk would
(:mod:`tpu_ops.provision.rewalk`). When a rung ahead of the held one is worth the move
(:func:`tpu_ops.provision.moving.worth_moving`), the supervisor asks for that rung alone, beside the held
slice; its agents stand by (``agent.job.STANDBY_KEY``) until the allocation document names their
incarnation, so two trainers never write the run. Once they are up, the old workers are told to stop
(``state/stop/<incarnation>.json``: they save the step in hand), the old slice is deleted, and the
allocation document names the new incarnation: it restores that step.

Every phase is in the run state (:class:`~tpu_ops.train.runstate.MoveState`) before it is acted on, so a
successor supervisor finishes a handover the old workers were told of, or undoes one they were not.
A refusal, a target that never comes up, or anything happening to the old slice meanwhile leaves the
old slice training (the target deleted); nothing is leaked: both slices carry the run's labels.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import asdict
from typing import Any

from tpu_ops.agent.job import ALLOCATION_DOC, STANDBY_KEY, allocation_doc
from tpu_ops.audit.events import AuditEvent
from tpu_ops.errors import TpuOpsError, TransientError
from tpu_ops.provision import ladder, rewalk
from tpu_ops.provision import ledger as L
from tpu_ops.provision.launch import Launch
from tpu_ops.provision.naming import SLICE_STRIDE, attempt_of, resource_id
from tpu_ops.provision.prices import PriceTable
from tpu_ops.provision.prices import load as load_prices
from tpu_ops.provision.providers import SliceState
from tpu_ops.provision.records import Attempt
from tpu_ops.provision.steps import plan
from tpu_ops.train import cancel, notices
from tpu_ops.train.checkpoints import latest_complete_step
from tpu_ops.train.incarnations import done_marker, movable, startup_script
from tpu_ops.train.layout import list_json, put_json
from tpu_ops.train.recovery import REPORT_S
from tpu_ops.train.runstate import IncarnationState, MoveState
from tpu_ops.train.verdict import Kind

ASKED, STOPPING, MOVED, REFUSED, ABANDONED = "asked", "stopping", "moved", "refused", "abandoned"


class Moved(Exception):
    """The run left its incarnation: the supervisor provisions (adopts) the live one the run state names."""


class Mover:
    """The supervisor's moves (``sup``: a :class:`tpu_ops.train.supervisor.Supervisor`)."""

    def __init__(self, sup: Any) -> None:
        self.sup, self.on = sup, movable(sup.job)
        self.seen = 0  # the newest checkpoint ranked: one ranking per committed checkpoint
        self.ranked_at: float | None = None  # monotonic: when the last ranking was (choose.move_every)
        self._table: PriceTable | None = None

    # -- when --------------------------------------------------------------------------------------
    def consider(self, inc: IncarnationState) -> None:
        """At a newly committed checkpoint of ``inc``, or ``choose.move_every`` after the last ranking: rank, and
        move if worth it (raises ``Moved``)."""
        try:
            step = self._due(inc)
        except TransientError:
            return  # the next poll looks again
        if step is None:
            return
        self.seen, self.ranked_at = step, time.monotonic()
        sup = self.sup
        spec = sup.job.provision
        held = (attempt_of(sup.run_id, inc.queued_resource) or 0) % SLICE_STRIDE
        read = getattr(sup.provider, "reservation_document", None)
        try:
            self._table = self._table or load_prices(sup.settings)
            started, rid = sup.state.started_at, sup.run_id
            choice, run, _ = rewalk.rank_now(spec, sup.slices.clients, self._table, step, started, read, run_id=rid)
            move = rewalk.decide(choice, held)
            if move is None:
                return
            spent = sup.ledger.summary(self._table).usd_total  # read only for a move worth making
            why = rewalk.over_budget(spec, self._table, spent, run, choice, held, move)
        except TpuOpsError:
            return  # no ranking at this checkpoint (a price missing too): the next one ranks again
        if why:
            self._over_budget(inc, step, move, why)
            return
        rewalk.record(spec, sup.slices.clients, sup.run_id, sup.ledger, self._table, choice, run, move,
                      inc.queued_resource)  # fmt: skip
        self._move(inc, step, move)

    def _due(self, inc: IncarnationState) -> int | None:
        """The step to rank at: a committed checkpoint newer than the resume step and the last one ranked; else,
        ``choose.move_every`` after the last ranking, the step in hand (a handover saves it); else None."""
        if not self.on or inc.last_step is None or not inc.queued_resource:
            return None
        t = self.sup.job.train
        base = max(self.seen, inc.resume_step or 0)
        if inc.last_step // t.checkpoint_every * t.checkpoint_every > base:  # a save since: list the steps
            step = latest_complete_step(self.sup.gcs, self.sup.layout.steps_uri)
            if step is not None and base < step < t.steps:
                return step
        every = self.sup.job.provision.choose.move_every
        now = time.monotonic()
        if self.ranked_at is None:
            self.ranked_at = now  # the first look: the interval counts from here
        if every is None or now - self.ranked_at < every.total_seconds():
            return None
        return inc.last_step if base < inc.last_step < t.steps else None

    # -- how ---------------------------------------------------------------------------------------
    def _state(self, inc: IncarnationState, step: int, move: Any) -> MoveState:
        sup, state = self.sup, self.sup.state
        target = next(s for s in plan(sup.job.provision) if s.number == move.to)
        new_id = f"{len(state.incarnations)}-{uuid.uuid4().hex[:8]}"
        return MoveState(len(state.moves) + 1, inc.number, new_id, step, inc.queued_resource, inc.tier, inc.zone,
                         resource_id(sup.run_id, move.to), str(target.tier), target.zone, move.why, move.stay_usd,
                         move.move_usd, time.time())  # fmt: skip

    def _over_budget(self, inc: IncarnationState, step: int, move: Any, why: str) -> None:
        """A move the budget refuses, before any request: ``refused`` with why (no stockout: the rung was not
        asked). Kept once while the same target stays over budget: one ranking per checkpoint would repeat it."""
        target = resource_id(self.sup.run_id, move.to)
        last = self.sup.state.moves[-1:]
        if any(
            m.phase == REFUSED and m.to_resource == target and m.detail.startswith(rewalk.OVER_BUDGET) for m in last
        ):
            return
        mv = self._state(inc, step, move)
        mv.phase, mv.ended_at, mv.detail = REFUSED, mv.asked_at, why
        self.sup.state.moves.append(mv)
        self.sup._save()
        self._event(mv)

    def _move(self, inc: IncarnationState, step: int, move: Any) -> None:
        sup, state = self.sup, self.sup.state
        mv = self._state(inc, step, move)
        state.moves.append(mv)
        sup._save()  # before the request: a successor deletes the target of a move it finds asked
        tried: list[Attempt] = []

        def note(a: Attempt) -> None:
            tried.append(a)
            sup.slices.on_attempt(a)  # refusals reach the run state's stockouts, as a walk's do

        md = Launch(startup_script(sup.run_id, sup.layout, mv.to_id), 1, {STANDBY_KEY: "true"}).metadata(0)
        try:
            got = ladder.request(sup.job.provision, sup.run_id, sup.settings, move.to, provider=sup.provider,
                                 metadata=md, on_attempt=note)  # fmt: skip
        except TpuOpsError as exc:
            got, mv.detail = None, (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        if got is None:
            mv.phase, mv.ended_at = REFUSED, time.time()
            mv.detail = mv.detail or (tried[-1].describe() if tried else "refused")
            sup._save()
            self._event(mv)
            return
        mv.granted_at = time.time()
        sup._save()
        why = self._standby(inc, mv, got.hosts)
        if why:
            self._drop(mv, why)
            return
        mv.phase, mv.stopped_at = STOPPING, time.time()
        sup._save()  # before the marker: a successor finishes a handover the old workers were told of
        put_json(sup.gcs, sup.layout.state(f"stop/{inc.id}.json"), {"slice": None, "reason": f"move {mv.number}"})
        self.handover(inc, mv, list(got.endpoints))

    def _standby(self, inc: IncarnationState, mv: MoveState, hosts: int) -> str:
        """Until every host of the target stands by at the gate, the old slice watched meanwhile; why not, or ''."""
        sup = self.sup
        stall = sup.stall_s
        beats: list[dict[str, Any]] = []
        while True:
            sup.lease.check()
            if time.monotonic() >= sup.deadline:
                return "the run's max_duration came first"
            if sum(1 for b in beats if b.get("state") == "waiting") >= hosts:
                return ""
            newest = max([float(b.get("time") or 0) for b in beats] + [mv.granted_at or 0.0])
            if time.time() - newest > stall:
                return f"the new slice's workers showed no sign of life for stall_limit ({stall:g} s)"
            try:
                cancel.check(sup.gcs, sup.layout, sup.run_id)  # a cancel tears down both slices
                beats = [b for b in list_json(sup.gcs, sup.layout.state(f"standby/{mv.to_id}")) if isinstance(b, dict)]
                rec = sup.provider.describe(mv.to_zone, mv.to_resource)
                sup._heartbeats(inc)
                v = sup._judge(inc, stall_limit_s=stall)
            except TransientError:
                rec, v = None, None
            if v is not None and (rec is None or rec.state not in SliceState.RUNNING):
                return f"the new slice is {rec.raw_state if rec else 'gone'}"
            if v is not None and v.kind != Kind.HEALTHY:
                return f"the old slice is {v.kind} ({v.reason})"  # the watch acts on it next
            if sum(1 for b in beats if b.get("state") == "waiting") < hosts:
                time.sleep(min(sup.poll_s, 1.0))

    def handover(self, inc: IncarnationState, mv: MoveState, endpoints: list[str] | None) -> None:
        """The old workers told to stop: their reports, the old slice deleted, the new incarnation named.
        ``endpoints``: the target's hosts (None: described again, a successor's case). Raises ``Moved``."""
        sup, job = self.sup, self.sup.doc
        hosts = sum(s.hosts for s in inc.allocation()) or 1
        until = (mv.stopped_at or time.time()) + 2 * job.heartbeat_s + job.term_grace_s + REPORT_S
        kept = {(0, w) for w in range(hosts)}
        notices.wait_for_exit_reports(sup.gcs, sup.layout, inc.id, hosts, [], kept=kept, stopped_until=until)
        with contextlib.suppress(TransientError):
            sup._heartbeats(inc)  # the old workers' exit heartbeats: their last step records
        if done_marker(sup.gcs, sup.layout) is not None:  # it finished before it saw the marker
            self._drop(mv, "the run finished first")
            return
        rec = sup.provider.describe(mv.to_zone, mv.to_resource)
        kept_until = latest_complete_step(sup.gcs, sup.layout.steps_uri)
        inc.end, inc.kept_until = "moved", kept_until
        if rec is None or rec.state not in SliceState.RUNNING:  # the old stopped, the new is lost: a new walk
            inc.ended_at = time.time()
            self._drop(mv, f"the new slice is {rec.raw_state if rec else 'gone'} after the old one stopped")
            sup.keeper.give_back(None)
            raise Moved(mv.detail)
        self._delete(mv.from_zone, mv.from_resource)
        inc.ended_at = mv.ended_at = time.time()
        mv.phase, mv.resume_step = MOVED, kept_until
        new = IncarnationState(len(sup.state.incarnations), mv.to_id, mv.asked_at, mv.to_resource, mv.to_zone,
                               mv.to_tier, mv.granted_at, kept_until)  # fmt: skip
        sup.state.incarnations.append(new)
        sup.doc.incarnation = new.id
        put_json(sup.gcs, sup.layout.job, asdict(sup.doc))
        sup._save()  # before the allocation document: the new trainer starts only once the state names it
        self.admit(mv, list(endpoints if endpoints is not None else rec.endpoints))
        self._event(mv)
        raise Moved(mv.why)

    def admit(self, mv: MoveState, endpoints: list[str]) -> None:
        """The allocation document naming the new incarnation: its agents leave the gate."""
        doc = {**allocation_doc(mv.to_id, [(mv.to_resource, endpoints)]), "kept": []}
        put_json(self.sup.gcs, self.sup.layout.state(ALLOCATION_DOC), doc)

    def _drop(self, mv: MoveState, why: str) -> None:
        """Give up on the move: the target deleted (confirmed gone), the reason kept."""
        self._delete(mv.to_zone, mv.to_resource)
        mv.phase, mv.ended_at, mv.detail = ABANDONED, time.time(), why
        self.sup._save()
        self._event(mv)

    def _delete(self, zone: str, rid: str) -> None:
        sup = self.sup
        open_ = sup.ledger.is_open(rid)
        if open_:
            sup.ledger.append(L.DELETE_REQUESTED, resource_id=rid, zone=zone)
        sup.provider.delete_slice(zone, rid, 900.0)
        if open_:
            sup.ledger.append(L.GONE, resource_id=rid, zone=zone)

    def _event(self, mv: MoveState) -> None:
        payload = {"run_id": self.sup.run_id, **asdict(mv), "overlap_s": round(mv.overlap_s, 3)}
        self.sup.notify(AuditEvent.SLICE_MOVED, payload)

    # -- a successor -------------------------------------------------------------------------------
    def resume(self) -> None:
        """A move a predecessor left half-way: undone before the old workers were told, else finished."""
        state = self.sup.state
        mv = state.moves[-1] if state.moves else None
        if mv is None:
            return
        live = state.live
        if mv.phase == MOVED and live is not None and live.id == mv.to_id:
            rec = self.sup.provider.describe(mv.to_zone, mv.to_resource)
            if rec is not None:
                self.admit(mv, list(rec.endpoints))  # (again: it may not have been written)
        elif mv.phase == ASKED:
            self._drop(mv, "the supervisor stopped before the handover")
        elif mv.phase == STOPPING and live is not None and live.number == mv.incarnation:
            with contextlib.suppress(Moved):
                self.handover(live, mv, None)
