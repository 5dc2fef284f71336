"""The training supervisor: provision, watch, recover from preemption, tear down, account.

``supervise(job, run)`` gets a slice through the ladder (the agent on every worker) and polls every
``poll_interval`` (SIGTERM notices in between): a notice, a lost slice or a stall is a preemption
(delete once the workers saved, a new slice, resume from the newest complete step, up to
``max_recoveries`` within ``max_duration``); a trainer exiting non-zero is a ``TrainingError``; a
cancel marker (``train.cancel``) ends the run. Always: teardown, and the report.

Run state (``train.runstate``) is written by the lease holder only; a successor adopts the live
slice or records the preemption meanwhile. The report (``train.goodput``) derives from it.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tpu_ops.audit.events import AuditEvent
from tpu_ops.errors import TrainingError, TransientError
from tpu_ops.polling import poll
from tpu_ops.provision import ledger as L
from tpu_ops.provision.lease import SliceLease
from tpu_ops.provision.providers import Provider, for_spec
from tpu_ops.run import Run
from tpu_ops.specs.jobs import TrainJobSpec
from tpu_ops.train import cancel, choice, costs, moves, notices, recovery
from tpu_ops.train.checkpoints import latest_complete_step
from tpu_ops.train.closing import finish
from tpu_ops.train.goodput import GoodputReport
from tpu_ops.train.incarnations import (
    absorb_heartbeats,
    check_command,
    check_recoveries,
    done_marker,
    job_document,
    mine,
    preemption_event,
    trainer_failed,
)
from tpu_ops.train.keeper import Keeper
from tpu_ops.train.layout import list_json, put_json
from tpu_ops.train.runstate import IncarnationState, Lease, LeaseLostError, PreemptionState, RunState
from tpu_ops.train.verdict import Kind, Verdict, decide
from tpu_ops.train.watch import observe

Notify = Callable[[AuditEvent, dict[str, Any]], None]
LEASE_MIN_S, LEASE_POLLS = 30.0, 20  # the lease lasts max(30 s, 20 polls); renewed every third of that
STATE_SAVE_S = 2.0  # run state written every max(2 s, 6 polls) while steps go by, and at every event


class _Preempted(Exception):
    def __init__(self, v: Verdict) -> None:
        super().__init__(v.reason)
        self.reason = v.reason
        self.slice = v.slice if v.kind in Kind.LOST else None  # a slice lost, not a stall: the others may stay
        self.notice_due = v.notice_due


class Supervisor:
    """One training run from first slice to teardown (see the module docstring)."""

    def __init__(
        self,
        job: TrainJobSpec,
        run: Run,
        *,
        provider: Provider | None = None,
        wheel: Path | None = None,
        notify: Notify | None = None,
        on_attempt: Callable[[Any], None] | None = None,
    ) -> None:
        job = choice.for_job(job)  # a cost-ranked ladder learns the run's length
        self.job, self.run_id, self.settings, self.ledger = job, run.id, run.settings, run.ledger
        run_id, settings = run.id, run.settings
        check_command(job, run_id)
        # The slice's owner here (provider seam); ``self.lease`` fences the run.
        provider = provider or for_spec(job.provision, settings, run.clients)
        self.slices = SliceLease(
            job.provision,
            run_id,
            settings,
            provider=provider,
            clients=run.clients,
            on_attempt=choice.noting_stockouts(self, on_attempt),
            progress=choice.kept_steps(self),
        )
        self.provider = self.slices.provider
        self.gcs, self.layout = run.clients.gcs(), run.layout
        self.doc = job_document(job, self.layout, run_id, settings.gcp_project)
        self.wheel, self.notify, self.on_attempt = wheel, notify or (lambda name, payload: None), on_attempt
        if self.wheel is None:  # an image has only its own python3: every worker needs the agent
            from tpu_ops.train.wheel import agent_wheel

            self.wheel = agent_wheel(settings)
        self.poll_s = job.train.poll_interval.total_seconds()
        self.stall_s = job.train.stall_limit.total_seconds()
        self.report = GoodputReport(run_id, "running", job.train.steps, None, time.time())
        self.deadline = time.monotonic() + job.train.max_duration.total_seconds()
        self.stalls: dict[int | None, int] = {}
        if job.train.goodput_logging:
            settings.check_safe("logging_endpoint")  # a dry run writes to the local fake only
        self.store = costs.Vouching(choice.state_store(self.gcs, self.layout, job, run_id), self.layout, self.ledger)
        self.lease = Lease(self.gcs, self.layout.lease, max(LEASE_MIN_S, LEASE_POLLS * self.poll_s))
        self.state = RunState(run_id, time.time(), job.train.steps)
        self._saved_at = 0.0
        self._save_every = max(STATE_SAVE_S, 6 * self.poll_s)
        self._progress_mark: tuple[Any, ...] = ()
        self._progress_mono = time.monotonic()
        self._notices: list[dict[str, Any]] = []  # the current incarnation's SIGTERM notices
        self.keeper = Keeper(self.slices, job.provision.slice, self.gcs, self.layout, self.ledger)
        self.mover = moves.Mover(self)  # a move at a checkpoint (choose.move)

    def run(self) -> GoodputReport:
        """Train to the end (or fail); always tear down and write the goodput report.

        A run whose report says it is done is not touched: its stored report is returned as it is.
        """
        stored = GoodputReport.finished(self.gcs, self.layout.goodput)
        if stored is not None:
            self.report = stored
            return stored
        self.lease.acquire()  # LeaseHeldError (naming the holder) if another supervisor runs this run
        self.lease.start()
        lost = False
        try:
            self._load_state()
            self._upload()
            self._train()
            self.state.outcome = "done"
        except LeaseLostError:
            lost = True  # another supervisor took the run over: slice and state are its
            raise
        except BaseException as exc:
            self.state.outcome, self.state.error = cancel.outcome(exc), f"{type(exc).__name__}: {exc}"
            raise
        finally:
            try:
                if not lost:
                    try:
                        self.slices.release()
                    finally:
                        self._finish()
            finally:
                self.lease.release()
        return self.report

    def _load_state(self) -> None:
        """The run's state from GCS (an earlier supervisor's), or a new one."""
        found = self.store.load()
        if found is not None:
            self.state = found
            self.state.outcome, self.state.error = "running", ""  # a failed run is resumed
        self.state.supervisors.append({**{k: self.lease.me[k] for k in ("host", "pid")}, "started_at": time.time()})
        self.report.started_at = self.state.started_at
        self._save()

    def _save(self) -> None:
        self.lease.check()
        self.store.save(self.state)
        self._saved_at = time.monotonic()

    def _upload(self) -> None:
        live = self.state.live
        if live is not None:  # an adopted incarnation: job.json keeps naming it
            self.doc.incarnation = live.id
            self.doc.goodput.update(run_started_at=self.state.started_at, requested_at=live.requested_at)
        put_json(self.gcs, self.layout.job, asdict(self.doc))
        choice.record_identity(self.gcs, self.layout, self.job)
        if self.wheel is not None:
            target = self.layout.agent_dir.child(self.wheel.name)
            self.gcs.bucket(target.bucket).blob(target.prefix).upload_from_filename(str(self.wheel))

    def _train(self) -> None:
        preemption = self._resume()
        while True:
            done = done_marker(self.gcs, self.layout)
            if done is not None:  # finished while no supervisor ran
                last = self.state.incarnations[-1] if self.state.incarnations else None
                if last is not None and last.end in ("", "done"):
                    self._completed(last, done)
                else:
                    self.state.final_step = latest_complete_step(self.gcs, self.layout.steps_uri)
                    self.state.finished_at = max(float(done.get("time") or time.time()), self.state.started_at)
                return
            inc = self._provision(preemption)
            try:
                self._watch(inc)
                return
            except _Preempted as p:
                preemption = self._recover(inc, p.reason, lost=p.slice, notice_due=p.notice_due)
            except moves.Moved:  # the run state names the new incarnation: adopted next
                preemption = None

    def _resume(self) -> PreemptionState | None:
        """Take over a live incarnation left by a predecessor: adopt a healthy slice, else record the
        preemption that happened meanwhile (keeping the slices that still run)."""
        self.mover.resume()  # a move left half-way: undone, or finished
        live = self.state.live
        if live is None or not live.queued_resource:  # a predecessor died mid-recovery, or before asking anew
            return recovery.finish_taken_over(self.keeper, self.gcs, self.layout, self.doc, self.state)
        self._heartbeats(live)  # progress meanwhile
        mine_all = [(s.zone, s.resource_id) for s in live.allocation()]  # every slice: which one went, if one did
        v = self._judge(live, with_done=False, slices=mine_all)  # a DONE run is _train's to close
        if v.kind not in Kind.LOST:
            return None  # _provision adopts it (same incarnation id: reports stay current)
        recovery.take_over(self.keeper, self.gcs, self.layout, live, v.slice)
        return self._recover(live, v.reason, unsupervised=True, lost=v.slice, notice_due=v.notice_due)

    def _provision(self, preemption: PreemptionState | None) -> IncarnationState:
        if time.monotonic() >= self.deadline:
            raise TrainingError(f"run {self.run_id}: max_duration ({self.job.train.max_duration}) reached")
        inc = self.state.live
        if inc is None:  # a new incarnation: its id is stored before the slice boots
            number = len(self.state.incarnations)
            inc = IncarnationState(
                number,
                f"{number}-{uuid.uuid4().hex[:8]}",
                time.time(),
                resume_step=latest_complete_step(self.gcs, self.layout.steps_uri),
            )
            self.state.incarnations.append(inc)
            self.doc.incarnation = inc.id
            self.doc.goodput.update(run_started_at=self.state.started_at, requested_at=inc.requested_at)
            put_json(self.gcs, self.layout.job, asdict(self.doc))
            self._save()
        self.doc.incarnation = inc.id
        t0 = time.monotonic()
        s = self.keeper.obtain(self.run_id, inc.id)[0]  # all k slices or none
        if inc.queued_resource and inc.queued_resource != s.queued_resource:
            raise TrainingError(f"run {self.run_id}: expected slice {inc.queued_resource}, found {s.queued_resource}")
        k = self.keeper
        adopted = recovery.ready(inc, k.slices, k.carried, preemption, time.monotonic() - t0, k.repaired)
        if self.job.provision.slice.shapes:  # elastic shapes: what this incarnation trains on (train.elastic)
            inc.shape, inc.chips = self.keeper.shape.name, sum(x.chips for x in self.keeper.slices)
        self._save()
        self.report.incarnations = self.state.incarnations
        self.notify(AuditEvent.SLICE_PROVISIONED, recovery.provisioned_event(inc, s, adopted))
        return inc

    def _watch(self, inc: IncarnationState) -> None:
        """Return when DONE; raise ``_Preempted`` or ``TrainingError``."""
        self._progress_mark = ()
        self._progress_mono = time.monotonic()
        preemption = self.state.preemptions[-1] if self.state.preemptions else None
        if preemption is not None and preemption.incarnation != inc.number - 1:
            preemption = None

        self._notices = []
        next_full = 0.0

        def check() -> bool | None:
            nonlocal next_full
            if time.monotonic() < next_full:  # between full polls: only the workers' SIGTERM notices
                self.lease.check()
                with contextlib.suppress(TransientError):
                    v = self._judge(inc, full=False)
                    if v.recover:
                        raise _Preempted(v)
                return None
            next_full = time.monotonic() + self.poll_s
            return self._check(inc, preemption)

        remaining = self.deadline - time.monotonic()
        every = min(self.poll_s, notices.POLL_S) if self.doc.preemption_notice else self.poll_s
        try:
            poll(
                check,
                timeout_s=max(remaining, 0.01),
                interval_s=every,
                max_interval_s=every,
                what=f"run {self.run_id} to finish",
            )
        except TimeoutError:
            raise TrainingError(
                f"run {self.run_id}: max_duration ({self.job.train.max_duration}) reached at step {inc.last_step}"
            ) from None

    def _check(self, inc: IncarnationState, preemption: PreemptionState | None) -> bool | None:
        """A full poll: observe, judge, act on the verdict."""
        self.lease.check()
        try:
            cancel.check(self.gcs, self.layout, self.run_id)
            self._heartbeats(inc, preemption)
            v = self._judge(inc, stall_limit_s=self.stall_s)
            if v.kind == Kind.FINISHED:
                self._completed(inc, dict(v.detail))
                return True
        except TransientError:
            return None  # this poll failed; the next one tries again
        if v.kind == Kind.FAILED:
            trainer_failed(self.run_id, [dict(v.detail)])
        if v.kind == Kind.STALLED:
            step = inc.last_step if inc.last_step is not None else inc.resume_step
            self.stalls[step] = self.stalls.get(step, 0) + 1
            if self.stalls[step] >= 2:
                raise TrainingError(f"run {self.run_id}: no progress past step {step} twice in a row; giving up")
        if v.recover:
            raise _Preempted(v)
        self.mover.consider(inc)  # at a new checkpoint: rank again, maybe move (moves.Moved)
        if time.monotonic() - self._saved_at >= self._save_every:
            self._save()  # the step records so far
        return None

    def _judge(self, inc: IncarnationState, *, full: bool = True, **kw: Any) -> Verdict:
        """The verdict on the incarnation's allocation (``train.verdict``); full: the slices' states too."""
        since = time.monotonic() - self._progress_mono
        kw.setdefault("slices", [(s.zone, s.queued_resource) for s in self.keeper.slices])
        facts = observe(
            self.gcs, self.layout, self.provider if full else None, inc, hosts=self._hosts, since_progress_s=since, **kw
        )
        self._notices = [dict(n) for n in facts.notices]  # recovery gives the workers their grace
        return decide(facts)

    @property
    def _hosts(self) -> int:
        return sum(s.hosts for s in self.keeper.slices) or 1

    def _completed(self, inc: IncarnationState, done: dict[str, Any]) -> None:
        final = latest_complete_step(self.gcs, self.layout.steps_uri)
        self._heartbeats(inc)  # worker 0's exit heartbeat (written before DONE) has the last steps
        inc.kept_until = self.state.final_step = final
        inc.end, inc.ended_at = "done", float(done.get("time") or time.time())
        # The run ends with the trainer's last record (the final save); DONE is bookkeeping after it.
        last = max((float(r[3]) for r in inc.timeline), default=inc.ended_at)
        self.state.finished_at = max(min(last, inc.ended_at), self.state.started_at)
        self._save()

    def _heartbeats(self, inc: IncarnationState, preemption: PreemptionState | None = None) -> None:
        mark = absorb_heartbeats(inc, mine(inc, list_json(self.gcs, self.layout.heartbeats)), self.state)
        if mark != self._progress_mark:
            self._progress_mark, self._progress_mono = mark, time.monotonic()
        if preemption is not None and preemption.restore_s is None and inc.first_step_at and inc.ready_at:
            preemption.restore_s = max(0.0, inc.first_step_at - inc.ready_at)
            self._save()  # an event: the recovery is complete
            payload = preemption_event(self.run_id, preemption, resumed_from=inc.resume_step, step=mark[0])
            self.notify(AuditEvent.SLICE_RECOVERED, payload)

    def _recover(
        self, inc: IncarnationState, reason: str, *, unsupervised: bool = False, lost: int | None = None,
        notice_due: bool = False,
    ) -> PreemptionState:  # fmt: skip
        """Record the loss (of slice ``lost``), let every worker save the step in hand, give the allocation back;
        ``notice_due``: the control plane showed the hosts stopping before their notices came (wait for them)."""
        rid = recovery.lost_resource(inc, [s.queued_resource for s in self.keeper.slices], lost, unsupervised)
        p = recovery.open_preemption(self.state, inc, reason, rid, unsupervised=unsupervised, lost=lost)
        self.report.preemptions = self.state.preemptions
        self._save()
        self.ledger.append(L.PREEMPTED, resource_id=rid, zone=p.zone, state=reason, t=p.detected_at)
        kept, stopped_until = recovery.stop_others(
            self.gcs, self.layout, self.doc, inc, self.keeper.slices, lost, reason
        )
        self.notify(AuditEvent.SLICE_PREEMPTED, preemption_event(self.run_id, p))
        if notice_due and not self._notices and self.doc.preemption_notice:
            since = inc.ready_at or 0.0
            self._notices = notices.await_notices(self.gcs, self.layout, inc.id, self._hosts, since)
        if self._notices or kept:  # the workers are saving: their grace first
            notices.wait_for_exit_reports(self.gcs, self.layout, inc.id, self._hosts, self._notices, kept=kept,
                                          stopped_until=stopped_until)  # fmt: skip
        t0 = time.monotonic()
        self.keeper.give_back(lost)
        p.delete_s = time.monotonic() - t0
        # Exit heartbeats and reports (written on SIGTERM) name the step each worker reached.
        with contextlib.suppress(TransientError):
            self._heartbeats(inc)
        recovery.close_preemption(p, inc, self.gcs, self.layout)
        self._save()
        check_recoveries(self.run_id, len(self.state.preemptions), self.job.train.max_recoveries)
        return p

    def _finish(self) -> None:
        sl = self.job.provision.slice  # the MFU's peak is every slice's
        args = (self.state, self.report, self.gcs, self.layout, self.ledger, self.settings, sl.accelerator)
        self.report = finish(*args, self._save, sl.slices)


def supervise(job: TrainJobSpec, run: Run, **kw: Any) -> GoodputReport:
    """Run ``job`` as ``run`` to the end through preemptions; see :class:`Supervisor`."""
    return Supervisor(job, run, **kw).run()
