"""A multislice run as its state, ``tpu-ops status`` and ``tpu-ops logs`` show it: every slice of every
incarnation (kept or new), hosts alive per slice, and log lines labelled and filtered by slice and worker.

Real objects in the stack's fake GCS (state.json, heartbeats, shipped log pieces, as the supervisor and
the agents write them); nothing of ours is mocked.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from flows.cli import main
from flows.commands.status import detail
from tpu_ops.agent.job import RunPaths
from tpu_ops.layout import RunLayout
from tpu_ops.provision.records import Slice
from tpu_ops.train.incarnations import record_allocation
from tpu_ops.train.launches import PROCESS, LaunchRecord, save
from tpu_ops.train.logs import LogReader
from tpu_ops.train.runstate import IncarnationState, RunState, SliceState, StateStore
from tpu_ops.train.status import run_status

RUN, ZONE = "ms-view", "us-central2-b"


def _slice(rid: str, tier: str = "spot", hosts: int = 2) -> Slice:
    return Slice(RUN, rid, rid, ZONE, tier, "v4-16", 8, hosts, tuple(f"10.0.0.{i}" for i in range(hosts)))


def _put(gcs: Any, bucket: str, key: str, data: bytes | dict[str, Any]) -> None:
    body = json.dumps(data).encode() if isinstance(data, dict) else data
    gcs.bucket(bucket).blob(key).upload_from_string(body)


def _two_incarnations() -> RunState:
    """Incarnation 0 on slices a1 + a1001, preempted on slice 1; incarnation 1 kept a1 and got a1002."""
    state = RunState(RUN, time.time() - 60, 30)
    first = IncarnationState(0, "0-aaaa", time.time() - 60, end="preempted", ended_at=time.time() - 30)
    record_allocation(first, [_slice(f"{RUN}-a1"), _slice(f"{RUN}-a1001")])
    second = IncarnationState(1, "1-bbbb", time.time() - 29, resume_step=10)
    record_allocation(second, [_slice(f"{RUN}-a1"), _slice(f"{RUN}-a1002", tier="on-demand")], kept=(0,))
    state.incarnations = [first, second]
    return state


def test_every_slice_of_each_incarnation_is_recorded_kept_or_new_and_read_back() -> None:
    state = _two_incarnations()
    back = RunState.from_json(json.loads(json.dumps(state.to_json())))
    first, second = back.incarnations
    assert [(s.index, s.resource_id, s.kept) for s in first.slices] == [
        (0, f"{RUN}-a1", False),
        (1, f"{RUN}-a1001", False),
    ]
    assert second.slices == [
        SliceState(0, f"{RUN}-a1", ZONE, "spot", 2, kept=True),
        SliceState(1, f"{RUN}-a1002", ZONE, "on-demand", 2, kept=False),
    ]
    # slice 0 stays in the fields single-slice readers (goodput, history, preemptions) use
    assert (second.queued_resource, second.zone, second.tier) == (f"{RUN}-a1", ZONE, "spot")
    # a successor supervisor adopting the live allocation (its keeper carried nothing) keeps the flags
    record_allocation(second, [_slice(f"{RUN}-a1"), _slice(f"{RUN}-a1002", tier="on-demand")])
    assert [s.kept for s in second.slices] == [True, False]


def test_a_state_file_written_before_slices_were_recorded_still_reads_as_its_one_slice() -> None:
    old = {"version": 1, "run_id": RUN, "started_at": 1.0, "steps": 10, "incarnations": [
        {"number": 0, "id": "0-old", "requested_at": 1.0, "queued_resource": f"{RUN}-a1", "zone": ZONE, "tier": "spot"}
    ]}  # fmt: skip
    inc = RunState.from_json(old).incarnations[0]
    assert inc.slices == [] and inc.allocation() == [SliceState(0, f"{RUN}-a1", ZONE, "spot", 0)]
    assert IncarnationState(1, "1-new", 2.0).allocation() == []  # asked for, nothing held yet


@pytest.fixture
def launched(gcs: Any, bucket: str, tmp_path: Path, local_stack: Any) -> tuple[Any, LaunchRecord, RunLayout]:
    settings = local_stack.settings(state_dir=tmp_path / "state")
    record = LaunchRecord(RUN, "train-job", PROCESS, checkpoint_dir=f"gs://{bucket}/runs", zones=[ZONE], hosts=2,
                          slices=2, heartbeat_s=5.0)  # fmt: skip
    save(settings, record)
    assert record.layout is not None
    return settings, record, record.layout


def test_status_shows_every_live_slice_with_its_hosts_alive_and_each_incarnations_slices(
    gcs: Any, bucket: str, launched: tuple[Any, LaunchRecord, RunLayout]
) -> None:
    settings, record, layout = launched
    StateStore(gcs, layout.run_state).save(_two_incarnations())
    paths = RunPaths(layout.run_uri, layout.checkpoint_subdir, str(layout.state_dir))
    now = time.time()
    for slice_index, worker in [(0, 0), (0, 1), (1, 0)]:  # slice 1's worker 1 has not come up yet
        beat = {"worker": worker, "slice": slice_index, "step": 12, "time": now, "incarnation": "1-bbbb",
                "state": "training"}  # fmt: skip
        _put(gcs, bucket, paths.heartbeat(worker, slice_index), beat)
    _put(gcs, bucket, paths.heartbeat(1, 1), {"worker": 1, "slice": 1, "time": now, "incarnation": "0-aaaa"})

    s = run_status(settings, record, gcs, now=now)
    assert [(sl.index, sl.slice_id, sl.hosts_alive, sl.hosts, sl.kept) for sl in s.slices] == [
        (0, f"{RUN}-a1", 2, 2, True),
        (1, f"{RUN}-a1002", 1, 2, False),  # the old incarnation's heartbeat is not taken for news
    ]
    assert s.hosts_alive == 3
    assert [[sl["resource_id"] for sl in i["slices"]] for i in s.to_json()["incarnations"]] == [
        [f"{RUN}-a1", f"{RUN}-a1001"],
        [f"{RUN}-a1", f"{RUN}-a1002"],
    ]
    text = detail(s)
    assert f"slice 0 ({RUN}-a1): spot in {ZONE}, 2/2 hosts alive, kept from the incarnation before" in text
    assert f"slice 1 ({RUN}-a1002): on-demand in {ZONE}, 1/2 hosts alive, new" in text
    assert f"incarnation 0 (preempted): slice 0 {RUN}-a1 (spot, 2 hosts), slice 1 {RUN}-a1001 (spot, 2 hosts)" in text
    assert f"incarnation 1 (live): slice 0 {RUN}-a1 (spot, 2 hosts, kept), slice 1 {RUN}-a1002" in text
    # No ledger of its slices in this state directory (its supervisor runs on a Prefect worker): no $0 cost.
    assert not s.cost_known and "cost not known here" in text and "cost so far" not in text
    from tpu_ops.provision.ledger import ACTIVE, Ledger

    Ledger(settings, RUN).append(ACTIVE, resource_id=f"{RUN}-a1", zone=ZONE, tier="spot", chips=8, generation="v4",
                                 t=now - 3600)  # fmt: skip
    billed = run_status(settings, record, gcs, now=now)
    assert billed.cost_known and billed.cost_usd > 0 and "cost so far $" in detail(billed)


def test_a_node_google_repaired_shows_repaired_not_kept_in_the_state_and_in_status(
    gcs: Any, bucket: str, launched: tuple[Any, LaunchRecord, RunLayout]
) -> None:
    """On the TPU API one multislice request keeps both node names: Google's repair of the lost node is a new
    node, not a slice held over (its VMs, endpoints and bill are new)."""
    settings, record, layout = launched
    state = RunState(RUN, time.time() - 60, 30)
    first = IncarnationState(0, "0-aaaa", time.time() - 60, end="preempted", ended_at=time.time() - 30)
    nodes = [_slice(f"{RUN}-a1-0"), _slice(f"{RUN}-a1-1")]
    record_allocation(first, nodes)
    second = IncarnationState(1, "1-bbbb", time.time() - 29, resume_step=10)
    record_allocation(second, nodes, kept=(0,), repaired=(1,))
    state.incarnations = [first, second]
    back = RunState.from_json(json.loads(json.dumps(state.to_json()))).incarnations[1]
    assert [(s.kept, s.repaired) for s in back.slices] == [(True, False), (False, True)]
    record_allocation(back, nodes)  # a successor supervisor adopting the allocation keeps both flags
    assert [(s.kept, s.repaired) for s in back.slices] == [(True, False), (False, True)]
    StateStore(gcs, layout.run_state).save(state)

    s = run_status(settings, record, gcs)
    assert [(sl.index, sl.kept, sl.repaired) for sl in s.slices] == [(0, True, False), (1, False, True)]
    text = detail(s)
    assert f"slice 1 ({RUN}-a1-1): spot in {ZONE}, 0/2 hosts alive, repaired by Google (a new node)" in text
    assert f"incarnation 1 (live): slice 0 {RUN}-a1-0 (spot, 2 hosts, kept), slice 1 {RUN}-a1-1 (spot, 2 hosts, " \
        "repaired)" in text


def test_a_run_cancelled_through_prefect_shows_its_last_incarnation_cancelled_not_failed(
    gcs: Any, bucket: str, launched: tuple[Any, LaunchRecord, RunLayout]
) -> None:
    """Prefect's cancellation signals the flow run's process, so the supervisor records the run and its live
    incarnation ``failed``; status, which knows of the cancel from the launch record, says cancelled for both."""
    settings, record, layout = launched
    state = _two_incarnations()
    state.outcome, state.incarnations[1].end = "failed", "failed"
    StateStore(gcs, layout.run_state).save(state)
    record.cancelled_at = time.time()
    s = run_status(settings, record, gcs)
    assert s.state == "cancelled"
    assert [i["end"] for i in s.incarnations] == ["preempted", "cancelled"]
    assert f"incarnation 1 (cancelled): slice 0 {RUN}-a1" in detail(s)


def test_status_of_an_old_state_file_shows_its_one_slice_with_the_launch_records_hosts(
    gcs: Any, bucket: str, launched: tuple[Any, LaunchRecord, RunLayout]
) -> None:
    settings, record, layout = launched
    old = {"version": 1, "run_id": RUN, "started_at": time.time() - 9, "steps": 10, "incarnations": [
        {"number": 0, "id": "0-old", "requested_at": time.time() - 9, "queued_resource": f"{RUN}-a1", "zone": ZONE,
         "tier": "spot"}]}  # fmt: skip
    _put(gcs, bucket, layout.run_state.prefix, old)
    s = run_status(settings, record, gcs)
    assert [(sl.index, sl.slice_id, sl.hosts, sl.hosts_alive) for sl in s.slices] == [(0, f"{RUN}-a1", 2, 0)]
    assert f"slice {RUN}-a1: spot in {ZONE}, 0/2 hosts alive" in detail(s)  # one slice: the line as ever


def _ship(gcs: Any, bucket: str, paths: RunPaths, inc: str, slice_index: int, worker: int, at_ms: int,
          text: str, offset: int = 0) -> None:  # fmt: skip
    _put(gcs, bucket, paths.log_chunk(inc, worker, offset, at_ms, slice_index), text.encode())


def test_logs_read_every_slices_workers_labelled_and_filtered_by_slice_and_worker(
    gcs: Any, bucket: str, launched: tuple[Any, LaunchRecord, RunLayout], monkeypatch: pytest.MonkeyPatch,
    local_stack: Any, capsys: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    settings, _, layout = launched
    paths = RunPaths(layout.run_uri, layout.checkpoint_subdir, str(layout.state_dir))
    _ship(gcs, bucket, paths, "0-aaaa", 0, 0, 1000, "s0w0 first\n")
    _ship(gcs, bucket, paths, "0-aaaa", 0, 1, 1001, "s0w1 first\n")
    _ship(gcs, bucket, paths, "0-aaaa", 1, 0, 1002, "s1w0 first\ns1w0 cut ")
    _ship(gcs, bucket, paths, "0-aaaa", 1, 1, 1003, "s1w1 first\n")
    _ship(gcs, bucket, paths, "0-aaaa", 1, 0, 1004, "in two\n", offset=len("s1w0 first\ns1w0 cut "))

    assert LogReader(gcs, layout, slices=2).read(final=True) == [
        "-- slice incarnation 0 --",
        "[s0 w0] s0w0 first",
        "[s0 w1] s0w1 first",
        "[s1 w0] s1w0 first",
        "[s1 w1] s1w1 first",
        "[s1 w0] s1w0 cut in two",  # a line cut between two pieces of one slice's worker, joined
    ]
    assert LogReader(gcs, layout, worker=0, slices=2).read() == [
        "-- slice incarnation 0 --", "[s0 w0] s0w0 first", "[s1 w0] s1w0 first", "[s1 w0] s1w0 cut in two"
    ]  # fmt: skip
    assert LogReader(gcs, layout, slice_index=1, slices=2).read()[1:] == [
        "[s1 w0] s1w0 first", "[s1 w1] s1w1 first", "[s1 w0] s1w0 cut in two"
    ]  # fmt: skip
    assert LogReader(gcs, layout, worker=1, slice_index=0).read() == ["-- slice incarnation 0 --", "[w1] s0w1 first"]

    # and through the command line, as `tpu-ops logs RUN --slice 1 --worker 0` runs it
    for name, value in local_stack.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TPU_OPS_STATE_DIR", str(settings.state_dir))
    assert main(["logs", RUN, "--slice", "1", "--worker", "0"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "-- slice incarnation 0 --", "[s1 w0] s1w0 first", "[s1 w0] s1w0 cut in two"
    ]  # fmt: skip
    assert main(["logs", RUN, "--slice", "2"]) == 2
    assert f"--slice 2 is not allowed: run {RUN} has slices 0-1" in capsys.readouterr().err
