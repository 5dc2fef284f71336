"""A reservation is paid whether used or not: the ranking charges it at its opportunity cost (the
spot price), so it goes to the runs that gain most from a steady slice, not to whoever asks first."""

from __future__ import annotations

import math

import pytest

from tpu_ops.errors import ConfigError
from tpu_ops.provision.choose import Choice, History, Rung, RunModel, rank
from tpu_ops.provision.ladder import plan
from tpu_ops.provision.prices import PriceTable, shipped
from tpu_ops.provision.ranking import backend_of, candidates, order, rank_price
from tpu_ops.specs.slice import ProvisionSpec

EXACT = {"rel": 1e-12, "abs": 1e-12}


def _spec() -> ProvisionSpec:
    return ProvisionSpec.model_validate({
        "slice": {"accelerator_type": "v5p-8", "region": "us-east5", "zones": ["us-east5-a", "us-east5-b"]},
        "ladder": ["reservation:team-res@us-east5-a", "spot", "on-demand"], "budget_usd": 1000, "hours": 2,
        "choose": {"steps": 3600, "checkpoint_every": 3600},
    })  # fmt: skip


def test_rank_price_by_tier() -> None:
    t = shipped()  # v5p: on-demand 4.20, spot 2.10, reservation 4.20 per chip-hour
    assert rank_price(t, "v5p", "reservation") == 2.10
    assert rank_price(t, "v5p", "reservation", "prepaid") == 0.0
    assert rank_price(t, "v5p", "reservation", "list") == 4.20
    assert rank_price(t, "v5p", "on-demand") == 4.20 and rank_price(t, "v5p", "spot", "prepaid") == 2.10
    no_spot = PriceTable.from_json({"date": "d", "source": "s", "generations": {"v5p": {"reservation": 4.2}}}, "t")
    assert rank_price(no_spot, "v5p", "reservation") == 0.0  # nothing to compare with: prepaid
    with pytest.raises(ConfigError):
        rank_price(no_spot, "v5p", "on-demand")


def test_candidates_charge_the_reservation_its_opportunity_cost() -> None:
    spec = _spec()
    rungs = candidates(spec, plan(spec), shipped())
    assert [(r.tier, r.zone, r.usd_per_hour) for r in rungs] == [
        ("reservation", "us-east5-a", 8.4), ("spot", "us-east5-a", 8.4), ("spot", "us-east5-b", 8.4),
        ("on-demand", "us-east5-a", 16.8), ("on-demand", "us-east5-b", 16.8),
    ]  # fmt: skip
    assert rungs[0].reservation == "team-res" and [r.order for r in rungs] == [1, 2, 3, 4, 5]
    assert candidates(spec, plan(spec), shipped(), "list")[0].usd_per_hour == 16.8


def ref_held(work: float, c: float, lam: float, r: float) -> float:
    """The segment model written out independently (held seconds)."""
    p = 1 - math.exp(-lam * c)
    return work / c * (p / lam + p * (math.exp(lam * (r + c)) - 1) / lam)


RES = Rung("v5p-8", "us-east5-a", "reservation", "compute", 8.4, "team-res", order=1)
SPOT = Rung("v5p-8", "us-east5-a", "spot", "compute", 8.4, order=2)
OD = Rung("v5p-8", "us-east5-a", "on-demand", "compute", 16.8, order=3)
# spot: 100 preemptions in 1000 h (λ = 102/1004 /h with the prior); the reservation: 100 h, none.
HIST = {SPOT.key: History(hours=1000.0, preemptions=100), RES.key: History(hours=100.0)}


def test_the_reservation_goes_to_the_run_that_gains_most() -> None:
    # Two hours of work checkpointed every two hours: spot would cost 11.8% more, so the reservation first.
    long = rank([SPOT, OD, RES], RunModel(3600, 2.0, 3600), HIST)
    assert [r.expectation.rung for r in long.ranked] == [RES, SPOT, OD]
    res, spot = long.ranked[0].expectation, long.ranked[1].expectation
    assert res.usd_per_step == pytest.approx(ref_held(7200, 7200, 0.04 / 104 / 3600, 300) / 3600 * 8.4 / 3600, **EXACT)
    assert spot.usd_per_step == pytest.approx(ref_held(7200, 7200, 102 / 1004 / 3600, 300) / 3600 * 8.4 / 3600, **EXACT)
    assert spot.usd_per_step / res.usd_per_step == pytest.approx(1.1178, abs=5e-5)  # not a tie (> 10%)
    assert long.ranked[0].why == "cheapest per kept step"
    # The same work checkpointed every 5 minutes loses little to a preemption: spot and the reservation
    # are within 10%, so spot goes first and the reservation is left to runs that need it.
    short = rank([SPOT, OD, RES], RunModel(3600, 2.0, 150), HIST)
    assert [r.expectation.rung for r in short.ranked] == [SPOT, RES, OD]
    s, r = short.ranked[0].expectation, short.ranked[1].expectation
    assert s.usd_per_step == pytest.approx(ref_held(7200, 300, 102 / 1004 / 3600, 300) / 3600 * 8.4 / 3600, **EXACT)
    assert r.usd_per_step < s.usd_per_step <= r.usd_per_step * 1.1
    assert short.ranked[1].why.endswith("a tie, steadier, tried after it")


def test_the_plan_says_how_the_reservation_was_priced() -> None:
    spec = _spec()
    steps = plan(spec)
    hist = {("v5p-8", "us-east5-a", "spot", backend_of(spec)): History(hours=10.0)}
    _, choice = order(spec, steps, shipped(), hist, RunModel(3600, 2.0, 3600))
    assert choice.method == "cost"
    assert choice.note.endswith("a reservation is paid whether used or not, so it is charged at the spot price, "
                                "its opportunity cost")  # fmt: skip
    _, prepaid = order(spec, steps, shipped(), hist, RunModel(3600, 2.0, 3600), "prepaid")
    assert prepaid.note.endswith("so it is charged at nothing")
    _, listed = order(spec, steps, shipped(), hist, RunModel(3600, 2.0, 3600), "list")
    assert "reservation is paid" not in listed.note

    def res_price(c: Choice) -> float:
        return next(r.expectation.rung.usd_per_hour for r in c.ranked if r.expectation.rung.tier == "reservation")

    assert (res_price(choice), res_price(prepaid), res_price(listed)) == (8.4, 0.0, 16.8)
    _, none = order(spec, steps, shipped(), {}, RunModel(3600, 2.0, 3600))
    assert none.method == "written-order" and "reservation is paid" not in none.note
