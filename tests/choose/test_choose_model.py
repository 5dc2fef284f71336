"""Exact figures for the expected-cost model (tpu_ops/provision/choose.py).

Every expected value is written out from the model's formulas by hand, so a changed constant or
operator in the module moves at least one asserted figure.
"""

from __future__ import annotations

import math

import pytest

from tpu_ops.provision import choose as C
from tpu_ops.provision.choose import (
    Belief,
    History,
    Rung,
    RunModel,
    believe,
    expect,
    held_time,
    poisson_cdf,
    rank,
)
from tpu_ops.provision.ranking import plan_rows

EXACT = {"rel": 1e-12, "abs": 1e-12}

# 1000 steps of 3.6 s = one hour of work; a checkpoint every 100 steps = every 360 s.
RUN = RunModel(steps=1000, seconds_per_step=3.6, checkpoint_every=100)
SPOT = Rung("v5p-32", "us-east5-a", "spot", "compute", 96.0, order=1)
# 36 h seen, 16 preemptions; 8 slices obtained in 2400 s; 8 recoveries in 800 s; 400 steps lost.
SEEN = History(hours=36.0, preemptions=16, obtained=8, obtain_s_total=2400.0, recoveries=8,
               recovery_s_total=800.0, steps_lost_total=400)  # fmt: skip


def test_priors_and_weights_are_the_documented_ones() -> None:
    assert C.PRIOR_HOURS == 4.0 and C.PRIOR_WEIGHT == 2.0 and C.TIE == 0.1
    assert believe("spot", History()) == Belief(0.5, 300.0, 300.0, None, 0.0)
    assert believe("on-demand", History()) == Belief(0.02, 300.0, 300.0, None, 0.0)
    assert believe("reservation", History()) == Belief(0.01, 120.0, 300.0, None, 0.0)
    assert believe("flex-start", History()) == Belief(0.01, 1800.0, 300.0, None, 0.0)
    assert believe("something-new", History()) == Belief(0.5, 600.0, 300.0, None, 0.0)


def test_history_is_shrunk_towards_the_prior() -> None:
    b = believe("spot", SEEN)
    assert b.rate_per_hour == pytest.approx((16 + 0.5 * 4) / (36 + 4), **EXACT)  # 0.45
    assert b.rate_per_hour == pytest.approx(0.45, **EXACT)
    assert b.obtain_s == pytest.approx((2400 + 300 * 2) / (8 + 2), **EXACT)  # 300
    assert b.recovery_s == pytest.approx((800 + 300 * 2) / (8 + 2), **EXACT)  # 140
    assert b.recovery_s == pytest.approx(140.0, **EXACT)
    assert b.steps_lost == 25.0 and b.hours == 36.0
    # A long history outweighs the prior: 1000 h, 100 preemptions -> (100 + 2) / 1004.
    assert believe("spot", History(hours=1000.0, preemptions=100)).rate_per_hour == pytest.approx(102 / 1004, **EXACT)


def ref(work: float, c: float, lam: float, r: float) -> tuple[float, float]:
    """The segment model written out independently: (held seconds, preemptions)."""
    k = work / c
    p = 1 - math.exp(-lam * c)  # a segment is hit
    retry = (math.exp(lam * (r + c)) - 1) / lam  # held time of a retry that needs r + c
    return k * (p / lam + p * retry), k * p * math.exp(lam * (r + c))


def test_expectation_with_history() -> None:
    e = expect(SPOT, RUN, SEEN)
    # λ = 0.45/h = 0.000125/s; 10 segments of 360 s; 140 s recovery; 300 s to obtain.
    held, n = ref(3600, 360, 0.000125, 140)
    assert e.held_s == pytest.approx(held, **EXACT)
    assert e.held_s == pytest.approx(3747.2349413678, rel=1e-12)
    assert e.preemptions == pytest.approx(n, **EXACT)
    assert e.preemptions == pytest.approx(0.4684043676710, rel=1e-12)
    assert e.wall_s == pytest.approx(300 + held + n * 300, **EXACT)
    assert e.usd == pytest.approx(held / 3600 * 96, **EXACT)
    assert e.usd_per_step == pytest.approx(held / 3600 * 96 / 1000, **EXACT)
    assert e.miss_probability == 0.0  # no deadline


def test_expectation_from_the_prior_alone() -> None:
    e = expect(SPOT, RUN)
    held, n = ref(3600, 360, 0.5 / 3600, 300)
    assert e.held_s == pytest.approx(held, **EXACT)
    assert e.preemptions == pytest.approx(n, **EXACT)
    assert e.wall_s == pytest.approx(300 + held + n * 300, **EXACT)
    assert e.usd_per_step == pytest.approx(held / 3600 * 96 / 1000, **EXACT)


def test_steps_lost_are_shown_not_priced() -> None:
    worse = History(hours=36.0, preemptions=16, steps_lost_total=1600)  # 100 steps each
    e = expect(SPOT, RUN, worse)
    assert e.belief.steps_lost == 100.0
    assert e.held_s == pytest.approx(ref(3600, 360, 18 / 40 / 3600, 300)[0], **EXACT)


def test_edges_of_the_segment_model() -> None:
    # never preempted: exactly the work, no preemption
    assert held_time(3600.0, 360.0, 0.0, 300.0) == (3600.0, 0.0)
    # a trainer that saves on the notice (c = 0): W e^{λr}, λ W e^{λr}
    held, n = held_time(3600.0, 0.0, 0.001, 300.0)
    assert held == pytest.approx(3600 * math.exp(0.3), **EXACT)
    assert n == pytest.approx(0.001 * 3600 * math.exp(0.3), **EXACT)
    # a checkpoint every 5000 steps (18000 s) on the spot prior: ruinous, not merely worse
    e = expect(SPOT, RunModel(1000, 3.6, 5000))
    assert e.held_s == pytest.approx(ref(3600, 18000, 0.5 / 3600, 300)[0], **EXACT)
    assert e.usd_per_step > 4 * expect(SPOT, RUN).usd_per_step
    # beyond floating point: never finishes
    inf = expect(SPOT, RunModel(1000, 3.6, 10**7, deadline_s=1e12))
    assert math.isinf(inf.held_s) and math.isinf(inf.usd_per_step) and math.isinf(inf.wall_s)
    assert math.isinf(inf.preemptions) and math.isinf(inf.usd) and inf.miss_probability == 1.0


def test_deadline_miss_probability() -> None:
    e = expect(SPOT, RunModel(1000, 3.6, 100, deadline_s=4600.0), SEEN)
    held, n = ref(3600, 360, 0.000125, 140)
    per = (held - 3600) / n + 300  # 614.33 s of wall time per preemption
    assert per == pytest.approx(614.332981350914, rel=1e-12)
    # slack = 4600 - 300 - 3600 = 700 s: one preemption allowed
    assert e.miss_probability == pytest.approx(1 - math.exp(-n) * (1 + n), **EXACT)
    assert e.miss_probability == pytest.approx(0.0807784, abs=1e-7)
    two = expect(SPOT, RunModel(1000, 3.6, 100, deadline_s=3900 + 2 * per + 0.01), SEEN)
    assert two.miss_probability == pytest.approx(1 - math.exp(-n) * (1 + n + n * n / 2), **EXACT)
    one = expect(SPOT, RunModel(1000, 3.6, 100, deadline_s=3900 + 2 * per - 0.01), SEEN)
    assert one.miss_probability == pytest.approx(e.miss_probability, **EXACT)
    # no slack at all: exactly enough for a run without preemptions
    assert expect(SPOT, RunModel(1000, 3.6, 100, deadline_s=3900.0), SEEN).miss_probability == pytest.approx(
        1 - math.exp(-n), **EXACT
    )
    assert expect(SPOT, RunModel(1000, 3.6, 100, deadline_s=3899.0), SEEN).miss_probability == 1.0
    # a rung never preempted meets any deadline it has the slack for
    od = Rung("v5p-32", "us-east5-a", "on-demand", "compute", 192.0)
    never = History(hours=1e9)
    assert expect(od, RunModel(1000, 3.6, 100, deadline_s=3900.0), never).miss_probability == pytest.approx(
        1 - math.exp(-ref(3600, 360, 0.08 / (1e9 + 4) / 3600, 300)[1]), rel=1e-6
    )


def test_poisson_cdf() -> None:
    assert poisson_cdf(0, 1.0) == pytest.approx(math.exp(-1), **EXACT)
    assert poisson_cdf(2, 2.0) == pytest.approx(5 * math.exp(-2), **EXACT)
    assert poisson_cdf(3, 2.0) == pytest.approx((1 + 2 + 2 + 8 / 6) * math.exp(-2), **EXACT)
    assert poisson_cdf(-1, 2.0) == 0.0
    assert poisson_cdf(0, 0.0) == 1.0
    assert poisson_cdf(500, 3.0) == 1.0


def test_history_merges_by_sum() -> None:
    a = History(1.0, 2, 3, 4.0, 5, 6.0, 7)
    assert a.merged(History(10.0, 20, 30, 40.0, 50, 60.0, 70)) == History(11.0, 22, 33, 44.0, 55, 66.0, 77)
    assert History().empty and not History(obtained=1).empty and not History(hours=0.5).empty
    assert not History(preemptions=1).empty


# -- ranking ---------------------------------------------------------------------------------

FLAKY = Rung("v5p-32", "us-east5-b", "spot", "compute", 96.0, order=1)
STEADY = Rung("v5p-32", "us-east5-a", "spot", "compute", 96.0, order=2)
OD = Rung("v5p-32", "us-east5-a", "on-demand", "compute", 192.0, order=3)


def test_without_history_the_written_order_stands_and_says_so() -> None:
    c = rank([OD, FLAKY, STEADY], RUN, {})
    assert c.method == "written-order"
    assert [r.expectation.rung for r in c.ranked] == [FLAKY, STEADY, OD]
    assert "keeping the written order" in c.note
    assert all(r.why == "written order (no history yet)" for r in c.ranked)


def test_ranking_by_cost_per_kept_step() -> None:
    hist = {FLAKY.key: History(hours=10.0, preemptions=96), STEADY.key: History(hours=100.0, preemptions=0)}
    c = rank([FLAKY, STEADY, OD], RUN, hist)
    assert c.method == "cost"
    assert [r.expectation.rung for r in c.ranked] == [STEADY, OD, FLAKY]
    assert [r.position for r in c.ranked] == [1, 2, 3]
    assert c.ranked[0].why == "cheapest per kept step"
    steady = c.ranked[0].expectation.usd_per_step
    assert steady == pytest.approx(ref(3600, 360, 2 / 104 / 3600, 300)[0] / 3600 * 96 / 1000, **EXACT)
    od = ref(3600, 360, 0.02 / 3600, 300)[0] / 3600 * 192 / 1000  # no history: the on-demand prior
    assert c.ranked[1].expectation.usd_per_step == pytest.approx(od, **EXACT)
    assert c.ranked[1].why == "2.00x the cost per kept step of spot in us-east5-a"
    # flaky: λ = 98/14 = 7/h
    assert c.ranked[2].expectation.held_s == pytest.approx(ref(3600, 360, 7 / 3600, 300)[0], **EXACT)
    assert c.to_json()["rungs"][0]["zone"] == "us-east5-a"


def test_a_rung_that_misses_the_deadline_goes_last() -> None:
    hist = {FLAKY.key: History(hours=10.0, preemptions=96), STEADY.key: History(hours=100.0, preemptions=0)}
    run = RunModel(1000, 3.6, 100, deadline_s=4500.0)
    c = rank([FLAKY, STEADY, OD], run, hist, max_miss=0.05)
    by = {r.expectation.rung: r for r in c.ranked}
    assert by[FLAKY].eligible is False and by[FLAKY].position == 3
    assert by[FLAKY].why.startswith("misses the deadline with P=")
    assert by[STEADY].why == "cheapest per kept step that makes the deadline"
    assert "deadline in 1.25 h at P(miss) ≤ 5%" in c.note
    # nothing makes an impossible deadline: least likely to miss first, and the note says so
    c2 = rank([FLAKY, STEADY, OD], RunModel(1000, 3.6, 100, deadline_s=3000.0), hist)
    assert not any(r.eligible for r in c2.ranked)
    assert "no rung is expected to make it" in c2.note
    assert [r.expectation.rung for r in c2.ranked] == [STEADY, OD, FLAKY]  # all P=1: by cost


def test_rows_render_infinite_rungs() -> None:
    hist = {FLAKY.key: History(hours=1.0, preemptions=100)}
    rows = plan_rows(rank([FLAKY, OD], RunModel(1000, 3.6, 10**7), hist).to_json())
    assert rows[-1]["$/kept step"] == "never" and rows[-1]["completion (h)"] == "never"
    assert rows[0]["rung"] == "on-demand in us-east5-a" and rows[0]["full"] == "0%"
    assert float(rows[0]["$/kept step"]) > 0 and rows[0]["#"] == 1
    assert rows[-1]["preempt/h"] == "20.400 (1.0 h seen)"


def test_small_print() -> None:
    # a one-second checkpoint interval is still the segment model (only c = 0 takes the limit)
    held, n = held_time(3600.0, 1.0, 0.001, 300.0)
    assert held == pytest.approx(ref(3600, 1.0, 0.001, 300)[0], **EXACT)
    assert n == pytest.approx(ref(3600, 1.0, 0.001, 300)[1], **EXACT)
    # nothing left to do costs nothing per step; a rung's written place defaults to 0
    assert expect(SPOT, RunModel(0, 3.6, 100)).usd_per_step == 0.0
    one = expect(SPOT, RunModel(1, 3.6, 1))
    assert one.usd_per_step == one.usd > 0
    assert Rung("v5p-8", "z", "spot", "compute", 1.0).order == 0
    # the plan's JSON keeps six decimals
    row = expect(SPOT, RUN, SEEN).to_json()
    assert row["held_s"] == 3747.234941 and row["preemptions"] == 0.468404
    assert row["usd_per_step"] == round(3747.2349413678076 / 3600 * 96 / 1000, 6)


def test_near_ties_go_flakiest_first() -> None:
    # For a run checkpointing every 360 s, 0.2/h and 0.3/h cost within 10% of each other: the flakier
    # goes first, leaving the steadier one to runs that need it. 2/h is well over 10% dearer.
    a = Rung("v5p-32", "us-east5-a", "spot", "compute", 96.0, order=1)
    b = Rung("v5p-32", "us-east5-b", "spot", "compute", 96.0, order=2)
    c = Rung("v5p-32", "us-east5-c", "spot", "compute", 96.0, order=3)
    hist = {a.key: History(hours=996.0, preemptions=197), b.key: History(hours=996.0, preemptions=297),
            c.key: History(hours=996.0, preemptions=1998)}  # fmt: skip
    got = rank([a, b, c], RUN, hist)
    assert [r.expectation.rung for r in got.ranked] == [b, a, c]
    ea, eb = (next(r.expectation for r in got.ranked if r.expectation.rung == x) for x in (a, b))
    assert ea.usd_per_step < eb.usd_per_step <= ea.usd_per_step * 1.1
    assert got.ranked[0].why.startswith("within 10% of the cheapest per kept step, and the least steady")
    ratio = ea.usd_per_step / eb.usd_per_step
    assert (
        got.ranked[1].why
        == f"{ratio:.2f}x the cost per kept step of spot in us-east5-b: a tie, steadier, tried after it"
    )
    assert got.ranked[2].why.endswith("the cost per kept step of spot in us-east5-a")
