"""The fleet simulator's accounting (bench/fleet_sim.py), on a handful of runs: what the README's
figures rest on. A reservation is paid whether used or not, by every policy alike."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


@pytest.fixture(scope="module")
def sim() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "fleet_sim.py"
    spec = importlib.util.spec_from_file_location("fleet_sim", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fleet_sim"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_every_policy_pays_the_reservation_and_using_it_is_free(sim: ModuleType) -> None:
    runs = sim.make_runs(6, 7)
    steps = sim.plan(sim.fleet_spec(sim.SCENARIO["written_ladder"]))
    orders = sim.fixed_orders(steps, True)
    window_h = max(r.deadline for r in runs) / 3600
    prepaid = 3 * 4 * 4.20 * window_h  # 3 VMs of 4 chips at the on-demand rate, the whole window
    written = sim.Fleet(runs, 7, orders["written: res > spot a,b,c > on-demand a,b,c"])
    w = written.run()
    od_only = sim.Fleet(runs, 7, orders["on-demand"])
    o = od_only.run()
    assert w["reservation_prepaid_usd"] == o["reservation_prepaid_usd"] == round(prepaid, 2)
    # Without the reservation in the ladder, every held hour is billed at on-demand, on top.
    assert sum(s.cost for s in od_only.state.values()) == pytest.approx(od_only.list_cost, rel=1e-12)
    assert od_only.list_cost == pytest.approx(sum(od_only.held.values()) * 16.8, rel=1e-12)
    assert o["usd_per_kept_step"] == pytest.approx((od_only.list_cost + prepaid) / o["kept_steps"], rel=1e-12)
    # With it, the reserved hours (all within the window here) cost nothing more.
    res_h = written.held["reservation@a"]
    assert res_h > 0
    used = sum(s.cost for s in written.state.values())
    assert used == pytest.approx(written.list_cost - res_h * 16.8, rel=1e-9)
    assert w["usd_per_kept_step_list_accounting"] == pytest.approx(written.list_cost / w["kept_steps"], rel=1e-12)
    # Insert, its operation read, get, delete per slice; no stock-out or preemption on on-demand here.
    assert o["api_calls_per_run"] == 4.0 and o["preemptions"] == 0
    assert o["slices_leaked"] == 0 == w["slices_leaked"]


def test_a_reserved_hour_past_the_window_is_billed(sim: ModuleType) -> None:
    runs = sim.make_runs(1, 7)
    steps = sim.plan(sim.fleet_spec(sim.SCENARIO["written_ladder"]))
    fleet = sim.Fleet(runs, 7, sim.fixed_orders(steps, True)["res > on-demand"])
    fleet.window_end = runs[0].arrival + 3600.0  # the reservation ends an hour after the run starts
    r = fleet.run()
    st = fleet.state[0]
    assert st.step is None and fleet.held["reservation@a"] > 1.0
    beyond = st.finished_at - fleet.window_end
    assert st.cost == pytest.approx(beyond / 3600 * 16.8, rel=1e-9)
    assert r["reservation_prepaid_usd"] == round(3 * 16.8 * fleet.window_end / 3600, 2)


def test_fixed_ladders_and_traces(sim: ModuleType) -> None:
    steps = sim.plan(sim.fleet_spec(sim.SCENARIO["written_ladder"]))
    orders = sim.fixed_orders(steps, True)
    assert len(orders) == 261 and len({tuple(v) for v in orders.values()}) == 261
    assert next(iter(orders.values())) == [s.number for s in steps]  # the written order first
    od = [s.number for s in steps if s.tier == "on-demand"]
    assert all(any(v[i : i + 3] == od for i in range(len(v))) for v in orders.values())
    assert list(sim.fixed_orders(steps, False)) == ["written: res > spot a,b,c > on-demand a,b,c"]
    # The same (run, rung, n-th use) meets the same luck whatever the policy; another key, other luck.
    assert sim.trace(7, 3, 4, 1).random() == sim.trace(7, 3, 4, 1).random() != sim.trace(7, 3, 4, 2).random()


def test_preemptions_follow_a_rate_that_changes(sim: ModuleType) -> None:
    import random

    rates = [(0.0, {"z": 1.0, "off": 0.0}), (3600.0, {"z": 2.0, "off": 0.0})]  # per hour, 2/h after an hour
    draws = [random.Random(s).expovariate(1.0) for s in range(40)]
    early = next(s for s in range(40) if draws[s] < 1.0)
    late = next(s for s in range(40) if draws[s] > 1.0)
    assert sim.preempted_at(rates, "z", 0.0, random.Random(early)) == pytest.approx(draws[early] * 3600, rel=1e-12)
    # past the change, the rest of the draw is spent at 2/h
    got = sim.preempted_at(rates, "z", 0.0, random.Random(late))
    assert got == pytest.approx(3600 + (draws[late] - 1.0) * 1800, rel=1e-12)
    # a slice held from after the change sees only the new rate; a zone never preempted, never
    assert sim.preempted_at(rates, "z", 7200.0, random.Random(early)) == pytest.approx(7200 + draws[early] * 1800)
    assert sim.preempted_at(rates, "off", 0.0, random.Random(1)) == float("inf")
    assert sim.scenario_rates("stationary") == [(0.0, sim.SCENARIO["spot_preemptions_per_hour"])]
    drift = sim.scenario_rates("drift")
    assert drift[1] == (30 * 3600.0, {"us-east5-a": 1.0, "us-east5-b": 0.6, "us-east5-c": 2.0})


def test_history_requests_and_the_fixed_ladder_cache(sim: ModuleType, tmp_path: Path) -> None:
    runs = sim.make_runs(30, 7)
    fleet = sim.Fleet(runs, 7, None)
    r = fleet.run()
    published = len(fleet.records)  # each slice's record, and the stock-outs met on the way to one
    # One summary read per ranking, and a read + a conditional write per record published.
    assert r["history_gcs_reads_per_run"] == (fleet.rankings + published) / 30
    assert r["history_gcs_writes_per_run"] == published / 30
    # The reservation (3 VMs) is contended by 30 runs: its stock-outs reach the history the ranking reads.
    res = next(h for k, h in fleet.history.items() if k[2] == "reservation")
    assert res.stockouts > 0 and res.obtained > 0
    assert fleet.history_scan_reads > fleet.rankings  # the full scan grew with every run recorded
    # Fixed ladders never call the ranking: their results are kept and read back as computed.
    steps = sim.plan(sim.fleet_spec(sim.SCENARIO["written_ladder"]))
    orders = sim.fixed_orders(steps, False)
    first = sim.compare(runs, 7, "stationary", orders, tmp_path)
    (cached,) = tmp_path.iterdir()
    assert cached.name == "fixed-30-7-stationary-1.json"
    again = sim.compare(runs, 7, "stationary", orders, tmp_path)
    assert again["written_order"] == first["written_order"]


def test_the_floor_respects_deadlines_and_the_paid_window(sim: ModuleType) -> None:
    """Two runs of 2 h due at once, one of 1 h later: a 1-VM reservation can hold 3 of the 5 hours in
    their windows (not 6, its paid window), spot the other 2; without spot, on-demand."""
    sc = {**sim.SCENARIO, "reservation_vms": 1}
    h = 3600.0
    runs = [sim.RunSpec(0, "nightly", 0.0, 3600, 600, 2 * h), sim.RunSpec(1, "nightly", 0.0, 3600, 600, 2 * h),
            sim.RunSpec(2, "experiment", 5 * h, 1800, 150, 6 * h)]  # fmt: skip
    fleet = sim.Fleet(runs, 7, None, sc=sc)
    assert fleet.usable_hours() == (3.0, 5.0)
    prepaid = 1 * 16.8 * 6  # one VM of 4 chips at 4.20, the window [0, 6 h]
    assert fleet.reservation_cost() == pytest.approx(prepaid, rel=1e-12)
    assert fleet.floor() == pytest.approx((prepaid + 2 * 8.4) / 9000, rel=1e-12)
    no_spot = {**sc, "capacity_chips": {z: {"STANDARD": 24} for z in sim.ZONES}}
    assert sim.Fleet(runs, 7, None, sc=no_spot).floor() == pytest.approx((prepaid + 2 * 16.8) / 9000, rel=1e-12)


def test_no_policy_beats_the_floor_and_the_gap_adds_up(sim: ModuleType) -> None:
    runs = sim.make_runs(40, 7)
    steps = sim.plan(sim.fleet_spec(sim.SCENARIO["written_ladder"]))
    orders = sim.fixed_orders(steps, True)
    fleet = sim.Fleet(runs, 7, None)
    total = sum(r.steps for r in runs)
    for name in ("written: res > spot a,b,c > on-demand a,b,c", "spot a > res > spot b > on-demand", "res > on-demand"):
        f = sim.Fleet(runs, 7, orders[name])
        r = f.run()
        assert r["kept_steps"] == total and r["usd_per_kept_step"] > fleet.floor()
        g = r["gap_to_floor_per_1k"]
        assert g["total"] == pytest.approx(1000 * (r["usd_per_kept_step"] - fleet.floor()), abs=1e-3)
        assert g["total"] == pytest.approx(g["on_demand"] + g["idle_reservation"] + g["lost"] + g["other"], abs=1e-3)
        od_h = sum(v for k, v in f.held.items() if k.startswith("on-demand"))
        assert g["on_demand"] == pytest.approx(round(1000 * od_h * 8.4 / total, 4), abs=1e-4)
        # Each class's hours add up to the hours per rung; a ladder's classes use only its rungs.
        by_class = r["slice_hours_by_class"]
        assert set(by_class) == set(sim.SCENARIO["classes"])
        for c in by_class:  # a class holds at least its own work
            work_h = sum(x.steps for x in runs if x.cls == c) * sim.SCENARIO["seconds_per_step"] / 3600.0
            assert sum(f.held_by_class.get(c, {}).values()) >= work_h > 0
        for where, hours in f.held.items():
            assert sum(c.get(where, 0.0) for c in f.held_by_class.values()) == pytest.approx(hours)
        if name == "res > on-demand":
            used = {w for c in by_class.values() for w in c}
            assert used <= {"reservation@a", "on-demand@a", "on-demand@b", "on-demand@c"}
    assert fleet.run()["usd_per_kept_step"] > fleet.floor()


def test_the_suite_is_fixed(sim: ModuleType) -> None:
    """Seven scenarios of different kinds, two seeds: changing one after measuring shows here."""
    assert list(sim.SUITE) == ["stationary", "drift", "cheap-flaky", "due-soon", "big-reservation", "swap",
                               "contended"]  # fmt: skip
    assert sim.SEEDS == (7, 8) and sim.SUITE_RUNS == 100
    assert sim.scenario_rates("swap")[1] == (25 * 3600.0, {"us-east5-a": 2.0, "us-east5-b": 0.6, "us-east5-c": 0.1})
    assert sim._prices(sim.scenario("cheap-flaky")).price("v5p", "spot") == pytest.approx(0.3 * 4.20)
    due = sim.make_runs(200, 7, sim.scenario("due-soon"))
    urgent = [r for r in due if r.cls == "urgent"]
    assert 50 < len(urgent) < 85
    assert all(r.deadline - r.arrival == pytest.approx(r.steps * 2.0 + 1800, abs=2.0) for r in urgent)


def test_a_patient_fleet_waits_for_spot_instead_of_buying_on_demand(sim: ModuleType) -> None:
    runs = sim.make_runs(60, 7)  # 30 runs no longer buy on-demand at all (recourse, ties)
    hasty = sim.Fleet(runs, 7, None)
    h = hasty.run()
    patient = sim.Fleet(runs, 7, None, wait_s=600.0)
    p = patient.run()
    assert patient.spec.choose.wait.total_seconds() == 600 and hasty.spec.choose.wait is None
    # The same runs and luck: on-demand falls to a fraction, every deadline still kept, nothing leaked.
    def od(r: dict[str, Any]) -> float:
        return sum(v for k, v in r["slice_hours"].items() if k.startswith("on-demand"))

    assert 0 < od(p) < od(h) / 2
    assert p["deadline_hit_rate"] == h["deadline_hit_rate"] == 1.0 and p["slices_leaked"] == 0


def test_auto_sees_the_swap_within_five_hours_and_asks_the_reservation_for_its_counts(sim: ModuleType) -> None:
    """Forgetting by default: the change-point reset fires on zone a's spot soon after the swap (hour 25);
    the fleet view reads the reservation's count / inUseCount before each ranking."""
    from tpu_ops.provision import forgetting

    sc = sim.scenario("swap")
    fleet = sim.Fleet(sim.make_runs(60, 7, sc), 7, None, sc=sc)
    resets: list[tuple[float, str]] = []
    weigh = forgetting.weigh

    def spy(entries: Any, now: float, half_life_s: float | None = None) -> Any:
        out, changes = weigh(entries, now, half_life_s)
        resets.extend(((now - fleet.t0) / 3600, f"{k[2]}@{k[1][-1]}") for k in changes)
        return out, changes

    reads: list[int] = []
    get = fleet.api.get_reservation

    def counted(*a: Any) -> Any:
        reads.append(1)
        return get(*a)

    fleet.api.get_reservation = counted
    sim.forgetting.weigh = spy
    try:
        r = fleet.run()
    finally:
        sim.forgetting.weigh = weigh
    first = min(t for t, k in resets if k == "spot@a")
    # ~4.2 h: fewer runs go to zone a's spot after the swap than before recourse, so the recent evidence
    # takes a while to outgrow MIN_RECENT_HOURS and the interval (29.2 h on this 60-run fleet)
    assert 25.0 < first < 30.0
    # Each run that ranked by cost (not the first ones, in the written order: no history yet) left its ask.
    asks = [e["ask"] for e in fleet.summary["runs"].values()]
    assert r["slices_leaked"] == 0 and fleet.why_counts["cost"] > 100 and len(asks) > 50
    assert len(sim.fleet.asks(fleet.summary)) == sim.fleet.RECENT_ASKS
    assert reads == [1] * fleet.rankings  # one reservations.get per ranking


def test_a_run_on_spot_moves_to_a_freed_reservation_vm_at_its_next_checkpoint(sim: ModuleType) -> None:
    """Make-before-break: run 1 is on spot (the 1-VM reservation held by run 0). Run 0 ends at 4020 s;
    at run 1's next checkpoint (4110 s, 1800 steps kept) the reservation is free and ranked first: its
    VM is inserted while spot trains on, and up at 4290 s; spot's workers save the step in hand (1890:
    none lost) and it is deleted, its record ending "moved" (no preemption); the reservation restores
    (240 s) and trains the other 1710 steps: done at 4530 + 3420 = 7950 s."""
    sc = {**sim.SCENARIO, "reservation_vms": 1, "spot_preemptions_per_hour": dict.fromkeys(sim.ZONES, 0.0)}
    h = 3600.0
    runs = [sim.RunSpec(0, "experiment", 0.0, 1800, 150, 10 * h), sim.RunSpec(1, "long", 60.0, 3600, 300, 10 * h)]
    fleet = sim.Fleet(runs, 7, None, sc=sc, moves={})
    r = fleet.run()
    st = fleet.state[1]
    assert fleet.move_counts["moved"] == 1 and fleet.move_counts["refused"] == 0
    assert st.finished_at == 7950.0 and st.kept == 3600 and st.recoveries == 0 and st.moves == 1
    assert r["preemptions"] == 0 and r["slices_leaked"] == 0 and r["deadline_hit_rate"] == 1.0
    # Spot held from RUNNING (270 s) to the handover (4290 s); the reservation from its insert (4110 s):
    # both held (and billed) during the new one's boot, while spot still trained.
    assert fleet.held["spot@a"] == pytest.approx((4290 - 270) / h, rel=1e-12)
    assert fleet.held["reservation@a"] == pytest.approx(((4020 - 180) + (7950 - 4110)) / h, rel=1e-12)
    assert st.cost == pytest.approx((4290 - 270) / h * 8.4, rel=1e-12)  # the reservation is prepaid
    moved = [rec for rec, _ in fleet.records if any(i["end"] == "moved" for i in rec["incarnations"])]
    assert len(moved) == 1 and moved[0]["preemptions"] == []
    (spot_key,) = [k for k in fleet.history if k[1:3] == ("us-east5-a", "spot")]
    assert fleet.history[spot_key].preemptions == 0
    assert fleet.history[spot_key].hours == pytest.approx((4290 - 270) / h, rel=1e-12)
