"""A supervisor killed (``kill -9``) while a 2-slice Compute Engine allocation trains; slice 1 preempted while
none runs; the next supervisor takes over. With ``keep_healthy_for`` it keeps slice 0 (the same instance, warm)
and replaces slice 1 alone, as a live supervisor does; with ``keep_healthy_for: 0`` it gives everything back.
Both are run and their time from the new supervisor's start to training again printed (each VM takes
``CREATE_S`` to come up in the fake, so the whole re-gather's second VM shows). A third test: the TPU API;
a fourth: a supervisor killed mid-recovery (the lost slice deleted, its replacement not yet gathered).

The real supervisor (``tpu-ops train --no-flow``) and agents, the fake Compute Engine over HTTP."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from train_helpers import ZONE as TPU_ZONE
from train_helpers import Cli, assert_sound, kill9, live_node, wait_for

from flows.commands.status import detail
from tpu_ops.provision import ledger as L
from tpu_ops.train.checkpoints import latest_complete_step
from tpu_ops.train.launches import PROCESS, LaunchRecord
from tpu_ops.train.status import run_status

pytestmark = [pytest.mark.usefixtures("nothing_left"), pytest.mark.slow]
ZONE = "us-east5-a"
STEPS, EVERY = 60, 5
CREATE_S = 3.0  # a VM's time from insert to RUNNING in the fake (Google: minutes for a TPU VM)
FIGURES: dict[str, str] = {}  # per case: seconds from the new supervisor's start to its first step, and where


def _state(gcs: Any, bucket: str, run_id: str) -> dict[str, Any]:
    blob = gcs.bucket(bucket).get_blob(f"runs/{run_id}/_tpu_ops/state.json")
    return {} if blob is None else dict(json.loads(blob.download_as_bytes()))


def _instance(stack: Any, name: str) -> dict[str, Any] | None:
    listing = stack.compute_backend.list_instances(stack.project, ZONE).get("items") or []
    return next((i for i in listing if i["name"] == name), None)


def _take_over(stack: Any, gcs: Any, bucket: str, settings: Any, tmp_path: Path, run_id: str, keep: str) -> Any:
    """Train 2 x v5p-8 (one host each) on spot; kill -9 the supervisor after a first commit; preempt slice 1;
    start a new supervisor. Returns the run state, both slices' instances before and while training again,
    ``tpu-ops status RUN`` meanwhile, and the step committed when slice 1 went."""
    stack.set_compute_capacity({ZONE: {"SPOT": 64}})
    default = stack.compute_backend.set_latency()["provision_s"]
    stack.compute_backend.set_latency(provision_s=CREATE_S)
    try:
        return _train_kill_preempt_take_over(stack, gcs, bucket, settings, tmp_path, run_id, keep)
    finally:
        stack.compute_backend.set_latency(provision_s=default)


def _train_kill_preempt_take_over(
    stack: Any, gcs: Any, bucket: str, settings: Any, tmp_path: Path, run_id: str, keep: str
) -> Any:
    cli = Cli(stack, settings, tmp_path, bucket, run_id, steps=STEPS, checkpoint_every=EVERY,
              hyperparameters={"step_delay_s": 0.3})  # fmt: skip
    doc = yaml.safe_load(cli.spec.read_text())
    doc["provision"] = {
        "slice": {"accelerator_type": "v5p-8", "backend": "compute", "region": "us-east5", "zones": [ZONE],
                  "slices": 2, "keep_healthy_for": keep},
        "ladder": ["spot"], "budget_usd": 1000, "hours": 1, "queue_timeout": "30s", "overall_timeout": "90s",
    }  # fmt: skip
    cli.spec.write_text(yaml.safe_dump(doc))
    first = cli.start()
    run_uri = f"gs://{bucket}/runs/{run_id}"
    wait_for(lambda: (latest_complete_step(gcs, run_uri) or 0) >= EVERY, 120, what="a first committed step")
    kill9(first)
    before = [_instance(stack, f"{run_id}-a{n}") for n in (1, 1001)]  # slices 0 and 1
    assert all(i is not None and i["status"] == "RUNNING" for i in before), before
    stack.preempt_instance(ZONE, f"{run_id}-a1001")  # slice 1 only, while no supervisor runs
    committed = latest_complete_step(gcs, run_uri)
    started = time.time()
    second = cli.start()

    def training_again() -> dict[str, Any] | None:
        incs = _state(gcs, bucket, run_id).get("incarnations") or []
        return incs[1] if len(incs) > 1 and incs[1].get("first_step_at") else None

    again = wait_for(training_again, 180, what="the next incarnation's first step", interval=0.1)
    during = [_instance(stack, f"{run_id}-a{n}") for n in (1, 1001)]
    record = LaunchRecord(run_id, "train-job", PROCESS, checkpoint_dir=f"gs://{bucket}/runs", zones=[ZONE],
                          hosts=2, accelerator="v5p-8", slices=2, heartbeat_s=10)  # fmt: skip
    status = detail(run_status(settings, record, gcs))  # what `tpu-ops status RUN` shows meanwhile
    rc, _, err = cli.finish(second, timeout=240)
    assert rc == 0, err
    state = _state(gcs, bucket, run_id)
    p = state["preemptions"][0]
    FIGURES[keep] = (
        f"{float(again['first_step_at']) - started:.1f} s (loss seen {p['detected_at'] - started:.1f} s, "
        f"deleting {p['delete_s']:.1f} s, gathering {p['reprovision_s']:.1f} s, "
        f"ready to first step {again['first_step_at'] - again['ready_at']:.1f} s)"
    )
    return state, before, during, status, committed


def _bills(settings: Any, run_id: str) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """The ledger, and each slice's opens and closes in order: each open closed once, none left billing."""
    events = L.Ledger(settings, run_id).events()
    bills: dict[str, list[str]] = {}
    for e in events:
        if e["kind"] in (L.ACTIVE, L.GONE):
            bills.setdefault(e["resource_id"], []).append(e["kind"])
    for rid, kinds in bills.items():
        assert kinds == [L.ACTIVE, L.GONE] * (len(kinds) // 2) and kinds, (rid, kinds)
    return events, bills


def _same(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """The same instance: its id and creation time (a new one of the same name has others)."""
    return a is not None and b is not None and (a["id"], a["creationTimestamp"]) == (b["id"], b["creationTimestamp"])


def _nothing_left(stack: Any) -> None:
    wait_for(lambda: stack.state()["compute"]["instances"] == 0 and not stack.state()["worker_pids"], 30,
             what="no instance and no worker left")  # fmt: skip


def test_a_supervisor_taking_over_keeps_the_healthy_slice_and_replaces_only_the_lost_one(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any, tmp_path: Path
) -> None:
    run_id = "takeover-keep"
    state, before, during, status, committed = _take_over(
        stack, gcs, ckpt_bucket, train_settings, tmp_path, run_id, "5m"
    )
    # slice 0 not recreated: the same instance (id, creation time) trains the next incarnation; slice 1 is new
    assert _same(before[0], during[0]) and during[1] is not None and not _same(before[1], during[1])
    (p,) = state["preemptions"]
    assert p["unsupervised"] is True and (p["queued_resource"], p["zone"], p["tier"]) == (
        f"{run_id}-a1001",
        ZONE,
        "spot",
    )
    _, inc1 = state["incarnations"]
    got = [(s["index"], s["resource_id"], s["kept"]) for s in inc1["slices"]]
    assert got == [(0, f"{run_id}-a1", True), (1, f"{run_id}-a1001", False)]  # slice 0 kept, slice 1 replaced
    assert state["outcome"] == "done" and state["final_step"] == STEPS
    # The steps lost are those slice 0 trained past the last commit while slice 1 was gone: with slice 1's
    # part missing they can never be committed (slice 1's own notice-driven save needs every process to agree).
    # (>=: slice 1 may have written its part of a step just before it went, committed just after this read)
    assert p["resume_step"] == inc1["resume_step"] >= committed
    assert p["steps_lost"] == p["last_step"] - p["resume_step"] <= EVERY
    events, bills = _bills(train_settings, run_id)
    assert bills == {f"{run_id}-a1": ["active", "gone"], f"{run_id}-a1001": ["active", "gone"] * 2}
    for rid, kinds in bills.items():  # each instance asked to be deleted once: none twice
        assert [e["kind"] for e in events if e.get("resource_id") == rid].count(L.DELETE_REQUESTED) == len(kinds) // 2
    gone = [e["resource_id"] for e in events if e["kind"] == L.GONE]
    assert gone[0] == f"{run_id}-a1001"  # the lost slice's bill closed first; the kept one's only at the end
    ladder = [(e["resource_id"], e["outcome"]) for e in events if e["kind"] == "attempt"]
    a1, a1001 = f"{run_id}-a1", f"{run_id}-a1001"
    assert ladder == [(a1, "active"), (a1001, "active"), (a1, "adopted"), (a1001, "active")], ladder
    assert f"slice 0 ({run_id}-a1): spot in {ZONE}, 1/1 hosts alive, kept from the incarnation before" in status
    assert f"incarnation 1 (live): slice 0 {run_id}-a1 (spot, 1 hosts, kept)" in status, status
    doc = json.loads(gcs.bucket(ckpt_bucket).blob(f"runs/{run_id}/_tpu_ops/goodput.json").download_as_bytes())
    assert_sound(doc)
    assert doc["steps_kept"] == STEPS and doc["preemptions"][0]["steps_lost"] == p["steps_lost"]
    _nothing_left(stack)
    print(f"\ntakeover, slice 0 kept: training again {FIGURES['5m']}; steps lost {p['steps_lost']}")


# The recovery figure's baseline only: keep 0 giving everything back is tested in test_keeper_takeover.py.
@pytest.mark.figures
def test_with_keep_healthy_for_0_the_supervisor_taking_over_gives_everything_back(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any, tmp_path: Path
) -> None:
    run_id = "takeover-drop"
    state, before, during, _, _ = _take_over(stack, gcs, ckpt_bucket, train_settings, tmp_path, run_id, "0s")
    assert not _same(before[0], during[0]) and not _same(before[1], during[1])  # a whole new allocation
    _, inc1 = state["incarnations"]
    assert [(s["index"], s["kept"]) for s in inc1["slices"]] == [(0, False), (1, False)]
    assert state["outcome"] == "done" and state["final_step"] == STEPS
    _, bills = _bills(train_settings, run_id)
    assert bills == {f"{run_id}-a1": ["active", "gone"] * 2, f"{run_id}-a1001": ["active", "gone"] * 2}
    _nothing_left(stack)
    print(f"\ntakeover, everything given back: training again {FIGURES['0s']}; "
          f"slice 0 kept: {FIGURES.get('5m', 'not run')}")  # fmt: skip


def test_on_the_tpu_api_the_supervisor_taking_over_keeps_the_request_and_waits_for_googles_repair(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any, tmp_path: Path
) -> None:
    """One multislice queued resource, node 1 preempted while no supervisor runs: the successor deletes
    nothing, waits for Google's new node (as a live supervisor does) and adopts the same request."""
    run_id = "takeover-tpu"
    cli = Cli(stack, train_settings, tmp_path, ckpt_bucket, run_id, steps=STEPS, checkpoint_every=EVERY,
              hyperparameters={"step_delay_s": 0.3})  # fmt: skip
    doc = yaml.safe_load(cli.spec.read_text())
    doc["provision"]["slice"].update(slices=2, keep_healthy_for="2m")  # 2 x v4-8, one host each
    cli.spec.write_text(yaml.safe_dump(doc))
    run_uri = f"gs://{ckpt_bucket}/runs/{run_id}"
    stack.backend.set_latency(repair_s=20)  # Google begins its repair after the successor has looked
    try:
        first = cli.start()
        wait_for(lambda: (latest_complete_step(gcs, run_uri) or 0) >= EVERY, 120, what="a first committed step")
        kill9(first)
        stack.preempt(TPU_ZONE, wait_for(lambda: live_node(train_settings, f"{run_id}-a1-1")))
        rc, _, err = cli.finish(cli.start(), timeout=240)
    finally:
        stack.backend.set_latency(repair_s=0.0)
    assert rc == 0, err
    state = _state(gcs, ckpt_bucket, run_id)
    (p,) = state["preemptions"]
    assert p["unsupervised"] is True and p["queued_resource"] == f"{run_id}-a1-1"
    got = [[(s["index"], s["resource_id"], s["kept"], s["repaired"]) for s in i["slices"]]
           for i in state["incarnations"]]  # fmt: skip
    n0, n1 = f"{run_id}-a1-0", f"{run_id}-a1-1"
    assert got == [[(0, n0, False, False), (1, n1, False, False)], [(0, n0, True, False), (1, n1, False, True)]]
    assert state["outcome"] == "done" and state["final_step"] == STEPS
    events = L.Ledger(train_settings, run_id).events()
    ladder = [(e["resource_id"], e["outcome"]) for e in events if e["kind"] == "attempt"]
    assert ladder == [(f"{run_id}-a1", "active"), (f"{run_id}-a1", "adopted")]  # one request throughout
    # Google replaced node 1 (its bill closed when lost, opened again when adopted); deleted only at the end
    kinds = [e["kind"] for e in events if e.get("resource_id") == n1]
    assert kinds == [L.ACTIVE, L.PREEMPTED, L.GONE, L.ACTIVE, L.DELETE_REQUESTED, L.GONE], kinds


DELETE_S = 6.0  # "deleting": the lost slice's VM takes that long to go, so the successor starts while it goes


def _deletes(stack: Any, name: str) -> int:
    """How many deletes of instance ``name`` Compute Engine was asked for (its operations)."""
    ops = stack.compute_backend.list_operations(stack.project, f"zones/{ZONE}").get("items") or []
    return sum(1 for o in ops if o["operationType"] == "delete" and o["targetLink"].endswith(f"/instances/{name}"))


@pytest.mark.parametrize(
    "kill_at",
    [
        "deleted",  # the lost slice deleted (its bill closed), its replacement not asked for
        pytest.param("deleting", marks=pytest.mark.figures),  # its delete asked, the VM still going
        "gathering",  # the next incarnation saved, with no slice yet: the replacement being created
    ],
)
def test_a_supervisor_killed_mid_recovery_is_succeeded_by_one_that_keeps_the_healthy_slice(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any, tmp_path: Path, kill_at: str
) -> None:
    """Slice 1 preempted while the supervisor runs; it is killed mid-recovery (its workers stopped, slice 0's
    waiting to be kept), at ``kill_at``. The successor finishes that recovery: slice 0 kept (its agent waits
    for an allocation listing it), slice 1 replaced, well before stall_limit; a delete under way is waited
    for, not asked again; the preemption gets its resume step (goodput, steps lost)."""
    run_id = f"takeover-mid-{kill_at}"
    cli = Cli(stack, train_settings, tmp_path, ckpt_bucket, run_id, steps=STEPS, checkpoint_every=EVERY,
              stall_limit="120s", hyperparameters={"step_delay_s": 0.3})  # fmt: skip
    doc = yaml.safe_load(cli.spec.read_text())
    doc["provision"] = {
        "slice": {"accelerator_type": "v5p-8", "backend": "compute", "region": "us-east5", "zones": [ZONE],
                  "slices": 2, "keep_healthy_for": "5m"},
        "ladder": ["spot"], "budget_usd": 1000, "hours": 1, "queue_timeout": "30s", "overall_timeout": "90s",
    }  # fmt: skip
    cli.spec.write_text(yaml.safe_dump(doc))
    stack.set_compute_capacity({ZONE: {"SPOT": 64}})
    default = stack.compute_backend.set_latency()
    stack.compute_backend.set_latency(provision_s=CREATE_S, delete_s=DELETE_S if kill_at == "deleting" else None)
    a1, a1001 = f"{run_id}-a1", f"{run_id}-a1001"
    ledger = L.Ledger(train_settings, run_id)
    try:
        first = cli.start()
        run_uri = f"gs://{ckpt_bucket}/runs/{run_id}"
        wait_for(lambda: (latest_complete_step(gcs, run_uri) or 0) >= EVERY, 120, what="a first committed step")
        before = _instance(stack, a1)
        stack.preempt_instance(ZONE, a1001)  # while the supervisor runs: it recovers, keeping slice 0

        def reached() -> bool:
            if kill_at == "deleting":  # Compute Engine asked (not only the ledger told), the VM not gone yet
                return _deletes(stack, a1001) > 0
            if kill_at == "deleted":  # the lost slice's bill closed: next it gathers the replacement
                return any(e["kind"] == L.GONE and e["resource_id"] == a1001 for e in ledger.events())
            incs = _state(gcs, ckpt_bucket, run_id).get("incarnations") or []
            return len(incs) > 1 and not incs[1].get("slices")

        wait_for(reached, 60, what=f"the kill point: {kill_at}", interval=0.01)
        kill9(first)
        going = _instance(stack, a1001)
        started = time.time()
        second = cli.start()

        def training_again() -> dict[str, Any] | None:  # slice 0 kept: its waiting agent trains on
            incs = _state(gcs, ckpt_bucket, run_id).get("incarnations") or []
            inc = incs[1] if len(incs) > 1 else {}
            kept = [s.get("kept") for s in inc.get("slices") or []]
            return inc if inc.get("first_step_at") and kept == [True, False] else None

        try:  # well below stall_limit (120 s), which would recover a slice 0 left without its agent
            again = wait_for(training_again, 40, what="the next incarnation training, slice 0 kept", interval=0.1)
        except AssertionError:
            kill9(second)
            raise
        during = _instance(stack, a1)
        rc, _, err = cli.finish(second, timeout=240)
    finally:
        stack.compute_backend.set_latency(provision_s=default["provision_s"], delete_s=default["delete_s"])
    assert rc == 0, err
    assert _same(before, during)  # slice 0 not recreated: the same instance trains on
    state = _state(gcs, ckpt_bucket, run_id)
    (p,) = state["preemptions"]
    _, inc1 = state["incarnations"]
    assert p["unsupervised"] is False and p["queued_resource"] == a1001
    # the resume step handed on (no stall, and the goodput's steps lost are known)
    assert p["resume_step"] is not None and p["resume_step"] == inc1["resume_step"], (p, inc1["resume_step"])
    assert p["steps_lost"] == p["last_step"] - p["resume_step"] <= EVERY
    got = [(s["index"], s["resource_id"], s["kept"]) for s in inc1["slices"]]
    assert got == [(0, a1, True), (1, a1001, False)]
    assert state["outcome"] == "done" and state["final_step"] == STEPS
    events, bills = _bills(train_settings, run_id)  # each bill opened and closed once: nothing billed twice
    assert bills == {a1: ["active", "gone"], a1001: ["active", "gone"] * 2}, bills
    asked = [e["kind"] for e in events if e.get("resource_id") == a1001].count(L.DELETE_REQUESTED)
    assert asked == 2  # once per instance (the lost one, its replacement at the end): none asked twice
    if kill_at == "deleting":
        assert going is not None and going["status"] == "STOPPING"  # the successor started while it went
        assert _deletes(stack, a1001) == 2  # Compute Engine too was asked once per instance
    doc = json.loads(gcs.bucket(ckpt_bucket).blob(f"runs/{run_id}/_tpu_ops/goodput.json").download_as_bytes())
    assert_sound(doc)
    assert doc["preemptions"][0]["steps_lost"] == p["steps_lost"]
    _nothing_left(stack)
    figure = float(again["first_step_at"]) - started
    print(f"\ntakeover mid-recovery, killed at {kill_at!r}, slice 0 kept: training again {figure:.1f} s after the "
          f"successor's start; steps lost {p['steps_lost']}")
