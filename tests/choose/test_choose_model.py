"""Exact figures for the expected-cost model (tpu_ops/provision/choose.py).

Every expected value is written out from the model's formulas by hand, so a changed constant or
operator in the module moves at least one asserted figure.
"""

from __future__ import annotations

import math

import pytest

from tpu_ops.provision import choose as C
from tpu_ops.provision.choose import Belief, History, Rung, RunModel, believe, expect, poisson_cdf, rank

EXACT = {"rel": 1e-12, "abs": 1e-12}

# 1000 steps of 3.6 s = one hour of work; a checkpoint every 100 steps = every 360 s.
RUN = RunModel(steps=1000, seconds_per_step=3.6, checkpoint_every=100)
SPOT = Rung("v5p-32", "us-east5-a", "spot", "compute", 96.0, order=1)
# 36 h seen, 16 preemptions; 8 slices obtained in 2400 s; 8 recoveries in 800 s; 400 steps lost.
SEEN = History(hours=36.0, preemptions=16, obtained=8, obtain_s_total=2400.0, recoveries=8,
               recovery_s_total=800.0, steps_lost_total=400)  # fmt: skip


def test_priors_and_weights_are_the_documented_ones() -> None:
    assert C.PRIOR_HOURS == 4.0 and C.PRIOR_WEIGHT == 2.0
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


def test_expectation_with_history() -> None:
    e = expect(SPOT, RUN, SEEN)
    # λ = 0.45/h = 0.000125/s; per preemption 180 s lost (c/2 > 25 steps x 3.6 = 90) + 140 s recovery.
    waste = 0.000125 * (180 + 140)  # 0.04
    assert e.held_s == pytest.approx(3600 / (1 - waste), **EXACT)  # 3750
    assert e.held_s == pytest.approx(3750.0, **EXACT)
    assert e.preemptions == pytest.approx(0.000125 * 3750, **EXACT)  # 0.46875
    assert e.wall_s == pytest.approx(300 + 3750 + 0.46875 * 300, **EXACT)  # 4190.625
    assert e.usd == pytest.approx(3750 / 3600 * 96, **EXACT)  # 100
    assert e.usd_per_step == pytest.approx(0.1, **EXACT)
    assert e.miss_probability == 0.0  # no deadline


def test_expectation_from_the_prior_alone() -> None:
    e = expect(SPOT, RUN)
    # λ = 0.5/h; per preemption 180 + 300 s: waste = 480/7200 = 1/15.
    assert e.held_s == pytest.approx(3600 * 15 / 14, **EXACT)
    assert e.preemptions == pytest.approx(3600 * 15 / 14 / 7200, **EXACT)
    assert e.wall_s == pytest.approx(300 + 3600 * 15 / 14 * (1 + 300 / 7200), **EXACT)
    assert e.usd_per_step == pytest.approx(3600 * 15 / 14 / 3600 * 96 / 1000, **EXACT)


def test_recorded_steps_lost_count_when_worse_than_half_an_interval() -> None:
    worse = History(hours=36.0, preemptions=16, steps_lost_total=1600)  # 100 steps = 360 s each
    e = expect(SPOT, RUN, worse)
    lam = (16 + 2) / 40 / 3600
    assert e.held_s == pytest.approx(3600 / (1 - lam * (360 + 300)), **EXACT)


def test_a_rung_that_loses_more_than_it_gains_never_finishes() -> None:
    # A checkpoint every 5000 steps (18000 s): λ (9000 + 300) = 9300 / 7200 > 1.
    e = expect(SPOT, RunModel(1000, 3.6, 5000, deadline_s=1e9))
    assert math.isinf(e.held_s) and math.isinf(e.usd_per_step) and math.isinf(e.wall_s)
    assert math.isinf(e.preemptions) and math.isinf(e.usd)
    assert e.miss_probability == 1.0
    # just inside the edge it finishes, at a price: 0.5/h x (6800 + 300) s = 7100/7200
    near = expect(SPOT, RunModel(1000, 1.0, 13600))
    assert near.held_s == pytest.approx(1000 / (1 - 7100 / 7200), **EXACT)


def test_deadline_miss_probability() -> None:
    # slack = 4600 - 300 - 3600 = 700 s; each preemption costs 180 + 140 + 300 = 620 s: one allowed.
    e = expect(SPOT, RunModel(1000, 3.6, 100, deadline_s=4600.0), SEEN)
    assert e.miss_probability == pytest.approx(1 - math.exp(-0.46875) * (1 + 0.46875), **EXACT)
    assert e.miss_probability == pytest.approx(0.0809, abs=1e-4)
    # 1239 s of slack: still one (2 x 620 = 1240); 1240 s: two.
    two = expect(SPOT, RunModel(1000, 3.6, 100, deadline_s=300 + 3600 + 1240.0), SEEN)
    assert two.miss_probability == pytest.approx(1 - math.exp(-0.46875) * (1 + 0.46875 + 0.46875**2 / 2), **EXACT)
    one = expect(SPOT, RunModel(1000, 3.6, 100, deadline_s=300 + 3600 + 1239.0), SEEN)
    assert one.miss_probability == pytest.approx(e.miss_probability, **EXACT)
    # no slack at all: exactly enough for a run without preemptions
    assert expect(SPOT, RunModel(1000, 3.6, 100, deadline_s=3900.0), SEEN).miss_probability == pytest.approx(
        1 - math.exp(-0.46875), **EXACT
    )
    assert expect(SPOT, RunModel(1000, 3.6, 100, deadline_s=3899.0), SEEN).miss_probability == 1.0


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
    hist = {FLAKY.key: History(hours=10.0, preemptions=61), STEADY.key: History(hours=100.0, preemptions=0)}
    c = rank([FLAKY, STEADY, OD], RUN, hist)
    assert c.method == "cost"
    assert [r.expectation.rung for r in c.ranked] == [STEADY, OD, FLAKY]
    assert [r.position for r in c.ranked] == [1, 2, 3]
    assert c.ranked[0].why == "cheapest per kept step"
    steady = c.ranked[0].expectation.usd_per_step
    assert steady == pytest.approx(3600 / (1 - 2 / 104 / 3600 * 480) / 3600 * 96 / 1000, **EXACT)
    od = 3600 / (1 - 0.02 / 3600 * 480) / 3600 * 192 / 1000  # no history: the on-demand prior
    assert c.ranked[1].expectation.usd_per_step == pytest.approx(od, **EXACT)
    assert c.ranked[1].why == "2.00x the cost per kept step of spot in us-east5-a"
    # flaky: λ = 63/14 = 4.5/h, 480 s per preemption: waste 0.6
    assert c.ranked[2].expectation.held_s == pytest.approx(3600 / 0.4, **EXACT)
    assert c.to_json()["rungs"][0]["zone"] == "us-east5-a"


def test_a_rung_that_misses_the_deadline_goes_last() -> None:
    hist = {FLAKY.key: History(hours=10.0, preemptions=61), STEADY.key: History(hours=100.0, preemptions=0)}
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
    rows = rank([FLAKY, OD], RUN, hist).rows()
    assert rows[-1]["$/kept step"] == "never" and rows[-1]["completion"] == "never"
    assert rows[0]["rung"] == "on-demand in us-east5-a (compute)"
    assert rows[0]["$/kept step"].startswith("$0.19")
