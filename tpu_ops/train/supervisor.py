"""The training supervisor: provision, watch, recover from preemption, tear down, account.

``supervise(job, run_id, settings)`` provisions a slice through the capacity ladder with a
startup script that runs the agent on every worker, then polls every ``poll_interval``: the
queued resource and node, the workers' exit reports, their heartbeats and the run's DONE marker.

- PREEMPTED/SUSPENDED/missing slice, or no new step for ``stall_limit``: a preemption. The slice
  is force-deleted, a new one provisioned through the ladder (another zone or tier may win) and
  the new workers resume from the newest complete checkpoint. Up to ``max_recoveries`` times,
  within ``max_duration``.
- A worker whose trainer exits non-zero while its slice is healthy and was not told to stop, or a
  stall twice at the same step: the trainer's own failure. ``TrainingError`` at once, with the
  worker's log tail; no recovery loop.
- Whatever happens, the run's slices are torn down and the goodput report is written to
  ``RUN/_tpu_ops/goodput.json``.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tpu_ops.agent.job import Job
from tpu_ops.cloud.clients import storage_client
from tpu_ops.errors import SpecError, TpuOpsError, TrainingError, TransientError
from tpu_ops.polling import poll
from tpu_ops.provision import ledger as L
from tpu_ops.provision.lease import SliceLease
from tpu_ops.provision.naming import check_run_id
from tpu_ops.provision.prices import load as load_prices
from tpu_ops.provision.providers import Phase, Provider, SliceState, for_spec
from tpu_ops.provision.records import Outcome
from tpu_ops.settings import Settings
from tpu_ops.specs.jobs import TrainJobSpec
from tpu_ops.startup import render_startup_script
from tpu_ops.train import choice, notices
from tpu_ops.train.checkpoints import latest_complete_step
from tpu_ops.train.goodput import GoodputReport, Incarnation, Preemption
from tpu_ops.train.layout import RunLayout, exists, list_json, put_json

Notify = Callable[[str, dict[str, Any]], None]
PREEMPTED_EVENT = "tpu-ops.slice.preempted"
RECOVERED_EVENT = "tpu-ops.slice.recovered"
PROVISIONED_EVENT = "tpu-ops.slice.provisioned"


def check_command(job: TrainJobSpec, run_id: str) -> None:
    """A MaxText-style ``run_name=`` in the command must be the run id, or its auto-resume and ours disagree."""
    for arg in job.train.command or []:
        if arg.startswith("run_name=") and arg.removeprefix("run_name=") != run_id:
            raise SpecError(
                f"train.command sets {arg!r} but the run id is {run_id!r}: they must match so the trainer's own "
                f"resume reads the same checkpoints (<checkpoint_dir>/<run_id>/{job.train.checkpoint_subdir})",
                [{"field": "train.command", "value": arg}],
            )


def job_document(job: TrainJobSpec, run_id: str) -> Job:
    """The job spec every worker's agent reads from ``RUN/_tpu_ops/job.json``."""
    t = job.train
    layout = RunLayout.of(t.checkpoint_dir, run_id, t.checkpoint_subdir)
    return Job(
        run_id=run_id, run_uri=layout.run_uri, steps=t.steps, checkpoint_every=t.checkpoint_every,
        command=list(t.command) if t.command else None, trainer=t.trainer, checkpoint_subdir=t.checkpoint_subdir,
        dataset_manifest=t.dataset_manifest, hyperparameters=dict(t.hyperparameters),
        heartbeat_s=t.heartbeat_interval.total_seconds(), term_grace_s=t.term_grace.total_seconds(),
        coordinator_port=t.coordinator_port, setup=list(t.setup) if t.setup else None, python=t.python,
        preemption_notice=t.preemption_notice,
    )  # fmt: skip


class _Preempted(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Supervisor:
    """One training run from first slice to teardown (see the module docstring)."""

    def __init__(self, job: TrainJobSpec, run_id: str, settings: Settings, *, provider: Provider | None = None,
                 wheel: Path | None = None, notify: Notify | None = None,
                 on_attempt: Callable[[Any], None] | None = None) -> None:  # fmt: skip
        job = choice.for_job(job)  # a cost-ranked ladder learns the run's steps, checkpoints and deadline
        self.job, self.run_id, self.settings = job, check_run_id(run_id), settings
        check_command(job, run_id)
        self.lease = SliceLease(job.provision, run_id, settings, provider=provider or for_spec(job.provision, settings),
                                on_attempt=on_attempt,  # re-ranked at every walk with the steps kept by then:
                                progress=choice.kept_steps(self))  # fmt: skip
        self.provider = self.lease.provider
        self.gcs = storage_client(settings)
        self.doc = job_document(job, run_id)
        self.layout = RunLayout(self.doc.run_uri, self.doc.checkpoint_subdir)
        self.wheel, self.notify, self.on_attempt = wheel, notify or (lambda name, payload: None), on_attempt
        if self.wheel is None:  # every worker needs the agent: an image has only its own python3 (agent hook)
            from tpu_ops.train.wheel import agent_wheel

            self.wheel = agent_wheel(settings)
        self.poll_s = job.train.poll_interval.total_seconds()
        self.stall_s = job.train.stall_limit.total_seconds()
        self.report = GoodputReport(run_id, "running", job.train.steps, None, time.time())
        self.deadline = time.monotonic() + job.train.max_duration.total_seconds()
        self.stalls: dict[int | None, int] = {}
        self._notices: list[dict[str, Any]] = []

    # -- the run -----------------------------------------------------------------------------
    def run(self) -> GoodputReport:
        """Train to the end (or fail); always tear down and write the goodput report."""
        t0 = time.monotonic()
        try:
            if exists(self.gcs, self.layout.done):
                self.report.outcome = "already-done"
            else:
                self._upload()
                self._train()
                self.report.outcome = "done"
        except BaseException as exc:
            self.report.outcome, self.report.error = "failed", f"{type(exc).__name__}: {exc}"
            raise
        finally:
            try:
                self.lease.release()
            finally:
                self._finish(time.monotonic() - t0)
        return self.report

    def _upload(self) -> None:
        put_json(self.gcs, self.layout.job, asdict(self.doc))
        choice.record_identity(self.gcs, self.layout, self.job)  # keys this run in the capacity history
        if self.wheel is not None:
            target = self.layout.agent_dir.child(self.wheel.name)
            self.gcs.bucket(target.bucket).blob(target.prefix).upload_from_filename(str(self.wheel))

    def _train(self) -> None:
        preemption: Preemption | None = None
        while True:
            inc = self._provision(len(self.report.incarnations), preemption)
            try:
                self._watch(inc, preemption)
                inc.kept_until = self.report.final_step = latest_complete_step(self.gcs, self.layout.steps_uri)
                return
            except _Preempted as p:
                preemption = self._recover(inc, p.reason)

    def _provision(self, number: int, preemption: Preemption | None) -> Incarnation:
        self._check_deadline()
        inc_id = f"{number}-{uuid.uuid4().hex[:8]}"
        script = render_startup_script(
            self.run_id, ["run", "--job", str(self.layout.job), "--incarnation", inc_id, "--job-file", "job.json"],
            run_uri=self.layout.run_uri, agent_prefix=str(self.layout.agent_dir),
        )  # fmt: skip
        t0 = time.monotonic()
        resume = latest_complete_step(self.gcs, self.layout.steps_uri)
        s = self.lease.acquire(metadata={"startup-script": script})
        if preemption is not None:
            preemption.reprovision_s = time.monotonic() - t0
            preemption.resume_step = resume
            preemption.steps_lost = max(0, (preemption.last_step or 0) - (resume or 0))
        adopted = any(a.outcome == Outcome.ADOPTED for a in s.attempts)
        inc = Incarnation(number, "" if adopted else inc_id, s.queued_resource, s.zone, s.tier, time.time(), resume)
        self._slice = s
        self.report.incarnations.append(inc)
        self.notify(PROVISIONED_EVENT, {"incarnation": number, "queued_resource": s.queued_resource, "node": s.node,
                                        "zone": s.zone, "tier": s.tier, "resume_step": resume})  # fmt: skip
        return inc

    # -- watching ----------------------------------------------------------------------------
    def _watch(self, inc: Incarnation, preemption: Preemption | None) -> None:
        """Return when DONE; raise ``_Preempted`` or ``TrainingError``."""
        self._progress_mark: tuple[Any, ...] = ()
        self._progress_mono = time.monotonic()

        next_full = 0.0

        def check() -> bool | None:
            nonlocal next_full
            if time.monotonic() < next_full:  # between polls: only the workers' SIGTERM notices (agent hook)
                why = notices.check(self.gcs, self.layout, inc.incarnation_id, inc.ready_at, self._notices)
                if why:
                    raise _Preempted(why)
                return None
            next_full = time.monotonic() + self.poll_s
            return self._check(inc, preemption)

        remaining = self.deadline - time.monotonic()
        every = min(self.poll_s, notices.POLL_S) if self.doc.preemption_notice else self.poll_s
        try:
            poll(check, timeout_s=max(remaining, 0.01), interval_s=every, max_interval_s=every,
                       what=f"run {self.run_id} to finish")  # fmt: skip
        except TimeoutError:
            raise TrainingError(
                f"run {self.run_id}: max_duration ({self.job.train.max_duration}) reached at step {inc.last_step}"
            ) from None

    def _check(self, inc: Incarnation, preemption: Preemption | None) -> bool | None:
        try:
            reports = self._mine(inc, list_json(self.gcs, self.layout.workers))
            self._heartbeats(inc, preemption)
            if exists(self.gcs, self.layout.done):
                return True
            self._notices = notices.notices(self.gcs, self.layout, inc.incarnation_id, inc.ready_at)  # agent hook
            lost = notices.reason(self._notices) if self._notices else self._slice_lost(inc)
        except TransientError:
            return None  # this poll failed; the next one tries again
        if lost:
            raise _Preempted(lost)
        failed = [r for r in reports if r["exit_code"] != 0]
        if any(r.get("terminated") for r in failed):
            raise _Preempted("workers terminated")  # told to stop by the host, not the trainer's fault
        if failed:
            r = min(failed, key=lambda r: r["worker"])
            raise TrainingError(
                f"run {self.run_id}: the trainer on worker {r['worker']} exited {r['exit_code']} at step "
                f"{r.get('last_step')} (resumed from {r.get('resume_step')}); not a preemption, so no recovery. "
                f"Log tail:\n{r.get('log_tail', '')}",
                worker=r["worker"], exit_code=r["exit_code"], log_tail=r.get("log_tail", ""),
            )  # fmt: skip
        if time.monotonic() - self._progress_mono > self.stall_s and len(reports) < self._slice.hosts:
            step = inc.last_step if inc.last_step is not None else inc.resume_step
            self.stalls[step] = self.stalls.get(step, 0) + 1
            if self.stalls[step] >= 2:
                raise TrainingError(f"run {self.run_id}: no progress past step {step} twice in a row; giving up")
            raise _Preempted(f"stalled: no new step for {self.stall_s:.0f}s")
        return None

    def _mine(self, inc: Incarnation, docs: list[Any]) -> list[dict[str, Any]]:
        return [d for d in docs if not inc.incarnation_id or d.get("incarnation") == inc.incarnation_id]

    def _heartbeats(self, inc: Incarnation, preemption: Preemption | None) -> None:
        beats = self._mine(inc, list_json(self.gcs, self.layout.heartbeats))
        steps = [b["step"] for b in beats if b.get("step") is not None]
        mark = (max(steps) if steps else None, sum(int(b.get("log_bytes", 0)) for b in beats))
        now = time.time()
        if mark != self._progress_mark:
            self._progress_mark, self._progress_mono = mark, time.monotonic()
        self._last_beat = max((float(b["time"]) for b in beats), default=inc.ready_at)
        top = mark[0]
        if top is None or (inc.last_step is not None and top <= inc.last_step):
            return
        if top > (inc.resume_step or 0) and inc.first_step is None:
            # When the agents saw the first new step (they heartbeat at once then), else when we did.
            seen = [float(b["first_step_at"]) for b in beats if b.get("first_step_at")]
            inc.first_step, inc.first_step_at = top, min(seen, default=now)
            if preemption is not None:
                preemption.restore_s = max(0.0, inc.first_step_at - inc.ready_at)
                self.notify(RECOVERED_EVENT, self._event(preemption, resumed_from=inc.resume_step, step=top))
        inc.last_step, inc.last_progress_at = top, now

    def _slice_lost(self, inc: Incarnation) -> str | None:
        """Why the slice is gone (as its provider describes it), or None while it is healthy."""
        rec = self.provider.describe(inc.zone, inc.queued_resource)
        if rec is None:
            return "slice missing"
        if rec.state in SliceState.RUNNING or rec.state == Phase.BOOTING:
            return None
        return rec.raw_state

    # -- recovery ----------------------------------------------------------------------------
    def _recover(self, inc: Incarnation, reason: str) -> Preemption:
        detected = time.time()
        p = Preemption(len(self.report.preemptions) + 1, reason, inc.queued_resource, inc.zone, inc.tier, detected,
                       inc.last_step, detect_s=max(0.0, detected - self._last_beat))  # fmt: skip
        self.report.preemptions.append(p)
        L.Ledger(self.settings, self.run_id).append(L.PREEMPTED, resource_id=inc.queued_resource, zone=inc.zone,
                                                    state=reason, t=detected)  # fmt: skip
        self.notify(PREEMPTED_EVENT, self._event(p))
        # A notice: the workers are saving; give them their grace before the slice is deleted (agent hook).
        notices.wait_for_exit_reports(self.gcs, self.layout, inc.incarnation_id, self._slice.hosts, self._notices)
        t0 = time.monotonic()
        self.lease.release()
        p.delete_s = time.monotonic() - t0
        # The killed workers' exit reports (written on SIGTERM) name the step each really reached.
        reports = self._mine(inc, list_json(self.gcs, self.layout.workers))
        reached = [s for s in [inc.last_step, *(r.get("last_step") for r in reports)] if s is not None]
        p.last_step = max(reached, default=None)
        inc.kept_until = latest_complete_step(self.gcs, self.layout.steps_uri)
        if len(self.report.preemptions) > self.job.train.max_recoveries:
            raise TrainingError(
                f"run {self.run_id}: preempted {len(self.report.preemptions)} times; max_recoveries is "
                f"{self.job.train.max_recoveries}. Resume later with the same run id."
            )
        return p

    def _check_deadline(self) -> None:
        if time.monotonic() >= self.deadline:
            raise TrainingError(f"run {self.run_id}: max_duration ({self.job.train.max_duration}) reached")

    def _event(self, p: Preemption, **extra: Any) -> dict[str, Any]:
        return {"run_id": self.run_id, "preemption": p.number, "reason": p.reason, "zone": p.zone, "tier": p.tier,
                "queued_resource": p.queued_resource, "last_step": p.last_step, **extra}  # fmt: skip

    def _finish(self, wall_s: float) -> None:
        """Wall time, cost from the ledger, and the report in GCS (best effort: never masks an error)."""
        self.report.wall_s = wall_s
        if self.report.final_step is None:
            with contextlib.suppress(TpuOpsError):
                self.report.final_step = latest_complete_step(self.gcs, self.layout.steps_uri)
        try:
            cost = L.Ledger(self.settings, self.run_id).summary(load_prices(self.settings))
            self.report.cost = cost.to_json()
            put_json(self.gcs, self.layout.goodput, self.report.to_json())
        except (TpuOpsError, OSError) as exc:
            self.report.error = self.report.error or f"goodput report not written: {exc}"


def supervise(job: TrainJobSpec, run_id: str, settings: Settings, **kw: Any) -> GoodputReport:
    """Run ``job`` under ``run_id`` to the end through preemptions; see :class:`Supervisor`."""
    return Supervisor(job, run_id, settings, **kw).run()
