"""Deadline risk with recourse: a run is ranked again at every walk, so a rung is not a promise to stay.

:func:`tpu_ops.provision.choose.expect` gives a rung's miss probability as if the whole rest of the run
stayed on it. But the ladder ranks again after every preemption, with the time then left, and on-demand
(the never-short rung) is always there to finish on. So the risk of *trying* a flaky rung is only that
one preemption on it leaves on-demand too little time. One preemption costs at most, in wall time, the
work since the last checkpoint (``c``), the recovery (``r``) and obtaining the next slice (``o``), and
the work left then is the work left now minus what was kept: the slack left for on-demand is the slack
now minus ``c + r + o``, wherever the preemption falls (issue 30).

So a rung's miss probability is the chance it is preempted at all times on-demand's miss probability
after one worst-case preemption on it (:func:`relieve`), and on-demand goes after the preemptible
rungs it is tied with (:func:`on_demand_after_ties`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

# Duck-typed (``tpu_ops.provision.choose``'s Expectation, RunModel, History): choose imports this
# module, and importing it back, even for types, would make an import cycle.
Expectation = Any
RunModel = Any
Expect = Callable[[Any, Any, Any], Any]  # choose.expect(rung, run, history)


def never_short(exps: Sequence[Expectation]) -> Expectation | None:
    """The rung to finish on: on-demand (priced at the fallback every scarcity charge is measured by),
    the likeliest to make the deadline of those."""
    od = [e for e in exps if 0 < e.rung.fallback_usd_per_hour <= e.rung.usd_per_hour]
    return min(od, key=lambda e: (e.miss_probability, e.rung.order), default=None)


def after_one_preemption(e: Expectation, run: RunModel) -> RunModel | None:
    """What is left of the run for on-demand after one worst-case preemption on ``e`` (None: no deadline)."""
    if run.deadline_s is None:
        return None
    spent = run.checkpoint_s + e.belief.recovery_s + e.belief.obtain_s
    return replace(run, deadline_s=run.deadline_s - spent)


def after_the_wait(cheaper: Sequence[Expectation], run: RunModel) -> float:
    """Wall seconds to keep for one worst-case preemption on what a wait may get (0: nothing preemptible).

    A wait spends slack on the bet that a cheaper rung frees; the rung it gets may then be preempted, and
    on-demand must still finish after that too, or the wait has spent the slack :func:`relieve` counts
    on. Measured on the suite (issue 30, ``choose.wait: 10m``): without it, deadlines were missed in 5
    of 14 (scenario, seed) pairs; with it, in 1. Weighing it by the chance of a preemption at all (as
    :func:`relieve` does) missed in 5 again: a short remainder on flaky spot is rarely preempted, but a
    preemption then is a miss."""
    spent = [run.checkpoint_s + e.belief.recovery_s + e.belief.obtain_s for e in cheaper if e.preemptions > 0]
    return max(spent, default=0.0)


def relieve(
    exps: list[Expectation], run: RunModel, histories: dict[tuple[str, str, str, str], Any], max_miss: float,
    expect: Expect,
) -> list[Expectation]:  # fmt: skip
    """Each preemptible rung's miss probability with recourse (``expect``: choose's): the chance it is
    preempted at all (``1 - e^-n``) x on-demand's miss probability after one worst-case preemption on
    it. It replaces the rung's own figure, which assumes the run stays on it to the end: lower far from
    the deadline, higher close to it, where one preemption at the wrong moment is enough to miss."""
    od = never_short(exps)
    if od is None or run.deadline_s is None or od.miss_probability > max_miss:
        return exps
    out = []
    for e in exps:
        later = after_one_preemption(e, run)
        slack = run.deadline_s - e.belief.obtain_s - run.work_s  # < 0: it misses even unpreempted
        if e is od or later is None or not 0 < e.preemptions < math.inf or slack < 0:
            out.append(e)
            continue
        miss = -math.expm1(-e.preemptions) * expect(od.rung, later, histories.get(od.rung.key)).miss_probability
        out.append(replace(e, miss_probability=miss))
    return out


def on_demand_after_ties(ok: list[Expectation], tie: float) -> list[Expectation]:
    """Every on-demand rung after the preemptible rungs within ``tie`` of the first of them per kept
    step (their order kept).

    Their figure assumes the run stays on them to the end; but the ladder ranks again after a
    preemption and may then find cheaper capacity freed meanwhile, and a refusal costs one request.
    So a near tie with the capacity that is never short goes to the rung that may turn out cheaper
    (the deadline is :func:`relieve`'s business: only rungs that make it are here). All on-demand
    rungs, not only :func:`never_short`'s: with on-demand in three zones, a tie moved ahead of one
    still came after the other two (issue 30: +0.5 points on the suite, no deadline lost)."""
    ods = [e for e in ok if 0 < e.rung.fallback_usd_per_hour <= e.rung.usd_per_hour]
    if not ods:
        return ok
    od = ods[0]
    i = next(n for n, e in enumerate(ok) if e is od)
    tied = [
        e
        for e in ok[i + 1 :]
        if not any(e is o for o in ods)
        and e.usd_per_step <= od.usd_per_step * (1 + tie)
        and e.preemptions > od.preemptions
    ]
    if not tied:
        return ok
    return [*ok[:i], *tied, *(e for e in ok[i:] if not any(e is t for t in tied))]
