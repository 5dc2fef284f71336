"""A reservation is paid whether used or not, so using it is charged nothing; what a scarce rung
costs the fleet is the scarcity charge: the share of requests the rung refuses for capacity x the
on-demand premium over its price, per hour held. So a contended reservation (or spot zone) goes to the
runs that gain most from it, not to whoever asks first."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tpu_ops.errors import ConfigError
from tpu_ops.provision.choose import Choice, History, Rung, RunModel, believe, expect, rank
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
    assert rank_price(t, "v5p", "reservation") == 0.0  # prepaid: using it costs nothing more
    assert rank_price(t, "v5p", "reservation", "opportunity") == 2.10
    assert rank_price(t, "v5p", "reservation", "list") == 4.20
    assert rank_price(t, "v5p", "on-demand") == 4.20 and rank_price(t, "v5p", "spot", "opportunity") == 2.10
    no_spot = PriceTable.from_json({"date": "d", "source": "s", "generations": {"v5p": {"reservation": 4.2}}}, "t")
    assert rank_price(no_spot, "v5p", "reservation", "opportunity") == 0.0  # nothing to compare with
    with pytest.raises(ConfigError):
        rank_price(no_spot, "v5p", "on-demand")


def test_candidates_price_the_slice_and_its_fallback() -> None:
    spec = _spec()
    rungs = candidates(spec, plan(spec), shipped())
    assert [(r.tier, r.zone, r.usd_per_hour, r.fallback_usd_per_hour) for r in rungs] == [
        ("reservation", "us-east5-a", 0.0, 16.8), ("spot", "us-east5-a", 8.4, 16.8), ("spot", "us-east5-b", 8.4, 16.8),
        ("on-demand", "us-east5-a", 16.8, 16.8), ("on-demand", "us-east5-b", 16.8, 16.8),
    ]  # fmt: skip
    assert rungs[0].reservation == "team-res" and [r.order for r in rungs] == [1, 2, 3, 4, 5]
    assert candidates(spec, plan(spec), shipped(), "list")[0].usd_per_hour == 16.8
    assert candidates(spec, plan(spec), shipped(), "opportunity")[0].usd_per_hour == 8.4
    assert {r.fallback_usd_per_hour for r in candidates(spec, plan(spec), shipped(), scarcity=False)} == {0.0}


def ref_held(work: float, c: float, lam: float, r: float) -> float:
    """The segment model written out independently (held seconds)."""
    p = 1 - math.exp(-lam * c)
    return work / c * (p / lam + p * (math.exp(lam * (r + c)) - 1) / lam)


RES = Rung("v5p-8", "us-east5-a", "reservation", "compute", 0.0, "team-res", order=1, fallback_usd_per_hour=16.8)
SPOT = Rung("v5p-8", "us-east5-a", "spot", "compute", 8.4, order=2, fallback_usd_per_hour=16.8)
OD = Rung("v5p-8", "us-east5-a", "on-demand", "compute", 16.8, order=3, fallback_usd_per_hour=16.8)
# spot: 100 preemptions in 1000 h (λ = 102/1004 /h with the prior), never refused; the reservation:
# 100 h, none, and it refused 5 of the 8 requests made of it: full = 5 / (5 + 3 + 2 granted by the prior).
HIST = {SPOT.key: History(hours=1000.0, preemptions=100, obtained=40),
        RES.key: History(hours=100.0, obtained=3, stockouts=5)}  # fmt: skip


def test_the_scarcity_charge_exactly() -> None:
    assert believe("spot", History(stockouts=1)).full == 1 / 3  # the prior: 2 requests granted
    assert believe("spot", History(obtained=40)).full == 0.0
    assert believe("reservation", HIST[RES.key]).full == 0.5
    run = RunModel(3600, 2.0, 3600)
    e = expect(RES, run, HIST[RES.key])
    held = ref_held(7200, 7200, 0.04 / 104 / 3600, 300)
    assert e.held_s == pytest.approx(held, **EXACT)
    assert e.usd == 0.0  # prepaid
    assert e.scarcity_usd == pytest.approx(held / 3600 * 0.5 * 16.8, **EXACT)
    assert e.usd_per_step == pytest.approx(held / 3600 * 8.4 / 3600, **EXACT)
    s = expect(SPOT, run, History(hours=10.0, obtained=1, stockouts=3))  # full = 3/6: half the premium
    assert s.scarcity_usd == pytest.approx(s.held_s / 3600 * 0.5 * (16.8 - 8.4), **EXACT)
    assert s.usd_per_step == pytest.approx((s.usd + s.scarcity_usd) / 3600, **EXACT)
    assert expect(OD, run, History(obtained=1, stockouts=9)).scarcity_usd == 0.0  # nothing to fall back on
    assert expect(SPOT, run, History(stockouts=9)).to_json()["full"] == round(9 / 11, 6)


def _scarce_note(e: Any) -> str:
    return f" (scarce: 50% of requests refused, +${e.scarcity_usd:.2f} included)"


def test_the_contended_reservation_goes_to_the_run_that_gains_most() -> None:
    # The reservation, full half the time, costs half of on-demand per hour held: as much as spot.
    # Two hours of work checkpointed every two hours: spot would cost 11.8% more, so the reservation first.
    long = rank([SPOT, OD, RES], RunModel(3600, 2.0, 3600), HIST)
    assert [r.expectation.rung for r in long.ranked] == [RES, SPOT, OD]
    res, spot = long.ranked[0].expectation, long.ranked[1].expectation
    assert res.usd_per_step == pytest.approx(ref_held(7200, 7200, 0.04 / 104 / 3600, 300) / 3600 * 8.4 / 3600, **EXACT)
    assert spot.usd_per_step == pytest.approx(ref_held(7200, 7200, 102 / 1004 / 3600, 300) / 3600 * 8.4 / 3600, **EXACT)
    assert spot.usd_per_step / res.usd_per_step == pytest.approx(1.1178, abs=5e-5)  # not a tie (> 10%)
    assert long.ranked[0].why == "cheapest per kept step" + _scarce_note(res)
    # The same work checkpointed every 5 minutes loses little to a preemption: spot and the reservation
    # are within 10%, so spot goes first and the reservation is left to runs that need it.
    short = rank([SPOT, OD, RES], RunModel(3600, 2.0, 150), HIST)
    assert [r.expectation.rung for r in short.ranked] == [SPOT, RES, OD]
    s, r = short.ranked[0].expectation, short.ranked[1].expectation
    assert s.usd_per_step == pytest.approx(ref_held(7200, 300, 102 / 1004 / 3600, 300) / 3600 * 8.4 / 3600, **EXACT)
    assert r.usd_per_step < s.usd_per_step <= r.usd_per_step * 1.1
    assert short.ranked[1].why.endswith("a tie, steadier, tried after it" + _scarce_note(r))
    # Nobody refused: the reservation costs nothing, and every run takes it first.
    free = {**HIST, RES.key: History(hours=100.0, obtained=3)}
    assert rank([SPOT, OD, RES], RunModel(3600, 2.0, 150), free).ranked[0].expectation.rung == RES


def test_the_plan_says_how_the_reservation_was_priced() -> None:
    spec = _spec()
    steps = plan(spec)
    hist = {("v5p-8", "us-east5-a", "spot", backend_of(spec)): History(hours=10.0)}
    _, choice = order(spec, steps, shipped(), hist, RunModel(3600, 2.0, 3600))
    assert choice.method == "cost"
    assert choice.note.endswith("a reservation is paid whether used or not, so it is charged at nothing")
    _, opportunity = order(spec, steps, shipped(), hist, RunModel(3600, 2.0, 3600), "opportunity")
    assert opportunity.note.endswith("so it is charged at the spot price, its opportunity cost")
    _, listed = order(spec, steps, shipped(), hist, RunModel(3600, 2.0, 3600), "list")
    assert "reservation is paid" not in listed.note

    def res_price(c: Choice) -> float:
        return next(r.expectation.rung.usd_per_hour for r in c.ranked if r.expectation.rung.tier == "reservation")

    assert (res_price(choice), res_price(opportunity), res_price(listed)) == (0.0, 8.4, 16.8)
    _, none = order(spec, steps, shipped(), {}, RunModel(3600, 2.0, 3600))
    assert none.method == "written-order" and "reservation is paid" not in none.note
    # A refusal seen: the note says what scarcity costs; without the charge, it does not.
    scarce = {**hist, ("v5p-8", "us-east5-a", "reservation", backend_of(spec)): History(stockouts=1)}
    _, charged = order(spec, steps, shipped(), scarce, RunModel(3600, 2.0, 3600))
    assert charged.note.endswith("a rung the fleet finds full also costs, per hour held, the share of requests "
                                 "it refuses x (on-demand - its price)")  # fmt: skip
    _, uncharged = order(spec, steps, shipped(), scarce, RunModel(3600, 2.0, 3600), scarcity=False)
    assert "finds full" not in uncharged.note
    assert all(r.expectation.scarcity_usd == 0.0 for r in uncharged.ranked)


def test_patience_holds_on_demand_back_only_while_it_still_makes_the_deadline() -> None:
    # 7200 s of work; on-demand takes 300 s to obtain (the prior). Asked 600 s later and after one
    # worst-case preemption of what the wait may get (the reservation's: 300 s checkpoint + 300 s
    # recovery + 48 s obtain = 648 s), it still makes a deadline of 300 + 7200 + 600 + 648 + 1 s, and
    # not one of 300 + 7200 + 600 + 648 - 1 s.
    def choice(deadline: float | None, rungs: list[Rung] | None = None) -> Choice:
        # max_miss 20%: this close to the deadline, one preemption on spot at the wrong moment is a miss
        # (18.6% with recourse); what is tested here is on-demand's own boundary after the wait.
        return rank(rungs or [OD, SPOT, RES], RunModel(3600, 2.0, 150, deadline), HIST, wait_s=600.0, max_miss=0.2)

    roomy = choice(300 + 7200 + 600 + 648 + 1)
    assert [r.expectation.rung for r in roomy.ranked] == [SPOT, RES, OD]
    assert (roomy.try_now, roomy.wait_s) == (2, 600.0)
    assert roomy.note.endswith("; if the first 2 are refused, wait 600 s and ask again: on-demand would still make "
                               "the deadline then")  # fmt: skip
    assert roomy.to_json()["try_now"] == 2
    tight = choice(300 + 7200 + 600 + 648 - 1)
    assert (tight.try_now, tight.wait_s) == (None, None) and "wait" not in tight.note
    assert choice(None).try_now is None  # no deadline: nothing bounds the wait
    assert rank([OD, SPOT], RunModel(3600, 2.0, 150, 10**6), HIST).try_now is None  # no choose.wait
    # On-demand first (spot hopeless for a 2-hour checkpoint on a flaky zone): nothing cheaper to wait for.
    flaky = {SPOT.key: History(hours=10.0, preemptions=60)}
    first = rank([OD, SPOT], RunModel(3600, 2.0, 3600, 10**6), flaky, wait_s=600.0)
    assert first.ranked[0].expectation.rung == OD and first.try_now is None


BAD_WAITS = [("2d", "out of range"), ("soon", "write 90s, 30m, 2h, 1d"), (0, "out of range")]


@pytest.mark.parametrize(("wait", "words"), BAD_WAITS)
def test_a_bad_wait_is_refused_naming_the_field(wait: Any, words: str) -> None:
    from tpu_ops.errors import SpecError
    from tpu_ops.specs import parse_spec

    doc = _spec().model_dump(mode="json")
    doc["choose"]["wait"] = wait
    with pytest.raises(SpecError) as info:
        parse_spec(ProvisionSpec, doc)
    assert "choose.wait" in [e["field"] for e in info.value.errors] and words in str(info.value)
    doc["choose"]["wait"] = "10m"
    assert parse_spec(ProvisionSpec, doc).choose.wait.total_seconds() == 600  # type: ignore[union-attr]


def test_patience_tries_a_rung_tied_with_on_demand_before_waiting() -> None:
    # The reservation refused 40 of 40 requests (full = 40/42): charged 95% of on-demand, a tie with it,
    # so the ranking puts the flakier on-demand first. Waiting, it asks the reservation first instead.
    hist = {RES.key: History(hours=10.0, stockouts=40)}
    run = RunModel(3600, 2.0, 150, 10**6)
    hasty = rank([OD, RES], run, hist)
    assert [r.expectation.rung for r in hasty.ranked] == [OD, RES]
    patient = rank([OD, RES], run, hist, wait_s=600.0)
    assert [(r.expectation.rung, r.position) for r in patient.ranked] == [(RES, 1), (OD, 2)]
    assert (patient.try_now, patient.wait_s) == (1, 600.0)
