"""Issue 30: the fleet view and who gets the reservation, forgetting by default, patience that knows
its cost, and the ranking's own gaps (exact figures)."""

from __future__ import annotations

import math

import pytest
from three_rungs import OD, RES, SEEN, SPOT, A, B

from tpu_ops.provision import fleet, forgetting, recourse
from tpu_ops.provision.choose import (
    PRIOR_WEIGHT,
    Choice,
    History,
    Rung,
    RunModel,
    expect,
    poisson_cdf,
    rank,
    wait_pays,
)
from tpu_ops.provision.viewing import View, with_view


# -- the fleet view --------------------------------------------------------------------------------
def test_the_reservation_counts_come_from_compute_engine_s_own_document() -> None:
    """``count`` / ``inUseCount`` as the fake Compute Engine's ``reservations.get`` answers them (strings)."""
    from infra.local.compute.models import RESERVATION_KEY, ComputeBackend
    from infra.local.core.clock import ManualClock

    api = ComputeBackend(clock=ManualClock(start=1_790_000_000.0))
    api.configure_capacity({A: {"STANDARD": 24, "reservations": {"team-res": {"count": 3, "machineType":
                                                                                "ct5p-hightpu-4t"}}}})  # fmt: skip
    api.set_latency(provision_s=0.0, op_polls=0)
    body = {"name": "r1", "machineType": f"zones/{A}/machineTypes/ct5p-hightpu-4t",
            "scheduling": {"provisioningModel": "RESERVATION_BOUND", "onHostMaintenance": "TERMINATE"},
            "reservationAffinity": {"consumeReservationType": "SPECIFIC_RESERVATION", "key": RESERVATION_KEY,
                                    "values": ["team-res"]}}  # fmt: skip
    api.insert_instance("p", A, body)
    api.tick()
    read = lambda: api.get_reservation("p", A, "team-res")  # noqa: E731
    assert read()["specificReservation"]["inUseCount"] == "1"
    assert fleet.counts(read) == fleet.Counts(3, 1) and fleet.Counts(3, 1).free == 2
    assert fleet.counts(lambda: {"specificReservation": {"count": "x"}}) is None  # unusable: no view
    assert fleet.Counts(2, 5).free == 0


def test_who_holds_what_comes_from_run_state() -> None:
    live = {"incarnations": [{"zone": A, "tier": "spot", "ready_at": 1.0, "ended_at": 5.0},
                             {"zone": A, "tier": "reservation", "ready_at": 9.0}]}  # fmt: skip
    assert fleet.holding(live) == {"zone": A, "tier": "reservation", "since": 9.0}
    assert fleet.holding({"incarnations": [{"zone": A, "tier": "spot", "ready_at": 1.0, "ended_at": 2.0}]}) is None
    assert fleet.holding({"incarnations": [{"zone": A, "tier": "spot", "requested_at": 1.0}]}) is None
    assert fleet.holding({**live, "finished_at": 12.0}) is None and fleet.holding({**live, "wall_s": 3.0}) is None
    doc = {"runs": {"r2": {"holds": {"zone": A, "tier": "reservation"}}, "r1": {"holds": {"zone": A,
           "tier": "reservation"}}, "r3": {"holds": {"zone": B, "tier": "reservation"}}, "r4": {}}}  # fmt: skip
    assert fleet.holders(doc, A) == ["r1", "r2"]
    assert fleet.free_now(doc, A, 3) == 1 and fleet.free_now(doc, A, 2) == 0
    assert fleet.free_now(doc, A, 3, fleet.Counts(3, 3)) == 0  # the reservation's own count wins


def test_the_summary_entry_says_what_a_run_holds() -> None:
    from tpu_ops.provision.history import entry

    rec = {"incarnations": [{"zone": A, "tier": "reservation", "requested_at": 8.0, "ready_at": 9.0}]}
    assert entry(rec, {"accelerator_type": "v5p-8", "backend": "compute"}, now=3609.0)["holds"] == {
        "zone": A, "tier": "reservation", "since": 9.0}  # fmt: skip
    rec["incarnations"][0]["ended_at"] = 20.0
    assert "holds" not in entry(rec, None)


def _gain(run: RunModel) -> float:
    return fleet.gain(rank([RES, SPOT, OD], run, SEEN))


def test_two_runs_asking_at_once_the_reservation_goes_to_the_one_that_gains_most() -> None:
    """A 5-minute-checkpoint run loses little on spot, a 2-hour one much: with one VM free, the second
    gets it even though the first asked first."""
    short = RunModel(7200, 1.0, 300)
    long = RunModel(7200, 1.0, 7200)
    g_short, g_long = _gain(short), _gain(long)
    # The gain: $ per kept step on spot (the next-best rung) minus on the reservation (charged 0).
    assert g_short == pytest.approx(expect(SPOT, short, SEEN[SPOT.key]).usd_per_step, rel=1e-12)
    assert g_long == pytest.approx(expect(SPOT, long, SEEN[SPOT.key]).usd_per_step, rel=1e-12)
    # Exactly: rate (5 + 0.5 x 4) / (10 + 4) per hour, recovery 300 s, 2 h of work.
    lam = 0.5 / 3600
    for run, g in ((short, g_short), (long, g_long)):
        c = run.checkpoint_s
        p = -math.expm1(-lam * c)
        held = run.work_s / c * (p / lam + p * math.expm1(lam * (300 + c)) / lam)
        assert g == pytest.approx(held / 3600 * 8.4 / 7200, rel=1e-12)
    assert g_long > g_short
    claims = [fleet.Claim("short", g_short, asked_at=1.0), fleet.Claim("long", g_long, asked_at=2.0)]
    assert fleet.allocate(1, claims) == ["long"]
    assert fleet.allocate(2, claims) == ["long", "short"]
    assert fleet.allocate(0, claims) == []
    assert fleet.allocate(1, [fleet.Claim("a", 1.0, 2.0), fleet.Claim("b", 1.0, 1.0)]) == ["b"]  # a tie: first ask
    assert fleet.allocate(3, [fleet.Claim("nothing", 0.0)]) == []  # gains nothing: left free


def test_the_gain_leaves_out_the_history_s_scarcity_and_needs_two_eligible_rungs() -> None:
    full = {**SEEN, RES.key: History(hours=10.0, obtained=2, stockouts=6)}
    run = RunModel(7200, 1.0, 7200)
    choice = rank([RES, SPOT, OD], run, full)
    res = next(r.expectation for r in choice.ranked if r.expectation.rung is RES)
    assert res.scarcity_usd > 0  # the history says it is often full ...
    assert fleet.gain(choice) == pytest.approx(expect(SPOT, run, SEEN[SPOT.key]).usd_per_step, rel=1e-12)
    assert fleet.gain(rank([RES], run, SEEN)) == 0.0 and fleet.gain(rank([SPOT, OD], run, SEEN)) == 0.0


def test_the_last_free_vm_goes_only_to_a_run_gaining_the_median_or_more() -> None:
    assert fleet.admit(0.1, 2, [5.0, 6.0]) is True  # two free: anyone
    assert fleet.admit(0.1, 1, []) is True  # nothing to compare with
    assert fleet.admit(2.0, 1, [1.0, 2.0, 3.0]) is True  # the median itself
    assert fleet.admit(1.999, 1, [1.0, 2.0, 3.0]) is False
    assert fleet.admit(9.0, 0, []) is False and fleet.admit(0.0, 3, []) is False
    assert fleet.admit(1.0, 1, [0.0] * 60 + [5.0] * 50) is False  # only the last RECENT_ASKS count


def test_the_view_moves_a_reservation_this_run_should_leave() -> None:
    run = RunModel(7200, 1.0, 300)
    choice = rank([RES, SPOT, OD], run, SEEN)
    assert choice.ranked[0].expectation.rung is RES
    kept = with_view(choice, View({"team-res": 2}))
    assert [r.expectation.rung for r in kept.ranked] == [RES, SPOT, OD] and "2 reservation VM(s) free" in kept.note
    full = with_view(choice, View({"team-res": 0}))
    assert [r.expectation.rung for r in full.ranked] == [SPOT, OD, RES]
    assert [r.position for r in full.ranked] == [1, 2, 3] and full.ranked[2].why.startswith("full now")
    g = fleet.gain(choice)
    left = with_view(choice, View({"team-res": 1}, (g * 2, g * 3)))
    assert left.ranked[2].expectation.rung is RES and "left to a run that gains more" in left.ranked[2].why
    assert with_view(choice, View({})) is choice  # no view of this reservation: unchanged
    # With patience the reservation stays among the rungs tried before waiting (last of them).
    patient = rank([RES, SPOT, OD], RunModel(7200, 1.0, 300, deadline_s=6 * 3600.0), SEEN, wait_s=600.0)
    assert patient.try_now == 2 and [r.expectation.rung for r in patient.ranked] == [RES, SPOT, OD]
    waits = with_view(patient, View({"team-res": 0}))
    assert waits.try_now == 2 and waits.wait_s == 600.0
    assert [r.expectation.rung for r in waits.ranked] == [SPOT, RES, OD]


def test_a_run_queues_for_a_full_reservation_only_while_the_wait_costs_time_not_money() -> None:
    """``fleet.queue``: a walk waits ``choose.queue`` for a full reservation when a freed VM would go to it and
    the wait leaves it ample slack (half its work + 1 h) and its best other rung no dearer; each guard alone
    turns it off (issue 30, ninth look)."""
    from dataclasses import replace

    view = View({"team-res": 0}, (), {"team-res": 3})

    def ranked(deadline_s: float | None, rungs: list[Rung] | None = None) -> tuple[RunModel, Choice, Choice]:
        run = RunModel(7200, 1.0, 300, deadline_s=deadline_s)
        later = replace(run, deadline_s=None if deadline_s is None else deadline_s - 600.0)
        now = with_view(rank([RES, SPOT, OD], run, SEEN), view)
        return run, now, with_view(rank(rungs or [RES, SPOT, OD], later, SEEN), view)

    run, now, later = ranked(15000.0)  # 15000 - 600 - 7200 = 7200 s of slack left = 0.5 x 7200 + 3600
    assert fleet.best_other(now) == fleet.best_other(later) == expect(SPOT, run, SEEN[SPOT.key]).usd_per_step
    why = fleet.queue(now, lambda: later, 0, 3, (), run, 600.0)
    assert why is not None and "2.0 h of slack left after the wait" in why
    short, now_s, later_s = ranked(14999.0)
    assert fleet.queue(now_s, lambda: later_s, 0, 3, (), short, 600.0) is None  # one second short
    assert fleet.queue(now, lambda: later, 0, 3, (), run, 601.0) is None  # a longer wait leaves less
    assert fleet.queue(now, lambda: later, 1, 3, (), run, 600.0) is None  # a VM is free: take it now

    def unranked() -> Choice:
        raise AssertionError("ranked again although a cheaper guard already said no")

    assert fleet.queue(now, unranked, 1, 3, (), run, 600.0) is None  # the second ranking only when it can decide
    assert fleet.queue(now, lambda: later, 0, 0, (), run, 600.0) is None  # no VM at all: none ever frees
    g = fleet.gain(now)
    assert fleet.queue(now, lambda: later, 0, 3, (g, g * 2, g * 3), run, 600.0) is None  # a freed VM goes to others
    assert fleet.queue(now, lambda: later, 0, 3, (g / 2, g, g * 3), run, 600.0) is not None  # the median itself
    # The wait would cost it its cheaper rung (here: only on-demand is left later): not worth it.
    run, now, dearer = ranked(15000.0, [RES, OD])
    assert fleet.best_other(dearer) > fleet.best_other(now)
    assert fleet.queue(now, lambda: dearer, 0, 3, (), run, 600.0) is None
    run, now, later = ranked(None)
    assert fleet.queue(now, lambda: later, 0, 3, (), run, 600.0) is None  # no deadline: no slack to measure


# -- forgetting ------------------------------------------------------------------------------------
def test_the_poisson_interval() -> None:
    assert forgetting.interval(2.0) == (0, 6)  # P(X ≤ 5) = 0.9834 < 0.995 ≤ P(X ≤ 6) = 0.9955
    lo, hi = forgetting.interval(20.0)
    assert poisson_cdf(lo - 1, 20.0) <= 0.005 < poisson_cdf(lo, 20.0)
    assert poisson_cdf(hi - 1, 20.0) < 0.995 <= poisson_cdf(hi, 20.0)
    assert (lo, hi) == (10, 32)


def test_a_rate_well_outside_its_interval_resets_the_rung() -> None:
    old = History(hours=10.0, preemptions=1)  # believed (1 + 0.5 x 4) / 14 = 3/14 per hour
    assert forgetting.changed("spot", old, History(hours=3.0, preemptions=3)) is None  # 0-3 expected
    c = forgetting.changed("spot", old, History(hours=3.0, preemptions=4))
    assert c is not None and c.interval == (0, 3) and c.old_rate_per_hour == pytest.approx(3 / 14, rel=1e-12)
    assert c.to_json() == {"old_rate_per_hour": 0.214286, "recent_hours": 3.0, "recent_preemptions": 4,
                           "expected_interval": [0, 3]}  # fmt: skip
    assert forgetting.changed("spot", History(hours=1.9), History(hours=3.0, preemptions=9)) is None  # too little old
    assert forgetting.changed("spot", old, History(hours=0.9, preemptions=9)) is None  # too little recent


def test_weighing_forgets_by_default_and_drops_a_changed_rung_s_past() -> None:
    day = 24 * 3600.0
    k, other = ("v5p-8", A, "spot", "compute"), ("v5p-8", B, "spot", "compute")
    entries = [  # entries that list no observation by time (summaries written before they did)
        forgetting.Entry(0.0, {k: History(hours=10.0, preemptions=1), other: History(hours=4.0, preemptions=2)}),
        forgetting.Entry(day, {k: History(hours=3.0, preemptions=4), other: History(hours=2.0, preemptions=1)}),
        forgetting.Entry(None, {other: History(hours=1.0)}),  # no time to age it by: counts whole
    ]
    got, changes = forgetting.weigh(entries, now=5 * day)  # age from the newest evidence (day 1), not now
    assert list(changes) == [k]
    assert got[k] == History(hours=3.0, preemptions=4)  # the old 10 h dropped; the recent one unweighted
    assert got[other].hours == pytest.approx(4.0 * 0.5 + 2.0 + 1.0, rel=1e-12)  # a day old: half
    assert got[other].preemptions == pytest.approx(2 * 0.5 + 1, rel=1e-12)
    explicit, _ = forgetting.weigh(entries, now=2 * day, half_life_s=day)  # choose.half_life: age from now
    assert explicit[other].hours == pytest.approx(4.0 * 0.25 + 2.0 * 0.5 + 1.0, rel=1e-12)
    doc = {"runs": {"r1": {"seen": 5.0, "sums": [[*k, 1, 2, 3, 4, 5, 6, 7, 8]]}, "r2": {"sums": []}}}
    assert forgetting.summary_entries(doc) == [
        forgetting.Entry(5.0, {k: History(1, 2, 3, 4, 5, 6, 7, 8)}),
        forgetting.Entry(None, {}),
    ]


# -- patience that knows its cost ------------------------------------------------------------------
def test_waiting_pays_only_when_the_saving_beats_the_deadline_risk() -> None:
    run = RunModel(3600, 1.0, 300, deadline_s=3 * 3600.0)
    spot_h = History(hours=10.0, preemptions=1, obtained=3, stockouts=3)  # full = 3 / (3 + 3 + 2)
    cheap, od = expect(SPOT, run, spot_h), expect(OD, run, SEEN[OD.key])
    assert cheap.belief.full == pytest.approx(3 / 8, rel=1e-12)
    saving = (1 - 3 / 8) * (od.usd_per_step - cheap.usd_per_step) * 3600
    # risk = (miss later - miss now) x the run at on-demand: the break-even miss probability added
    edge = od.miss_probability + saving / od.usd
    assert wait_pays([cheap], od, edge * 0.999, 3600) is True
    assert wait_pays([cheap], od, edge * 1.001, 3600) is False
    assert wait_pays([cheap], od, 0.0, 3600) is True
    # The best of the cheaper rungs counts: a reservation always full adds nothing, takes nothing away.
    always_full = expect(RES, run, History(obtained=0, stockouts=1e9))
    assert wait_pays([always_full, cheap], od, edge * 0.999, 3600) is True
    assert wait_pays([always_full, cheap], od, edge * 1.001, 3600) is False


def test_the_wait_decision_reads_on_demand_s_history() -> None:
    """On-demand seen preempted often (host maintenance) makes the wait dear; its prior alone would not."""
    # 2500 s of slack: the wait (600 s) and one worst-case preemption on spot after it (750 s) still
    # leave on-demand (300 s to obtain) room to finish (see test_recourse's patience test).
    run = RunModel(3600, 1.0, 300, deadline_s=3600.0 + 2500.0)
    calm = rank([SPOT, OD], run, {SPOT.key: History(hours=10.0, obtained=2)}, wait_s=600.0)
    assert calm.try_now == 1 and calm.wait_s == 600.0
    shaky = {SPOT.key: History(hours=10.0, obtained=2), OD.key: History(hours=4.0, preemptions=4, obtained=2)}
    assert rank([SPOT, OD], run, shaky, wait_s=600.0).try_now is None


# -- the ranking's own gaps (mutation testing) -----------------------------------------------------
def test_a_rung_without_expected_preemptions_and_a_deadline_does_not_divide_by_zero() -> None:
    e = expect(SPOT, RunModel(0, 2.0, 10, deadline_s=3600.0), History())
    assert (e.preemptions, e.held_s, e.miss_probability, e.usd_per_step) == (0.0, 0.0, 0.0, 0.0)


def test_without_history_the_deadline_flag_still_says_who_makes_it() -> None:
    run = RunModel(3600, 1.0, 3600, deadline_s=3600.0 + 400.0)  # 400 s of slack: spot's prior misses
    choice = rank([SPOT, OD], run, {})
    assert choice.method == "written-order"
    assert [(r.expectation.rung, r.eligible) for r in choice.ranked] == [(SPOT, False), (OD, True)]
    assert [r.expectation.miss_probability > 0.1 for r in choice.ranked] == [True, False]


def test_the_plan_carries_obtain_recovery_wait_and_eligibility() -> None:
    h = History(hours=5.0, obtained=2, obtain_s_total=200.0, recoveries=1, recovery_s_total=100.0)
    run = RunModel(3600, 1.0, 300, deadline_s=3 * 3600.0)
    doc = rank([SPOT, OD], run, {SPOT.key: h}, wait_s=600.0).to_json()
    spot = next(r for r in doc["rungs"] if r["tier"] == "spot")
    assert spot["obtain_s"] == (200.0 + 300.0 * PRIOR_WEIGHT) / (2 + PRIOR_WEIGHT) == 200.0
    assert spot["recovery_s"] == round((100.0 + 300.0 * PRIOR_WEIGHT) / (1 + PRIOR_WEIGHT), 3) == 233.333
    assert spot["eligible"] is True and doc["wait_s"] == 600.0 and doc["try_now"] == 1
    late = rank([SPOT, OD], RunModel(3600, 1.0, 3600, deadline_s=4000.0), {SPOT.key: h}).to_json()
    assert [(r["tier"], r["eligible"]) for r in late["rungs"]] == [("on-demand", True), ("spot", False)]
    assert late["wait_s"] is None and late["try_now"] is None


def test_a_reservation_free_now_is_not_charged_for_the_scarcity_the_history_remembers() -> None:
    from tpu_ops.provision.viewing import free_is_free

    hist = {**SEEN, RES.key: History(hours=10.0, obtained=2, stockouts=6)}
    run = RunModel(7200, 1.0, 300)

    def res_scarcity(h: dict[tuple[str, str, str, str], History]) -> float:
        return next(
            r.expectation.scarcity_usd for r in rank([RES, SPOT, OD], run, h).ranked if r.expectation.rung is RES
        )

    assert res_scarcity(hist) == pytest.approx(2.0 * 16.8 * 6 / 10, rel=1e-2)  # ~2 h held x 6/10 full x 16.8
    free = free_is_free([RES, SPOT, OD], hist, View({"team-res": 1}))
    assert free[RES.key] == History(hours=10.0, obtained=2) and free[SPOT.key] is hist[SPOT.key]
    assert res_scarcity(free) == 0.0
    assert free_is_free([RES, SPOT, OD], hist, View({"team-res": 0})) == hist  # full now: the history stands
    assert free_is_free([RES, SPOT, OD], hist, View({})) == hist  # no view of it


# -- what mutation testing of choose.py left (issue 30) --------------------------------------------
def test_without_history_positions_and_note_are_the_written_order_s() -> None:
    choice = rank([OD, SPOT], RunModel(3600, 1.0, 300), {})
    assert [(r.position, r.expectation.rung) for r in choice.ranked] == [(1, SPOT), (2, OD)]  # by `order`
    assert choice.note == "no history for any rung: keeping the written order (run once to record some)"


def test_a_miss_probability_equal_to_max_miss_is_eligible() -> None:
    # Spot alone: no on-demand to finish on, so its own figure (no recourse, tests/choose/test_recourse.py).
    run = RunModel(3600, 1.0, 300, deadline_s=3600.0 + 1200.0)
    m = expect(SPOT, run, SEEN[SPOT.key]).miss_probability
    assert 0 < m < 1
    at = rank([SPOT], run, SEEN, max_miss=m)
    assert len(at.ranked) == 1 and all(r.eligible for r in at.ranked)
    m0 = expect(SPOT, run).miss_probability  # no history: the prior's figure, the same rule
    assert rank([SPOT], run, {}, max_miss=m0).ranked[0].eligible is True
    assert rank([SPOT], run, {}, max_miss=m0 * 0.999).ranked[0].eligible is False
    below = rank([SPOT, RES], run, SEEN, max_miss=m * 0.999)
    assert [(r.expectation.rung, r.eligible) for r in below.ranked] == [(RES, True), (SPOT, False)]


def test_the_notes_say_the_deadline_and_the_wait() -> None:
    run = RunModel(3600, 1.0, 300, deadline_s=5400.0)
    assert rank([SPOT, OD], run, SEEN).note == (
        "ranked by expected $ per kept step over 3600 steps, deadline in 1.50 h at P(miss) ≤ 10%"
    )
    assert ", deadline in 18.01 h at" in rank([SPOT, OD], RunModel(3600, 1.0, 300, deadline_s=18.006 * 3600), SEEN).note
    hopeless = rank([SPOT, OD], RunModel(3600, 1.0, 300, deadline_s=3000.0), SEEN)
    assert hopeless.note == ("ranked by expected $ per kept step over 3600 steps, deadline in 0.83 h at P(miss) ≤ 10%"
                             "; no rung is expected to make it, so the least likely to miss goes first")  # fmt: skip
    patient = rank([RES, SPOT, OD], RunModel(3600, 1.0, 300, deadline_s=6 * 3600.0), SEEN, wait_s=600.0)
    assert patient.note == ("ranked by expected $ per kept step over 3600 steps, deadline in 6.00 h at P(miss) ≤ 10%"
                            "; if the first 2 are refused, wait 600 s and ask again: on-demand would still make the "
                            "deadline then")  # fmt: skip


def test_patience_needs_an_on_demand_rung_and_finds_it_at_any_price() -> None:
    run = RunModel(3600, 1.0, 300, deadline_s=6 * 3600.0)
    assert rank([RES, SPOT], run, SEEN, wait_s=600.0).try_now is None  # nothing never-short: no waiting
    cheap_spot = Rung("v5e-1", B, "spot", "compute", 0.25, "", 2, 0.5)
    cheap_od = Rung("v5e-1", B, "on-demand", "compute", 0.5, "", 3, 0.5)
    seen = {cheap_spot.key: History(hours=10.0, obtained=5), cheap_od.key: History(hours=10.0, obtained=5)}
    assert rank([cheap_spot, cheap_od], run, seen, wait_s=600.0).try_now == 1  # on-demand at $0.50/h
    # A rung without a fallback price (no scarcity charge) is not taken for the never-short one.
    res_plain = Rung("v5p-8", A, "reservation", "compute", 0.0, "team-res", 1, 0.0)
    assert rank([res_plain, SPOT, OD], run, SEEN, wait_s=600.0).try_now == 2


def test_patience_skips_a_rung_cheaper_by_the_hour_but_not_per_kept_step() -> None:
    run = RunModel(3600, 1.0, 3600, deadline_s=36000.0)
    flaky = {SPOT.key: History(hours=1.0, preemptions=6), OD.key: History(hours=10.0, obtained=5)}
    assert expect(SPOT, run, flaky[SPOT.key]).usd_per_step > 1.3 * expect(OD, run, flaky[OD.key]).usd_per_step
    assert rank([SPOT, OD], run, flaky, wait_s=600.0).try_now is None
    # Beside a reservation worth waiting for, the flaky spot is not among the rungs tried before waiting.
    with_res = {**flaky, RES.key: History(hours=10.0, obtained=5)}
    patient = rank([RES, SPOT, OD], run, with_res, wait_s=600.0)
    assert patient.try_now == 1 and patient.ranked[0].expectation.rung is RES


def test_patience_at_the_boundaries_of_the_deadline_and_of_its_worth() -> None:
    # On-demand is judged 600 s (the wait) + 634 s later: one worst-case preemption of the reservation
    # (its prior's rare host maintenance) after the wait: 300 s checkpoint + 300 s recovery + 34 s obtain.
    run0 = RunModel(3600, 1.0, 300)
    margin = recourse.after_the_wait([expect(RES, run0, SEEN[RES.key])], run0)
    assert margin == pytest.approx(300.0 + 300.0 + 240.0 / 7, rel=1e-12)
    run = RunModel(3600, 1.0, 300, deadline_s=3600.0 + 1200.0 + margin)
    later = RunModel(3600, 1.0, 300, deadline_s=3600.0 + 600.0)
    m = expect(OD, later, SEEN[OD.key]).miss_probability
    assert rank([RES, OD], run, SEEN, max_miss=m, wait_s=600.0).try_now == 1  # on-demand later misses at max_miss
    assert rank([RES, OD], run, SEEN, max_miss=m * 0.999, wait_s=600.0).try_now is None
    # A reservation nearly always full: tied with on-demand per step, but the wait is not worth its risk.
    full = {**SEEN, RES.key: History(hours=10.0, obtained=2, stockouts=100)}
    assert rank([RES, OD], run, full, max_miss=0.1, wait_s=600.0).try_now is None
    res, od = expect(RES, run, full[RES.key]), expect(OD, run, SEEN[OD.key])
    assert res.usd_per_step <= od.usd_per_step * 1.1 and not wait_pays([res], od, m, 3600)


def test_the_wait_s_risk_is_the_miss_probability_it_adds() -> None:
    from dataclasses import replace

    run = RunModel(3600, 1.0, 300, deadline_s=3 * 3600.0)
    cheap = expect(SPOT, run, History(hours=10.0, obtained=2, stockouts=40))
    od = replace(expect(OD, run, SEEN[OD.key]), miss_probability=0.05)
    s_per_usd = (1 - cheap.belief.full) * (od.usd_per_step - cheap.usd_per_step) * 3600 / od.usd
    assert 0 < s_per_usd < 0.2
    assert wait_pays([cheap], od, 0.05 + 0.9 * s_per_usd, 3600) is True  # adds 0.9 of the break-even
    assert wait_pays([cheap], od, 0.05 + 1.1 * s_per_usd, 3600) is False


def test_two_free_rungs_tie_at_zero_and_the_flakier_goes_first() -> None:
    res_b = Rung("v5p-8", B, "reservation", "compute", 0.0, "other-res", 2, 16.8)
    hist = {RES.key: History(hours=10.0, obtained=5), res_b.key: History(hours=10.0, preemptions=3, obtained=5)}
    ranked = rank([RES, res_b], RunModel(3600, 1.0, 300), hist).ranked
    assert [r.expectation.rung for r in ranked] == [res_b, RES]
    assert ranked[0].why.startswith("within 10% of the cheapest per kept step")
