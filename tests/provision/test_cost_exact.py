"""Exact figures for the ledger summary and the cost functions (what ``make mutmut`` judges them by).

Prices are chosen so that no two products coincide, and durations so that hours are exact binary
fractions where it matters: a changed operator, constant or default shows in the figures.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tpu_ops.errors import BudgetError, ConfigError, SpecError
from tpu_ops.provision import cost as C
from tpu_ops.provision import ledger as L
from tpu_ops.provision.prices import PriceTable

TABLE = PriceTable(
    date="2030-01-02",
    source="test table",
    rates={
        "v4": {"on-demand": 3.25, "spot": 1.5, "reservation": 2.75, "commit-1y": 2.5, "commit-3y": 1.75},
        "v5p": {"on-demand": 4.0, "spot": 1.25, "commit-1y": 3.0, "commit-3y": 2.0},
        "v5e": {"on-demand": 0.0, "commit-1y": 0.5},
    },
    origin="test",
)


# -- ledger.summarise ----------------------------------------------------------------------------


def _ev(kind: str, rid: str = "", **kw: Any) -> dict[str, Any]:
    return {"kind": kind, "resource_id": rid, **kw} if rid else {"kind": kind, **kw}


def test_summarise_a_preempted_slice_a_recreated_one_and_an_open_one_exactly() -> None:
    t0 = 1_000_000.0
    events = [  # deliberately out of order: the summary sorts by time
        _ev(L.GONE, "a", t=t0 + 5400 + 1800),
        _ev(L.ATTEMPT, t=t0 - 50, seconds_waited=40.5),
        _ev(L.ATTEMPT, t=t0 - 10),  # no seconds_waited: counts 0
        _ev(L.ACTIVE, "a", t=t0, zone="z-a", tier="spot", chips=8, generation="v4"),
        _ev(L.PREEMPTED, "a", t=t0 + 3600),
        _ev(L.DELETE_REQUESTED, "a", t=t0 + 5400),
        _ev(L.ACTIVE, "a", t=t0 + 9000, zone="z-b", tier="on-demand", chips=8, generation="v4"),  # recreated
        _ev(L.ACTIVE, "a", t=t0 + 9100, zone="z-x", tier="spot", chips=99, generation="v4"),  # still open: ignored
        _ev(L.DELETE_REQUESTED, "a", t=t0 + 9000 + 1800),  # running → deleting directly
        _ev(L.PREEMPTED, "a", t=t0 + 9000 + 2700),  # after deleting: no going back to "preempted"
        _ev(L.ACTIVE, "b", t=t0 + 100, zone="z-c", tier="reservation", chips=4),  # no generation: no price
        _ev(L.PREEMPTED, "ghost", t=t0 + 200),  # never ACTIVE: ignored
        _ev("owner", t=t0 + 300, host="h", pid=1),
    ]
    now = t0 + 9000 + 3600
    cost = L.summarise("run-x", events, TABLE, now)
    a1, b, a2 = cost.slices
    assert (a1.resource_id, a1.zone, a1.tier, a1.chips, a1.generation, a1.open) == ("a", "z-a", "spot", 8, "v4", False)
    assert a1.hours == {"running": 1.0, "preempted": 0.5, "deleting": 0.5}
    assert (b.resource_id, b.zone, b.tier, b.chips, b.generation, b.open) == ("b", "z-c", "reservation", 4, "", True)
    assert b.hours == {"running": (now - t0 - 100) / 3600.0, "preempted": 0.0, "deleting": 0.0}
    assert (a2.zone, a2.tier, a2.chips, a2.open) == ("z-b", "on-demand", 8, True)
    assert a2.hours == {"running": 0.5, "preempted": 0.0, "deleting": 0.5}
    assert a1.chip_hours == 16.0 and a2.chip_hours == 8.0
    assert cost.run_id == "run-x" and cost.price_date == "2030-01-02"
    assert cost.chip_hours_by_tier == {"spot": 16.0, "on-demand": 8.0, "reservation": 4 * b.hours["running"]}
    assert cost.usd_by_tier == {"spot": 16.0 * 1.5, "on-demand": 8.0 * 3.25, "reservation": 0.0}
    assert cost.usd_total == 16.0 * 1.5 + 8.0 * 3.25
    assert cost.chip_hours_by_phase == {"running": 8.0 + 4.0 + 4 * b.hours["running"], "preempted": 4.0,
                                        "deleting": 4.0 + 4.0}  # fmt: skip
    assert cost.queue_seconds == 40.5 and cost.open_slices == 2
    assert list(cost.chip_hours_by_phase) == list(L.PHASES)


def test_summarise_defaults_zero_durations_and_a_clock_before_the_start() -> None:
    events = [
        {"kind": L.ACTIVE, "resource_id": "r"},  # no time (0), zone, tier, chips or generation
        {"kind": L.GONE, "resource_id": "r", "t": 7200.0},
        {"kind": L.ACTIVE, "resource_id": "s", "t": 100.0, "chips": 2, "generation": "v5p", "tier": "spot"},
        {"kind": L.PREEMPTED, "resource_id": "s", "t": 100.0},  # the same moment: nothing billed as running
        {"kind": L.ACTIVE, "resource_id": "u", "t": 9000.0, "chips": 1, "generation": "v5p", "tier": "spot"},
        {"kind": "attempt", "seconds_waited": 2},
        {"kind": L.ACTIVE, "t": 200.0, "chips": 1},  # no resource id: the empty one
        {"kind": L.ACTIVE, "resource_id": "g", "t": 50.0, "chips": 1, "tier": "spot"},
        {"kind": L.DELETE_REQUESTED, "resource_id": "g", "t": 60.0},
        {"kind": L.GONE, "resource_id": "g", "t": 60.0},  # gone the moment its deletion was asked: 0 s deleting
        {"kind": L.ACTIVE, "resource_id": "h"},  # no time: sorts before t=0.5 (a missing time is 0, not 1)
        {"kind": L.PREEMPTED, "resource_id": "h", "t": 0.5},
    ]
    cost = L.summarise("run-y", events, TABLE, now=3700.0)  # before u's start: u bills nothing, not negative
    r, h, g, s, anon, u = cost.slices
    assert anon.resource_id == "" and anon.hours["running"] == 3500.0 / 3600.0
    assert g.hours == {"running": 10.0 / 3600.0, "preempted": 0.0, "deleting": 0.0} and not g.open
    assert h.hours == {"running": 0.5 / 3600.0, "preempted": 3699.5 / 3600.0, "deleting": 0.0}
    assert (r.zone, r.tier, r.chips, r.generation, r.open) == ("", "", 0, "", False)
    assert r.hours == {"running": 2.0, "preempted": 0.0, "deleting": 0.0}
    assert s.hours == {"running": 0.0, "preempted": 1.0, "deleting": 0.0} and s.open
    assert u.hours == {"running": 0.0, "preempted": 0.0, "deleting": 0.0}
    assert cost.usd_by_tier == {"": 0.0, "spot": 2 * 1.0 * 1.25}
    assert cost.chip_hours_by_tier == {"": 3500.0 / 3600.0, "spot": 2.0 + 10.0 / 3600.0}
    assert cost.queue_seconds == 2.0 and cost.open_slices == 4


def test_summarise_bills_an_open_slice_up_to_the_clock_when_no_time_is_given() -> None:
    start = time.time() - 1800.0
    before = time.time()
    cost = L.summarise("run-z", [{"kind": L.ACTIVE, "resource_id": "r", "t": start, "chips": 1}], TABLE)
    after = time.time()
    hours = cost.slices[0].hours["running"]
    assert (before - start) / 3600.0 <= hours <= (after - start) / 3600.0


def test_summarise_nothing() -> None:
    cost = L.summarise("run-0", [], TABLE, now=5.0)
    assert (cost.slices, cost.chip_hours_by_tier, cost.usd_by_tier, cost.usd_total) == ([], {}, {}, 0)
    assert cost.chip_hours_by_phase == {"running": 0.0, "preempted": 0.0, "deleting": 0.0}
    assert (cost.queue_seconds, cost.open_slices) == (0.0, 0)


# -- cost functions ------------------------------------------------------------------------------


def test_estimate_exactly(spec_factory: Any) -> None:
    spec = spec_factory(hours=2.5)  # v4-32: 16 chips; reservation res-a, spot, on-demand
    est = C.estimate(spec, TABLE)
    assert (est.accelerator_type, est.chips, est.hours) == ("v4-32", 16, 2.5)
    assert est.rungs == (
        C.RungEstimate("reservation", "res-a", 2.75, 16 * 2.5 * 2.75),
        C.RungEstimate("spot", "", 1.5, 16 * 2.5 * 1.5),
        C.RungEstimate("on-demand", "", 3.25, 16 * 2.5 * 3.25),
    )
    assert est.worst_usd == 130.0 and (est.price_date, est.price_source) == ("2030-01-02", "test table")
    assert est.to_json() == {
        "accelerator_type": "v4-32", "chips": 16, "hours": 2.5, "worst_usd": 130.0, "price_date": "2030-01-02",
        "price_source": "test table",
        "rungs": [{"tier": "reservation", "reservation": "res-a", "usd_per_chip_hour": 2.75, "usd": 110.0},
                  {"tier": "spot", "reservation": "", "usd_per_chip_hour": 1.5, "usd": 60.0},
                  {"tier": "on-demand", "reservation": "", "usd_per_chip_hour": 3.25, "usd": 130.0}],
    }  # fmt: skip
    # the worst rung wherever it stands
    assert C.estimate(spec_factory(hours=2.5, ladder=["on-demand", "spot"]), TABLE).worst_usd == 130.0


def test_check_budget_at_and_past_the_line(spec_factory: Any) -> None:
    assert C.check_budget(spec_factory(hours=2.5, budget_usd=130), TABLE).worst_usd == 130.0  # exactly the budget
    # a billionth of a dollar of float noise is tolerated (and no more: 130 > (130 - 1e-9) + 1e-9 is False)
    assert C.check_budget(spec_factory(hours=2.5, budget_usd=130 - 1e-9), TABLE).worst_usd == 130.0
    with pytest.raises(BudgetError) as info:
        C.check_budget(spec_factory(hours=2.5, budget_usd=129.99), TABLE)
    assert str(info.value) == (
        "over budget: estimated cost $130.00 exceeds the budget $129.99: 16 chips (v4-32) x 2.5 h x "
        "$3.25/chip-hour on the on-demand rung (prices of 2030-01-02)"
    )
    assert info.value.fix == (
        "raise budget_usd to at least $130.00, or shrink the run: fewer hours, a smaller slice, or drop the "
        "on-demand rung"
    )
    with pytest.raises(BudgetError) as info:  # the fix names the field where the spec the user wrote has it
        C.check_budget(spec_factory(hours=2.5, budget_usd=129.99), TABLE, field="provision.budget_usd")
    assert "raise provision.budget_usd to at least $130.00" in info.value.fix and "provision.hours" in info.value.fix
    assert info.value.estimate_usd == 130.0 and info.value.budget_usd == 129.99
    with pytest.raises(BudgetError) as info:  # rounding of the figure it reports: 2 decimals
        C.check_budget(spec_factory(hours=1.001, budget_usd=1, ladder=["spot"]), TABLE)
    assert info.value.estimate_usd == 24.02 and "$24.02" in str(info.value) and "x 1.001 h" in str(info.value)


def test_hourly_usd_and_its_bounds() -> None:
    assert C.hourly_usd(3, 2.5) == 7.5
    assert C.hourly_usd(1, 0.0) == 0.0
    with pytest.raises(SpecError) as info:
        C.hourly_usd(0, 1.0)
    assert str(info.value) == "chips must be positive, not 0"
    with pytest.raises(SpecError) as info:
        C.hourly_usd(2, -0.5)
    assert str(info.value) == "price must be ≥ 0, not -0.5"


def test_compare_tiers_exactly() -> None:
    assert C.compare_tiers(4, 10.0, "v5p", TABLE) == {
        "on-demand": {"usd_per_chip_hour": 4.0, "usd_per_hour": 16.0, "usd": 160.0},
        "spot": {"usd_per_chip_hour": 1.25, "usd_per_hour": 5.0, "usd": 50.0},
        "commit-1y": {"usd_per_chip_hour": 3.0, "usd_per_hour": 12.0, "usd": 120.0},
        "commit-3y": {"usd_per_chip_hour": 2.0, "usd_per_hour": 8.0, "usd": 80.0},
    }
    with pytest.raises(ConfigError, match="no price for v6e on-demand"):
        C.compare_tiers(4, 1.0, "v6e", TABLE)


def test_commitment_savings_exactly() -> None:
    q = C.commitment_savings(2, "v5p", 0.75, 1, TABLE)
    assert q.to_json() == {
        "years": 1, "chips": 2, "utilisation": 0.75,
        "on_demand_usd": 2 * 4.0 * 8760 * 0.75, "commit_usd": 2 * 3.0 * 8760,
        "savings_usd": 2 * 4.0 * 8760 * 0.75 - 2 * 3.0 * 8760, "savings_pct": 0.0, "break_even_utilisation": 0.75,
    }  # fmt: skip
    q3 = C.commitment_savings(2, "v5p", 1.0, 3, TABLE)
    assert (q3.on_demand_usd, q3.commit_usd, q3.savings_usd) == (210240.0, 105120.0, 105120.0)
    assert q3.savings_pct == 50.0 and q3.break_even_utilisation == 0.5
    free = C.commitment_savings(1, "v5e", 0.5, 1, TABLE)  # an on-demand price of 0: no division by zero
    assert (free.on_demand_usd, free.commit_usd, free.savings_pct, free.break_even_utilisation) == (0, 4380.0, 0, 0)
    for years, util, message in [(2, 0.5, "commitments are 1 or 3 years, not 2"),
                                 (1, 0.0, "utilisation must be in (0, 1], not 0.0"),
                                 (1, 1.01, "utilisation must be in (0, 1], not 1.01")]:  # fmt: skip
        with pytest.raises(SpecError) as info:
            C.commitment_savings(2, "v5p", util, years, TABLE)
        assert str(info.value) == message
    assert C.HOURS_PER_YEAR == 8760.0


def test_usd_per_million_tokens_exactly() -> None:
    assert C.usd_per_million_tokens(36.0, 10.0) == 1000.0  # 36,000 tokens an hour for $36
    assert C.usd_per_million_tokens(7.2, 0.5) == 4000.0
    with pytest.raises(SpecError) as info:
        C.usd_per_million_tokens(1.0, 0)
    assert str(info.value) == "tokens per second must be positive, not 0"
