"""Issue 30: deadline risk with recourse (a run is ranked again after every preemption, and on-demand is
always there to finish on), and the fleet view as the production ladder builds it (exact figures)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from three_rungs import OD, RES, SEEN, SPOT, A, B

from tpu_ops.provision import fleet, recourse
from tpu_ops.provision.choose import History, Rung, RunModel, expect, rank
from tpu_ops.provision.viewing import View, view_for

RUN = RunModel(3600, 1.0, 300, deadline_s=3600.0 + 1200.0)  # an hour of work, 20 minutes to spare


def test_one_worst_case_preemption_costs_a_checkpoint_a_recovery_and_an_obtain() -> None:
    spot = expect(SPOT, RUN, SEEN[SPOT.key])
    assert (spot.belief.obtain_s, spot.belief.recovery_s) == (pytest.approx(600.0 / 7), 300.0)  # the priors, shrunk
    later = recourse.after_one_preemption(spot, RUN)
    assert later == RunModel(3600, 1.0, 300, deadline_s=pytest.approx(4800.0 - 300.0 - 300.0 - 600.0 / 7))
    assert recourse.after_one_preemption(spot, RunModel(3600, 1.0, 300)) is None  # no deadline, nothing to keep
    assert recourse.never_short([spot, expect(OD, RUN, SEEN[OD.key])]).rung is OD  # type: ignore[union-attr]
    assert recourse.never_short([spot]) is None


def test_the_miss_probability_with_recourse_is_a_preemption_at_all_times_on_demand_missing_after_it() -> None:
    spot = expect(SPOT, RUN, SEEN[SPOT.key])
    assert spot.miss_probability == pytest.approx(0.016954387942596183, rel=1e-12)  # staying to the end
    preempted = -math.expm1(-spot.preemptions)
    assert preempted == pytest.approx(0.41273888708811435, rel=1e-12)
    # On-demand asked after one worst-case preemption on spot: 0.0057 (one of its rare preemptions).
    after = expect(OD, recourse.after_one_preemption(spot, RUN), SEEN[OD.key]).miss_probability  # type: ignore[arg-type]
    assert after == pytest.approx(0.005702050108198908, rel=1e-12)
    taken = rank([SPOT, OD], RUN, SEEN, max_miss=0.003)  # 0.0170 alone > 0.3% ≥ 0.41 x 0.0057 = 0.0024
    assert [(r.expectation.rung, r.eligible) for r in taken.ranked] == [(SPOT, True), (OD, True)]
    assert taken.ranked[0].expectation.miss_probability == pytest.approx(0.0023534578157786796, rel=1e-12)
    left = rank([SPOT, OD], RUN, SEEN, max_miss=0.002)
    assert [(r.expectation.rung, r.eligible) for r in left.ranked] == [(OD, True), (SPOT, False)]


def test_close_to_the_deadline_one_preemption_at_the_wrong_moment_is_a_miss() -> None:
    """614 s of slack: the average preemption (the rung's own figure) fits once, so staying on spot
    misses only on two (10.0%); the worst case (686 s) does not, so with recourse spot misses whenever
    it is preempted at all (41.3%)."""
    near = RunModel(3600, 1.0, 300, deadline_s=3600.0 + 700.0)
    assert expect(SPOT, near, SEEN[SPOT.key]).miss_probability == pytest.approx(0.1001481757414463, rel=1e-12)
    choice = rank([SPOT, OD], near, SEEN, max_miss=0.2)
    assert [(r.expectation.rung, r.eligible) for r in choice.ranked] == [(OD, True), (SPOT, False)]
    assert choice.ranked[1].expectation.miss_probability == pytest.approx(0.41273888708811435, rel=1e-12)


def test_no_recourse_without_on_demand_or_when_on_demand_itself_misses() -> None:
    alone = rank([SPOT], RUN, SEEN, max_miss=0.01)
    assert alone.ranked[0].eligible is False
    hopeless = RunModel(3600, 1.0, 300, deadline_s=3600.0)  # not even on-demand makes it
    exps = [expect(SPOT, hopeless, SEEN[SPOT.key]), expect(OD, hopeless, SEEN[OD.key])]
    assert recourse.relieve(exps, hopeless, SEEN, 0.1, expect) is exps
    long_checkpoints = RunModel(3600, 1.0, 1200, deadline_s=4800.0)  # a preemption loses up to 20 minutes
    assert [r.eligible for r in rank([SPOT, OD], long_checkpoints, SEEN).ranked] == [True, False]


def test_on_demand_goes_after_the_preemptible_rungs_it_is_tied_with() -> None:
    """Hour-long checkpoints: spot a is cheapest; spot b (4% dearer per kept step than on-demand, by
    its figure to the end) is tried before on-demand, since a preemption there may move the run to
    cheaper capacity freed meanwhile."""
    steady = Rung("v5p-8", A, "spot", "compute", 8.4, "", 1, 16.8)
    flaky = Rung("v5p-8", B, "spot", "compute", 13.0, "", 2, 16.8)
    seen = {steady.key: History(hours=100.0, preemptions=1, obtained=5), flaky.key: SEEN[SPOT.key],
            OD.key: SEEN[OD.key]}  # fmt: skip
    run = RunModel(7200, 1.0, 3600)
    e, o = expect(flaky, run, seen[flaky.key]), expect(OD, run, seen[OD.key])
    assert e.usd_per_step / o.usd_per_step == pytest.approx(1.043204780625503, rel=1e-12)
    assert [r.expectation.rung for r in rank([steady, OD, flaky], run, seen).ranked] == [steady, flaky, OD]
    dear = Rung("v5p-8", B, "spot", "compute", 14.0, "", 2, 16.8)  # 12% dearer: not a tie
    assert [r.expectation.rung for r in rank([steady, OD, dear], run, {**seen, dear.key: SEEN[SPOT.key]}).ranked] \
        == [steady, OD, dear]  # fmt: skip


# -- the fleet view, as ranking.apply builds it ----------------------------------------------------
class _Step:
    def __init__(self, number: int, tier: str, zone: str, reservation: str = "") -> None:
        self.number, self.tier, self.zone, self.reservation = number, tier, zone, reservation


STEPS = [_Step(1, "reservation", A, "projects/p/zones/us-east5-a/reservations/team-res"), _Step(2, "spot", B),
         _Step(3, "on-demand", B)]  # fmt: skip


def test_the_view_reads_the_reservation_by_zone_and_name_and_the_asks_from_the_summary() -> None:
    calls: list[tuple[str, str]] = []

    def read(zone: str, name: str) -> dict[str, object]:
        calls.append((zone, name))
        return {"specificReservation": {"count": "3", "inUseCount": "2"}}

    doc = {"runs": {"r2": {"ask": {"gain": 2.0, "at": 20.0}}, "r1": {"ask": {"gain": 1.0, "at": 10.0}}, "r3": {}}}
    assert view_for(STEPS, doc, read) == View({"team-res": 1}, (1.0, 2.0), {"team-res": 3})  # asks oldest first
    assert calls == [(A, "team-res")]
    assert view_for(STEPS, doc, None) is None  # no source (the Cloud TPU API): no view
    assert view_for(STEPS, doc, lambda z, n: None) is None  # no such reservation: no view
    assert view_for(STEPS[1:], doc, read) is None and len(calls) == 1  # no reservation rung: nothing read


def test_asks_keep_each_run_s_last_and_only_the_newest() -> None:
    runs = {f"r{i}": {"ask": fleet.ask(float(i), float(i))} for i in range(fleet.RECENT_ASKS + 5)}
    assert fleet.asks({"runs": runs}) == tuple(float(i) for i in range(5, fleet.RECENT_ASKS + 5))
    assert fleet.ask(float("inf"), 3.0) == {"gain": fleet.ENDLESS, "at": 3.0}  # JSON has no infinity
    assert fleet.asks({"runs": {"x": {"ask": {"gain": "1"}}}}) == ()


def test_two_runs_asking_for_the_last_vm_at_once_it_goes_to_the_one_that_gains_most() -> None:
    """Through the ranking as the ladder calls it: both asks are in the summary; the run with hour-long
    checkpoints (which loses most on spot) keeps the reservation first, the one with 5-minute ones
    leaves it to the other and tries spot first."""
    long_run, short_run = RunModel(7200, 1.0, 3600), RunModel(7200, 1.0, 300)
    gains = {n: fleet.gain(rank([RES, SPOT, OD], r, SEEN)) for n, r in (("long", long_run), ("short", short_run))}
    assert gains["long"] > gains["short"] > 0
    doc = {"runs": {n: {"ask": fleet.ask(g, float(i))} for i, (n, g) in enumerate(gains.items())}}
    view = view_for(STEPS, doc, lambda z, n: {"specificReservation": {"count": "3", "inUseCount": "2"}})
    from tpu_ops.provision.viewing import with_view

    first = {n: with_view(rank([RES, SPOT, OD], r, SEEN), view).ranked[0].expectation.rung  # type: ignore[arg-type]
             for n, r in (("long", long_run), ("short", short_run))}  # fmt: skip
    assert first == {"long": RES, "short": SPOT}
    assert fleet.allocate(1, [fleet.Claim("short", gains["short"], 0.0), fleet.Claim("long", gains["long"], 1.0)]) \
        == ["long"]  # fmt: skip


def test_patience_keeps_room_for_one_worst_case_preemption_after_the_wait() -> None:
    """A wait spends slack on the bet that a cheaper rung frees; on-demand must still finish after the
    wait *and* one worst-case preemption on the rung the wait may get (300 s checkpoint + 300 s
    recovery + 150 s obtain = 750 s), or the wait spends the slack recourse counts on."""
    seen = {SPOT.key: History(hours=10.0, obtained=2)}  # never preempted in 10 h: 0.145 expected
    run = RunModel(3600, 1.0, 300, deadline_s=10**6)
    spot = expect(SPOT, run, seen[SPOT.key])
    assert (spot.belief.obtain_s, spot.belief.recovery_s) == (150.0, 300.0)
    assert recourse.after_the_wait([spot], run) == 750.0
    assert recourse.after_the_wait([replace(spot, preemptions=0.0)], run) == 0.0  # never preempted: no margin
    assert recourse.after_the_wait([replace(spot, belief=replace(spot.belief, obtain_s=450.0)), spot], run) == 1050.0
    assert recourse.after_the_wait([], run) == 0.0
    # On-demand needs 300 s to obtain + 3600 s of work: the wait pays up to a deadline of
    # 3900 + 600 (the wait) + 750 (the margin) = 5250 s; without the margin it would up to 4500 s.
    def waits(deadline: float) -> bool:
        choice = rank([SPOT, OD], RunModel(3600, 1.0, 300, deadline_s=deadline), seen, wait_s=600.0)
        return (choice.try_now, choice.wait_s) == (1, 600.0)

    assert waits(5251.0) is True
    assert waits(5249.0) is False
    assert waits(4501.0) is False  # the boundary before the margin
    edge = rank([SPOT, OD], RunModel(3600, 1.0, 300, deadline_s=5249.0), seen, wait_s=600.0).ranked[0]
    assert edge.expectation.rung == SPOT and edge.eligible  # spot still first: only the wait changed


def test_a_tie_goes_ahead_of_every_on_demand_rung_not_only_the_never_short_one() -> None:
    """On-demand in three zones: a preemptible rung within 10% of the first of them per kept step is
    tried before all three (before the fix, only before the one picked as never short)."""
    run = RunModel(3600, 1.0, 300, deadline_s=10**6)
    zones = ((3, A), (4, B), (5, "us-east5-c"))
    ods = [expect(Rung("v5p-8", z, "on-demand", "compute", 16.8, "", n, 16.8), run, None) for n, z in zones]
    assert ods[0].usd_per_step == pytest.approx(16.8 * ods[0].held_s / 3600 / 3600, rel=1e-12)
    ods[0] = replace(ods[0], miss_probability=0.01)  # never short: zone b's, the second in the order
    assert recourse.never_short(ods) is ods[1]
    spot = expect(SPOT, run, SEEN[SPOT.key])
    tied = replace(spot, usd_per_step=ods[0].usd_per_step * 1.1)  # exactly at the tie
    assert recourse.on_demand_after_ties([*ods, tied], 0.1) == [tied, *ods]
    dear = replace(spot, usd_per_step=ods[0].usd_per_step * 1.1001)
    assert recourse.on_demand_after_ties([*ods, dear], 0.1) == [*ods, dear]
    steady = replace(tied, preemptions=ods[0].preemptions)  # no more preemptible than on-demand: stays
    assert recourse.on_demand_after_ties([*ods, steady], 0.1) == [*ods, steady]
    assert recourse.on_demand_after_ties([tied], 0.1) == [tied]  # no on-demand rung: as it was
