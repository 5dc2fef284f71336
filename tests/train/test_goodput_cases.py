"""More goodput timelines with exact figures, written against what mutation testing of
``train/goodput.py`` left alive (docs/mutation-testing.md): three slices and two preemptions, a
slice lost before its trainer's first record, one lost while booting, a preemption with no next
slice, a run that started at a non-zero time with sub-second steps (the stored rounding), a run of
under a second, a run measured at its start; then the invariant's boundaries, a stored report read
back, the rows and the summary line. Each timeline is worked out by hand in its docstring."""

from __future__ import annotations

from typing import Any

import pytest

from tpu_ops.train import goodput as G
from tpu_ops.train.runstate import IncarnationState, PreemptionState, RunState


def inc(number: int, requested: float, ready: float | None, **kw: Any) -> IncarnationState:
    return IncarnationState(number, f"{number}-x", requested, f"r-a{number + 1}", "z", "spot", ready_at=ready, **kw)


def pre(number: int, incarnation: int, **kw: Any) -> PreemptionState:
    return PreemptionState(number, incarnation, "spot preemption", f"r-a{incarnation + 1}", "z", "spot", 0.0, None,
                           None, **kw)  # fmt: skip


def three_slices() -> RunState:
    """Slice 0: asked 0, ready 10 (tpu_init 10); steps 1-2 at 10-30, kept up to 1 (prod 10, wasted
    10); preempted, last record 30 → slice 1 ready at 60 (recovery 30). Slice 1 resumes from 1:
    restore 60-65, step 2 65-75 (kept), idle 75-78 (other 3), step 3 78-88 (wasted: slice 2 resumed
    from 2); preempted, last record 88 → slice 2 ready at 110 (recovery 22). Slice 2: restore
    110-112, steps 3-4 at 112-132 (prod 20); DONE at 150 (other 18). The idle gap of slice 1 is
    `other`, not recovery: each recovery ends at the *next* slice, not the last one."""
    i0 = inc(0, 0.0, 10.0, ended_at=40.0, end="preempted", kept_until=1, last_step=2,
             timeline=[["step", 1, 10.0, 20.0], ["step", 2, 20.0, 30.0]])  # fmt: skip
    i1 = inc(1, 45.0, 60.0, resume_step=1, ended_at=90.0, end="preempted", kept_until=2, last_step=3,
             timeline=[["restore", 1, 60.0, 65.0], ["step", 2, 65.0, 75.0], ["step", 3, 78.0, 88.0]])  # fmt: skip
    i2 = inc(2, 95.0, 110.0, resume_step=2, ended_at=140.0, end="done", kept_until=4, last_step=4,
             timeline=[["restore", 2, 110.0, 112.0], ["step", 3, 112.0, 122.0], ["step", 4, 122.0, 132.0]])  # fmt: skip
    p0 = pre(1, 0, resume_step=1, steps_lost=1, detect_s=1.5, delete_s=2.25, reprovision_s=20.0, restore_s=5.0)
    p1 = pre(2, 1, resume_step=2, steps_lost=1, unsupervised=True, detect_s=3.0)
    return RunState("three", 0.0, 4, "done", 150.0, 4, incarnations=[i0, i1, i2], preemptions=[p0, p1])


def lost_before_first_record() -> RunState:
    """Slice 0: asked 0, ready 10 (tpu_init 10), no trainer record, ended 50: start-up runs to its
    end (40), not to the run's end; recovery from its ready time (the last sign of life) to slice 1
    ready at 80 takes what is left (50-80: 30). Slice 1: start-up 80-85, step 1 85-95, DONE 100."""
    i0 = inc(0, 0.0, 10.0, ended_at=50.0, end="preempted")
    i1 = inc(1, 60.0, 80.0, ended_at=100.0, end="done", kept_until=1, last_step=1,
             timeline=[["step", 1, 85.0, 95.0]])  # fmt: skip
    return RunState("early", 0.0, 1, "done", 100.0, 1, incarnations=[i0, i1], preemptions=[pre(1, 0)])


def lost_while_booting() -> RunState:
    """Slice 0 never became ready (asked 0, ended 30): no tpu_init, no start-up; its recovery runs
    from its request to slice 1 ready at 50. Slice 1 (asked 30): start-up 50-55, step 1 55-65,
    DONE 70 (other 5). Scheduling: slice 0 asked 30 held 0, slice 1 asked 20 held 20."""
    i0 = inc(0, 0.0, None, ended_at=30.0, end="preempted")
    i1 = inc(1, 30.0, 50.0, ended_at=70.0, end="done", kept_until=1, last_step=1,
             timeline=[["step", 1, 55.0, 65.0]])  # fmt: skip
    return RunState("boot", 0.0, 1, "done", 70.0, 1, incarnations=[i0, i1], preemptions=[pre(1, 0)])


def no_next_slice() -> RunState:
    """Preempted, then failed before a new slice was asked for: recovery runs from the last record
    (30) to the run's end (60). Asked 0, ready 10; step 1 (10-20) kept, step 2 (20-30) wasted."""
    i0 = inc(0, 0.0, 10.0, ended_at=35.0, end="preempted", kept_until=1, last_step=2,
             timeline=[["step", 1, 10.0, 20.0], ["step", 2, 20.0, 30.0]])  # fmt: skip
    return RunState("lost", 0.0, 5, "failed", 60.0, None, "no capacity anywhere", incarnations=[i0],
                    preemptions=[pre(1, 0)])  # fmt: skip


def odd_kinds() -> RunState:
    """Records the trainer may send that name no category: an unknown kind (`compile`, 12-15) and a
    `step` without a number (15-17) count as start-up, and the numberless step is never kept.
    Asked 0, ready 10; start-up 10-12 (ready → first record) and 12-17; step 1 17-27; DONE 30."""
    i0 = inc(0, 0.0, 10.0, ended_at=30.0, end="done", kept_until=1, last_step=1,
             timeline=[["compile", None, 12.0, 15.0], ["step", None, 15.0, 17.0], ["step", 1, 17.0, 27.0]])  # fmt: skip
    return RunState("odd", 0.0, 1, "done", 30.0, 1, incarnations=[i0])


def live_steps_not_kept_yet() -> RunState:
    """A running run at now=40: the live slice (kept_until unknown) made steps 1-2 at 10-30; until
    the supervisor knows which checkpoint holds, they count as wasted, never as productive."""
    i0 = inc(0, 0.0, 10.0, last_step=2, timeline=[["step", 1, 10.0, 20.0], ["step", 2, 20.0, 30.0]])
    return RunState("live", 0.0, 9, incarnations=[i0])


def fractional() -> RunState:
    """Started at 1000 (not 0), asked 1000, ready 1000.5; steps 1-2 of ~0.43 s from 1001 (both start
    in second 1001: two steps kept, not one); DONE at 1003.14159. Figures with a 4th decimal, so the
    stored rounding (3 places for seconds, 4 for ratios) shows."""
    i0 = inc(0, 1000.0, 1000.5, ended_at=1003.14159, end="done", kept_until=2, last_step=2,
             timeline=[["step", 1, 1001.0, 1001.4321], ["step", 2, 1001.4321, 1001.86419]])  # fmt: skip
    return RunState("frac", 1000.0, 2, "done", 1003.14159, 2, incarnations=[i0])


def zeros(**figures: float) -> dict[str, float]:
    return {**dict.fromkeys((G.PRODUCTIVE, *G.BADPUT), 0.0), **figures}


CASES: dict[str, tuple[Any, float, dict[str, float]]] = {
    "three slices, two preemptions": (three_slices, 999.0, zeros(
        productive=40.0, tpu_initialization=10.0, wasted_progress_from_disruption=20.0,
        infrastructure_recovery_from_disruption=52.0, checkpoint_restore=7.0, other=21.0)),
    "lost before the first record": (lost_before_first_record, 999.0, zeros(
        productive=10.0, tpu_initialization=10.0, program_startup=45.0,
        infrastructure_recovery_from_disruption=30.0, other=5.0)),
    "lost while booting": (lost_while_booting, 999.0, zeros(
        productive=10.0, program_startup=5.0, infrastructure_recovery_from_disruption=50.0, other=5.0)),
    "preempted, no next slice": (no_next_slice, 999.0, zeros(
        productive=10.0, tpu_initialization=10.0, wasted_progress_from_disruption=10.0,
        infrastructure_recovery_from_disruption=30.0)),
    "records of no category": (odd_kinds, 999.0, zeros(
        productive=10.0, tpu_initialization=10.0, program_startup=7.0, other=3.0)),
    "live steps not kept yet": (live_steps_not_kept_yet, 40.0, zeros(
        tpu_initialization=10.0, wasted_progress_from_disruption=20.0, other=10.0)),
    "started at 1000, sub-second steps": (fractional, 9999.0, zeros(
        productive=0.86419, tpu_initialization=0.5, program_startup=0.5, other=1.2774)),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_each_timeline_has_its_exact_figures(name: str) -> None:
    make, now, expected = CASES[name]
    report = G.GoodputReport.derive(make(), now=now)
    assert report.categories == pytest.approx(expected, abs=1e-9)
    assert report.wall_s == pytest.approx(sum(expected.values()), abs=1e-9)


def test_the_figures_around_the_categories() -> None:
    three = G.GoodputReport.derive(three_slices(), now=999.0)
    assert (three.wall_s, three.steps_kept, three.goodput) == (150.0, 4, pytest.approx(40.0 / 150.0))
    # asked 10 + 15 + 15, held 30 + 30 + 30
    assert three.scheduling_goodput == pytest.approx(90.0 / 130.0)
    boot = G.GoodputReport.derive(lost_while_booting(), now=999.0)
    assert boot.scheduling_goodput == pytest.approx(20.0 / 70.0)
    failed = G.GoodputReport.derive(no_next_slice(), now=999.0)
    assert (failed.outcome, failed.error, failed.final_step) == ("failed", "no capacity anywhere", None)
    assert G.GoodputReport.derive(odd_kinds(), now=999.0).steps_kept == 1  # the numberless step is not one
    assert G.GoodputReport.derive(live_steps_not_kept_yet(), now=40.0).steps_kept == 0
    frac = G.GoodputReport.derive(fractional(), now=9999.0)
    assert (frac.wall_s, frac.steps_kept) == (pytest.approx(3.14159), 2)


def test_a_run_measured_at_its_start_has_no_figures_and_no_scheduling_goodput() -> None:
    report = G.GoodputReport.derive(RunState("new", 5.0, 3), now=5.0)
    assert (report.wall_s, report.goodput, report.scheduling_goodput) == (0.0, 0.0, None)
    assert report.categories == zeros()
    doc = report.to_json()
    assert (doc["wall_s"], doc["goodput"], doc["scheduling_goodput"], doc["recoveries"]) == (0.0, 0.0, None, 0)


def test_a_run_of_under_a_second_still_has_scheduling_goodput() -> None:
    """Asked 0, ready 0.25, ended 0.75: held 0.5 of 0.75 s (a sum under 1 s is still a ratio)."""
    i0 = inc(0, 0.0, 0.25, ended_at=0.75, end="done", kept_until=0, last_step=0)
    report = G.GoodputReport.derive(RunState("tiny", 0.0, 0, "done", 0.75, 0, incarnations=[i0]), now=9.0)
    assert report.scheduling_goodput == pytest.approx(0.5 / 0.75)


def test_the_kept_rule_at_its_bounds() -> None:
    """A step is kept when resume < step ≤ kept_until; the step a slice resumed from belongs to the
    slice before, and a live slice (kept_until unknown) has kept nothing yet."""
    resumed = inc(1, 0.0, 1.0, resume_step=2, kept_until=4)
    assert [G._kept(resumed, s) for s in (2, 3, 4, 5)] == [False, True, True, False]
    live = inc(0, 0.0, 1.0)
    assert [G._kept(live, s) for s in (0, 1, 2)] == [False, False, False]


def test_the_stored_report_rounds_seconds_to_3_places_and_ratios_to_4() -> None:
    doc = G.GoodputReport.derive(fractional(), now=9999.0).to_json()
    figures = (doc["wall_s"], doc["productive_s"], doc["goodput"], doc["scheduling_goodput"])
    assert figures == (3.142, 0.864, 0.2751, 0.8408)
    badput = zeros(tpu_initialization=0.5, program_startup=0.5, other=1.277)
    del badput[G.PRODUCTIVE]
    assert doc["badput_s"] == badput
    assert [i["productive_s"] for i in doc["incarnations"]] == [0.864]
    assert doc["started_at"] == 1000.0


def test_three_slices_store_each_slice_and_each_preemption() -> None:
    doc = G.GoodputReport.derive(three_slices(), now=999.0).to_json()
    assert [i["productive_s"] for i in doc["incarnations"]] == [10.0, 10.0, 20.0]
    # detect 1.5 + delete 2.25 + re-provision 20 + restore 5; the second has not restored yet
    assert [p["overhead_s"] for p in doc["preemptions"]] == [28.75, None]
    assert doc["recoveries"] == 2


def test_rows_show_dashes_for_what_is_not_known_yet() -> None:
    rows = G.GoodputReport.derive(three_slices(), now=999.0).rows()
    assert rows == [
        {"#": 1, "reason": "spot preemption", "slice": "spot z r-a1", "steps lost": 1, "resumed from": 1,
         "detect (s)": "1.50", "delete (s)": "2.25", "re-provision (s)": "20.00", "restore (s)": "5.00",
         "overhead (s)": "28.75"},
        {"#": 2, "reason": "spot preemption (no supervisor running)", "slice": "spot z r-a2", "steps lost": 1,
         "resumed from": 2, "detect (s)": "3.00", "delete (s)": "0.00", "re-provision (s)": "0.00",
         "restore (s)": "-", "overhead (s)": "-"},
    ]  # fmt: skip
    bare = G.GoodputReport.derive(no_next_slice(), now=999.0).rows()[0]
    assert (bare["steps lost"], bare["resumed from"], bare["reason"]) == ("-", "-", "spot preemption")


def test_a_stored_report_read_back_has_every_figure() -> None:
    """``from_json`` of a stored report gives a report whose own figures are the stored ones (the
    export and the audit read them), and defaults for what an old report lacks."""
    doc = G.GoodputReport.derive(three_slices(), now=999.0, cost={"usd_total": 3.0}).to_json()
    doc["error"], doc["efficiency"] = "late", {"mfu": 0.5}
    back = G.GoodputReport.from_json(doc)
    assert (back.run_id, back.outcome, back.steps, back.final_step, back.started_at) == ("three", "done", 4, 4, 0.0)
    assert (back.wall_s, back.productive_s, back.steps_kept, back.scheduling_goodput) == (150.0, 40.0, 4, 0.6923)
    assert back.categories == {**doc["badput_s"], G.PRODUCTIVE: 40.0}
    assert (back.cost, back.error, back.efficiency) == ({"usd_total": 3.0}, "late", {"mfu": 0.5})
    assert back.goodput == pytest.approx(40.0 / 150.0)
    old = G.GoodputReport.from_json({"run_id": "old", "outcome": "done", "steps": 2, "started_at": 7.0})
    assert (old.final_step, old.started_at, old.wall_s, old.steps_kept) == (None, 7.0, 0.0, 0)
    assert old.categories == {G.PRODUCTIVE: 0.0}
    assert (old.scheduling_goodput, old.cost, old.error, old.efficiency) == (None, {}, "", {})
    older = G.GoodputReport.from_json({"run_id": "old", "outcome": "done", "steps": 2, "final_step": 2})
    assert (older.final_step, older.started_at) == (2, 0.0)


@pytest.mark.parametrize(
    ("wall", "productive", "raises"),
    [
        (1000.0, 1000.0 * (1 + 1e-9) + 1e-6, False),  # exactly at the allowance: not over
        (1.0, 1.0, False),  # equal is never over, however small the wall
        (1e6, 1e6 + 0.0005, False),  # within the relative allowance of a large wall
        (1e6, 1e6 + 0.002, True),
    ],
)
def test_productive_over_wall_is_refused_past_its_allowance(wall: float, productive: float, raises: bool) -> None:
    _refused_if(G.GoodputReport("r", "done", 1, 1, 0.0, wall, {G.PRODUCTIVE: productive}), raises, "productive")


def _refused_if(report: G.GoodputReport, raises: bool, match: str) -> None:
    """``report.check()`` refuses the report (naming ``match``) when ``raises``, else passes."""
    if raises:
        with pytest.raises(G.GoodputInvariantError, match=match):
            report.check()
    else:
        report.check()


@pytest.mark.parametrize(
    ("wall", "total", "raises"),
    [
        (100.0, 101.0, False),  # exactly 1% off: allowed
        (100.0, 100.5, False),
        (100.0, 101.5, True),
        (0.5, 0.6, True),  # a wall under a second is checked too
        (0.0, 5.0, False),  # no wall, no ratio to check against
    ],
)
def test_the_categories_must_add_up_to_the_wall_within_1_percent(wall: float, total: float, raises: bool) -> None:
    _refused_if(G.GoodputReport("r", "done", 1, 1, 0.0, wall, {G.OTHER: total}), raises, "add up")


def test_the_summary_line_has_the_cost_by_tier_and_nothing_after_it_without_efficiency() -> None:
    report = G.GoodputReport.derive(three_slices(), now=999.0, cost={"usd_by_tier": {"spot": 1.25, "on-demand": 2}})
    assert report.summary() == (
        "run three: done at step 4/4; wall 150.0s, productive 40.0s, goodput 26.7%; 2 preemption(s); "
        "cost by tier on-demand $2.0000, spot $1.2500 (total $0.0000)"
    )
    report.efficiency = {"mfu": 0.25}
    assert report.summary().endswith("(total $0.0000); MFU 25.00% of the slice bf16 peak")


def test_the_efficiency_line_of_a_toy_model() -> None:
    """MFU far under 0.01% keeps two significant figures; the slice's name when the trainer gave none."""
    line = G.efficiency_line({"mfu": 1.234e-5, "effective_mfu": 2.5e-6})
    assert line == "MFU 0.0012% of the slice bf16 peak (0.00025% over the wall time)"
    assert G.efficiency_line({"mfu": 9e-5}) == "MFU 0.009% of the slice bf16 peak"
    assert G.efficiency_line({"mfu": 0.5, "accelerator": "v5p-8"}) == "MFU 50.00% of the v5p-8 bf16 peak"
