"""The expected-cost model: what a rung is expected to cost per *kept* training step, and whether it
makes a deadline. Pure functions, no I/O; the ladder, ``tpu-ops plan`` and ``bench/fleet_sim.py``
all rank with them.

The model (every figure per rung, times in seconds):

- work ``W = steps x s`` (``s`` seconds per step); checkpoint interval ``c = checkpoint_every x s``.
- preemptions arrive as a Poisson process of rate ``λ`` per second of held slice; each throws away
  the work since the last checkpoint and costs ``r`` seconds of held-slice recovery (detect, delete,
  restore) plus ``o`` seconds to obtain the next slice (not billed: no slice is held while asking).
- held time ``H`` and expected preemptions ``n`` from the exact segment model of
  :func:`held_time` (checkpointed work under Poisson failures: the cost grows like ``e^{λ(r+c)}``,
  so a long checkpoint interval on a flaky rung is ruinous, not merely worse).
- expected wall time ``T = o + H + n o``; expected cost ``H x price``; $ per kept step ``cost / steps``.
- miss probability: each preemption costs ``(H - W)/n + o`` of wall time on average; the deadline
  ``D`` allows ``n_max = floor((D - o - W) / that)`` of them, so ``P(miss) = 1 - PoissonCDF(n_max; n)``
  (1 when even a run without preemption cannot make it).
- steps lost per preemption are recorded and shown, but the cost derives the loss from the run's
  own checkpoint interval: other runs' losses reflect their intervals, not this one's.
- **scarcity**: a rung the fleet often finds full (``f``: the share of requests for it refused for
  capacity, which for requests arriving at random is the share of time it is full) charges each
  hour held ``f x (fallback - price)``, ``fallback`` being the price of the capacity that is never
  short (on-demand): an hour taken on a contended rung is, that often, an hour another run must buy
  at on-demand instead. So runs that gain little from steady capacity leave it to those that gain
  much; a rung nobody is refused (``f = 0``, the prior) costs its price alone.

History is thin at first, so every rate is shrunk towards a **conservative prior** (``PRIORS``):
the posterior mean of a Gamma prior worth ``PRIOR_HOURS`` hours of observation, i.e.
``λ = (preemptions + λ0 x PRIOR_HOURS) / (hours + PRIOR_HOURS)``. The spot prior (one preemption
every two hours) is deliberately pessimistic: Google promises spot capacity nothing, and a rung
that is wrongly believed safe costs a whole checkpoint interval per surprise, while one wrongly
believed unsafe costs only the price difference until history corrects it. Obtain and recovery
times are shrunk the same way, with ``PRIOR_WEIGHT`` pseudo-observations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Final

from tpu_ops.provision import recourse
from tpu_ops.provision import why as text

PRIOR_HOURS: Final = 4.0  # a prior rate weighs as much as 4 hours of observed slice time
TIE: Final = 0.1  # rungs within 10% of the cheapest per kept step count as a tie (see ``rank``)
PRIOR_WEIGHT: Final = 2.0  # a prior obtain/recovery time weighs as much as 2 observations


@dataclass(frozen=True)
class Prior:
    """What is assumed of a tier before any history: preemptions per hour, seconds to obtain, to recover."""

    rate_per_hour: float
    obtain_s: float
    recovery_s: float


# Conservative by tier (see the module docstring). Reservations and on-demand are not preempted by
# contract but do get host maintenance; flex-start holds its slice for its whole run duration.
PRIORS: Final[dict[str, Prior]] = {
    "reservation": Prior(0.01, 120.0, 300.0),
    "on-demand": Prior(0.02, 300.0, 300.0),
    "flex-start": Prior(0.01, 1800.0, 300.0),
    "calendar": Prior(0.01, 120.0, 300.0),  # held for its window, like a reservation
    "spot": Prior(0.5, 300.0, 300.0),
}
UNKNOWN_TIER_PRIOR: Final = Prior(0.5, 600.0, 300.0)


@dataclass(frozen=True)
class Rung:
    """A candidate: where a slice could come from and what it costs per hour (the whole slice)."""

    accelerator_type: str
    zone: str
    tier: str
    backend: str
    usd_per_hour: float
    reservation: str = ""
    order: int = 0  # its place in the written ladder (ties and the no-history case keep it)
    fallback_usd_per_hour: float = 0.0  # the never-short capacity's price (on-demand): see scarcity

    @property
    def key(self) -> tuple[str, str, str, str]:
        """The history key: (accelerator type, zone, tier, backend)."""
        return (self.accelerator_type, self.zone, self.tier, self.backend)

    def label(self) -> str:
        what = f"reservation {self.reservation}" if self.reservation else self.tier
        return f"{what} in {self.zone}"


@dataclass(frozen=True)
class RunModel:
    """What is left of a run: steps, seconds per step, checkpoint interval, and an optional deadline."""

    steps: int
    seconds_per_step: float
    checkpoint_every: int
    deadline_s: float | None = None  # seconds from now, None: no deadline

    @property
    def work_s(self) -> float:
        return self.steps * self.seconds_per_step

    @property
    def checkpoint_s(self) -> float:
        return self.checkpoint_every * self.seconds_per_step


@dataclass(frozen=True)
class History:
    """What was observed on one (accelerator type, zone, tier, backend): raw sums, not means."""

    hours: float = 0.0  # slice-hours held
    preemptions: float = 0  # counts: whole numbers, unless weighted by age (:meth:`scaled`)
    obtained: float = 0  # slices obtained (with a measured time)
    obtain_s_total: float = 0.0
    recoveries: float = 0  # preemptions with a measured recovery overhead
    recovery_s_total: float = 0.0
    steps_lost_total: float = 0  # over ``preemptions``
    stockouts: float = 0  # requests refused for capacity (beside the ``obtained`` that were granted)

    @property
    def empty(self) -> bool:
        return self.hours == 0.0 and self.obtained == 0 and self.preemptions == 0 and self.stockouts == 0

    def merged(self, other: History) -> History:
        return History(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def scaled(self, weight: float) -> History:
        """Every sum times ``weight``: an older observation counts for less (``choose.half_life``);
        the means (obtain, recovery, steps lost, the rate) are unchanged, only how much they weigh."""
        return History(*(a * weight for a in astuple(self)))


def astuple(h: History) -> tuple[Any, ...]:
    return (h.hours, h.preemptions, h.obtained, h.obtain_s_total, h.recoveries, h.recovery_s_total,
            h.steps_lost_total, h.stockouts)  # fmt: skip


@dataclass(frozen=True)
class Belief:
    """The figures the model uses for one rung: history shrunk towards the tier's prior."""

    rate_per_hour: float
    obtain_s: float
    recovery_s: float
    steps_lost: float | None  # mean observed steps lost per preemption, None without observations
    hours: float  # how many observed hours the rate rests on
    full: float = 0.0  # the share of requests refused for capacity (scarcity; 0 without refusals)


def prior_for(tier: str) -> Prior:
    return PRIORS.get(tier, UNKNOWN_TIER_PRIOR)


def believe(tier: str, h: History) -> Belief:
    """Posterior means: ``(observed + prior x weight) / (count + weight)``."""
    p = prior_for(tier)
    rate = (h.preemptions + p.rate_per_hour * PRIOR_HOURS) / (h.hours + PRIOR_HOURS)
    obtain = (h.obtain_s_total + p.obtain_s * PRIOR_WEIGHT) / (h.obtained + PRIOR_WEIGHT)
    recovery = (h.recovery_s_total + p.recovery_s * PRIOR_WEIGHT) / (h.recoveries + PRIOR_WEIGHT)
    lost = h.steps_lost_total / h.preemptions if h.preemptions else None
    # No refusal seen is no evidence of scarcity: the prior's pseudo-requests were all granted.
    full = h.stockouts / (h.stockouts + h.obtained + PRIOR_WEIGHT)
    return Belief(rate, obtain, recovery, lost, h.hours, full)


def poisson_cdf(n: int, mean: float) -> float:
    """P(X ≤ n) for X ~ Poisson(mean)."""
    if n < 0:
        return 0.0
    if mean <= 0:
        return 1.0
    term = total = math.exp(-mean)
    for k in range(1, n + 1):
        term *= mean / k
        total += term
    return min(1.0, total)


@dataclass(frozen=True)
class Expectation:
    """The model's answer for one rung and one run."""

    rung: Rung
    belief: Belief
    held_s: float  # expected slice time billed (math.inf: never finishes)
    wall_s: float  # expected wall time to the last step
    preemptions: float  # expected number
    usd: float  # held time at the rung's price
    usd_per_step: float  # (usd + scarcity_usd) per step: what the ranking compares
    miss_probability: float  # of the deadline (0.0 without one)
    scarcity_usd: float = 0.0  # held time x full x (fallback - price)

    def to_json(self) -> dict[str, Any]:
        def num(v: float) -> float | None:
            return None if math.isinf(v) else round(v, 6)

        return {
            **asdict(self.rung),
            "rate_per_hour": round(self.belief.rate_per_hour, 6),
            "history_hours": round(self.belief.hours, 3),
            "obtain_s": round(self.belief.obtain_s, 3),
            "recovery_s": round(self.belief.recovery_s, 3),
            "held_s": num(self.held_s),
            "wall_s": num(self.wall_s),
            "preemptions": num(self.preemptions),
            "usd": num(self.usd),
            "full": round(self.belief.full, 6),
            "scarcity_usd": num(self.scarcity_usd),
            "usd_per_step": num(self.usd_per_step),
            "miss_probability": round(self.miss_probability, 6),
        }


def held_time(work_s: float, checkpoint_s: float, rate_per_s: float, recovery_s: float) -> tuple[float, float]:
    """Expected (held seconds, preemptions) to get ``work_s`` of work checkpointed every ``checkpoint_s``.

    The work is ``k = W / c`` segments. A segment needs ``c`` seconds without a preemption; after one,
    each retry needs ``r + c`` (restore first). With ``X ~ Exp(λ)``: ``T(x) = E[min(X, x)] + P(X < x) T(r+c)``
    gives ``T(c) = p/λ + p (e^{λ(r+c)} - 1)/λ`` with ``p = 1 - e^{-λc}``, and ``p e^{λ(r+c)}``
    preemptions per segment. At ``c = 0`` (a trainer that saves on the preemption notice) the limits
    are ``W e^{λr}`` and ``λ W e^{λr}``.
    """
    lam, r, c = rate_per_s, recovery_s, checkpoint_s
    if lam <= 0:
        return work_s, 0.0
    try:
        if c <= 0:
            grow = math.exp(lam * r)
            return work_s * grow, lam * work_s * grow
        k = work_s / c
        p = -math.expm1(-lam * c)
        retry = math.expm1(lam * (r + c)) / lam
        return k * (p / lam + p * retry), k * p * math.exp(lam * (r + c))
    except OverflowError:
        return math.inf, math.inf


def expect(rung: Rung, run: RunModel, history: History | None = None) -> Expectation:
    """Expected held time, wall time, cost and deadline miss probability of ``run`` on ``rung``."""
    b = believe(rung.tier, history or History())
    held, n = held_time(run.work_s, run.checkpoint_s, b.rate_per_hour / 3600.0, b.recovery_s)
    if math.isinf(held):
        wall = usd = scarcity = math.inf
    else:
        wall = b.obtain_s + held + n * b.obtain_s
        usd = held / 3600.0 * rung.usd_per_hour
        scarcity = held / 3600.0 * b.full * max(0.0, rung.fallback_usd_per_hour - rung.usd_per_hour)
    per_step = (usd + scarcity) / run.steps if run.steps > 0 else 0.0
    miss = 0.0
    if run.deadline_s is not None:
        slack = run.deadline_s - b.obtain_s - run.work_s
        if slack < 0 or math.isinf(held):
            miss = 1.0
        elif n > 0:
            per_preemption = (held - run.work_s) / n + b.obtain_s  # wall time each one costs, on average
            miss = 1.0 - poisson_cdf(math.floor(slack / per_preemption), n)
    return Expectation(rung, b, held, wall, n, usd, per_step, max(0.0, miss), scarcity)


@dataclass(frozen=True)
class Ranked:
    """A rung's place in the choice and why."""

    expectation: Expectation
    position: int  # 1-based, in the order the ladder will try
    eligible: bool  # meets the deadline within the allowed miss probability
    why: str


@dataclass(frozen=True)
class Choice:
    """The ranked rungs and a sentence on how they were ranked."""

    ranked: tuple[Ranked, ...]
    method: str  # "cost" | "written-order"
    note: str
    # choose.wait: try the first ``try_now`` rungs; all refused: wait ``wait_s``, rank again.
    try_now: int | None = None
    wait_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "note": self.note,
            "try_now": self.try_now,
            "wait_s": self.wait_s,
            "rungs": [
                {"position": r.position, "eligible": r.eligible, "why": r.why, **r.expectation.to_json()}
                for r in self.ranked
            ],
        }


def rank(
    rungs: Sequence[Rung],
    run: RunModel,
    histories: dict[tuple[str, str, str, str], History],
    *,
    max_miss: float = 0.1,
    keep_order_without_history: bool = True,
    wait_s: float | None = None,
) -> Choice:
    """Order ``rungs`` by expected $ per kept step, those that make the deadline first.

    Rungs within ``TIE`` (10%) of the cheapest are a tie for this run and go flakiest first: the
    steadier capacity is worth more to runs with long checkpoint intervals, which pay for a
    preemption far more than this one (each run is ranked alone; this keeps it from taking the
    steady rungs others need for nothing).
    A rung whose deadline miss probability exceeds ``max_miss`` goes after every rung that meets
    it (still tried: better late than nothing), ordered by miss probability. With no history for
    any rung and ``keep_order_without_history``, the written order stands (the priors alone would
    only restate the price list) and the note says so.

    ``wait_s`` (patience): on-demand is never short, so buying it before it is needed gains nothing
    but time. While the best on-demand rung would still make the deadline if asked ``wait_s`` later,
    the rungs cheaper than it (or tied) go first and the ladder tries only those; if all are refused
    it waits ``wait_s`` and ranks again, rather than pay for on-demand now.
    """
    exps = recourse.relieve([expect(r, run, histories.get(r.key)) for r in rungs], run, histories, max_miss, expect)
    no_history = all(histories.get(r.key, History()).empty for r in rungs)
    if no_history and keep_order_without_history:
        order = sorted(exps, key=lambda e: e.rung.order)
        ranked = tuple(
            Ranked(e, i + 1, e.miss_probability <= max_miss, "written order (no history yet)")
            for i, e in enumerate(order)
        )
        note = "no history for any rung: keeping the written order (run once to record some)"
        return Choice(ranked, "written-order", note)
    ok, near = _by_cost([e for e in exps if e.miss_probability <= max_miss])
    ok = recourse.on_demand_after_ties(ok, TIE)
    late = sorted((e for e in exps if e.miss_probability > max_miss),
                  key=lambda e: (e.miss_probability, e.usd_per_step, e.rung.order))  # fmt: skip
    deadline = " that makes the deadline" if run.deadline_s is not None else ""
    out = [Ranked(e, i + 1, True, text.why(e, ok, near, deadline, TIE) + text.scarce(e)) for i, e in enumerate(ok)]
    for e in late:
        why = f"misses the deadline with P={e.miss_probability:.1%} > {max_miss:.1%}"
        out.append(Ranked(e, len(out) + 1, False, why))
    note = f"ranked by expected $ per kept step over {run.steps} steps"
    if run.deadline_s is not None:
        note += f", deadline in {run.deadline_s / 3600:.2f} h at P(miss) ≤ {max_miss:.0%}"
        if not ok:
            note += "; no rung is expected to make it, so the least likely to miss goes first"
    first = _patience(out, run, histories, max_miss, wait_s)
    if first is None:
        return Choice(tuple(out), "cost", note)
    # Tried before waiting: every rung that is no dearer than on-demand (within the tie), in order.
    rest = [r for r in out if r not in first]
    out = [replace(r, position=i + 1) for i, r in enumerate(first + rest)]
    note += (f"; if the first {len(first)} are refused, wait {wait_s:.0f} s and ask again: on-demand would "
             "still make the deadline then")  # fmt: skip
    return Choice(tuple(out), "cost", note, len(first), wait_s)


def _patience(ranked: list[Ranked], run: RunModel, histories: dict[tuple[str, str, str, str], History],
              max_miss: float, wait_s: float | None) -> list[Ranked] | None:  # fmt: skip
    """The rungs to try before waiting ``wait_s``: every one cheaper than on-demand (the never-short
    rung: priced at its fallback) or tied with it, while on-demand still makes the deadline after the
    wait and one worst-case preemption on what it may get (:func:`recourse.after_the_wait`); None: no
    waiting."""
    if wait_s is None or run.deadline_s is None:
        return None
    od = next((r.expectation for r in ranked if 0 < r.expectation.rung.fallback_usd_per_hour
               <= r.expectation.rung.usd_per_hour), None)  # fmt: skip
    if od is None:
        return None
    cheaper = [r for r in ranked if r.eligible and r.expectation.rung.usd_per_hour < od.rung.usd_per_hour
               and r.expectation.usd_per_step <= od.usd_per_step * (1 + TIE)]  # fmt: skip
    exps = [r.expectation for r in cheaper]
    later = replace(run, deadline_s=run.deadline_s - wait_s - recourse.after_the_wait(exps, run))
    miss_later = expect(od.rung, later, histories.get(od.rung.key)).miss_probability
    if not cheaper or miss_later > max_miss:
        return None
    return cheaper if wait_pays(exps, od, miss_later, run.steps) else None


def wait_pays(cheaper: Sequence[Expectation], od: Expectation, miss_later: float, steps: int) -> bool:
    """Patience that knows its cost: the expected saving of the wait (the best of the cheaper rungs, each
    free after it as often as it is not full: ``(1 - full) x (on-demand - it) x steps``) against its
    expected deadline risk (the miss probability it adds x the run at on-demand, what a miss wastes)."""
    saving = max((1.0 - c.belief.full) * (od.usd_per_step - c.usd_per_step) * steps for c in cheaper)
    risk = max(0.0, miss_later - od.miss_probability) * od.usd
    return saving > risk


def _by_cost(ok: list[Expectation]) -> tuple[list[Expectation], list[Expectation]]:
    """Cheapest per kept step first; the near ties (within ``TIE`` of the cheapest) least steady first.

    They cost this run the same, and steadier capacity is worth more to runs with long checkpoint
    intervals. Returns the order and the near ties."""
    ok = sorted(ok, key=lambda e: (e.usd_per_step, e.rung.order))
    if not ok or math.isinf(ok[0].usd_per_step):
        return ok, []
    near = [e for e in ok if e.usd_per_step <= ok[0].usd_per_step * (1 + TIE)]
    near.sort(key=lambda e: (-e.belief.rate_per_hour, e.usd_per_step, e.rung.order))
    return near + ok[len(near) :], near
