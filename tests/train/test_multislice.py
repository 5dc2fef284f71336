"""Multislice end to end on the emulated clouds: 2 slices of 2 hosts, one slice preempted.

On the Cloud TPU API the 2 slices are one multislice queued resource (nodes ``{run}-a1-0`` and ``-1``):
Google repairs the lost node (same name, new VMs) and restarts the other's VMs; the run waits for it."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from train_helpers import ZONE, Run, job_spec, live_node, params_bytes, run_reference_locally, wait_for

from tpu_ops.cloud.tpu import TpuApi
from tpu_ops.layout import RunLayout
from tpu_ops.provision.ledger import Ledger
from tpu_ops.train.checkpoints import latest_complete_step
from tpu_ops.train.logs import LogReader
from tpu_ops.train.wheel import agent_wheel

pytestmark = pytest.mark.usefixtures("nothing_left")


def test_two_slices_one_preempted_google_repairs_it_the_healthy_one_kept_resume_bit_identical(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any
) -> None:
    every, steps, run_id = 5, 30, "ms-2"
    job = job_spec(ckpt_bucket, "v4-16", steps=steps, checkpoint_every=every, term_grace=10)
    job = job.model_copy(update={"provision": job.provision.model_copy(
        update={"slice": job.provision.slice.model_copy(update={"slices": 2})})})  # fmt: skip
    run_uri = f"gs://{ckpt_bucket}/runs/{run_id}"
    run = Run(job, run_id, train_settings, wheel=agent_wheel(train_settings))
    wait_for(lambda: (latest_complete_step(gcs, run_uri) or 0) >= every, what="a first committed step")
    first = json.loads(gcs.bucket(ckpt_bucket).blob(f"runs/{run_id}/_tpu_ops/allocation.json").download_as_bytes())
    assert [s["id"] for s in first["slices"]] == [f"{run_id}-a1-0", f"{run_id}-a1-1"]  # one request's two nodes
    (qr,) = TpuApi(train_settings).list_queued_resources(ZONE)
    assert (qr.qr_id, qr.node_count) == (f"{run_id}-a1", 2)
    stack.preempt(ZONE, wait_for(lambda: live_node(train_settings, f"{run_id}-a1-1")))  # slice 1 only
    report = run.result(timeout=240)

    assert report.outcome == "done" and report.final_step == steps
    assert len(report.preemptions) == 1, report.preemptions
    p = report.preemptions[0]
    assert p.queued_resource == f"{run_id}-a1-1"  # the lost slice is named, not slice 0
    assert p.steps_lost == 0  # every worker of both slices saved the step in hand
    # the workers of the new allocation started from its document: 4 processes over 2 slices
    last = json.loads(gcs.bucket(ckpt_bucket).blob(f"runs/{run_id}/_tpu_ops/allocation.json").download_as_bytes())
    assert last["incarnation"] == report.incarnations[-1].id != first["incarnation"]
    assert [s["hosts"] for s in last["slices"]] == [2, 2]
    # the same request throughout: the healthy node kept (its VMs restarted by Google), the lost one repaired
    assert last["kept"] == [0, 1] and last["slices"][0]["endpoints"] == first["slices"][0]["endpoints"]
    assert last["slices"][1]["endpoints"] != first["slices"][1]["endpoints"]  # a new node of the same name
    assert report.incarnations[0].queued_resource == report.incarnations[1].queued_resource == f"{run_id}-a1-0"
    state = json.loads(gcs.bucket(ckpt_bucket).blob(f"runs/{run_id}/_tpu_ops/state.json").download_as_bytes())
    got = [[(s["index"], s["resource_id"], s["hosts"], s["kept"], s["repaired"]) for s in i["slices"]]
           for i in state["incarnations"]]  # fmt: skip
    n0, n1 = f"{run_id}-a1-0", f"{run_id}-a1-1"
    # the request kept: its healthy node kept, the lost one repaired by Google (a new node of the same name)
    assert got == [[(0, n0, 2, False, False), (1, n1, 2, False, False)],
                   [(0, n0, 2, True, False), (1, n1, 2, False, True)]]  # fmt: skip
    events = Ledger(train_settings, run_id).events()
    assert [e["kind"] for e in events if e.get("resource_id") == f"{run_id}-a1-0"].count("active") == 1
    assert [e["kind"] for e in events if e.get("resource_id") == f"{run_id}-a1-1"].count("active") == 2  # repaired
    gone = [e["resource_id"] for e in events if e["kind"] == "gone"]
    assert gone[0] == f"{run_id}-a1-1"  # the lost slice's bill closed first; the kept one only at the end
    ladder = [(e["resource_id"], e["outcome"]) for e in events if e["kind"] == "attempt"]
    assert ladder == [(f"{run_id}-a1", "active"), (f"{run_id}-a1", "adopted")]  # one request, never a second
    listing = gcs.list_blobs(ckpt_bucket, prefix=f"runs/{run_id}/_tpu_ops/workers/")
    reports = [json.loads(b.download_as_bytes()) for b in listing]
    final = [r for r in reports if r["incarnation"] == last["incarnation"]]
    assert sorted((r["slice"], r["worker"]) for r in final) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {r["exit_code"] for r in final} == {0}
    parts = {b.name.rsplit("/", 1)[-1] for b in gcs.list_blobs(ckpt_bucket, prefix=f"runs/{run_id}/{steps}/params/")}
    assert {f"part-0000{w}.npy" for w in range(4)} <= parts  # one part per process of the 2 x 2
    # bit-identical to an uninterrupted run of the same trainer
    run_reference_locally(dict(os.environ, **stack.env()), f"gs://{ckpt_bucket}/baseline", steps, every, "{}")
    assert params_bytes(gcs, ckpt_bucket, f"runs/{run_id}/{steps}") == params_bytes(
        gcs, ckpt_bucket, f"baseline/{steps}"
    )
    doc = json.loads(gcs.bucket(ckpt_bucket).blob(f"runs/{run_id}/_tpu_ops/goodput.json").download_as_bytes())
    per_slice = {s["resource_id"] for s in doc["cost"]["slices"]}
    assert {f"{run_id}-a1-0", f"{run_id}-a1-1"} <= per_slice  # chip-hours accounted per slice (per node)
    # `tpu-ops logs`: every host of both slices, each labelled with its slice and worker, both incarnations
    lines = LogReader(gcs, RunLayout.of(f"gs://{ckpt_bucket}/runs", run_id), slices=2).read(final=True)
    assert {ln.split("]")[0] + "]" for ln in lines if ln.startswith("[")} == {
        "[s0 w0]",
        "[s0 w1]",
        "[s1 w0]",
        "[s1 w1]",
    }, lines[:20]
    assert "-- slice incarnation 1 --" in lines
