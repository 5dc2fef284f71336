"""Issue 29, "Accounting that cannot be quietly wrong": a multislice run whose healthy slice finishes a save
after the lost slice is gone still counts every step it kept (the JAX + Orbax multislice test once reported
54 kept steps of 60).

The healthy slice's workers learn of the loss from the stop marker, at their next heartbeat, and then have
the whole grace: they may commit a step (and write their last step records) after the lost slice's grace
is over. The preemption's bookkeeping must wait for them, and the step an incarnation kept is the step the
next one resumed from. Before the fix this run counted 25 of 30 steps kept: the supervisor read the step
kept (10) and the next resume step (10) before slice 0 committed step 15, which the workers then resumed
from; without the wait alone, slice 0's last records (the save of step 15) are never read."""

from __future__ import annotations

from typing import Any

import pytest
from train_helpers import ZONE, Run, job_spec, live_node, wait_for

pytestmark = pytest.mark.usefixtures("nothing_left")


def test_a_save_committed_by_the_kept_slice_after_the_loss_is_counted_and_resumed_from(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any
) -> None:
    every, steps, run_id, slow = 5, 30, "ms-acct", 15
    # No notice: the loss is seen in the API, so nothing holds the bookkeeping back but the kept workers.
    job = job_spec(ckpt_bucket, "v4-8", steps=steps, checkpoint_every=every, term_grace=15,
                   preemption_notice=False,
                   hyperparameters={"step_delay_s": 0.1, "slow_commit_step": slow, "commit_delay_s": 8.0})  # fmt: skip
    job = job.model_copy(update={"provision": job.provision.model_copy(
        update={"slice": job.provision.slice.model_copy(update={"slices": 2})})})  # fmt: skip
    run = Run(job, run_id, train_settings)
    key = f"runs/{run_id}/{slow}/meta.json"  # written by process 0 (slice 0) just before its slow commit
    wait_for(lambda: gcs.bucket(ckpt_bucket).blob(key).exists(), timeout=180, what=f"step {slow}'s commit begun")
    stack.preempt(ZONE, wait_for(lambda: live_node(train_settings, f"{run_id}-a1-1")))  # slice 1, mid-commit
    report = run.result(timeout=240)  # assert_sound: a done run kept every step

    assert report.outcome == "done" and report.final_step == steps and len(report.preemptions) == 1
    p = report.preemptions[0]
    assert p.queued_resource == f"{run_id}-a1-1" and p.resume_step == slow  # the slow commit landed
    first, second = report.incarnations
    assert (first.resume_step, first.kept_until) == (None, slow)  # kept_until: the step the next one resumed from
    assert (second.resume_step, second.kept_until) == (slow, steps)
    kept = sorted({int(r[1]) for r in first.timeline if r[0] == "step" and int(r[1]) <= slow})
    assert kept == list(range(1, slow + 1))  # the kept slice's records up to its exit, none missing
    # its last record, written after the slow commit, past the lost slice's end: its exit heartbeat was read
    assert ["save", slow] in [r[:2] for r in first.timeline], first.timeline[-3:]
    assert report.steps_kept == steps
