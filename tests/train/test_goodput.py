"""Goodput from first principles (exact figures on a hand-made run state), and the lease on fake-gcs-server."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

from tpu_ops.errors import CloudError
from tpu_ops.layout import RunLayout
from tpu_ops.train import goodput as G
from tpu_ops.train.runstate import (
    IncarnationState,
    Lease,
    LeaseHeldError,
    LeaseLostError,
    PreemptionState,
    RunState,
    StateStore,
    write_if,
)


def _steps(first: int, last: int, t0: float, dt: float, saves: dict[int, float] | None = None) -> list[list[Any]]:
    """Step records ``first..last`` back to back from ``t0``, each ``dt`` long; a save after some."""
    out, t = [], t0
    for s in range(first, last + 1):
        out.append(["step", s, t, t + dt])
        t += dt
        if saves and s in saves:
            out.append(["save", s, t, t + saves[s]])
            t += saves[s]
    return out


def preempted_run() -> RunState:
    """t=0 start; slice 0 asked for at 0, ready at 10; data 12-13; steps 1..6 of 1 s from 13 with a 0.5 s
    save after step 4 (so steps end at 19.5); preempted, detected at 21; slice 1 ready at 30, restore
    32-33, steps 5..8 of 1 s from 33 (save 1 s after 8) → DONE at 38."""
    inc0 = IncarnationState(0, "0-a", 0.0, "r-a1", "z", "spot", ready_at=10.0, resume_step=None, ended_at=21.0,
                            end="preempted", kept_until=4, last_step=6,
                            timeline=[["data", None, 12.0, 13.0], *_steps(1, 6, 13.0, 1.0, {4: 0.5})])  # fmt: skip
    inc1 = IncarnationState(1, "1-b", 21.5, "r-a1", "z", "spot", ready_at=30.0, resume_step=4, ended_at=38.0,
                            end="done", kept_until=8, last_step=8,
                            timeline=[["restore", 4, 32.0, 33.0], *_steps(5, 8, 33.0, 1.0, {8: 1.0})])  # fmt: skip
    p = PreemptionState(1, 0, "queued resource SUSPENDED", "r-a1", "z", "spot", 21.0, 19.5, 6)
    return RunState("gp", 0.0, 8, "done", 38.0, 8, incarnations=[inc0, inc1], preemptions=[p])


def test_categories_exact_figures_and_invariants() -> None:
    report = G.GoodputReport.derive(preempted_run(), now=999.0)
    c = report.categories
    assert report.wall_s == 38.0
    assert c[G.PRODUCTIVE] == pytest.approx(8.0)  # steps 1-4 of slice 0 and 5-8 of slice 1: 1 s each
    assert c[G.WASTED_PROGRESS] == pytest.approx(2.0)  # steps 5 and 6 of slice 0, thrown away
    assert c[G.CHECKPOINT_SAVE] == pytest.approx(1.5)
    assert c[G.CHECKPOINT_RESTORE] == pytest.approx(1.0)
    assert c[G.DATA_LOADING] == pytest.approx(1.0)
    assert c[G.TPU_INITIALIZATION] == pytest.approx(10.0)
    assert c[G.PROGRAM_STARTUP] == pytest.approx(2.0 + 2.0)  # ready → first record, on both slices
    assert c[G.INFRASTRUCTURE_RECOVERY] == pytest.approx(30.0 - 19.5)  # last record → next slice ready
    assert c[G.OTHER] == pytest.approx(0.0)
    assert sum(c.values()) == pytest.approx(report.wall_s)
    assert report.goodput == pytest.approx(8.0 / 38.0)
    assert report.steps_kept == 8
    assert report.scheduling_goodput == pytest.approx((11.0 + 8.0) / (11.0 + 8.0 + 10.0 + 8.5))
    doc = report.to_json()
    assert [i["productive_s"] for i in doc["incarnations"]] == [4.0, 4.0]
    assert G.GoodputReport.from_json(json.loads(json.dumps(doc))).to_json() == doc


def test_a_rate_is_never_extrapolated_and_overlaps_count_once() -> None:
    """One slow step among fast ones, and records that overlap (two kinds at once): still ≤ wall."""
    state = preempted_run()
    state.incarnations[1].timeline.append(["data", None, 33.0, 37.0])  # overlaps steps: steps win
    state.incarnations[1].timeline[1] = ["step", 5, 33.0, 34.9]  # a step that takes longer
    report = G.GoodputReport.derive(state, now=999.0)
    assert report.productive_s == pytest.approx(8.0)  # the kept steps' own times, each moment once
    assert report.categories[G.DATA_LOADING] == pytest.approx(1.0)
    assert sum(report.categories.values()) == pytest.approx(38.0)


def test_the_invariant_is_checked_in_code() -> None:
    report = G.GoodputReport("x", "done", 1, 1, 0.0, 10.0, {G.PRODUCTIVE: 11.0})
    with pytest.raises(G.GoodputInvariantError, match="productive"):
        report.check()
    report = G.GoodputReport("x", "done", 1, 1, 0.0, 10.0, {G.PRODUCTIVE: 5.0, G.OTHER: 4.0})
    with pytest.raises(G.GoodputInvariantError, match="add up"):
        report.check()


@pytest.fixture
def layout(gcs: Any, bucket: str) -> RunLayout:
    return RunLayout.of(f"gs://{bucket}/runs", "lease-run")


def test_lease_refuses_a_second_holder_naming_it_and_takes_over_only_when_expired(gcs: Any, layout: RunLayout) -> None:
    first = Lease(gcs, layout.lease, ttl_s=60)
    assert first.acquire() is None
    with pytest.raises(LeaseHeldError, match=f"pid {os.getpid()} on host") as held:
        Lease(gcs, layout.lease, ttl_s=60).acquire()
    assert held.value.holder["token"] == first.me["token"]
    # a holder on another host whose lease ran out: taken over; the old holder learns it at its next renewal
    doc = json.loads(gcs.bucket(layout.run.bucket).blob(layout.lease.prefix).download_as_bytes())
    gen = gcs.bucket(layout.run.bucket).get_blob(layout.lease.prefix).generation
    write_if(gcs, layout.lease, {**doc, "host": "elsewhere", "expires_at": time.time() - 1}, gen)
    first.generation = int(gen) + 0  # it still believes in the generation it wrote
    second = Lease(gcs, layout.lease, ttl_s=60)
    assert second.acquire()["host"] == "elsewhere"
    with pytest.raises(LeaseLostError, match="taken over"):
        first.renew()
    first.release()  # not ours any more: left alone
    assert (
        json.loads(gcs.bucket(layout.run.bucket).blob(layout.lease.prefix).download_as_bytes())["token"]
        == (second.me["token"])
    )
    second.release()
    assert not gcs.bucket(layout.run.bucket).blob(layout.lease.prefix).exists()


def test_state_writes_are_fenced_by_generation(gcs: Any, layout: RunLayout) -> None:
    a, b = StateStore(gcs, layout.run_state), StateStore(gcs, layout.run_state)
    assert a.load() is None
    a.save(RunState("lease-run", 1.0, 10))
    assert b.load() is not None
    b.save(RunState("lease-run", 1.0, 10, error="b"))
    with pytest.raises(LeaseLostError):
        a.save(RunState("lease-run", 1.0, 10, error="a"))  # stale: b wrote since a read
    with pytest.raises(CloudError) as exc:
        write_if(gcs, layout.run_state, {}, 0)  # "create only": it exists
    assert exc.value.status == 412


def test_the_agent_reads_the_trainers_step_log_incrementally_and_the_supervisor_merges_it(tmp_path: Any) -> None:
    from tpu_ops.agent.goodput_hooks import STEP_LOG_ENV, StepTimeline, record
    from tpu_ops.train.incarnations import merge_timeline

    tl = StepTimeline(tmp_path, worker=0)
    path = tl.path
    assert tl.env() == {STEP_LOG_ENV: str(path)}
    record(path, "data", None, 1.0, 2.0)
    record(path, "step", 1, 2.0, 3.0)
    record(None, "step", 9, 0.0, 1.0)  # no step log: nothing written
    with path.open("a") as f:
        f.write('not json\n{"kind": "bogus", "step": 1, "start": 0, "end": 1}\n{"kind": "step", "step": 2, "start": 3')
    assert tl.heartbeat_fields() == {"timeline": [["data", None, 1.0, 2.0], ["step", 1, 2.0, 3.0]]}
    with path.open("a") as f:
        f.write(', "end": 4}\n')  # the half-written line completes
    assert tl.heartbeat_fields()["timeline"][-1] == ["step", 2, 3.0, 4.0]
    assert StepTimeline(tmp_path / "w1", worker=1).heartbeat_fields() == {}

    inc = IncarnationState(0, "0-a", 0.0, timeline=[["step", 1, 2.0, 3.0]])
    merge_timeline(inc, [["step", 2, 3.0, 4.0], ["step", 1, 2.0, 3.0], ["data", None, 1.0, 2.0]])
    assert inc.timeline == [["data", None, 1.0, 2.0], ["step", 1, 2.0, 3.0], ["step", 2, 3.0, 4.0]]
