"""Deadline risk with recourse: a run is ranked again at every walk, so a rung is not a promise to stay.

:func:`tpu_ops.provision.choose.expect` gives a rung's miss probability as if the whole rest of the run
stayed on it. But the ladder ranks again after every preemption, with the time then left, and on-demand
(the never-short rung) is always there to finish on. So the risk of *trying* a flaky rung is only that
one preemption on it leaves on-demand too little time. One preemption costs at most, in wall time, the
work since the last checkpoint (``c``), the recovery (``r``) and obtaining the next slice (``o``), and
the work left then is the work left now minus what was kept: the slack left for on-demand is the slack
now minus ``c + r + o``, wherever the preemption falls (issue 30).

So a rung that would miss on its own is still eligible when on-demand, asked after one worst-case
preemption on it, makes the deadline within ``max_miss``; its miss probability is then that one.
"""

from __future__ import annotations

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


def relieve(
    exps: list[Expectation], run: RunModel, histories: dict[tuple[str, str, str, str], Any], max_miss: float,
    expect: Expect,
) -> list[Expectation]:  # fmt: skip
    """Each expectation whose own miss probability exceeds ``max_miss`` with its miss probability
    replaced by on-demand's after one worst-case preemption on it (``expect``: choose's), when lower."""
    od = never_short(exps)
    if od is None or run.deadline_s is None or od.miss_probability > max_miss:
        return exps
    out = []
    for e in exps:
        later = after_one_preemption(e, run)
        if e is od or e.miss_probability <= max_miss or later is None:
            out.append(e)
            continue
        miss = expect(od.rung, later, histories.get(od.rung.key)).miss_probability
        out.append(replace(e, miss_probability=min(e.miss_probability, miss)))
    return out
