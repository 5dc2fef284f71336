"""Goodput categories pinned with exact figures over hand-made timelines: every record kind, an idle
tail, saves of steps a preemption threw away, recoveries that end at the next slice, a running run,
clock skew. Each case is worked out by hand in its docstring; a change of any category's rule moves
a figure and turns its row red."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tpu_ops.train import goodput as G
from tpu_ops.train.runstate import IncarnationState, PreemptionState, RunState


def every_kind() -> RunState:
    """One slice, every record kind, an idle tail. Asked 0, ready 10 (tpu_init 10); startup 10-12;
    init 12-14 (tpu_init); prep 14-20; restore 20-22; data 22-25; steps 1-4 from 25 (10, 10, 10,
    15 s) with a save at 33-35 (step 1) and 65-70 (step 4), each winning over its step; the trainer
    ends at 70, DONE at 100: a tail of 30 s in `other`."""
    timeline = [["init", None, 12.0, 14.0], ["prep", None, 14.0, 20.0], ["restore", None, 20.0, 22.0],
                ["data", None, 22.0, 25.0], ["step", 1, 25.0, 35.0], ["save", 1, 33.0, 35.0],
                ["step", 2, 35.0, 45.0], ["step", 3, 45.0, 55.0], ["step", 4, 55.0, 70.0],
                ["save", 4, 65.0, 70.0]]  # fmt: skip
    inc = IncarnationState(0, "0-a", 0.0, "r-a1", "z", "spot", ready_at=10.0, ended_at=100.0, end="done",
                           kept_until=4, last_step=4, timeline=timeline)  # fmt: skip
    return RunState("every", 0.0, 4, "done", 100.0, 4, incarnations=[inc])


def preempted_with_a_discarded_save() -> RunState:
    """Slice 0: asked 0, ready 10, steps 1-3 of 10 s from 20 with saves 28-30 and 38-40 (kept: the
    next slice resumed from 2) and a save of step 3 at 45-50 that never committed (wasted with its
    step). Last record 50 → slice 1 ready at 120: recovery 70. Slice 1: asked 90, startup 120-125,
    restore 125-130, steps 3-4 of 10 s from 130 with a save 145-150; DONE at 200: tail 50."""
    inc0 = IncarnationState(0, "0-a", 0.0, "r-a1", "z", "spot", ready_at=10.0, ended_at=80.0, end="preempted",
                            kept_until=2, last_step=3,
                            timeline=[["step", 1, 20.0, 30.0], ["save", 1, 28.0, 30.0], ["step", 2, 30.0, 40.0],
                                      ["save", 2, 38.0, 40.0], ["step", 3, 40.0, 50.0],
                                      ["save", 3, 45.0, 50.0]])  # fmt: skip
    inc1 = IncarnationState(1, "1-b", 90.0, "r-a2", "z", "spot", ready_at=120.0, resume_step=2, ended_at=200.0,
                            end="done", kept_until=4, last_step=4,
                            timeline=[["restore", 2, 125.0, 130.0], ["step", 3, 130.0, 140.0],
                                      ["step", 4, 140.0, 150.0], ["save", 4, 145.0, 150.0]])  # fmt: skip
    p = PreemptionState(1, 0, "spot preemption", "r-a1", "z", "spot", 60.0, 50.0, 3, resume_step=2, steps_lost=1,
                        detect_s=10.0, delete_s=20.0, reprovision_s=40.0, restore_s=10.0)  # fmt: skip
    return RunState("pre", 0.0, 4, "done", 200.0, 4, incarnations=[inc0, inc1], preemptions=[p])


def still_recovering() -> RunState:
    """A running run measured at now=100: slice 0 ready at 10, steps 1-2 of 10 s from 10 (kept up to
    1: the checkpoint of step 1), preempted; slice 1 asked at 40, not ready yet. Recovery runs from
    the last record (30) to now (70 s); step 2 is wasted."""
    inc0 = IncarnationState(0, "0-a", 0.0, "r-a1", "z", "spot", ready_at=10.0, ended_at=35.0, end="preempted",
                            kept_until=1, last_step=2,
                            timeline=[["step", 1, 10.0, 20.0], ["step", 2, 20.0, 30.0]])  # fmt: skip
    inc1 = IncarnationState(1, "1-b", 40.0, "", "z", "spot")
    p = PreemptionState(1, 0, "spot preemption", "r-a1", "z", "spot", 35.0, 30.0, 2)
    return RunState("live", 0.0, 10, incarnations=[inc0, inc1], preemptions=[p])


CASES: dict[str, tuple[Any, float, dict[str, float]]] = {
    "every record kind, idle tail": (every_kind, 999.0, {
        G.PRODUCTIVE: 38.0, G.TPU_INITIALIZATION: 12.0, G.PROGRAM_STARTUP: 2.0, G.TRAINING_PREP: 6.0,
        G.CHECKPOINT_RESTORE: 2.0, G.DATA_LOADING: 3.0, G.CHECKPOINT_SAVE: 7.0, G.WASTED_PROGRESS: 0.0,
        G.INFRASTRUCTURE_RECOVERY: 0.0, G.OTHER: 30.0}),
    "preempted, a save thrown away": (preempted_with_a_discarded_save, 999.0, {
        G.PRODUCTIVE: 31.0, G.TPU_INITIALIZATION: 10.0, G.PROGRAM_STARTUP: 15.0, G.TRAINING_PREP: 0.0,
        G.CHECKPOINT_RESTORE: 5.0, G.DATA_LOADING: 0.0, G.CHECKPOINT_SAVE: 9.0, G.WASTED_PROGRESS: 10.0,
        G.INFRASTRUCTURE_RECOVERY: 70.0, G.OTHER: 50.0}),
    "running, still recovering": (still_recovering, 100.0, {
        G.PRODUCTIVE: 10.0, G.TPU_INITIALIZATION: 10.0, G.PROGRAM_STARTUP: 0.0, G.TRAINING_PREP: 0.0,
        G.CHECKPOINT_RESTORE: 0.0, G.DATA_LOADING: 0.0, G.CHECKPOINT_SAVE: 0.0, G.WASTED_PROGRESS: 10.0,
        G.INFRASTRUCTURE_RECOVERY: 70.0, G.OTHER: 0.0}),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_every_category_has_its_exact_figure(name: str) -> None:
    make, now, expected = CASES[name]
    report = G.GoodputReport.derive(make(), now=now)
    assert report.categories == pytest.approx(expected, abs=1e-9)
    assert sum(report.categories.values()) == pytest.approx(report.wall_s)


def test_the_figures_around_the_categories() -> None:
    done = G.GoodputReport.derive(every_kind(), now=999.0)
    assert (done.wall_s, done.goodput, done.steps_kept) == (100.0, pytest.approx(0.38), 4)
    assert done.scheduling_goodput == pytest.approx(90.0 / 100.0)  # asked 10 s, held 90 s
    pre = G.GoodputReport.derive(preempted_with_a_discarded_save(), now=999.0)
    assert (pre.wall_s, pre.steps_kept) == (200.0, 4)  # 1, 2 on slice 0; 3, 4 on slice 1
    assert pre.scheduling_goodput == pytest.approx((70.0 + 80.0) / (70.0 + 80.0 + 10.0 + 30.0))
    live = G.GoodputReport.derive(still_recovering(), now=100.0)
    assert (live.outcome, live.wall_s, live.steps_kept) == ("running", 100.0, 1)
    # slice 0 asked 10 s and held 25 s; slice 1 asked since 40 and still waits at 100 (60 s)
    assert live.scheduling_goodput == pytest.approx(25.0 / (25.0 + 10.0 + 60.0))


def test_a_clock_skewed_slice_counts_no_negative_wait() -> None:
    """A slice whose ready time is before its request (clocks of two machines): its wait counts 0,
    never a negative that would lift scheduling goodput over 100%."""
    state = every_kind()
    state.incarnations[0].requested_at = 15.0
    report = G.GoodputReport.derive(state, now=999.0)
    assert report.scheduling_goodput == 1.0


def test_the_stored_report_pins_every_field() -> None:
    doc = G.GoodputReport.derive(preempted_with_a_discarded_save(), now=999.0, cost={"usd_total": 1.5}).to_json()
    assert {k: v for k, v in doc.items() if k not in ("incarnations", "preemptions")} == {
        "run_id": "pre", "outcome": "done", "steps": 4, "final_step": 4, "steps_kept": 4, "started_at": 0.0,
        "wall_s": 200.0, "productive_s": 31.0, "goodput": 0.155,
        "badput_s": {G.TPU_INITIALIZATION: 10.0, G.TRAINING_PREP: 0.0, G.PROGRAM_STARTUP: 15.0,
                     G.DATA_LOADING: 0.0, G.CHECKPOINT_SAVE: 9.0, G.CHECKPOINT_RESTORE: 5.0,
                     G.WASTED_PROGRESS: 10.0, G.INFRASTRUCTURE_RECOVERY: 70.0, G.OTHER: 50.0},
        "scheduling_goodput": 0.7895, "recoveries": 1, "cost": {"usd_total": 1.5}, "error": "",
    }  # fmt: skip
    assert [i["productive_s"] for i in doc["incarnations"]] == [16.0, 15.0]
    assert [i["id"] for i in doc["incarnations"]] == ["0-a", "1-b"]
    assert "timeline" not in doc["incarnations"][0]
    assert doc["preemptions"][0]["overhead_s"] == 80.0  # detect 10 + delete 20 + re-provision 40 + restore 10
    assert doc["preemptions"][0]["steps_lost"] == 1
    assert G.GoodputReport.from_json(json.loads(json.dumps(doc))).to_json() == doc


def test_overhead_waits_for_the_first_new_step() -> None:
    p = still_recovering().preemptions[0]
    assert G._overhead(p) is None  # no restore yet: the recovery has not made a step
    p.restore_s, p.detect_s, p.delete_s, p.reprovision_s = 4.0, 1.0, 2.0, 3.0
    assert G._overhead(p) == 10.0


def test_a_rows_table_has_one_row_per_preemption_with_its_figures() -> None:
    rows = G.GoodputReport.derive(preempted_with_a_discarded_save(), now=999.0).rows()
    assert rows == [{"#": 1, "reason": "spot preemption", "slice": "spot z r-a1", "steps lost": 1, "resumed from": 2,
                     "detect (s)": "10.00", "delete (s)": "20.00", "re-provision (s)": "40.00",
                     "restore (s)": "10.00", "overhead (s)": "80.00"}]  # fmt: skip


def test_the_summary_line_says_goodput_and_cost() -> None:
    report = G.GoodputReport.derive(every_kind(), now=999.0, cost={"usd_total": 2.0, "usd_by_tier": {"spot": 2.0}})
    line = report.summary()
    assert "done at step 4/4" in line and "wall 100.0s" in line and "productive 38.0s" in line
    assert "goodput 38.0%" in line and "0 preemption(s)" in line and "total $2.0000" in line
