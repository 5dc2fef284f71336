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
constant in the ``stationary`` scenario, zone a's rising on day 3 in ``drift``), how long a slice
takes to boot and restore, and the training itself (steps of ``seconds_per_step``, a checkpoint every
``checkpoint_every`` steps; a preemption loses the steps since the last one). Billing: a held slice by
the second at its list price, from RUNNING to deleted; the reservation as Compute Engine bills it,
every VM for the whole window whether used or not (the same sum for every policy), so an hour of it
used costs nothing more. Traces are keyed by (run, rung, n-th use), so every policy meets the same
luck on the same choice.

The default (``--runs 300 --seed 7``) runs both scenarios; the figures and the scenario are printed,
and the README quotes them, with a floor no policy can beat (:meth:`Fleet.floor`), which bounds what
any ranking could save against the best fixed ladder on the same runs.

    .venv/bin/python bench/fleet_sim.py [--runs 300] [--seed 7] [--scenario both|stationary|drift]
        [--written-only] [--json] [--json-out FILE] [--fixed-cache DIR]

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.local.compute.models import RESERVATION_KEY, ComputeBackend
from infra.local.core.clock import ManualClock
from tpu_ops.provision import history as H
from tpu_ops.provision import ranking
from tpu_ops.provision.choose import History, RunModel
from tpu_ops.provision.ladder import Step, plan
from tpu_ops.provision.prices import shipped
from tpu_ops.specs.slice import ProvisionSpec

PROJECT = "fleet-sim"
MACHINE = "ct5p-hightpu-4t"  # a v5p-8 slice: one 4-chip host
ZONES = ("us-east5-a", "us-east5-b", "us-east5-c")
RESERVATION = "team-res"

# -- the default scenario ------------------------------------------------------------------------
SCENARIO: dict[str, Any] = {
    "accelerator": "v5p-8 (one ct5p-hightpu-4t host, 4 chips) on Compute Engine",
    # Ground truth the ranking never sees: spot preemptions per hour of a held slice, by zone.
    "spot_preemptions_per_hour": {"us-east5-a": 0.1, "us-east5-b": 0.6, "us-east5-c": 2.0},
    # Capacity in chips (4 per slice) per zone and provisioning model; the reservation is 3 VMs in zone a.
    "capacity_chips": {
        "us-east5-a": {"SPOT": 16, "STANDARD": 24},
        "us-east5-b": {"SPOT": 24, "STANDARD": 24},
        "us-east5-c": {"SPOT": 48, "STANDARD": 24},
    },
    "reservation_vms": 3,
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
    # Run classes: share, hours of work (uniform range), minutes between checkpoints, deadline.
    "classes": {
        "experiment": {"share": 0.5, "hours": [1.0, 3.0], "checkpoint_min": 5, "deadline": "3 x work"},
        "nightly": {"share": 0.3, "hours": [4.0, 6.0], "checkpoint_min": 20, "deadline": "work + 2 h"},
        "long": {"share": 0.2, "hours": [10.0, 16.0], "checkpoint_min": 120, "deadline": "2 x work"},
    },
    "written_ladder": ["reservation:team-res@us-east5-a", "spot", "on-demand"],
    "max_miss": 0.1,  # the default of choose.max_miss
    # ``choose.half_life`` of the variant that weighs history by age: yesterday's runs count half.
    "half_life_h": 24.0,
    # The drifting variant: spot capacity in zone a degrades on day 3 (on-demand demand there grows,
    # so Compute Engine reclaims spot VMs more often); the other zones stay as they are.
    "drift": {"at_hour": 72.0, "spot_preemptions_per_hour": {"us-east5-a": 1.0}},
}
Rates = list[tuple[float, dict[str, float]]]  # (from second, spot preemptions/h by zone), in order


def scenario_rates(name: str) -> Rates:
    """``stationary``: the rates above throughout; ``drift``: zone a's changes at ``drift.at_hour``."""
    base = dict(SCENARIO["spot_preemptions_per_hour"])
    if name == "stationary":
        return [(0.0, base)]
    d = SCENARIO["drift"]
    return [(0.0, base), (d["at_hour"] * 3600.0, {**base, **d["spot_preemptions_per_hour"]})]


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


def _deadline(cls: str, work_s: float) -> float:
    if cls == "experiment":
        return 3 * work_s
    if cls == "nightly":
        return work_s + 7200.0
    return 2 * work_s


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


def make_runs(n: int, seed: int) -> list[RunSpec]:
    rng = random.Random(seed)
    sps = SCENARIO["seconds_per_step"]
    out, t = [], 0.0
    classes = SCENARIO["classes"]
    for i in range(n):
        t += rng.expovariate(SCENARIO["arrivals_per_hour"] / 3600.0)
        r = rng.random()
        acc = 0.0
        cls = "long"
        for name, c in classes.items():
            acc += c["share"]
            if r < acc:
                cls = name
                break
        c = classes[cls]
        work = rng.uniform(*c["hours"]) * 3600.0
        steps = int(work / sps)
        out.append(RunSpec(i, cls, t, steps, int(c["checkpoint_min"] * 60 / sps), t + _deadline(cls, work)))
    return out


def trace(seed: int, *key: Any) -> random.Random:
    """The same luck for the same (run, rung, n-th use) whatever the policy."""
    h = hashlib.sha256(repr((seed, *key)).encode()).digest()
    return random.Random(int.from_bytes(h[:8], "big"))


def fleet_spec(ladder: list[str], wait_s: float | None = None) -> ProvisionSpec:
    choose: dict[str, Any] = {"max_miss": SCENARIO["max_miss"]}
    if wait_s is not None:
        choose["wait"] = f"{wait_s:.0f}s"
    return ProvisionSpec.model_validate({
        "slice": {"accelerator_type": "v5p-8", "region": "us-east5", "zones": list(ZONES)},
        "ladder": ladder, "budget_usd": 100000, "hours": 16, "choose": choose,
    })  # fmt: skip


class Fleet:
    """One policy over the whole trace: ``order`` is None for ``auto``, else a fixed list of step numbers."""

    def __init__(self, runs: list[RunSpec], seed: int, order: list[int] | None,
                 reservation_price: ranking.ReservationPrice = "prepaid", rates: Rates | None = None,
                 half_life_h: float | None = None, scarcity: bool = True,
                 wait_s: float | None = None) -> None:  # fmt: skip
        self.runs, self.seed, self.fixed = runs, seed, order
        self.reservation_price, self.scarcity = reservation_price, scarcity
        self.rates = rates or scenario_rates("stationary")
        self.half_life_s = half_life_h * 3600.0 if half_life_h is not None else None
        self.records: list[tuple[dict[str, Any], dict[H.Key, History]]] = []  # each slice's record, folded
        # The reservation's paid window: the same for every policy (arrivals and deadlines are the runs').
        self.window_end = max((r.deadline for r in runs), default=0.0)
        self.spec = fleet_spec(SCENARIO["written_ladder"], wait_s)
        self.steps = plan(self.spec)
        self.table = shipped()
        self.backend_name = ranking.backend_of(self.spec)
        self.clock = ManualClock(start=1_790_000_000.0)
        self.t0 = self.clock.now()
        self.api = ComputeBackend(clock=self.clock, preempt_notice_s=30.0)
        cap = {z: dict(c) for z, c in SCENARIO["capacity_chips"].items()}
        cap["us-east5-a"]["reservations"] = {
            RESERVATION: {"count": SCENARIO["reservation_vms"], "machineType": MACHINE}
        }
        self.api.configure_capacity(cap)
        self.api.set_latency(provision_s=SCENARIO["boot_s"], delete_s=0.0)
        self.history: dict[H.Key, History] = {}
        self.events: list[tuple[float, int, str, int]] = []
        self.seq = itertools.count()
        self.state = {r.idx: RunState(r) for r in runs}
        self.rankings = 0
        self.held: dict[str, float] = {}  # slice-hours by tier@zone
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
    def at(self, t: float, what: str, run: int) -> None:
        heapq.heappush(self.events, (t, next(self.seq), what, run))

    def now(self) -> float:
        return self.clock.now() - self.t0

    def price(self, step: Step) -> float:
        return 4 * self.table.price("v5p", str(step.tier))  # 4 chips

    def order_for(self, st: RunState) -> tuple[list[Step], float | None]:
        """The rungs to try on this walk, and how long to wait before the next if all are refused
        (``choose.wait``: then only those before on-demand are tried); None: the ladder's retry."""
        if self.fixed is not None:
            by = {s.number: s for s in self.steps}
            return [by[n] for n in self.fixed], None
        sps = SCENARIO["seconds_per_step"]
        left = st.spec.steps - st.kept
        run = RunModel(left, sps, st.spec.checkpoint_every, st.spec.deadline - self.now())
        ordered, choice = ranking.order(self.spec, self.steps, self.table, self.aged_history(), run,
                                        self.reservation_price, self.scarcity)  # fmt: skip
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
            if "error" in op:
                t += SCENARIO["stockout_s"]
                st.refused.append({"zone": step.zone, "tier": str(step.tier), "at": self.t0 + t})
                continue
            self._publish_refusals(st)
            st.uses[step.number] = n + 1
            st.instance, st.step = name, step
            self.at(t + SCENARIO["boot_s"], "ready", st.spec.idx)
            return
        self.at(t + (SCENARIO["ladder_retry_s"] if wait is None else wait), "walk", st.spec.idx)

    def _publish_refusals(self, st: RunState) -> None:
        """The stock-outs met on the way to a slice, published with its "obtained" milestone (as the
        supervisor's state store does): the fleet's scarcity, as the real history folds it."""
        if not st.refused:
            return
        rec: dict[str, Any] = {"incarnations": [], "preemptions": [], "stockouts": st.refused}
        folded = H.fold_run(rec, {"accelerator_type": "v5p-8", "backend": self.backend_name})
        for k, h in folded.items():
            self.history[k] = self.history.get(k, History()).merged(h)
        self.records.append((rec, folded))
        self.history_reads += 1
        self.history_writes += 1
        st.refused = []

    def ready(self, st: RunState) -> None:
        assert st.step is not None
        st.api_calls += 1
        inst = self.api.get_instance(PROJECT, st.step.zone, st.instance)
        assert inst["status"] == "RUNNING", inst["status"]
        t = st.ready_at = self.now()
        sps = SCENARIO["seconds_per_step"]
        done_at = t + SCENARIO["restore_s"] + (st.spec.steps - st.kept) * sps
        lose_at = math.inf
        if st.step.tier == "spot":
            luck = trace(self.seed, st.spec.idx, st.step.number, st.uses[st.step.number])
            lose_at = preempted_at(self.rates, st.step.zone, t, luck)
        if lose_at < done_at:
            self.at(lose_at, "preempt", st.spec.idx)
        else:
            self.at(done_at, "finish", st.spec.idx)

    def _release(self, st: RunState, end: float, outcome: str, lost_steps: int | None) -> None:
        assert st.step is not None
        held = end - st.ready_at
        self.list_cost += held / 3600.0 * self.price(st.step)
        # A reserved VM is paid for the whole window anyway (see ``reservation_cost``): only an hour
        # held after the window costs anything more.
        billed = max(0.0, end - max(st.ready_at, self.window_end)) if st.step.tier == "reservation" else held
        st.cost += billed / 3600.0 * self.price(st.step)
        where = f"{st.step.tier}@{st.step.zone[-1]}"
        self.held[where] = self.held.get(where, 0.0) + held / 3600.0
        st.api_calls += 1
        self.api.delete_instance(PROJECT, st.step.zone, st.instance)
        # The slice's record, as a run's state.json has it, folded by the real history code.
        inc = {"zone": st.step.zone, "tier": str(st.step.tier), "requested_at": self.t0 + st.requested_at,
               "ready_at": self.t0 + st.ready_at, "ended_at": self.t0 + end, "end": outcome}  # fmt: skip
        rec: dict[str, Any] = {"incarnations": [inc], "preemptions": []}
        if outcome == "preempted":
            rec["preemptions"].append({"zone": inc["zone"], "tier": inc["tier"], "detect_s": 0.0,
                                       "delete_s": SCENARIO["detect_delete_s"], "restore_s": SCENARIO["restore_s"],
                                       "steps_lost": lost_steps})  # fmt: skip
        ident = {"accelerator_type": "v5p-8", "backend": self.backend_name}
        folded = H.fold_run(rec, ident)
        for k, h in folded.items():
            self.history[k] = self.history.get(k, History()).merged(h)
        self.records.append((rec, folded))
        self.history_reads += 1
        self.history_writes += 1
        self.recorded_runs.add(st.spec.idx)
        st.step, st.instance, st.requested_at = None, "", 0.0

    def preempt(self, st: RunState) -> None:
        assert st.step is not None
        t = self.now()
        self.api.preempt(st.step.zone, st.instance, PROJECT)
        sps = SCENARIO["seconds_per_step"]
        ran = max(0, int((t - st.ready_at - SCENARIO["restore_s"]) / sps))
        every = st.spec.checkpoint_every
        kept = min(st.spec.steps, st.kept + ran // every * every)
        lost = st.kept + ran - kept
        st.kept = kept
        st.recoveries += 1
        self._release(st, t + SCENARIO["detect_delete_s"], "preempted", lost)
        if st.recoveries > SCENARIO["max_recoveries"]:
            st.failed, st.finished_at = True, t
            return
        self.at(t + SCENARIO["detect_delete_s"], "walk", st.spec.idx)

    def finish(self, st: RunState) -> None:
        st.kept = st.spec.steps
        st.finished_at = self.now()
        self._release(st, st.finished_at, "done", None)

    def _forget_done_operations(self) -> None:
        """The fake keeps every operation forever and walks them all on each call (fine for a test,
        quadratic over a fleet's thousands): finished ones are dropped, as Compute Engine expires them."""
        with self.api._lock:
            self.api._ops = {k: op for k, op in self.api._ops.items() if not op.done}

    def aged_history(self) -> dict[H.Key, History]:
        """The history as ``history.fold`` weighs it with ``choose.half_life`` (the sums, without one)."""
        if self.half_life_s is None:
            return self.history
        now = self.clock.now()
        out: dict[H.Key, History] = {}
        for rec, folded in self.records:
            w = H.weight(rec, now, self.half_life_s)
            for k, h in folded.items():
                out[k] = out.get(k, History()).merged(h.scaled(w))
        return out

    def reservation_cost(self) -> float:
        """What the reservation costs every policy: each VM at its price over the window, used or not."""
        by = {s.tier: s for s in self.steps}
        return SCENARIO["reservation_vms"] * self.price(by["reservation"]) * self.window_end / 3600.0

    def floor(self) -> float:
        """A lower bound on any policy's $ per kept step over these runs (all of them finished): every
        hour of work needs a slice-hour; the reservation's are prepaid (at most its VMs over the
        window, each slice on one VM), every other costs at least the spot price. No preemption, no
        boot, no restore, perfect packing: no policy, however clairvoyant, does better."""
        sps = SCENARIO["seconds_per_step"]
        steps = sum(r.steps for r in self.runs)
        work_h = steps * sps / 3600.0
        reserved_h = SCENARIO["reservation_vms"] * self.window_end / 3600.0
        spot = next(s for s in self.steps if s.tier == "spot")
        return (self.reservation_cost() + max(0.0, work_h - reserved_h) * self.price(spot)) / steps

    def run(self) -> dict[str, Any]:
        for r in self.runs:
            self.at(r.arrival, "walk", r.idx)
        handlers = {"walk": self.walk, "ready": self.ready, "preempt": self.preempt, "finish": self.finish}
        for n in itertools.count():
            if not self.events:
                break
            t, _, what, idx = heapq.heappop(self.events)
            self.clock.advance(max(0.0, t - self.now()))
            handlers[what](self.state[idx])
            if n % 256 == 255:
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
            "slice_hours": {k: round(v, 1) for k, v in sorted(self.held.items())},
            "usd_per_1k_steps_by_class": {
                c: round(
                    1000
                    * sum(s.cost for s in sts if s.spec.cls == c)
                    / max(1, sum(s.kept for s in sts if s.spec.cls == c)),
                    4,
                )
                for c in SCENARIO["classes"]
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
                for c in SCENARIO["classes"]
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


# name: (reservation price, half-life, scarcity charge, choose.wait seconds)
AUTOS: dict[str, tuple[ranking.ReservationPrice, bool, bool, float | None]] = {
    "auto": ("prepaid", False, True, None),  # as shipped, defaults only: the README's figure
    "auto with choose.wait 10 min": ("prepaid", False, True, 600.0),
    "auto with choose.half_life 24 h": ("prepaid", True, True, None),
    "auto without the scarcity charge, reservation at the spot price (the previous round)": (
        "opportunity", False, False, None),
    "auto without the scarcity charge, reservation at 0": ("prepaid", False, False, None),
}


def compare(runs: list[RunSpec], seed: int, scenario: str, orders: dict[str, list[int]],
            fixed_cache: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """Every fixed ladder and ``auto`` (with its variants) on the same runs and the same luck.
    ``fixed_cache``: a directory keeping the fixed ladders' results per (runs, seed, scenario, ladders):
    they never call the ranking, so they can be reused while it changes (delete it when the sim does)."""
    rates = scenario_rates(scenario)
    cached = fixed_cache / f"fixed-{len(runs)}-{seed}-{scenario}-{len(orders)}.json" if fixed_cache else None
    if cached is not None and cached.exists():
        results: dict[str, dict[str, Any]] = json.loads(cached.read_text())
    else:
        results = {name: Fleet(runs, seed, order, rates=rates).run() for name, order in orders.items()}
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_text(json.dumps(results, default=str))
    autos: dict[str, dict[str, Any]] = {}
    for name, (price, aged, scarce, wait_s) in AUTOS.items():
        fleet = Fleet(runs, seed, None, price, rates, SCENARIO["half_life_h"] if aged else None, scarce, wait_s)
        autos[name] = {**fleet.run(), "rankings": fleet.rankings, "ranking_methods": fleet.why_counts}
    for a in autos.values():  # each variant against the best fixed ladder at its own hit rate
        pool_a = {k: v for k, v in results.items() if v["deadline_hit_rate"] >= a["deadline_hit_rate"]} or results
        best_a = min(pool_a, key=lambda k: pool_a[k]["usd_per_kept_step"])
        a["vs_best_fixed"] = {"ladder": best_a, "usd_per_kept_step": pool_a[best_a]["usd_per_kept_step"],
                              "saving": 1 - a["usd_per_kept_step"] / pool_a[best_a]["usd_per_kept_step"]}  # fmt: skip
    auto = autos["auto"]
    floor = Fleet(runs, seed, None, rates=rates).floor()
    written_name = next(iter(orders))
    # The best fixed ladder, with hindsight, at an equal or better deadline hit rate than auto's.
    comparable = {k: v for k, v in results.items() if v["deadline_hit_rate"] >= auto["deadline_hit_rate"]}
    pool = comparable or results
    best_name = min(pool, key=lambda k: pool[k]["usd_per_kept_step"])
    cheapest_name = min(results, key=lambda k: results[k]["usd_per_kept_step"])
    return {
        "scenario": scenario,
        "spot_rates": rates,
        "autos": autos,
        "written_order": {"ladder": written_name, **results[written_name]},
        "best_fixed": {"ladder": best_name, **results[best_name], "compared_at_hit_rate_ge_auto": bool(comparable)},
        "cheapest_fixed": {"ladder": cheapest_name, **results[cheapest_name]},
        "fixed_ladders": len(results),
        "auto_saving_vs_best_fixed": 1 - auto["usd_per_kept_step"] / results[best_name]["usd_per_kept_step"],
        # The most any policy could save against the best fixed ladder on these runs (see Fleet.floor).
        "floor_usd_per_kept_step": floor,
        "ceiling_saving_vs_best_fixed": 1 - floor / results[best_name]["usd_per_kept_step"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--scenario", choices=("both", "stationary", "drift"), default="both")
    ap.add_argument("--written-only", action="store_true", help="compare with the written order only")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--json-out", help="also write the figures as JSON to this file")
    ap.add_argument("--fixed-cache", type=Path, help="directory reusing the fixed ladders' results (see compare)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    runs = make_runs(args.runs, args.seed)
    steps = plan(fleet_spec(SCENARIO["written_ladder"]))
    orders = fixed_orders(steps, not args.written_only)
    names = ("stationary", "drift") if args.scenario == "both" else (args.scenario,)
    out: dict[str, Any] = {"scenario": {**SCENARIO, "runs": args.runs, "seed": args.seed}}
    for name in names:
        out[name] = compare(runs, args.seed, name, orders, args.fixed_cache)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=2, default=str))
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return 0

    def line(name: str, r: dict[str, Any]) -> str:
        return (f"  {name:<64} ${r['cost_usd']:>8,.0f}  ${r['usd_per_kept_step'] * 1000:6.3f}/1k steps  "
                f"hit {r['deadline_hit_rate']:6.1%}  failed {r['failed_runs']:2d}  leaked {r['slices_leaked']}  "
                f"API calls/run {r['api_calls_per_run']:4.1f}  preemptions {r['preemptions']}")  # fmt: skip

    prepaid = out[names[0]]["written_order"]["reservation_prepaid_usd"]
    print(f"fleet: {args.runs} runs (seed {args.seed}), {SCENARIO['accelerator']}")
    print(f"  spot preemptions/h by zone (hidden from the ranking): {SCENARIO['spot_preemptions_per_hour']}")
    print(f"  capacity chips: {SCENARIO['capacity_chips']}; reservation {SCENARIO['reservation_vms']} VMs in "
          f"us-east5-a, {SCENARIO['reservation_billing']} (${prepaid:,.0f}); "
          f"{SCENARIO['arrivals_per_hour']} arrivals/h")  # fmt: skip
    print(f"  classes: {json.dumps(SCENARIO['classes'])}")
    print(f"  auto: choose.max_miss {SCENARIO['max_miss']}; starts with no history (the written order)")
    for name in names:
        r = out[name]
        d = SCENARIO["drift"]
        what = "rates as above" if name == "stationary" else (
            f"from hour {d['at_hour']:.0f} spot/h {d['spot_preemptions_per_hour']}")  # fmt: skip
        print(f"scenario {name} ({what}); {r['fixed_ladders']} fixed-order ladders on the same traces:")
        for label, a in r["autos"].items():
            print(line(label, a) + f"  vs best fixed at its hit rate {a['vs_best_fixed']['saving']:.1%}")
        print(line(r["written_order"]["ladder"], r["written_order"]))
        print(line("best fixed (hit ≥ auto): " + r["best_fixed"]["ladder"], r["best_fixed"]))
        print(line("cheapest fixed (any hit): " + r["cheapest_fixed"]["ladder"], r["cheapest_fixed"]))
        a, b = r["autos"]["auto"], r["best_fixed"]
        print(f"  => auto vs best fixed: {r['auto_saving_vs_best_fixed']:.1%} cheaper per kept step, hit rate "
              f"{a['deadline_hit_rate']:.1%} vs {b['deadline_hit_rate']:.1%}; rankings {a['rankings']} "
              f"{a['ranking_methods']}, history GCS reads/run {a['history_gcs_reads_per_run']:.1f} "
              f"(+{a['history_gcs_writes_per_run']:.1f} writes; a full scan per ranking: "
              f"{a['history_gcs_reads_per_run_full_scan']:.0f})")  # fmt: skip
        print(f"  => floor (no policy does better: all work on the prepaid reservation or on spot, never "
              f"preempted): ${r['floor_usd_per_kept_step'] * 1000:.3f}/1k steps, at most "
              f"{r['ceiling_saving_vs_best_fixed']:.1%} below the best fixed ladder")  # fmt: skip
    print(f"{out['seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
