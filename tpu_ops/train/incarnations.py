"""One incarnation of a run's slice: the job document its agents read, its heartbeats, its slice's health."""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import Any

from tpu_ops.agent.job import WORK_FIELDS, Job
from tpu_ops.errors import NotFoundError, SpecError, TrainingError
from tpu_ops.layout import RunLayout
from tpu_ops.provision.records import Slice
from tpu_ops.specs.jobs import TrainJobSpec
from tpu_ops.specs.slice import SliceSpec
from tpu_ops.startup import render_startup_script
from tpu_ops.train.layout import get_json
from tpu_ops.train.runstate import IncarnationState, PreemptionState, RunState, SliceState


def check_command(job: TrainJobSpec, run_id: str) -> None:
    """A MaxText-style ``run_name=`` in the command must be the run id, or its auto-resume and ours disagree."""
    for arg in job.train.command or []:
        if arg.startswith("run_name=") and arg.removeprefix("run_name=") != run_id:
            raise SpecError(
                f"train.command sets {arg!r} but the run id is {run_id!r}: they must match so the trainer's own "
                f"resume reads the same checkpoints (<checkpoint_dir>/<run_id>/{job.train.checkpoint_subdir})",
                [{"field": "train.command", "value": arg}],
            )


def job_document(job: TrainJobSpec, layout: RunLayout, run_id: str, project: str) -> Job:
    """The job spec every worker's agent reads from ``layout.job``."""
    t = job.train
    # what worker 0 needs to write ml-goodput-measurement's entries (agent.goodput_hooks)
    goodput = {"logging": t.goodput_logging, "job_name": run_id, "logger_name": f"goodput_{run_id}",
               "project": project, "steps": t.steps}  # fmt: skip
    return Job(
        run_id=run_id, run_uri=layout.run_uri, steps=t.steps, checkpoint_every=t.checkpoint_every,
        command=list(t.command) if t.command else None, trainer=t.trainer, checkpoint_subdir=t.checkpoint_subdir,
        dataset_manifest=t.dataset_manifest, hyperparameters=dict(t.hyperparameters),
        heartbeat_s=t.heartbeat_interval.total_seconds(), term_grace_s=t.term_grace.total_seconds(),
        coordinator_port=t.coordinator_port, setup=list(t.setup) if t.setup else None, python=t.python,
        preemption_notice=t.preemption_notice, goodput=goodput, slices=job.provision.slice.slices,
        movable=movable(job), **elastic(job.provision.slice),
    )  # fmt: skip


def movable(job: TrainJobSpec) -> bool:
    """Whether the run may move at a checkpoint (train.moves): ``choose`` with ``move``, one slice of one shape."""
    c, sl = job.provision.choose, job.provision.slice
    return c is not None and c.move and sl.slices == 1 and not sl.shapes


def elastic(sl: SliceSpec) -> dict[str, Any]:
    """The job's target shape and chips when the slice has elastic ``shapes`` (docs/elastic.md), else nothing."""
    return {"target_shape": sl.shape_list[0].name, "target_chips": sl.shape_list[0].chips} if sl.shapes else {}


def record_allocation(
    inc: IncarnationState, slices: Sequence[Slice], kept: Collection[int] = (), repaired: Collection[int] = ()
) -> None:
    """Record every slice of ``inc``'s allocation (slice 0 also in the fields single-slice readers use).

    ``kept``: the indices held over from the previous incarnation (``Keeper.carried``); ``repaired``: those
    Google repaired (``Keeper.repaired``: the request kept, the node new). A slice the incarnation already
    records (a successor supervisor adopting it) keeps its flags.
    """
    if not slices:
        return
    before = {s.resource_id: (s.kept, s.repaired) for s in inc.slices}
    inc.slices = []
    for i, s in enumerate(slices):
        was_kept, was_repaired = before.get(s.queued_resource, (False, False))
        fixed = i in repaired or was_repaired
        carried = not fixed and (i in kept or was_kept)
        inc.slices.append(SliceState(i, s.queued_resource, s.zone, s.tier, s.hosts, carried, fixed))
    inc.queued_resource, inc.zone, inc.tier = slices[0].queued_resource, slices[0].zone, slices[0].tier


def merge_timeline(inc: IncarnationState, records: list[list[Any]]) -> None:
    """Add the records not seen yet (a heartbeat carries the newest ones, overlapping the last)."""
    seen = {(r[0], r[1], r[2]) for r in inc.timeline}
    new = [list(r) for r in records if (r[0], r[1], r[2]) not in seen]
    if new:
        inc.timeline = sorted([*inc.timeline, *new], key=lambda r: (float(r[2]), float(r[3])))


def absorb_heartbeats(
    inc: IncarnationState, beats: list[dict[str, Any]], state: RunState | None = None
) -> tuple[int | None, int]:
    """Take this incarnation's heartbeats into its state; the progress mark (top step, log bytes).

    The step the run's first worker says its trainer resumed from becomes the incarnation's ``resume_step``
    (the supervisor read the bucket earlier: a save committed in between is resumed from, and its steps were
    not redone); with ``state``, the incarnation before follows (``follow_resume``).
    """
    resumed = None
    for b in beats:  # worker 0 carries the trainer's newest step records: merge them in
        if b.get("worker") == 0 and b.get("timeline"):
            merge_timeline(inc, b["timeline"])
        if b.get("worker") == 0 and not b.get("slice") and b.get("resume_step") is not None:
            resumed = int(b["resume_step"])
        if b.get("worker") == 0:  # and, if the trainer says, what a step does (tokens, model FLOPs)
            for name in WORK_FIELDS:
                if isinstance(b.get(name), (int, float)) and b[name] > 0:
                    setattr(inc, name, float(b[name]))
    if resumed is not None:
        inc.resume_step = resumed
        if state is not None:
            follow_resume(state, inc)
    steps = [int(b["step"]) for b in beats if b.get("step") is not None]
    top = max(steps) if steps else None
    if beats:
        inc.last_seen_at = max(float(b["time"]) for b in beats)
    if top is not None and (inc.last_step is None or top > inc.last_step):
        if top > (inc.resume_step or 0) and inc.first_step_at is None:
            # When the agents saw the first new step (they heartbeat at once then), else when we did.
            seen = [float(b["first_step_at"]) for b in beats if b.get("first_step_at")]
            inc.first_step_at = min(seen, default=time.time())
        inc.last_step = top
    return top, sum(int(b.get("log_bytes", 0)) for b in beats)


def follow_resume(state: RunState, inc: IncarnationState) -> None:
    """``inc`` resumed from ``inc.resume_step``: the preempted incarnation before it kept its steps up to
    there (``kept_until`` is the step the next one resumed from), and its preemption lost the rest."""
    prev = state.incarnations[inc.number - 1] if 0 < inc.number <= len(state.incarnations) else None
    if prev is None or prev.end != "preempted":
        return
    prev.kept_until = inc.resume_step
    for p in state.preemptions:
        if p.incarnation == prev.number and p.resume_step is not None:
            p.resumed_from(inc.resume_step)


def mine(inc: IncarnationState, docs: list[Any]) -> list[dict[str, Any]]:
    """Only this incarnation's documents: a stale report of an earlier slice is never taken for news."""
    return [d for d in docs if isinstance(d, dict) and d.get("incarnation") == inc.id]


def preemption_event(run_id: str, p: PreemptionState, **extra: Any) -> dict[str, Any]:
    """The payload of the ``tpu-ops.slice.preempted`` / ``recovered`` events."""
    return {"run_id": run_id, "preemption": p.number, "reason": p.reason, "zone": p.zone, "tier": p.tier,
            "queued_resource": p.queued_resource, "last_step": p.last_step, "unsupervised": p.unsupervised,
            **extra}  # fmt: skip


def done_marker(gcs: Any, layout: RunLayout) -> dict[str, Any] | None:
    """The run's DONE marker (worker 0 writes it once every worker exited 0), or None."""
    try:
        doc = get_json(gcs, layout.done)
    except NotFoundError:
        return None
    return doc if isinstance(doc, dict) else {}


def trainer_failed(run_id: str, reports: list[dict[str, Any]]) -> None:
    """Raise ``TrainingError`` (lowest worker's exit and log tail) if a trainer exited non-zero on a healthy slice."""
    failed = [r for r in reports if r["exit_code"] != 0]
    if failed:
        r = min(failed, key=lambda r: r["worker"])
        raise TrainingError(
            f"run {run_id}: the trainer on worker {r['worker']} exited {r['exit_code']} at step "
            f"{r.get('last_step')} (resumed from {r.get('resume_step')}); not a preemption, so no recovery. "
            f"Log tail:\n{r.get('log_tail', '')}",
            worker=r["worker"], exit_code=r["exit_code"], log_tail=r.get("log_tail", ""),
        )  # fmt: skip


def startup_script(run_id: str, layout: RunLayout, incarnation_id: str) -> str:
    """The startup script that runs this incarnation's agent on every worker."""
    return render_startup_script(
        run_id, ["run", "--job", str(layout.job), "--incarnation", incarnation_id, "--job-file", "job.json"],
        run_uri=layout.run_uri, agent_prefix=str(layout.agent_dir),
    )  # fmt: skip


def check_recoveries(run_id: str, preemptions: int, max_recoveries: int) -> None:
    """``TrainingError`` once the run was preempted more often than ``max_recoveries``."""
    if preemptions > max_recoveries:
        raise TrainingError(
            f"run {run_id}: preempted {preemptions} times; max_recoveries is {max_recoveries}. "
            "Resume later with the same run id."
        )
