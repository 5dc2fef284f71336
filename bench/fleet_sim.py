"""Fleet simulator: the cost-ranked ladder (``ladder: auto``) against every fixed-order ladder, on the
same seeded traces, in compressed time.

What is real: the fake Compute Engine's own state machine (``infra.local.compute.models``, in
process, no HTTP, on a manual clock) holds the capacity — chips per zone and provisioning model, a
reservation of a few VMs — so stock-outs come from the fleet's own concurrent demand, exactly as the
fake decides them; every slice is an instance inserted, read and deleted through it, and the fake's
``preempt`` control preempts spot VMs. The choice is the real code: ``tpu_ops.provision.ladder.plan``
for the attempts, ``tpu_ops.provision.ranking.order`` (``choose.rank``) to order them, and
``tpu_ops.provision.history.fold_run`` folding each finished slice's record (the shape of a run's
``state.json``) and the stock-outs met on the way to each slice into the fleet's capacity history,
which ``auto`` learns from as the fleet runs (starting from no history at all, i.e. the written
order): the preemption rates and, from the stock-outs, how often each rung is full (its scarcity).

What is modelled: when a spot VM is preempted (per-zone Poisson rates the ranking never sees,
changing at set hours in some scenarios), how long a slice takes to boot and restore, and the training
itself (steps of ``seconds_per_step``, a checkpoint every ``checkpoint_every`` steps; a preemption
loses the steps since the last one). Billing: a held slice by the second at its list price, from
RUNNING to deleted; the reservation as Compute Engine bills it, every VM for the whole window whether
used or not (the same sum for every policy), so an hour of it used costs nothing more. Traces are
keyed by (run, rung, n-th use), so every policy meets the same luck on the same choice.

**The suite** (``SUITE``, seeds ``SEEDS``, ``SUITE_RUNS`` runs per seed; fixed, and committed, before
the policy it judges was measured on it): ``stationary`` and ``drift`` (the two scenarios of earlier
rounds), ``cheap-flaky`` (spot at 30% of on-demand, the flakiest zone the most plentiful), ``due-soon``
(no reservation, a third of the runs due half an hour after their work), ``big-reservation`` (6 VMs,
more than half the demand, rare preemption), ``swap`` (zones a and c swap spot rates at hour 25) and
``contended`` (a 2-VM reservation, little steady spot, many long-checkpoint runs). Each comment in
``SUITE`` says what it tests. Baselines: the best of 261 fixed ladders chosen with hindsight (at a hit
rate ≥ auto's), and per-class fixed ladders (one order per kind of run, each the cheapest for its class
with hindsight). The floor (:meth:`Fleet.floor`) respects every run's window and the reservation's
paid window; for each policy the gap to it is split into on-demand hours, idle reservation, lost time
(:meth:`Fleet.gap`).

Voluntary moves (``auto with moves``, the table's ``auto``): at every checkpoint a running run ranks
its remaining work again and, when :func:`tpu_ops.provision.moving.worth_moving` says so, moves
make-before-break (the new slice inserted while the old trains; the old saves the step in hand and is
deleted when the new one is up; both billed during the new one's boot). See docs/fleet.md. A walk that finds
the reservation full may wait for it (``choose.queue``, its default 10 min, as in production: ``ranking.order(...,
queue=True)``); ``auto with moves, never queueing (as the eighth look)`` turns that off.

    .venv/bin/python bench/fleet_sim.py [--runs 100] [--seeds 7,8] [--scenario NAME ...] [--jobs 2]
        [--variants NAME ...] [--written-only] [--json] [--json-out FILE] [--fixed-cache DIR]

History requests are counted as the capacity summary makes them (``history_gcs_reads_per_run``: one
read per ranking, a read and a conditional write per slice recorded), beside what a full scan of the
run records per ranking would have made (``history_gcs_reads_per_run_full_scan``).
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import itertools
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.local.compute.models import RESERVATION_KEY, ComputeBackend
from infra.local.core.clock import ManualClock
from tpu_ops.provision import fleet, forgetting, moving, ranking, viewing
from tpu_ops.provision import history as H
from tpu_ops.provision.choose import History, RunModel
from tpu_ops.provision.ladder import Step, plan
from tpu_ops.provision.prices import PriceTable, shipped
from tpu_ops.specs.choose import ChooseSpec
from tpu_ops.specs.slice import ProvisionSpec

PROJECT = "fleet-sim"
MACHINE = "ct5p-hightpu-4t"  # a v5p-8 slice: one 4-chip host
ZONES = ("us-east5-a", "us-east5-b", "us-east5-c")
RESERVATION = "team-res"

# -- the scenarios ---------------------------------------------------------------------------------
# The base scenario (``stationary``); every other scenario of the suite (``SUITE``) changes a few keys.
SCENARIO: dict[str, Any] = {
    "accelerator": "v5p-8 (one ct5p-hightpu-4t host, 4 chips) on Compute Engine",
    # Ground truth the ranking never sees: spot preemptions per hour of a held slice, by zone.
    "spot_preemptions_per_hour": {"us-east5-a": 0.1, "us-east5-b": 0.6, "us-east5-c": 2.0},
    # When the ground truth changes: (from hour, spot preemptions/h of the zones that change).
    "changes": [],
    # Capacity in chips (4 per slice) per zone and provisioning model; the reservation is 3 VMs in zone a.
    "capacity_chips": {
        "us-east5-a": {"SPOT": 16, "STANDARD": 24},
        "us-east5-b": {"SPOT": 24, "STANDARD": 24},
        "us-east5-c": {"SPOT": 48, "STANDARD": 24},
    },
    "reservation_vms": 3,
    # Spot's price as a share of on-demand (None: the shipped price table's, 50% for v5p).
    "spot_price_factor": None,
    # A reservation is billed whether used or not (Compute Engine: at the on-demand rate, for as long as
    # it exists): every policy pays for its VMs from the first arrival to the last deadline; using it
    # adds nothing (an hour used after that window is billed as held).
    "reservation_billing": "prepaid: every VM from t=0 to the last run's deadline, used or not",
    "boot_s": 180.0,  # insert -> RUNNING (the fake's provision latency)
    "restore_s": 240.0,  # RUNNING -> first new step (agent, restore); billed
    "detect_delete_s": 60.0,  # preemption -> slice gone; billed
    "stockout_s": 30.0,  # an attempt that ends in ZONE_RESOURCE_POOL_EXHAUSTED
    "ladder_retry_s": 600.0,  # every rung stocked out: wait, then walk again
    "max_recoveries": 40,  # then the run fails (a miss), keeping the steps it checkpointed
    "arrivals_per_hour": 2.0,
    "seconds_per_step": 2.0,
    # Run classes: share, hours of work (uniform range), minutes between checkpoints, and the deadline
    # as ``x_work`` x the work + ``plus_h`` hours after arrival.
    "classes": {
        "experiment": {"share": 0.5, "hours": [1.0, 3.0], "checkpoint_min": 5, "deadline": {"x_work": 3}},
        "nightly": {"share": 0.3, "hours": [4.0, 6.0], "checkpoint_min": 20, "deadline": {"x_work": 1, "plus_h": 2}},
        "long": {"share": 0.2, "hours": [10.0, 16.0], "checkpoint_min": 120, "deadline": {"x_work": 2}},
    },
    "written_ladder": ["reservation:team-res@us-east5-a", "spot", "on-demand"],
    "max_miss": 0.1,  # the default of choose.max_miss
    # ``choose.half_life`` of the variant that weighs history by age: yesterday's runs count half.
    "half_life_h": 24.0,
}

# The suite, fixed before the policy it judges was measured on it (issue 30; see docs/fleet.md):
# seven scenarios of different kinds, each the base with these keys changed. Seeds: ``SEEDS``.
SUITE: dict[str, dict[str, Any]] = {
    # The base: constant rates, a 3-VM reservation, spot at half the on-demand price.
    "stationary": {},
    # Learning must follow a change: zone a's spot (the steadiest) degrades at hour 30 (of ~50 of arrivals).
    "drift": {"changes": [(30.0, {"us-east5-a": 1.0})]},
    # Spot at 30% of on-demand, and the flakiest zone (c, 2/h) is by far the most plentiful: cheap
    # capacity is everywhere, steady cheap capacity is scarce.
    "cheap-flaky": {
        "spot_price_factor": 0.3,
        "capacity_chips": {
            "us-east5-a": {"SPOT": 8, "STANDARD": 24},
            "us-east5-b": {"SPOT": 16, "STANDARD": 24},
            "us-east5-c": {"SPOT": 96, "STANDARD": 24},
        },
    },
    # No reservation (its rung is in the written ladder but holds no VM) and a third of the runs due
    # half an hour after their work: patience is dear for them, cheap for the rest.
    "due-soon": {
        "reservation_vms": 0,
        "classes": {
            "urgent": {"share": 0.33, "hours": [1.0, 4.0], "checkpoint_min": 30,
                       "deadline": {"x_work": 1, "plus_h": 0.5}},
            "experiment": {"share": 0.34, "hours": [1.0, 3.0], "checkpoint_min": 5, "deadline": {"x_work": 3}},
            "nightly": {"share": 0.2, "hours": [4.0, 6.0], "checkpoint_min": 20,
                        "deadline": {"x_work": 1, "plus_h": 2}},
            "long": {"share": 0.13, "hours": [10.0, 16.0], "checkpoint_min": 120, "deadline": {"x_work": 2}},
        },
    },
    # A reservation larger than half the demand (6 VMs; ~10 slices busy on average) and rare
    # preemption: reordering gains little, using the prepaid VMs fully is most of it.
    "big-reservation": {
        "reservation_vms": 6,
        "spot_preemptions_per_hour": {"us-east5-a": 0.05, "us-east5-b": 0.1, "us-east5-c": 0.3},
    },
    # Two zones' spot rates swap mid-way (hour 25 of ~50 of arrivals): a becomes the flaky one.
    "swap": {"changes": [(25.0, {"us-east5-a": 2.0, "us-east5-c": 0.1})]},
    # Our own: steady capacity is contended. A 2-VM reservation, zone a's spot small, more long runs
    # (2-hour checkpoints) and more arrivals: who gets the steady capacity decides the bill.
    "contended": {
        "reservation_vms": 2,
        "arrivals_per_hour": 2.5,
        "capacity_chips": {
            "us-east5-a": {"SPOT": 8, "STANDARD": 32},
            "us-east5-b": {"SPOT": 24, "STANDARD": 32},
            "us-east5-c": {"SPOT": 48, "STANDARD": 32},
        },
        "classes": {
            "experiment": {"share": 0.45, "hours": [1.0, 3.0], "checkpoint_min": 5, "deadline": {"x_work": 3}},
            "nightly": {"share": 0.2, "hours": [4.0, 6.0], "checkpoint_min": 20,
                        "deadline": {"x_work": 1, "plus_h": 2}},
            "long": {"share": 0.35, "hours": [10.0, 16.0], "checkpoint_min": 120, "deadline": {"x_work": 2}},
        },
    },
}
SEEDS = (7, 8)  # every scenario, both seeds
# Runs per seed: 300 before the suite; 100 here, because the fake Compute Engine's fidelity work made a
# fleet ~10x slower (~1 s per 100 runs loaded, x 261 fixed ladders x 14 (scenario, seed)): ~50 h of arrivals.
SUITE_RUNS = 100
Rates = list[tuple[float, dict[str, float]]]  # (from second, spot preemptions/h by zone), in order


def scenario(name: str) -> dict[str, Any]:
    """The base scenario with the suite's changes for ``name``."""
    if name not in SUITE:
        raise ValueError(f"scenario: {name!r} is not one of {list(SUITE)}")
    return {**SCENARIO, **SUITE[name], "name": name}


def scenario_rates(name: str | dict[str, Any]) -> Rates:
    """The spot rates through time: the base's, then each change from its hour."""
    sc = scenario(name) if isinstance(name, str) else name
    out: Rates = [(0.0, dict(sc["spot_preemptions_per_hour"]))]
    for at_h, change in sc["changes"]:
        out.append((at_h * 3600.0, {**out[-1][1], **change}))
    return out


def preempted_at(rates: Rates, zone: str, start: float, rng: random.Random) -> float:
    """When a spot slice held from ``start`` is preempted: a Poisson process whose rate follows
    ``rates`` (one unit-exponential draw spent against the accumulated hazard)."""
    budget = rng.expovariate(1.0)
    t = start
    for i, (_, by_zone) in enumerate(rates):
        end = rates[i + 1][0] if i + 1 < len(rates) else math.inf
        if end <= t:
            continue
        lam = by_zone[zone] / 3600.0
        if lam > 0 and t + budget / lam <= end:
            return t + budget / lam
        budget -= lam * (end - t)
        t = end
    return math.inf


def _deadline(cls: dict[str, Any], work_s: float) -> float:
    d = cls["deadline"]
    return float(d.get("x_work", 1.0)) * work_s + float(d.get("plus_h", 0.0)) * 3600.0


@dataclass
class RunSpec:
    idx: int
    cls: str
    arrival: float
    steps: int
    checkpoint_every: int
    deadline: float  # absolute


@dataclass
class RunState:
    spec: RunSpec
    kept: int = 0  # steps checkpointed
    cost: float = 0.0
    recoveries: int = 0
    uses: dict[int, int] = field(default_factory=dict)  # rung number -> times used (trace key)
    instance: str = ""
    step: Step | None = None
    ready_at: float = 0.0
    requested_at: float = 0.0
    finished_at: float | None = None
    failed: bool = False
    api_calls: int = 0
    refused: list[dict[str, Any]] = field(default_factory=list)  # stock-outs not yet published
    # Voluntary moves (``moves``): billing starts at RUNNING, or at the insert for a slice moved to (its
    # boot overlaps the old slice's training: both are billed); the held slice's pending events, ended
    # by a move; the slice being moved to (step, instance, inserted at); the moves made and the rungs left.
    bill_from: float = 0.0
    train_from: float = 0.0
    ends_at: float = 0.0  # the held slice's preemption or finish, whichever comes first
    live: list[int] = field(default_factory=list)
    moving: tuple[Step, str, float] | None = None
    moves: int = 0
    left: list[int] = field(default_factory=list)


def make_runs(n: int, seed: int, sc: dict[str, Any] | None = None) -> list[RunSpec]:
    sc = sc or SCENARIO
    rng = random.Random(seed)
    sps = sc["seconds_per_step"]
    out, t = [], 0.0
    classes = sc["classes"]
    for i in range(n):
        t += rng.expovariate(sc["arrivals_per_hour"] / 3600.0)
        r = rng.random()
        acc = 0.0
        cls = list(classes)[-1]
        for name, c in classes.items():
            acc += c["share"]
            if r < acc:
                cls = name
                break
        c = classes[cls]
        work = rng.uniform(*c["hours"]) * 3600.0
        steps = int(work / sps)
        out.append(RunSpec(i, cls, t, steps, int(c["checkpoint_min"] * 60 / sps), t + _deadline(c, work)))
    return out


def _prices(sc: dict[str, Any]) -> PriceTable:
    """The shipped table, with v5p spot at ``spot_price_factor`` x on-demand when the scenario sets it."""
    table = shipped()
    if sc.get("spot_price_factor") is None:
        return table
    v5p = {**table.rates["v5p"], "spot": sc["spot_price_factor"] * table.rates["v5p"]["on-demand"]}
    return replace(table, rates={**table.rates, "v5p": v5p}, origin=f"{table.origin} (scenario {sc.get('name')})")


def trace(seed: int, *key: Any) -> random.Random:
    """The same luck for the same (run, rung, n-th use) whatever the policy."""
    h = hashlib.sha256(repr((seed, *key)).encode()).digest()
    return random.Random(int.from_bytes(h[:8], "big"))


def fleet_spec(ladder: list[str], wait_s: float | None = None, queue: bool = True) -> ProvisionSpec:
    choose: dict[str, Any] = {"max_miss": SCENARIO["max_miss"]}  # choose.queue: its default (10 min), or null
    if not queue:
        choose["queue"] = None
    if wait_s is not None:
        choose["wait"] = f"{wait_s:.0f}s"
    return ProvisionSpec.model_validate({
        "slice": {"accelerator_type": "v5p-8", "region": "us-east5", "zones": list(ZONES)},
        "ladder": ladder, "budget_usd": 100000, "hours": 16, "choose": choose,
    })  # fmt: skip


class Fleet:
    """One policy over the whole trace: ``order`` is None for ``auto``, else a fixed list of step numbers,
    or one per run class (a per-class fixed ladder)."""

    def __init__(self, runs: list[RunSpec], seed: int, order: list[int] | dict[str, list[int]] | None,
                 reservation_price: ranking.ReservationPrice = "prepaid", rates: Rates | None = None,
                 half_life_h: float | None = None, scarcity: bool = True,
                 wait_s: float | None = None, sc: dict[str, Any] | None = None, forget: bool = True,
                 view: bool = True, moves: dict[str, Any] | None = None, queue: bool = True) -> None:  # fmt: skip
        self.sc = sc or SCENARIO
        # Voluntary moves at checkpoints (``auto`` only; fixed ladders never rank): None, or the
        # keywords of :func:`moving.worth_moving` plus the simulator's own rules (``MOVES``).
        self.moves = {**MOVES, **moves} if moves is not None and order is None else None
        self.cancelled: set[int] = set()
        self.move_counts = {"checkpoints": 0, "asked": 0, "refused": 0, "moved": 0, "back": 0,
                            "old_preempted_in_overlap": 0, "finished_in_overlap": 0}  # fmt: skip
        self.forget, self.view = forget, view
        self.changes: dict[H.Key, forgetting.Change] = {}  # rungs reset by a change, at the last ranking
        self.summary: dict[str, Any] = {"runs": {}}  # the capacity summary's asks (fleet.asks, fleet.admit)
        self.runs, self.seed, self.fixed = runs, seed, order
        self.reservation_price, self.scarcity = reservation_price, scarcity
        self.rates = rates or scenario_rates(self.sc)
        self.half_life_s = half_life_h * 3600.0 if half_life_h is not None else None
        self.records: list[tuple[dict[str, Any], dict[H.Key, History]]] = []  # each record published, folded
        # Each run's record so far (its state.json) and the capacity summary's entry for the run (its sums in it).
        self.entries: dict[int, tuple[dict[str, Any], forgetting.Entry]] = {}
        # The reservation's paid window: the same for every policy (arrivals and deadlines are the runs').
        self.window_end = max((r.deadline for r in runs), default=0.0)
        self.spec = fleet_spec(self.sc["written_ladder"], wait_s, queue)
        self.steps = plan(self.spec)
        self.table = _prices(self.sc)
        self.backend_name = ranking.backend_of(self.spec)
        self.clock = ManualClock(start=1_790_000_000.0)
        self.t0 = self.clock.now()
        self.api = ComputeBackend(clock=self.clock, preempt_notice_s=30.0)
        cap = {z: dict(c) for z, c in self.sc["capacity_chips"].items()}
        cap["us-east5-a"]["reservations"] = {
            RESERVATION: {"count": self.sc["reservation_vms"], "machineType": MACHINE}
        }
        self.api.configure_capacity(cap)
        self.api.set_latency(provision_s=self.sc["boot_s"], delete_s=0.0, op_polls=0)  # an answer at once
        self.events: list[tuple[float, int, str, int]] = []
        self.seq = itertools.count()
        self.state = {r.idx: RunState(r) for r in runs}
        self.rankings = 0
        self.queued = 0  # walks that waited for the full reservation (choose.queue)
        self.held: dict[str, float] = {}  # slice-hours by tier@zone
        self.held_by_class: dict[str, dict[str, float]] = {}  # the same, per run class (where the gap is)
        self.reserved_in_window_h = 0.0  # reservation hours used within its paid window
        self.list_cost = 0.0  # every held hour at its list price (the accounting before the audit)
        # GCS requests for the history: a ranking reads the capacity summary (1); each slice's record is
        # published into it (a read and a conditional write; the sim is sequential, so no 412 retries).
        # ``history_scan_reads``: what the full scan did before the summary (a listing + 2 per past run).
        self.history_reads = 0
        self.history_writes = 0
        self.history_scan_reads = 0
        self.recorded_runs: set[int] = set()
        self.why_counts: dict[str, int] = {}

    # -- plumbing ----------------------------------------------------------------------------------
    def at(self, t: float, what: str, run: int) -> int:
        seq = next(self.seq)
        heapq.heappush(self.events, (t, seq, what, run))
        return seq

    def now(self) -> float:
        return self.clock.now() - self.t0

    def price(self, step: Step) -> float:
        return 4 * self.table.price("v5p", str(step.tier))  # 4 chips

    def order_for(self, st: RunState) -> tuple[list[Step], float | None]:
        """The rungs to try on this walk, and how long to wait before the next if all are refused
        (``choose.wait``: then only those before on-demand are tried); None: the ladder's retry."""
        if self.fixed is not None:
            by = {s.number: s for s in self.steps}
            fixed = self.fixed[st.spec.cls] if isinstance(self.fixed, dict) else self.fixed
            return [by[n] for n in fixed], None
        sps = self.sc["seconds_per_step"]
        left = st.spec.steps - st.kept
        run = RunModel(left, sps, st.spec.checkpoint_every, st.spec.deadline - self.now())
        view = None
        if self.view:  # as the production ladder builds it (ranking.apply): the reservation's own count /
            # inUseCount as Compute Engine answers them, and the asks kept in the capacity summary
            st.api_calls += 1
            view = viewing.view_for(self.steps, self.summary, lambda z, n: self.api.get_reservation(PROJECT, z, n))
        ordered, choice = ranking.order(self.spec, self.steps, self.table, self.aged_history(), run,
                                        self.reservation_price, self.scarcity, view, queue=True)  # fmt: skip
        if choice.try_now == 0:
            self.queued += 1
        if view is not None and choice.method == "cost":  # history.note_ask in production
            self.summary["runs"].setdefault(st.spec.idx, {})["ask"] = fleet.ask(fleet.gain(choice), self.clock.now())
        self.rankings += 1
        self.history_reads += 1
        self.history_scan_reads += 1 + 2 * len(self.recorded_runs)
        self.why_counts[choice.method] = self.why_counts.get(choice.method, 0) + 1
        if choice.try_now is not None:
            return ordered[: choice.try_now], choice.wait_s
        return ordered, None

    def body(self, st: RunState, step: Step, name: str) -> dict[str, Any]:
        sched: dict[str, Any] = {"onHostMaintenance": "TERMINATE"}
        body: dict[str, Any] = {"name": name, "machineType": f"zones/{step.zone}/machineTypes/{MACHINE}",
                                "labels": {"tpu-ops-run": f"sim-{st.spec.idx}"}}  # fmt: skip
        if step.tier == "spot":
            sched.update(provisioningModel="SPOT", instanceTerminationAction="DELETE")
        elif step.tier == "reservation":
            sched["provisioningModel"] = "RESERVATION_BOUND"
            body["reservationAffinity"] = {"consumeReservationType": "SPECIFIC_RESERVATION", "key": RESERVATION_KEY,
                                           "values": [step.reservation]}  # fmt: skip
        else:
            sched["provisioningModel"] = "STANDARD"
        body["scheduling"] = sched
        return body

    # -- events ------------------------------------------------------------------------------------
    def walk(self, st: RunState) -> None:
        """The ladder: try the rungs in order; stock-outs cost ``stockout_s`` each."""
        t = self.now()
        st.requested_at = st.requested_at or t
        steps, wait = self.order_for(st)
        for step in steps:
            n = st.uses.get(step.number, 0)
            name = f"sim-{st.spec.idx}-a{step.number}-{n}"
            st.api_calls += 1
            op = self.api.insert_instance(PROJECT, step.zone, self.body(st, step, name))
            # Operations are asynchronous (RUNNING, then DONE): a stock-out shows on the first read.
            st.api_calls += 1
            op = self.api.get_operation(PROJECT, f"zones/{step.zone}", op["name"])
            if "error" in op:
                t += self.sc["stockout_s"]
                st.refused.append({"zone": step.zone, "tier": str(step.tier), "at": self.t0 + t})
                continue
            self._publish_refusals(st)
            st.uses[step.number] = n + 1
            st.instance, st.step = name, step
            self.at(t + self.sc["boot_s"], "ready", st.spec.idx)
            return
        self.at(t + (self.sc["ladder_retry_s"] if wait is None else wait), "walk", st.spec.idx)

    def _publish_refusals(self, st: RunState) -> None:
        """The stock-outs met on the way to a slice, published with its "obtained" milestone (as the
        supervisor's state store does): the fleet's scarcity, as the real history folds it."""
        if not st.refused:
            return
        rec: dict[str, Any] = {"incarnations": [], "preemptions": [], "stockouts": st.refused}
        self._publish(st.spec.idx, rec)
        self.history_reads += 1
        self.history_writes += 1
        st.refused = []

    def ready(self, st: RunState, bill_from: float | None = None) -> None:
        assert st.step is not None
        st.api_calls += 1
        inst = self.api.get_instance(PROJECT, st.step.zone, st.instance)
        assert inst["status"] == "RUNNING", inst["status"]
        t = st.ready_at = self.now()
        st.bill_from = t if bill_from is None else bill_from
        sps = self.sc["seconds_per_step"]
        st.train_from = t + self.sc["restore_s"]
        done_at = st.train_from + (st.spec.steps - st.kept) * sps
        lose_at = math.inf
        if st.step.tier == "spot":
            luck = trace(self.seed, st.spec.idx, st.step.number, st.uses[st.step.number])
            lose_at = preempted_at(self.rates, st.step.zone, t, luck)
        st.ends_at = min(lose_at, done_at)
        st.live = [self.at(lose_at, "preempt", st.spec.idx) if lose_at < done_at
                   else self.at(done_at, "finish", st.spec.idx)]  # fmt: skip
        if self.moves is not None:
            self._next_checkpoint(st, st.train_from)

    # -- voluntary moves -----------------------------------------------------------------------------
    def _next_checkpoint(self, st: RunState, after: float) -> None:
        """The held slice's next ranking after ``after`` (its last): its next committed checkpoint, or
        ``choose.move_every`` later if that comes first (production's ``Mover._due``), before its end."""
        every_s = st.spec.checkpoint_every * self.sc["seconds_per_step"]
        k = math.floor((after - st.train_from) / every_s + 1e-9) + 1
        t = st.train_from + k * every_s
        assert self.moves is not None
        t = min(t, after + self.moves["every_s"])
        if t < st.ends_at:
            st.live.append(self.at(t, "checkpoint", st.spec.idx))

    def checkpoint(self, st: RunState) -> None:
        """A committed checkpoint: rank the remaining work as a re-walk would and, when
        :func:`moving.worth_moving` says so, insert the rung it names while this slice trains on."""
        assert st.step is not None and self.moves is not None
        t = self.now()
        self._next_checkpoint(st, t)
        self.move_counts["checkpoints"] += 1
        if st.moving is not None:
            return
        sps = self.sc["seconds_per_step"]
        every = st.spec.checkpoint_every
        ran = (t - st.train_from) / sps
        at_checkpoint = abs(ran - round(ran)) < 1e-6 and round(ran) % every == 0
        kept = st.kept + (round(ran) if at_checkpoint else int(ran))  # between them a handover saves the step in hand
        run = RunModel(st.spec.steps - kept, sps, every, st.spec.deadline - t)
        view = None
        if self.view:
            st.api_calls += 1
            view = viewing.view_for(self.steps, self.summary, lambda z, n: self.api.get_reservation(PROJECT, z, n))
        _, choice = ranking.order(self.spec, self.steps, self.table, self.aged_history(), run,
                                  self.reservation_price, self.scarcity, view)  # fmt: skip
        if view is not None and choice.method == "cost" and self.moves.get("note_ask"):
            self.summary["runs"].setdefault(st.spec.idx, {})["ask"] = fleet.ask(fleet.gain(choice), self.clock.now())
        self.rankings += 1
        self.history_reads += 1
        move_s = self.sc["boot_s"] + self.sc["restore_s"]
        move = moving.worth_moving(choice, st.step.number, move_s, margin=self.moves["margin"])
        by = {s.number: s for s in self.steps}
        if move is None or str(by[move.to].tier) not in self.moves["to"]:
            return
        self.move_counts["asked"] += 1
        step = by[move.to]
        n = st.uses.get(step.number, 0)
        name = f"sim-{st.spec.idx}-a{step.number}-{n}"
        st.api_calls += 2
        op = self.api.insert_instance(PROJECT, step.zone, self.body(st, step, name))
        op = self.api.get_operation(PROJECT, f"zones/{step.zone}", op["name"])
        if "error" in op:  # refused: stay; the refusal is published as the ladder's are
            self.move_counts["refused"] += 1
            st.refused.append({"zone": step.zone, "tier": str(step.tier), "at": self.t0 + t})
            self._publish_refusals(st)
            return
        st.uses[step.number] = n + 1
        st.moving = (step, name, t)
        self.at(t + self.sc["boot_s"], "moved", st.spec.idx)

    def moved(self, st: RunState) -> None:
        """The slice moved to is up: the old one's workers save the step in hand (none lost) and it is
        deleted (its record ends "moved", not a preemption); the new one restores and trains on."""
        assert st.moving is not None
        step, name, inserted = st.moving
        st.moving = None
        t = self.now()
        if st.step is not None:
            old = st.step.number
            kind = f"moved {st.step.tier}@{st.step.zone[-1]} > {step.tier}@{step.zone[-1]}"
            self.move_counts[kind] = self.move_counts.get(kind, 0) + 1
            ran = max(0, int((t - st.train_from) / self.sc["seconds_per_step"]))
            st.kept = min(st.spec.steps, st.kept + ran)
            self.cancelled.update(st.live)
            self._release(st, t, "moved", None)
            self.move_counts["moved"] += 1
            self.move_counts["back"] += old in st.left or step.number in st.left
            st.left.append(old)
            st.moves += 1
        st.step, st.instance, st.requested_at = step, name, inserted
        if st.finished_at is not None or st.failed:  # the run ended during the boot: give the new one back
            self.move_counts["finished_in_overlap"] += 1
            st.ready_at = st.bill_from = inserted
            self._release(st, t, "unused", None)
            return
        self.ready(st, bill_from=inserted)

    def _release(self, st: RunState, end: float, outcome: str, lost_steps: int | None) -> None:
        assert st.step is not None
        held = end - st.bill_from
        self.list_cost += held / 3600.0 * self.price(st.step)
        # A reserved VM is paid for the whole window anyway (see ``reservation_cost``): only an hour
        # held after the window costs anything more.
        billed = max(0.0, end - max(st.bill_from, self.window_end)) if st.step.tier == "reservation" else held
        st.cost += billed / 3600.0 * self.price(st.step)
        where = f"{st.step.tier}@{st.step.zone[-1]}"
        self.held[where] = self.held.get(where, 0.0) + held / 3600.0
        mine = self.held_by_class.setdefault(st.spec.cls, {})
        mine[where] = mine.get(where, 0.0) + held / 3600.0
        if st.step.tier == "reservation":
            self.reserved_in_window_h += max(0.0, min(end, self.window_end) - st.bill_from) / 3600.0
        st.api_calls += 1
        self.api.delete_instance(PROJECT, st.step.zone, st.instance)
        # The slice's record, as a run's state.json has it, folded by the real history code.
        inc = {"zone": st.step.zone, "tier": str(st.step.tier), "requested_at": self.t0 + st.requested_at,
               "ready_at": self.t0 + st.ready_at, "ended_at": self.t0 + end, "end": outcome}  # fmt: skip
        rec: dict[str, Any] = {"incarnations": [inc], "preemptions": []}
        if outcome == "preempted":
            rec["preemptions"].append({"zone": inc["zone"], "tier": inc["tier"], "detect_s": 0.0,
                                       "detected_at": self.t0 + end - self.sc["detect_delete_s"],
                                       "delete_s": self.sc["detect_delete_s"], "restore_s": self.sc["restore_s"],
                                       "steps_lost": lost_steps})  # fmt: skip
        self._publish(st.spec.idx, rec)
        self.history_reads += 1
        self.history_writes += 1
        self.recorded_runs.add(st.spec.idx)
        st.step, st.instance, st.requested_at = None, "", 0.0

    def preempt(self, st: RunState) -> None:
        assert st.step is not None
        t = self.now()
        self.api.preempt(st.step.zone, st.instance, PROJECT)
        sps = self.sc["seconds_per_step"]
        ran = max(0, int((t - st.ready_at - self.sc["restore_s"]) / sps))
        every = st.spec.checkpoint_every
        kept = min(st.spec.steps, st.kept + ran // every * every)
        lost = st.kept + ran - kept
        st.kept = kept
        st.recoveries += 1
        self._release(st, t + self.sc["detect_delete_s"], "preempted", lost)
        if st.recoveries > self.sc["max_recoveries"]:
            st.failed, st.finished_at = True, t
            return
        if st.moving is not None:  # the slice moved to is already booting: no walk, it takes over
            self.move_counts["old_preempted_in_overlap"] += 1
            return
        self.at(t + self.sc["detect_delete_s"], "walk", st.spec.idx)

    def finish(self, st: RunState) -> None:
        st.kept = st.spec.steps
        st.finished_at = self.now()
        self._release(st, st.finished_at, "done", None)

    def _forget_done_operations(self) -> None:
        """The fake keeps every operation forever and walks them all on each call (fine for a test,
        quadratic over a fleet's thousands): finished ones are dropped, as Compute Engine expires them."""
        with self.api._lock:
            self.api._ops = {k: op for k, op in self.api._ops.items() if not op.done}

    def _publish(self, idx: int, part: dict[str, Any]) -> None:
        """What a run adds to its record, folded again whole by the real history code: as ``history.publish``
        keeps one summary entry per run, and the ranking ages each entry by when its run was last seen
        (``forgetting.summary_entries``), not each slice by when it ended."""
        ident = {"accelerator_type": "v5p-8", "backend": self.backend_name}
        self.records.append((part, H.fold_run(part, ident)))
        old = self.entries[idx][0] if idx in self.entries else {"incarnations": [], "preemptions": [], "stockouts": []}
        rec = {k: old[k] + list(part.get(k) or []) for k in ("incarnations", "preemptions", "stockouts")}
        self.entries[idx] = (rec, forgetting.entry(H.entry(rec, ident)))

    @property
    def history(self) -> dict[H.Key, History]:
        """Every run's sums added, unweighted."""
        out: dict[H.Key, History] = {}
        for _, e in self.entries.values():
            for k, h in e.sums.items():
                out[k] = out.get(k, History()).merged(h)
        return out

    def aged_history(self) -> dict[H.Key, History]:
        """The history as the ranking reads it: forgetting by default (:mod:`tpu_ops.provision.forgetting`,
        ``choose.half_life`` or a day, change-point resets); the plain sums without (``forget=False``)."""
        if self.forget:
            entries = [e for _, e in self.entries.values()]
            weighed, self.changes = forgetting.weigh(entries, self.clock.now(), self.half_life_s)
            return weighed
        if self.half_life_s is None:
            return self.history
        now = self.clock.now()
        out: dict[H.Key, History] = {}
        for rec, e in self.entries.values():
            w = H.weight(rec, now, self.half_life_s)
            for k, h in e.sums.items():
                out[k] = out.get(k, History()).merged(h.scaled(w))
        return out

    def reservation_cost(self) -> float:
        """What the reservation costs every policy: each VM at its price over the window, used or not."""
        by = {s.tier: s for s in self.steps}
        return self.sc["reservation_vms"] * self.price(by["reservation"]) * self.window_end / 3600.0

    def usable_hours(self) -> tuple[float, float]:
        """Slice-hours any policy could put on (the reservation, the reservation or spot) while respecting
        every run's window: at each instant a run can hold one slice, and only between its arrival and
        its deadline, so at most ``min(runs in their window, VMs)`` reserved hours accrue, and at most
        ``min(runs in their window, VMs + spot slices)`` cheap ones; each integrated over the paid window."""
        spot_slices = sum(c.get("SPOT", 0) for c in self.sc["capacity_chips"].values()) // 4
        vms = self.sc["reservation_vms"]
        edges = sorted([(r.arrival, 1) for r in self.runs] + [(r.deadline, -1) for r in self.runs])
        active, last, res, cheap = 0, 0.0, 0.0, 0.0
        for t, d in edges:
            span = max(0.0, min(t, self.window_end) - last)
            res += span * min(active, vms)
            cheap += span * min(active, vms + spot_slices)
            active, last = active + d, max(last, min(t, self.window_end))
        return res / 3600.0, cheap / 3600.0

    def floor(self) -> float:
        """A lower bound on any policy's $ per kept step over these runs (all of them finished by their
        deadlines): every hour of work needs a slice-hour; the reservation's are prepaid but usable only
        while runs are in their window (:meth:`usable_hours`), the rest at least the spot price while
        spot slices exist, on-demand beyond. No preemption, no boot, no restore, perfect packing: no
        policy, however clairvoyant, does better."""
        steps = sum(r.steps for r in self.runs)
        return self.floor_usd(steps * self.sc["seconds_per_step"] / 3600.0) / steps

    def floor_usd(self, work_h: float) -> float:
        res_h, cheap_h = self.usable_hours()
        on_res, on_cheap = min(work_h, res_h), min(work_h, cheap_h)
        return self.reservation_cost() + (on_cheap - on_res) * self.tier_price("spot") + (
            work_h - on_cheap) * self.tier_price("on-demand")  # fmt: skip

    def tier_price(self, tier: str) -> float:
        return self.price(next(s for s in self.steps if s.tier == tier))

    def gap(self, kept: int, cost: float) -> dict[str, float]:
        """Where this policy's $ per 1k kept steps above the floor (on the same work) goes: on-demand
        hours (each at on-demand - spot), idle reservation (usable reserved hours not used, each at
        the spot price it would have saved), lost time (held hours beyond the work kept: steps lost to
        preemptions, boot-to-step restores, failed runs' unkept work; at the spot price), the rest."""
        sps = self.sc["seconds_per_step"]
        work_h = kept * sps / 3600.0
        spot, od = self.tier_price("spot"), self.tier_price("on-demand")
        od_h = sum(v for k, v in self.held.items() if k.startswith("on-demand"))
        res_h, _ = self.usable_hours()
        parts = {
            "on_demand": od_h * (od - spot),
            "idle_reservation": max(0.0, min(work_h, res_h) - self.reserved_in_window_h) * spot,
            "lost": max(0.0, sum(self.held.values()) - work_h) * spot,
        }
        total = cost - self.floor_usd(work_h)
        parts["other"] = total - sum(parts.values())
        return {k: round(1000 * v / max(1, kept), 4) for k, v in {"total": total, **parts}.items()}

    def run(self) -> dict[str, Any]:
        for r in self.runs:
            self.at(r.arrival, "walk", r.idx)
        handlers = {"walk": self.walk, "ready": self.ready, "preempt": self.preempt, "finish": self.finish,
                    "checkpoint": self.checkpoint, "moved": self.moved}  # fmt: skip
        for n in itertools.count():
            if not self.events:
                break
            t, seq, what, idx = heapq.heappop(self.events)
            if seq in self.cancelled:
                continue
            self.clock.advance(max(0.0, t - self.now()))
            handlers[what](self.state[idx])
            if n % 16 == 15:
                self._forget_done_operations()
        self.api.tick()
        leaked = self.api.state()["instances"]
        sts = list(self.state.values())
        prepaid = self.reservation_cost()
        used = sum(s.cost for s in sts)
        cost = used + prepaid
        kept = sum(s.kept for s in sts)
        hit = sum(1 for s in sts if not s.failed and s.finished_at is not None and s.finished_at <= s.spec.deadline)
        return {
            "cost_usd": round(cost, 2),
            "reservation_prepaid_usd": round(prepaid, 2),
            "kept_steps": kept,
            "usd_per_kept_step": cost / kept if kept else math.inf,
            # Before the audit: every held hour at list price, an idle reservation free.
            "usd_per_kept_step_list_accounting": self.list_cost / kept if kept else math.inf,
            "deadline_hit_rate": hit / len(sts),
            "failed_runs": sum(1 for s in sts if s.failed),
            "slices_leaked": leaked,
            "api_calls_per_run": sum(s.api_calls for s in sts) / len(sts),
            "history_gcs_reads_per_run": self.history_reads / len(sts),
            "history_gcs_writes_per_run": self.history_writes / len(sts),
            "history_gcs_reads_per_run_full_scan": self.history_scan_reads / len(sts),
            "preemptions": sum(s.recoveries for s in sts),
            "moves": dict(self.move_counts) if self.moves is not None else None,
            "gap_to_floor_per_1k": self.gap(kept, cost),
            "slice_hours": {k: round(v, 1) for k, v in sorted(self.held.items())},
            "slice_hours_by_class": {
                c: {k: round(v, 1) for k, v in sorted(self.held_by_class.get(c, {}).items())}
                for c in self.sc["classes"]
            },
            "usd_per_1k_steps_by_class": {
                c: round(
                    1000
                    * sum(s.cost for s in sts if s.spec.cls == c)
                    / max(1, sum(s.kept for s in sts if s.spec.cls == c)),
                    4,
                )
                for c in self.sc["classes"]
            },
            "hit_by_class": {
                c: round(
                    sum(
                        1
                        for s in sts
                        if s.spec.cls == c
                        and not s.failed
                        and s.finished_at is not None
                        and s.finished_at <= s.spec.deadline
                    )
                    / max(1, sum(1 for s in sts if s.spec.cls == c)),
                    3,
                )
                for c in self.sc["classes"]
            },
        }


def fixed_orders(steps: list[Step], all_orders: bool) -> dict[str, list[int]]:
    """Fixed ladders a user can write, the written one first; with ``all_orders``, every one that
    differs in what it buys: any arrangement of any subset of {the reservation, spot in a, b, c}, with
    the on-demand rungs (a > b > c) anywhere among them — 261 ladders. On-demand is always in (without
    it a run waits for spot when spot is out) and its zone order is fixed: the three zones' on-demand
    is the same price and size, so ordering it differently only reshuffles equal slices."""
    by = {(str(s.tier), s.zone): s.number for s in steps}
    res = next(s for s in steps if s.tier == "reservation")
    singles = [("res", res.number)] + [(f"spot {z[-1]}", by[("spot", z)]) for z in ZONES]
    od = [by[("on-demand", z)] for z in ZONES]
    written = [s.number for s in steps]
    out: dict[str, list[int]] = {"written: res > spot a,b,c > on-demand a,b,c": written}
    if not all_orders:
        return out
    for k in range(len(singles) + 1):
        for perm in itertools.permutations(singles, k):
            for pos in range(k + 1):
                names = [n for n, _ in perm[:pos]] + ["on-demand"] + [n for n, _ in perm[pos:]]
                seq = [x for _, x in perm[:pos]] + od + [x for _, x in perm[pos:]]
                if seq != written:
                    out[" > ".join(names)] = seq
    return out


# name: the Fleet's keyword arguments for that variant of ``auto``
AUTOS: dict[str, dict[str, Any]] = {
    "auto": {},  # as shipped, defaults only: forgetting, the fleet view
    "auto with choose.wait 10 min": {"wait_s": 600.0},  # patience, taken per run when it pays
    "auto as last round (no forgetting, no fleet view)": {"forget": False, "view": False},
    "auto without the scarcity charge, reservation at the spot price (two rounds ago)": {
        "reservation_price": "opportunity", "scarcity": False, "forget": False, "view": False},
    "auto with moves": {"moves": {}},  # voluntary moves at checkpoints and every choose.move_every (10 min)
    "auto with moves keeping no ask": {"moves": {"note_ask": False}},  # a ranking while training kept no ask
    "auto with moves as last round (checkpoints only, keeping no ask)": {
        "moves": {"every_s": math.inf, "note_ask": False}},
    "auto with moves and choose.wait 10 min": {"moves": {}, "wait_s": 600.0},  # both opt-in levers at once
    "auto with moves, never queueing (as the eighth look)": {"moves": {}, "queue": False},  # choose.queue: null
}


# Voluntary moves (``Fleet(moves=...)``): ``margin`` for worth_moving, the tiers a run may move to (the
# "reservation only" variant measured in docs/fleet.md), whether a ranking while training keeps the
# run's ask in the summary as a walk's does (``fleet.admit``'s median then counts running runs too; as
# production's ``rewalk.rank_now``), and ``every_s``, the longest time between two rankings of a running
# run (``choose.move_every``'s default).
MOVES: dict[str, Any] = {"margin": moving.MARGIN, "to": ("reservation", "spot", "on-demand"), "note_ask": True,
                         "every_s": ChooseSpec().move_every.total_seconds()}

VARIANTS = ("auto with moves", "auto")  # measured by default; ``--variants`` adds the others of ``AUTOS``


def per_class_orders(results: dict[str, dict[str, Any]], classes: list[str]) -> dict[str, str]:
    """What a team writes with hindsight: for each kind of run, the fixed ladder cheapest for that class
    among those whose hit rate for it is within 2 points of the best any fixed ladder reached."""
    out = {}
    for c in classes:
        best_hit = max(r["hit_by_class"][c] for r in results.values())
        pool = [k for k, r in results.items() if r["hit_by_class"][c] >= best_hit - 0.02]
        out[c] = min(pool, key=lambda k: results[k]["usd_per_1k_steps_by_class"][c])
    return out


def compare(runs: list[RunSpec], seed: int, name: str, orders: dict[str, list[int]],
            fixed_cache: Path | None = None, variants: tuple[str, ...] = VARIANTS) -> dict[str, Any]:  # fmt: skip
    """Every fixed ladder, the per-class fixed ladders and ``auto`` (with ``variants``) on the same runs
    and the same luck, in scenario ``name``.
    ``fixed_cache``: a directory keeping the fixed ladders' results per (runs, seed, scenario, ladders):
    they never call the ranking, so they can be reused while it changes (delete it when the sim does)."""
    sc = scenario(name)
    rates = scenario_rates(sc)
    cached = fixed_cache / f"fixed-{len(runs)}-{seed}-{name}-{len(orders)}.json" if fixed_cache else None
    if cached is not None and cached.exists():
        results: dict[str, dict[str, Any]] = json.loads(cached.read_text())
    else:
        results = {k: Fleet(runs, seed, order, rates=rates, sc=sc).run() for k, order in orders.items()}
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_text(json.dumps(results, default=str))
    by_class = per_class_orders(results, list(sc["classes"]))
    per_class = Fleet(runs, seed, {c: orders[k] for c, k in by_class.items()}, rates=rates, sc=sc).run()
    autos: dict[str, dict[str, Any]] = {}
    for v in variants:
        fleet = Fleet(runs, seed, None, rates=rates, sc=sc, **AUTOS[v])
        autos[v] = {**fleet.run(), "rankings": fleet.rankings, "ranking_methods": fleet.why_counts,
                    "queued_walks": fleet.queued}  # fmt: skip
    for a in autos.values():  # each variant against the best fixed ladder at its own hit rate
        pool_a = {k: v for k, v in results.items() if v["deadline_hit_rate"] >= a["deadline_hit_rate"]} or results
        best_a = min(pool_a, key=lambda k: pool_a[k]["usd_per_kept_step"])
        a["vs_best_fixed"] = {"ladder": best_a, "usd_per_kept_step": pool_a[best_a]["usd_per_kept_step"],
                              "saving": 1 - a["usd_per_kept_step"] / pool_a[best_a]["usd_per_kept_step"]}  # fmt: skip
    auto = autos[variants[0]]
    floor = Fleet(runs, seed, None, rates=rates, sc=sc).floor()
    written_name = next(iter(orders))
    # The best fixed ladder, with hindsight, at an equal or better deadline hit rate than auto's.
    comparable = {k: v for k, v in results.items() if v["deadline_hit_rate"] >= auto["deadline_hit_rate"]}
    pool = comparable or results
    best_name = min(pool, key=lambda k: pool[k]["usd_per_kept_step"])
    cheapest_name = min(results, key=lambda k: results[k]["usd_per_kept_step"])
    return {
        "scenario": name,
        "seed": seed,
        "runs": len(runs),
        "spot_rates": rates,
        "autos": autos,
        "written_order": {"ladder": written_name, **results[written_name]},
        "best_fixed": {"ladder": best_name, **results[best_name], "compared_at_hit_rate_ge_auto": bool(comparable)},
        "cheapest_fixed": {"ladder": cheapest_name, **results[cheapest_name]},
        "per_class_fixed": {"ladders": by_class, **per_class},
        "fixed_ladders": len(results),
        "auto_saving_vs_best_fixed": 1 - auto["usd_per_kept_step"] / results[best_name]["usd_per_kept_step"],
        # The most any policy could save against the best fixed ladder on these runs (see Fleet.floor).
        "floor_usd_per_kept_step": floor,
        "ceiling_saving_vs_best_fixed": 1 - floor / results[best_name]["usd_per_kept_step"],
    }


def _one(job: tuple[str, int, int, bool, Path | None, tuple[str, ...]]) -> dict[str, Any]:
    name, seed, n, written_only, cache, variants = job
    runs = make_runs(n, seed, scenario(name))
    orders = fixed_orders(plan(fleet_spec(SCENARIO["written_ladder"])), not written_only)
    t0 = time.perf_counter()
    out = compare(runs, seed, name, orders, cache, variants)
    return {**out, "seconds": round(time.perf_counter() - t0, 1)}


def table(results: list[dict[str, Any]]) -> str:
    """The suite's table: per scenario and seed, both baselines, the floor, auto, hit rates, leaks."""
    head = (f"{'scenario':<16}{'seed':>5}  {'best fixed':>16}  {'per-class fixed':>16}  {'floor':>7}  "
            f"{'auto':>16}  {'auto vs best':>12}  {'leaked':>6}")  # fmt: skip
    lines = [head, "-" * len(head)]

    def cell(r: dict[str, Any]) -> str:
        return f"{r['usd_per_kept_step'] * 1000:6.3f} hit {r['deadline_hit_rate']:5.1%}"

    for r in results:
        a = next(iter(r["autos"].values()))
        leaked = sum(x["slices_leaked"] for x in (a, r["best_fixed"], r["per_class_fixed"]))
        lines.append(f"{r['scenario']:<16}{r['seed']:>5}  {cell(r['best_fixed']):>16}  "
                     f"{cell(r['per_class_fixed']):>16}  "
                     f"{r['floor_usd_per_kept_step'] * 1000:7.3f}  {cell(a):>16}  "
                     f"{r['auto_saving_vs_best_fixed']:>12.1%}  {leaked:>6}")  # fmt: skip
    if results:
        mean = sum(r["auto_saving_vs_best_fixed"] for r in results) / len(results)
        worst = min(results, key=lambda r: r["auto_saving_vs_best_fixed"])
        # Two decimals: the target is 15%, and 14.96% is not it, whatever one decimal says.
        lines.append(f"mean saving of auto vs the best fixed ladder: {mean:.2%}; worst {worst['scenario']} seed "
                     f"{worst['seed']}: {worst['auto_saving_vs_best_fixed']:.1%} ($ per 1k kept steps; the best "
                     "fixed ladder chosen with hindsight among those at a hit rate ≥ auto's)")  # fmt: skip
    lines.append("")
    lines.append("where the gap to the floor goes ($ per 1k kept steps: on-demand / idle reservation / lost / other)")
    for r in results:
        for label, x in (("best fixed", r["best_fixed"]), ("per-class", r["per_class_fixed"]),
                         *r["autos"].items()):  # fmt: skip
            g = x["gap_to_floor_per_1k"]
            lines.append(f"  {r['scenario']:<16}{r['seed']:>3} {label:<12} total {g['total']:6.3f} = "
                         f"{g['on_demand']:6.3f} / {g['idle_reservation']:6.3f} / {g['lost']:6.3f} / "
                         f"{g['other']:6.3f}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=SUITE_RUNS, help=f"runs per seed (default {SUITE_RUNS})")
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated (default the suite's)")
    ap.add_argument("--scenario", action="append", choices=list(SUITE), help="repeatable; default: the suite")
    ap.add_argument("--variants", action="append", choices=list(AUTOS), help="auto variants (default: auto)")
    ap.add_argument("--written-only", action="store_true", help="compare with the written order only")
    ap.add_argument("--jobs", type=int, default=1, help="processes, one (scenario, seed) each")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--json-out", help="also write the figures as JSON to this file")
    ap.add_argument("--fixed-cache", type=Path, help="directory reusing the fixed ladders' results (see compare)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    names = args.scenario or list(SUITE)
    variants = tuple(args.variants or VARIANTS)
    jobs = [(n, int(s), args.runs, args.written_only, args.fixed_cache, variants)
            for n in names for s in args.seeds.split(",")]  # fmt: skip
    if args.jobs > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            results = pool.map(_one, jobs, chunksize=1)
    else:
        results = [_one(j) for j in jobs]
    out: dict[str, Any] = {"base": SCENARIO, "suite": SUITE, "runs": args.runs, "results": results,
                           "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=2, default=str))
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    print(f"fleet suite: {len(names)} scenario(s) x seeds {args.seeds}, {args.runs} runs each, "
          f"{SCENARIO['accelerator']}; {results[0]['fixed_ladders'] if results else 0} fixed ladders; "
          f"the auto column: {variants[0]!r}")
    print(table(results))
    print(f"{out['seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
