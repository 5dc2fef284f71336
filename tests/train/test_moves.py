"""A run moves, make-before-break, at a checkpoint (tpu_ops/train/moves.py, docs/moves.md): the real
supervisor on the fake Compute Engine over HTTP, the real agent on its VMs (the host simulator), the
capacity history and the run's records in fake-gcs-server.

The reservation's only VM is held by another instance when the run starts, so the ladder puts it on
spot; that instance is deleted while the run trains, and at its next committed checkpoint the run
ranks again, asks for the reservation alone, and hands over without losing a step."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from train_helpers import Run, job_spec, wait_for

from tpu_ops.provision import ledger as L
from tpu_ops.provision.rewalk import MOVE_EVENT
from tpu_ops.specs import TrainJobSpec
from tpu_ops.train.launches import PROCESS, LaunchRecord
from tpu_ops.train.status import run_status

pytestmark = pytest.mark.slow
ZONE = "us-east5-a"
RES = "team-res"
STEPS, EVERY = 80, 5
CLI = str(Path(sys.executable).with_name("tpu-ops"))


def _spec(bucket: str, move: bool = True, steps: int = STEPS, every: int = EVERY, **choose: Any) -> TrainJobSpec:
    doc = json.loads(job_spec(bucket, steps=steps, checkpoint_every=every,
                              hyperparameters={"step_delay_s": 0.25}).model_dump_json())  # fmt: skip
    doc["provision"] = {
        "slice": {"accelerator_type": "v5p-8", "backend": "compute", "region": "us-east5", "zones": [ZONE]},
        "ladder": [f"reservation:{RES}@{ZONE}", "spot", "on-demand"], "choose": {"move": move, **choose},
        "budget_usd": 1000, "hours": 1, "queue_timeout": "10s", "overall_timeout": "60s",
    }  # fmt: skip
    return TrainJobSpec.model_validate(doc)


def _seed_history(gcs: Any, bucket: str) -> None:
    """Past runs of the fleet: the reservation and on-demand never preempted, spot 5 times in 10 h; and
    a past ask for the reservation that gained little (the bar for its last free VM)."""
    from tpu_ops.provision import fleet, history
    from tpu_ops.uris import parse_gs

    b = gcs.bucket(bucket)
    for run, tier, preempted in (("old-res", "reservation", 0), ("old-spot", "spot", 5), ("old-od", "on-demand", 0)):
        state = {"incarnations": [{"zone": ZONE, "tier": tier, "requested_at": 0.0, "ready_at": 60.0,
                                   "ended_at": 60.0 + 36000}],
                 "preemptions": [{"zone": ZONE, "tier": tier, "detect_s": 5.0, "delete_s": 5.0, "restore_s": 50.0,
                                  "steps_lost": 100}] * preempted}  # fmt: skip
        b.blob(f"runs/{run}/_tpu_ops/state.json").upload_from_string(json.dumps(state))
        ident = {"accelerator_type": "v5p-8", "backend": "compute", "chips": 4}
        b.blob(f"runs/{run}/_tpu_ops/capacity.json").upload_from_string(json.dumps(ident))
    history.load(gcs, parse_gs(f"gs://{bucket}/runs"))  # the summary, built once
    history.note_ask(gcs, parse_gs(f"gs://{bucket}/runs"), "old-res", fleet.ask(1e-9, time.time() - 60))


@pytest.fixture
def fleet(stack: Any, gcs: Any, ckpt_bucket: str) -> Iterator[Any]:
    """The reservation (1 VM) in zone a, held by another instance; spot and on-demand plentiful."""
    from infra.local.compute.models import RESERVATION_KEY

    api = stack.compute_backend
    api.configure_capacity({ZONE: {"SPOT": 64, "STANDARD": 64, "reservations": {
        RES: {"count": 1, "machineType": "ct5p-hightpu-4t"}}}})  # fmt: skip
    body = {"name": "other-run", "machineType": f"zones/{ZONE}/machineTypes/ct5p-hightpu-4t",
            "scheduling": {"provisioningModel": "RESERVATION_BOUND", "onHostMaintenance": "TERMINATE"},
            "reservationAffinity": {"consumeReservationType": "SPECIFIC_RESERVATION", "key": RESERVATION_KEY,
                                    "values": [RES]}}  # fmt: skip
    api.insert_instance(stack.project, ZONE, body)
    wait_for(lambda: _in_use(stack) == 1, 15, what="the other instance holding the reservation")
    _seed_history(gcs, ckpt_bucket)
    try:
        yield api
    finally:
        with api._lock:  # an injected refusal left over must not reach another test
            api._op_faults.clear()


def _in_use(stack: Any) -> int:
    return int(stack.compute_backend.get_reservation(stack.project, ZONE, RES)["specificReservation"]["inUseCount"])


def _free_the_reservation(stack: Any) -> None:
    stack.compute_backend.delete_instance(stack.project, ZONE, "other-run")
    wait_for(lambda: _in_use(stack) == 0, 15, what="the reservation's VM handed back")


def _state(gcs: Any, bucket: str, run_id: str) -> dict[str, Any]:
    blob = gcs.bucket(bucket).get_blob(f"runs/{run_id}/_tpu_ops/state.json")
    return {} if blob is None else dict(json.loads(blob.download_as_bytes()))


def _training_on_spot(gcs: Any, bucket: str, run_id: str) -> bool:
    incs = _state(gcs, bucket, run_id).get("incarnations") or []
    return bool(incs) and incs[0].get("tier") == "spot" and (incs[0].get("last_step") or 0) >= 1


def _nothing_left(stack: Any, run_id: str) -> None:
    def clean() -> bool:
        s = stack.state()
        return s["compute"]["instances"] == 0 and not s["worker_pids"]

    wait_for(clean, 30, what="no instance and no worker left")


def _kill9_once_granted(proc: subprocess.Popen[bytes], stack: Any, gcs: Any, bucket: str, run_id: str) -> None:
    """Once ``run_id`` trains on spot, free the reservation; ``kill -9`` the supervisor once its move's target is
    granted (the move ``asked``: two slices of the run, the old one training)."""
    try:
        wait_for(lambda: _training_on_spot(gcs, bucket, run_id), 120, what="the run training on spot")
        _free_the_reservation(stack)
        wait_for(lambda: any(m.get("granted_at") for m in _state(gcs, bucket, run_id).get("moves") or []), 120,
                 what="the target granted", interval=0.05)  # fmt: skip
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)


Named = tuple[TrainJobSpec, str]  # a run's spec and id


def _side_by_side(
    stack: Any, gcs: Any, bucket: str, settings: Any, moving: Named, staying: Named
) -> tuple[Run, dict[str, Any]]:
    """Both runs on spot (the second started after the first trains: the agent wheel is built), then the
    reservation freed; ``staying`` ends where it began, with no move. The moving run and its report."""
    run = Run(moving[0], moving[1], settings)
    wait_for(lambda: run.error or _training_on_spot(gcs, bucket, moving[1]), 120, what=f"{moving[1]} on spot")
    other = Run(staying[0], staying[1], settings)
    wait_for(lambda: other.error or _training_on_spot(gcs, bucket, staying[1]), 120, what=f"{staying[1]} on spot")
    assert run.error is None and other.error is None, (run.error, other.error)
    _free_the_reservation(stack)
    report = run.result(timeout=240).to_json()
    other.result(timeout=240)
    state = _state(gcs, bucket, staying[1])
    assert [(i["tier"], i["end"]) for i in state["incarnations"]] == [("spot", "done")] and state["moves"] == []
    return run, report


def _no_step_lost(state: dict[str, Any], steps: int = STEPS) -> None:
    """Each incarnation resumed from the step the one before reached: nothing was done twice."""
    incs = state["incarnations"]
    for before, after in itertools.pairwise(incs):
        assert after["resume_step"] == before["last_step"] == before["kept_until"], (before, after)
    assert state["preemptions"] == [] and state["final_step"] == steps


def test_a_run_on_spot_moves_to_the_freed_reservation_at_a_checkpoint_one_with_move_false_stays(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any, fleet: Any
) -> None:
    """Two runs side by side (one stack, one wait): ``mover`` moves; ``settled`` (``choose.move: false``) stays."""
    run, report = _side_by_side(stack, gcs, ckpt_bucket, train_settings, (_spec(ckpt_bucket), "mover"),
                                (_spec(ckpt_bucket, move=False), "settled"))  # fmt: skip
    assert not [e for e in L.Ledger(train_settings, "settled").events() if e["kind"] == MOVE_EVENT]
    state = _state(gcs, ckpt_bucket, "mover")
    incs = state["incarnations"]
    assert [(i["tier"], i["end"]) for i in incs] == [("spot", "moved"), ("reservation", "done")]
    _no_step_lost(state)
    (mv,) = state["moves"]
    assert mv["phase"] == "moved" and mv["to_tier"] == "reservation" and mv["from_tier"] == "spot"
    assert 0 < mv["checkpoint"] <= mv["resume_step"] < STEPS and "reservation" in mv["why"]
    assert report["outcome"] == "done" and report["steps_kept"] == STEPS and report["recoveries"] == 0
    assert report["moves"][0]["overlap_s"] > 0  # both slices were held while the new one came up
    # The ledger: spot obtained, then the reservation beside it, then spot deleted before the new trainer ran.
    ev = L.Ledger(train_settings, "mover").events()
    active = [e for e in ev if e["kind"] == L.ACTIVE]
    assert [e["tier"] for e in active] == ["spot", "reservation"]
    spot_gone = next(e["t"] for e in ev if e["kind"] == L.GONE and e["resource_id"] == active[0]["resource_id"])
    assert active[1]["t"] < spot_gone < incs[1]["first_step_at"]
    (plan,) = [e["plan"] for e in ev if e["kind"] == MOVE_EVENT]
    assert plan["move"]["why"] == mv["why"] and plan["move"]["to"] == 1
    # A move is not a preemption: the capacity history counts none for spot.
    from tpu_ops.provision.history import fold_run

    folded = fold_run(state, {"accelerator_type": "v5p-8", "backend": "compute"})
    assert sum(h.preemptions for h in folded.values()) == 0
    assert any(n == "slice.moved" for n, _ in run.events)
    _nothing_left(stack, "mover")


def test_between_checkpoints_a_run_ranks_every_move_every_and_moves_with_the_step_in_hand(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any, fleet: Any
) -> None:
    """No checkpoint before the end (``checkpoint_every`` = ``steps``): ``ranker`` (``move_every: 2s``) moves to the
    freed reservation at the step in hand, which the old workers save on the stop marker; ``waiter``
    (``move_every: null``) ranks at checkpoints only, so it stays on spot to the end."""
    steps = 160
    _, report = _side_by_side(stack, gcs, ckpt_bucket, train_settings,
                              (_spec(ckpt_bucket, steps=steps, every=steps, move_every="2s"), "ranker"),
                              (_spec(ckpt_bucket, steps=steps, every=steps, move_every=None), "waiter"))  # fmt: skip
    state = _state(gcs, ckpt_bucket, "ranker")
    assert [(i["tier"], i["end"]) for i in state["incarnations"]] == [("spot", "moved"), ("reservation", "done")]
    _no_step_lost(state, steps)
    (mv,) = state["moves"]
    assert mv["phase"] == "moved" and 0 < mv["checkpoint"] <= mv["resume_step"] < steps  # ranked mid-interval
    assert report["steps_kept"] == steps and report["recoveries"] == 0
    # Each ranking keeps the run's ask in the capacity summary, as a walk does: the ranker's is from a ranking
    # while it trained, the waiter's (no ranking between its walk and its end) from its walk.
    blob = gcs.bucket(ckpt_bucket).blob("runs/_tpu_ops/capacity-summary.json")
    asks = {r: e["ask"]["at"] for r, e in json.loads(blob.download_as_bytes())["runs"].items() if "ask" in e}
    assert asks["ranker"] > state["incarnations"][0]["first_step_at"]
    waiter = _state(gcs, ckpt_bucket, "waiter")["incarnations"][0]
    assert asks["waiter"] < waiter["first_step_at"]
    _nothing_left(stack, "ranker")


def test_a_refused_target_leaves_the_run_where_it_is(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any, fleet: Any
) -> None:
    run = Run(_spec(ckpt_bucket), "stayer", train_settings)
    wait_for(lambda: _training_on_spot(gcs, ckpt_bucket, "stayer"), 120, what="the run training on spot")
    # From here every instance insert is refused for capacity, as when another run takes the VM first.
    fleet.fail_operations("instances", "insert", "ZONE_RESOURCE_POOL_EXHAUSTED", count=1000)
    _free_the_reservation(stack)
    report = run.result(timeout=240).to_json()
    state = _state(gcs, ckpt_bucket, "stayer")
    assert [(i["tier"], i["end"]) for i in state["incarnations"]] == [("spot", "done")]
    _no_step_lost(state)
    assert state["moves"] and all(m["phase"] == "refused" for m in state["moves"])
    assert report["steps_kept"] == STEPS and "moves" in report
    refused = [e for e in L.Ledger(train_settings, "stayer").events() if e["kind"] == L.ATTEMPT
               and e["tier"] == "reservation"]  # fmt: skip
    assert refused and all(e["outcome"] == "stockout" for e in refused)
    assert any(s["tier"] == "reservation" for s in state["stockouts"])  # published as the ladder's refusals
    _nothing_left(stack, "stayer")


def test_kill9_mid_handover_a_resumed_supervisor_leaves_one_slice_training(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any, fleet: Any, tmp_path: Path
) -> None:
    """``tpu-ops train --no-flow`` killed twice: once with the target granted (a successor deletes it and the
    old slice trains on), once after the old workers were told to stop (a successor finishes the handover)."""
    spec = tmp_path / "spec.yaml"
    doc = json.loads(_spec(ckpt_bucket, steps=120).model_dump_json())
    doc["train"]["heartbeat_interval"] = 1.5  # the old workers see the stop marker up to 1.5 s later
    spec.write_text(yaml.safe_dump(doc))
    env = {**os.environ, **stack.env(), "TPU_OPS_STATE_DIR": str(train_settings.state_dir),
           "TPU_OPS_POLL_INTERVAL_S": "0.1"}  # fmt: skip
    argv = [CLI, "train", "--spec", str(spec), "--run-id", "crash", "--no-flow", "--json"]
    record = LaunchRecord("crash", "train-job", PROCESS, checkpoint_dir=f"gs://{ckpt_bucket}/runs", zones=[ZONE])

    def start(n: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / f"{n}.err").open("wb"))

    def moves() -> list[dict[str, Any]]:
        return list(_state(gcs, ckpt_bucket, "crash").get("moves") or [])

    def stop_marker() -> bool:
        return any(gcs.list_blobs(ckpt_bucket, prefix="runs/crash/_tpu_ops/stop/", max_results=1))

    _kill9_once_granted(start(1), stack, gcs, ckpt_bucket, "crash")
    assert [m["phase"] for m in moves()] == ["asked"]  # two slices of the run, the old one training
    status = run_status(train_settings, record, gcs)  # what `tpu-ops status crash` shows meanwhile
    assert status.state == "moving" and [m["phase"] for m in status.moves] == ["asked"]
    second = start(2)
    try:
        wait_for(stop_marker, 120, what="the old workers told to stop", interval=0.02)
    finally:
        second.send_signal(signal.SIGKILL)
        second.wait(10)
    assert [m["phase"] for m in moves()] == ["abandoned", "stopping"]
    third = subprocess.run(argv, env=env, capture_output=True, timeout=300)
    assert third.returncode == 0, third.stderr.decode()[-3000:]
    state = _state(gcs, ckpt_bucket, "crash")
    _no_step_lost(state, steps=120)
    assert [m["phase"] for m in state["moves"]] == ["abandoned", "moved"]
    assert "supervisor stopped" in state["moves"][0]["detail"]
    assert [(i["tier"], i["end"]) for i in state["incarnations"]] == [("spot", "moved"), ("reservation", "done")]
    last = run_status(train_settings, record, gcs).moves[-1]
    assert (last["phase"], last["from"], last["to"]) == ("moved", f"spot in {ZONE}", f"reservation in {ZONE}")
    _nothing_left(stack, "crash")


def test_kill9_mid_move_and_no_successor_the_reaper_deletes_both_slices(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any, fleet: Any, tmp_path: Path
) -> None:
    """``tpu-ops train --no-flow`` killed with the move ``asked`` (the target granted, its agents standing by, the
    old slice training), and nobody takes over: both slices carry the run's labels, the ledger's owner is
    dead, so the reaper (no judge, no TTL: a dead owner is enough) deletes both."""
    from tpu_ops.provision.reaper import reap

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(json.loads(_spec(ckpt_bucket, steps=120).model_dump_json())))
    env = {**os.environ, **stack.env(), "TPU_OPS_STATE_DIR": str(train_settings.state_dir),
           "TPU_OPS_POLL_INTERVAL_S": "0.1"}  # fmt: skip
    argv = [CLI, "train", "--spec", str(spec), "--run-id", "orphan", "--no-flow", "--json"]
    sup = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / "err").open("wb"))

    def moves() -> list[dict[str, Any]]:
        return list(_state(gcs, ckpt_bucket, "orphan").get("moves") or [])

    _kill9_once_granted(sup, stack, gcs, ckpt_bucket, "orphan")
    (mv,) = moves()
    assert mv["phase"] == "asked" and stack.state()["compute"]["instances"] == 2
    assert reap(train_settings, zones=[ZONE], dry_run=True).reaped[0].deleted is False  # (nothing deleted yet)
    assert stack.state()["compute"]["instances"] == 2
    report = reap(train_settings, zones=[ZONE])
    (r,) = report.reaped
    assert (r.run_id, r.reason, r.deleted, r.error) == ("orphan", "the process that provisioned it is gone", True, "")
    instances = {(x.resource_id, x.tier) for x in r.resources if x.kind == "instance"}
    assert instances == {(mv["from_resource"], "spot"), (mv["to_resource"], "reservation")}, r.resources
    assert report.kept == [] and _in_use(stack) == 0  # the reservation's VM handed back
    _nothing_left(stack, "orphan")


def test_on_the_tpu_api_a_run_moves_back_to_spot_once_it_is_in_stock(
    stack: Any, gcs: Any, ckpt_bucket: str, train_settings: Any
) -> None:
    """The same handover on the Cloud TPU API (queued resources, its host simulator): spot is stocked out
    when the run starts, so it trains on on-demand; spot comes back, and at the next checkpoint the
    ranking (history only: the TPU API has no reservation counts) moves it there."""
    b = gcs.bucket(ckpt_bucket)
    for run, tier in (("old-spot", "spot"), ("old-od", "on-demand")):
        state = {"incarnations": [{"zone": "us-central2-b", "tier": tier, "requested_at": 0.0, "ready_at": 60.0,
                                   "ended_at": 60.0 + 360000}]}  # fmt: skip
        b.blob(f"runs/{run}/_tpu_ops/state.json").upload_from_string(json.dumps(state))
        ident = {"accelerator_type": "v4-8", "backend": "tpu-api", "chips": 4}
        b.blob(f"runs/{run}/_tpu_ops/capacity.json").upload_from_string(json.dumps(ident))
    doc = json.loads(job_spec(ckpt_bucket, steps=STEPS, checkpoint_every=EVERY,
                              hyperparameters={"step_delay_s": 0.25}).model_dump_json())  # fmt: skip
    doc["provision"].update(ladder=["spot", "on-demand"], choose={})
    stack.set_capacity({"us-central2-b": {"spot": 0, "on-demand": 64}})
    run = Run(TrainJobSpec.model_validate(doc), "tpumove", train_settings)

    def training_on_demand() -> bool:
        incs = _state(gcs, ckpt_bucket, "tpumove").get("incarnations") or []
        return bool(incs) and incs[0].get("tier") == "on-demand" and (incs[0].get("last_step") or 0) >= 1

    wait_for(training_on_demand, 120, what="the run training on on-demand")
    stack.set_capacity({"us-central2-b": {"spot": 64, "on-demand": 64}})
    run.result(timeout=240)
    state = _state(gcs, ckpt_bucket, "tpumove")
    assert [(i["tier"], i["end"]) for i in state["incarnations"]] == [("on-demand", "moved"), ("spot", "done")]
    _no_step_lost(state)
    assert [m["phase"] for m in state["moves"]] == ["moved"]

    def clean() -> bool:
        s = stack.state()
        return s["queued_resources"] == 0 and s["nodes"] == 0 and not s["worker_pids"]

    wait_for(clean, 30, what="no queued resource, node or worker left")
