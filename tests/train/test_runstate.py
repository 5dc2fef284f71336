"""Runs that survive the supervisor's own ``kill -9``, from the outside: ``tpu-ops train --no-flow`` as a
process on the local stack, killed and run again. The report is derived from the run's state in GCS."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from train_helpers import Cli, blob_exists, kill9, live_node, params_bytes, run_reference_locally, wait_for

from tpu_ops.provision import ledger as L
from tpu_ops.train.checkpoints import latest_complete_step

pytestmark = [pytest.mark.usefixtures("nothing_left"), pytest.mark.slow]


def goodput_doc(gcs: Any, bucket: str, run_id: str) -> tuple[dict[str, Any], bytes]:
    raw = gcs.bucket(bucket).blob(f"runs/{run_id}/_tpu_ops/goodput.json").download_as_bytes()
    return json.loads(raw), raw


def assert_sound(doc: dict[str, Any]) -> None:
    """The invariants every report holds: goodput ≤ 100%, the categories add up, every kept step counted."""
    assert 0 < doc["goodput"] <= 1.0, doc
    assert doc["productive_s"] <= doc["wall_s"]
    total = doc["productive_s"] + sum(doc["badput_s"].values())
    assert abs(total - doc["wall_s"]) <= 0.01 * doc["wall_s"], (total, doc["wall_s"])
    assert doc["steps_kept"] == doc["final_step"] == doc["steps"], doc


def slices_created(settings: Any, run_id: str) -> list[str]:
    """Every slice the ledger saw become ACTIVE for the run."""
    return [e["resource_id"] for e in L.Ledger(settings, run_id).events() if e["kind"] == L.ACTIVE]


def test_kill9_rerun_adopts_the_live_slice_a_second_supervisor_is_refused_a_finished_run_stays_put(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any, tmp_path: Path
) -> None:
    steps, every = 100, 10
    cli = Cli(stack, train_settings, tmp_path, ckpt_bucket, "adopt", steps=steps, checkpoint_every=every,
              hyperparameters={"step_delay_s": 0.1, "slow_commit_step": 10, "commit_delay_s": 1.0})  # fmt: skip
    run_uri = f"gs://{ckpt_bucket}/runs/adopt"

    def lease_pid() -> int | None:  # a new Blob each time: a downloaded one pins the generation it read
        blob = gcs.bucket(ckpt_bucket).get_blob("runs/adopt/_tpu_ops/lease.json")
        return None if blob is None else int(json.loads(blob.download_as_bytes())["pid"])

    first = cli.start()
    wait_for(lambda: (latest_complete_step(gcs, run_uri) or 0) >= every, 90, what="a first committed step")
    kill9(first)
    assert live_node(train_settings, "adopt") is not None  # the slice trains on without its supervisor
    second = cli.start()  # takes the lease over at once: its holder's process is gone
    wait_for(lambda: lease_pid() == second.pid, 60, what="the second supervisor holding the lease")
    # a third supervisor of the same run, while the second runs: refused, naming the holder
    rc, _, err = cli.finish(cli.start())
    assert rc == 1 and "another supervisor holds this run" in err and f"pid {second.pid}" in err, err
    rc, out, err = cli.finish(second)
    assert rc == 0, err
    doc, raw = goodput_doc(gcs, ckpt_bucket, "adopt")
    assert json.loads(out)["goodput"] == doc["goodput"]
    assert doc["outcome"] == "done" and doc["recoveries"] == 0 and len(doc["incarnations"]) == 1
    assert slices_created(train_settings, "adopt") == [doc["incarnations"][0]["queued_resource"]]
    assert_sound(doc)
    run_reference_locally(dict(os.environ, **stack.env()), f"gs://{ckpt_bucket}/baseline", steps, every, "{}")
    assert params_bytes(gcs, ckpt_bucket, f"runs/adopt/{steps}") == params_bytes(gcs, ckpt_bucket, f"baseline/{steps}")
    # a finished run: trains nothing, leaves its report byte-identical
    ops = stack.state()["operations"]
    rc, out, err = cli.finish(cli.start())
    assert rc == 0, err
    assert goodput_doc(gcs, ckpt_bucket, "adopt")[1] == raw and json.loads(out) == doc
    assert stack.state()["operations"] == ops


def test_preempted_while_unsupervised_is_replaced_and_reported_then_a_crash_adopts_the_recovered_slice(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any, tmp_path: Path
) -> None:
    steps, every = 60, 10
    cli = Cli(stack, train_settings, tmp_path, ckpt_bucket, "unsup", steps=steps, checkpoint_every=every,
              hyperparameters={"step_delay_s": 0.1})  # fmt: skip
    run_uri = f"gs://{ckpt_bucket}/runs/unsup"
    first = cli.start()
    wait_for(lambda: (latest_complete_step(gcs, run_uri) or 0) >= every, 90, what="a first committed step")
    kill9(first)
    node = live_node(train_settings, "unsup")
    assert node is not None
    stack.preempt("us-central2-b", node)  # nobody watches: the workers' exit reports say "terminated"
    wait_for(lambda: blob_exists(gcs, ckpt_bucket, "runs/unsup/_tpu_ops/workers/worker-0.json"), what="exit report")
    second = cli.start()
    # the replacement slice trains past its resume step; then this supervisor dies too
    wait_for(lambda: len(slices_created(train_settings, "unsup")) == 2, 90, what="a second slice")
    resumed = latest_complete_step(gcs, run_uri) or 0
    wait_for(lambda: (latest_complete_step(gcs, run_uri) or 0) > resumed, 90, what="a step on the new slice")
    kill9(second)
    rc, _, err = cli.finish(cli.start())
    assert rc == 0, err
    doc, _ = goodput_doc(gcs, ckpt_bucket, "unsup")
    assert doc["outcome"] == "done" and doc["recoveries"] == 1, doc
    (p,) = doc["preemptions"]
    assert p["unsupervised"] is True and p["queued_resource"] == slices_created(train_settings, "unsup")[0]
    # the first slice's trainer saved on SIGTERM (the step in hand, not only a multiple of every): resumed from it
    assert p["resume_step"] is not None and every <= p["resume_step"] <= (p["last_step"] or 0)
    # the recovered slice was adopted: no third one, and the terminated reports of the first were ignored
    assert len(slices_created(train_settings, "unsup")) == 2 and len(doc["incarnations"]) == 2
    assert doc["badput_s"]["infrastructure_recovery_from_disruption"] > 0
    assert_sound(doc)


def test_a_run_that_finished_while_unsupervised_is_accounted_and_torn_down(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any, tmp_path: Path
) -> None:
    cli = Cli(stack, train_settings, tmp_path, ckpt_bucket, "alone", steps=30, checkpoint_every=10)
    first = cli.start()
    wait_for(lambda: latest_complete_step(gcs, f"gs://{ckpt_bucket}/runs/alone"), 90, what="a first committed step")
    kill9(first)
    wait_for(lambda: blob_exists(gcs, ckpt_bucket, "runs/alone/_tpu_ops/DONE"), 90, what="DONE")
    rc, _, err = cli.finish(cli.start())
    assert rc == 0, err
    doc, _ = goodput_doc(gcs, ckpt_bucket, "alone")
    assert doc["outcome"] == "done" and doc["recoveries"] == 0 and len(doc["incarnations"]) == 1
    assert slices_created(train_settings, "alone") == [doc["incarnations"][0]["queued_resource"]]
    assert_sound(doc)


def test_a_slice_lost_while_unsupervised_is_named_by_the_supervisor_that_takes_over(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any, tmp_path: Path
) -> None:
    """2 slices (one multislice request on the TPU API); slice 1 preempted while no supervisor runs: the
    next one observes every slice of the run state's allocation and records slice 1 lost, not slice 0."""
    steps, every = 40, 5
    cli = Cli(stack, train_settings, tmp_path, ckpt_bucket, "unsup-ms", steps=steps, checkpoint_every=every)
    doc = yaml.safe_load(cli.spec.read_text())
    # The successor keeps the request and waits for Google's repair (tests/train/test_takeover.py), 2 s here
    doc["provision"]["slice"].update(accelerator_type="v4-16", slices=2, keep_healthy_for="2s")
    cli.spec.write_text(yaml.safe_dump(doc))
    run_uri = f"gs://{ckpt_bucket}/runs/unsup-ms"
    stack.backend.set_latency(repair_s=600)  # Google's repair not begun while the successor looks
    try:
        first = cli.start()
        wait_for(lambda: (latest_complete_step(gcs, run_uri) or 0) >= every, 90, what="a first committed step")
        kill9(first)
        lost = wait_for(lambda: live_node(train_settings, "unsup-ms-a1-1"))
        stack.preempt("us-central2-b", lost)
        rc, _, err = cli.finish(cli.start(), timeout=240)
    finally:
        stack.backend.set_latency(repair_s=0.0)
    assert rc == 0, err
    state = json.loads(gcs.bucket(ckpt_bucket).blob("runs/unsup-ms/_tpu_ops/state.json").download_as_bytes())
    (p,) = state["preemptions"]
    assert p["unsupervised"] is True
    assert (p["queued_resource"], p["zone"], p["tier"]) == ("unsup-ms-a1-1", "us-central2-b", "spot")
    events = L.Ledger(train_settings, "unsup-ms").events()
    ladder = [(e["resource_id"], e["outcome"]) for e in events if e["kind"] == "attempt"]
    assert ladder == [("unsup-ms-a1", "active")] * 2  # no repair within 2 s: given back whole, a new request
