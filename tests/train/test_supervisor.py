"""The supervisor end to end on the emulated clouds: preemption, multi-host, failures, hangs."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest
from train_helpers import Run, blob_exists, job_spec, live_node, params_bytes, run_reference_locally, wait_for

from tpu_ops.audit.events import AuditEvent
from tpu_ops.errors import TrainingError
from tpu_ops.specs import TrainJobSpec
from tpu_ops.train.checkpoints import latest_complete_step
from tpu_ops.train.reference import step_work
from tpu_ops.train.wheel import agent_wheel

pytestmark = pytest.mark.usefixtures("nothing_left")


def test_two_preemptions_one_mid_checkpoint_resume_bit_identical(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any
) -> None:
    every, steps = 5, 30
    job = job_spec(ckpt_bucket, steps=steps, checkpoint_every=every,
                   hyperparameters={"slow_commit_step": 20, "commit_delay_s": 3.0})  # fmt: skip
    run_uri = f"gs://{ckpt_bucket}/runs/pre-2"
    run = Run(job, "pre-2", train_settings, wheel=agent_wheel(train_settings))
    # 1: once a step is committed (and long before step 20's slow commit)
    wait_for(lambda: (latest_complete_step(gcs, run_uri) or 0) >= every, what="a first committed step")
    stack.preempt("us-central2-b", wait_for(lambda: live_node(train_settings, "pre-2")))
    # 2: while step 20 is half written: its parts exist, its commit marker does not
    wait_for(lambda: blob_exists(gcs, ckpt_bucket, "runs/pre-2/20/params/part-00000.npy"), what="step 20's parts")
    assert not blob_exists(gcs, ckpt_bucket, "runs/pre-2/20/commit_success.txt")
    stack.preempt("us-central2-b", wait_for(lambda: live_node(train_settings, "pre-2")))
    report = run.result()

    assert report.outcome == "done" and report.final_step == steps
    # the agents' SIGTERM notice usually beats the API to the supervisor; on a loaded machine the API may be
    # seen first (the second preemption lands mid-checkpoint): the request SUSPENDED, or, when the preemption
    # falls between the supervisor's two reads (the request, then its node), the node PREEMPTED. Each is a
    # detection; a stall or "workers terminated" would mean the notice was missed.
    seen = {"preemption notice (SIGTERM) from worker 0", "queued resource SUSPENDED", "node PREEMPTED"}
    reasons = [p.reason for p in report.preemptions]
    assert len(reasons) == 2 and set(reasons) <= seen, reasons
    first, second = report.preemptions
    # the first notice let the trainer save the step in hand (not only a multiple of checkpoint_every)
    assert first.resume_step is not None and first.resume_step < 20 and first.steps_lost == 0
    assert second.resume_step == 15  # the newest complete step, never the partial 20
    assert [i.resume_step for i in report.incarnations] == [None, first.resume_step, 15]
    for p in report.preemptions:
        assert p.steps_lost is not None and 0 <= p.steps_lost <= every
        assert p.restore_s is not None and p.delete_s >= 0 and p.reprovision_s > 0
    recovery_events = [n for n, _ in run.events if n in (AuditEvent.SLICE_PREEMPTED, AuditEvent.SLICE_RECOVERED)]
    assert recovery_events == [AuditEvent.SLICE_PREEMPTED, AuditEvent.SLICE_RECOVERED] * 2
    # bit-identical to an uninterrupted run of the same trainer
    run_reference_locally(dict(os.environ, **stack.env()), f"gs://{ckpt_bucket}/baseline", steps, every, "{}")
    assert params_bytes(gcs, ckpt_bucket, f"runs/pre-2/{steps}") == params_bytes(gcs, ckpt_bucket, f"baseline/{steps}")
    doc = json.loads(gcs.bucket(ckpt_bucket).blob("runs/pre-2/_tpu_ops/goodput.json").download_as_bytes())
    assert doc["recoveries"] == 2 and doc["final_step"] == steps and doc["cost"]["chip_hours_by_phase"]["preempted"] > 0
    assert 0 < doc["goodput"] < 1 and doc["steps_kept"] == steps
    assert abs(doc["productive_s"] + sum(doc["badput_s"].values()) - doc["wall_s"]) <= 0.01 * doc["wall_s"]
    assert doc["badput_s"]["wasted_progress_from_disruption"] > 0  # the steps after the last commit, twice
    # the reference trainer's own figures (16 features, batch 64), over the kept steps only: $/M tokens and MFU
    tokens, flops = step_work(16, 64)
    eff = doc["efficiency"]
    assert (eff["steps_kept"], eff["tokens"], eff["model_flops"]) == (steps, steps * tokens, steps * flops)
    assert eff["usd_per_million_tokens"] == pytest.approx(eff["usd"] / (steps * tokens / 1e6), rel=1e-4)
    assert eff["accelerator"] == job.provision.slice.accelerator_type and 0 < eff["effective_mfu"] < eff["mfu"] < 1
    assert "per million tokens, MFU" in report.summary()


def test_v4_32_four_agents_restore_the_same_step_and_only_worker_0_commits(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any
) -> None:
    every, steps = 5, 15
    job = job_spec(ckpt_bucket, "v4-32", steps=steps, checkpoint_every=every, heartbeat_interval=0.5)
    run_uri = f"gs://{ckpt_bucket}/runs/multi"
    run = Run(job, "multi", train_settings)
    wait_for(lambda: latest_complete_step(gcs, run_uri) is not None, what="a first committed step")
    stack.preempt("us-central2-b", wait_for(lambda: live_node(train_settings, "multi")))
    report = run.result()
    assert report.outcome == "done" and report.final_step == steps and len(report.preemptions) == 1
    resumed = report.preemptions[0].resume_step
    assert resumed is not None
    listing = gcs.list_blobs(ckpt_bucket, prefix="runs/multi/_tpu_ops/workers/")
    reports = [json.loads(b.download_as_bytes()) for b in listing]
    assert sorted(r["worker"] for r in reports) == [0, 1, 2, 3]
    assert {r["resume_step"] for r in reports} == {resumed} and {r["exit_code"] for r in reports} == {0}
    workers = stack.hosts.workers("us-central2-b", report.incarnations[-1].queued_resource)
    logs = {w.number: (w.workdir / "multi" / "trainer.log").read_text() for w in workers}
    assert all(f"restored step {resumed}" in text for text in logs.values())
    assert "committed step" in logs[0] and not any("committed step" in logs[w] for w in (1, 2, 3))
    parts = {b.name.rsplit("/", 1)[-1] for b in gcs.list_blobs(ckpt_bucket, prefix=f"runs/multi/{steps}/params/")}
    assert {f"part-0000{w}.npy" for w in range(4)} <= parts
    # a finished run trains nothing: no slice, no step
    ops = stack.state()["operations"]
    stored = gcs.bucket(ckpt_bucket).blob("runs/multi/_tpu_ops/goodput.json").download_as_bytes()
    again = Run(job, "multi", train_settings).result()
    assert again.to_json() == report.to_json() == json.loads(stored) and stack.state()["operations"] == ops
    assert gcs.bucket(ckpt_bucket).blob("runs/multi/_tpu_ops/goodput.json").download_as_bytes() == stored


def test_a_trainer_that_exits_1_fails_fast_with_its_log_tail(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any
) -> None:
    job = job_spec(ckpt_bucket, hyperparameters={"fail_at_step": 1})
    run = Run(job, "fails", train_settings)
    run.thread.join(60)
    assert isinstance(run.error, TrainingError), run.error
    assert "injected failure at step 1" in str(run.error) and run.error.worker == 0 and run.error.exit_code == 1
    report = json.loads(gcs.bucket(ckpt_bucket).blob("runs/fails/_tpu_ops/workers/worker-0.json").download_as_bytes())
    assert run.error_at is not None
    assert run.error_at - report["time"] <= 0.5 + 1.0  # one poll interval, plus the poll's own GCS calls
    goodput = json.loads(gcs.bucket(ckpt_bucket).blob("runs/fails/_tpu_ops/goodput.json").download_as_bytes())
    assert goodput["outcome"] == "failed" and goodput["recoveries"] == 0 and len(goodput["incarnations"]) == 1


def test_a_hung_trainer_is_detected_and_recovered(stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any) -> None:
    job = job_spec(ckpt_bucket, steps=12, checkpoint_every=2, stall_limit="8s", hyperparameters={"hang_at_step": 5})
    t0 = time.monotonic()
    report = Run(job, "hangs", train_settings).result()
    assert report.outcome == "done" and report.final_step == 12
    assert len(report.preemptions) == 1 and report.preemptions[0].reason.startswith("stalled")
    assert report.preemptions[0].resume_step == 4
    assert time.monotonic() - t0 < 60


def test_the_stock_outs_on_the_way_to_a_slice_are_kept_in_the_run_state(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any
) -> None:
    # Spot is stocked out in the only zone: the ladder moves on to on-demand, and the run's state
    # keeps the refusal, which the capacity history counts as that rung being full.
    stack.set_capacity({"us-central2-b": {"spot": 0, "on-demand": 64, "reservations": {}}})
    job = job_spec(ckpt_bucket, steps=4, checkpoint_every=2)
    report = Run(job, "stocked-out", train_settings, wheel=agent_wheel(train_settings)).result()
    assert report.outcome == "done" and [i.tier for i in report.incarnations] == ["on-demand"]
    state = json.loads(gcs.bucket(ckpt_bucket).blob("runs/stocked-out/_tpu_ops/state.json").download_as_bytes())
    assert [(s["zone"], s["tier"]) for s in state["stockouts"]] == [("us-central2-b", "spot")]


def test_a_stop_the_control_plane_shows_before_the_notice_still_lets_the_workers_save(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any
) -> None:
    """Compute Engine shows the spot VM STOPPING at once; its guest acts on the SIGTERM 2.5 s later. The
    supervisor sees STOPPING first; it waits for the notice and the workers' save before deleting the VM, so
    the step in hand is kept. Deleting at once killed the guest before its SIGTERM: nothing was saved."""
    zone = "us-east5-a"
    doc = json.loads(job_spec(ckpt_bucket, steps=60, checkpoint_every=40, term_grace="10s",
                              hyperparameters={"step_delay_s": 0.1}).model_dump_json())  # fmt: skip
    doc["provision"] = {
        "slice": {"accelerator_type": "v5p-8", "backend": "compute", "region": "us-east5", "zones": [zone]},
        "ladder": ["spot"], "budget_usd": 1000, "hours": 1, "queue_timeout": "10s", "overall_timeout": "60s",
    }  # fmt: skip
    job = TrainJobSpec.model_validate(doc)
    stack.set_compute_capacity({zone: {"SPOT": 64}})

    def step() -> int:
        beat = gcs.bucket(ckpt_bucket).get_blob("runs/lag/_tpu_ops/heartbeats/worker-0.json")
        return int((json.loads(beat.download_as_bytes()) if beat is not None else {}).get("step") or 0)

    stack.compute_hosts.notice_lag_s = 2.5
    try:
        run = Run(job, "lag", train_settings)
        wait_for(lambda: run.error or step() >= 5, what="step 5 (the first commit is step 40)")
        assert run.error is None, run.error
        stack.preempt_instance(zone, "lag-a1")
        report = run.result()
    finally:
        stack.compute_hosts.notice_lag_s = 0.0
    assert report.outcome == "done" and report.final_step == 60
    (p,) = report.preemptions
    assert "notice" not in p.reason, p.reason  # the control plane was seen first
    assert p.resume_step is not None and p.resume_step >= 5 and p.steps_lost == 0, p
    assert p.last_step == p.resume_step and report.incarnations[1].resume_step == p.resume_step
