"""Forgetting by default: the capacity history weighs recent evidence more, and a rung whose preemption
rate moves well outside what its older evidence predicts starts again from the recent evidence alone.

A capacity history that only sums believes, after a zone's spot capacity changes, what it saw before
for as long as the old hours outweigh the new ones (issue 30: after two zones swap their spot rates,
the fleet ranks the now-flaky zone first dozens of times). Two remedies, both on by default:

- **recency weighting**: each run's observations count ``0.5 ** (age / half_life)`` (``half_life``:
  ``choose.half_life``, age from now; else ``DEFAULT_HALF_LIFE_S``, one day, age from the newest
  observation, so an idle fleet keeps what it last saw);
- **a change-point reset**: per rung, the observations of the last ``RECENT_S`` (6 h, counted the same
  way) are compared
  with the rate the older ones give (shrunk towards the tier's prior, as the ranking believes it). If
  the recent preemption count falls outside the central ``1 - CHANGE_P`` (99%) Poisson interval of
  what that rate predicts over the recent hours, the older observations of that rung are dropped: its
  confidence resets, and its belief rests on the prior and the recent hours.

Pure functions; :func:`weigh` takes ``(last seen, sums by key)`` per run, as the capacity summary keeps them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from tpu_ops.provision.choose import History, believe, poisson_cdf

Key = tuple[str, str, str, str]
DEFAULT_HALF_LIFE_S: Final = 24 * 3600.0
RECENT_S: Final = 6 * 3600.0
CHANGE_P: Final = 0.01  # outside the central 99% of the prediction: a change, not bad luck
MIN_OLD_HOURS: Final = 2.0  # below this, the old evidence predicts too little to contradict
MIN_RECENT_HOURS: Final = 1.0  # below this, the recent evidence says too little to overturn


@dataclass(frozen=True)
class Change:
    """A rung whose recent rate left its interval: what was predicted, what was seen."""

    old_rate_per_hour: float  # the older evidence's belief
    recent_hours: float
    recent_preemptions: float
    interval: tuple[int, int]  # preemptions the old rate allows over the recent hours (central 99%)

    def to_json(self) -> dict[str, Any]:
        return {
            "old_rate_per_hour": round(self.old_rate_per_hour, 6),
            "recent_hours": round(self.recent_hours, 3),
            "recent_preemptions": self.recent_preemptions,
            "expected_interval": list(self.interval),
        }


def interval(mean: float, p: float = CHANGE_P) -> tuple[int, int]:
    """The central ``1 - p`` interval of a Poisson count of ``mean``: ``[lo, hi]``, each tail ≤ ``p / 2``."""
    lo = 0
    while poisson_cdf(lo, mean) <= p / 2:  # P(X < lo + 1) still in the lower tail: lo + 1 is allowed
        lo += 1
    hi = lo
    while poisson_cdf(hi, mean) < 1 - p / 2:
        hi += 1
    return lo, hi


def changed(tier: str, old: History, recent: History) -> Change | None:
    """The change at this rung, if its recent preemptions lie outside what the old evidence predicts."""
    if old.hours < MIN_OLD_HOURS or recent.hours < MIN_RECENT_HOURS:
        return None
    rate = believe(tier, old).rate_per_hour
    lo, hi = interval(rate * recent.hours)
    if lo <= recent.preemptions <= hi:
        return None
    return Change(rate, recent.hours, recent.preemptions, (lo, hi))


def weigh(
    entries: Iterable[tuple[float | None, dict[Key, History]]], now: float, half_life_s: float | None = None
) -> tuple[dict[Key, History], dict[Key, Change]]:
    """The history ``entries`` (last seen, sums per key) make once weighed by age, and the rungs reset by
    a change (their older entries dropped). ``half_life_s`` None: ``DEFAULT_HALF_LIFE_S``."""
    listed = list(entries)
    if half_life_s is None:
        # By default, age counts from the newest evidence, not from now: a fleet idle for a month still
        # believes what it last saw (nothing newer contradicts it), while within a busy fleet old runs fade.
        now = max((seen for seen, _ in listed if seen is not None), default=now)
    half = DEFAULT_HALF_LIFE_S if half_life_s is None else half_life_s
    old: dict[Key, History] = {}
    recent: dict[Key, History] = {}
    for seen, sums in listed:
        into = recent if seen is not None and now - seen <= RECENT_S else old
        for k, h in sums.items():
            into[k] = into.get(k, History()).merged(h)
    changes = {k: c for k in recent if (c := changed(k[2], old.get(k, History()), recent[k])) is not None}
    out: dict[Key, History] = {}
    for seen, sums in listed:
        is_recent = seen is not None and now - seen <= RECENT_S
        w = 1.0 if seen is None else float(0.5 ** (max(0.0, now - seen) / half))
        for k, h in sums.items():
            if k in changes and not is_recent:
                continue
            out[k] = out.get(k, History()).merged(h.scaled(w))
    return out, changes


def summary_entries(doc: dict[str, Any]) -> list[tuple[float | None, dict[Key, History]]]:
    """A capacity summary's runs as :func:`weigh` takes them."""
    out: list[tuple[float | None, dict[Key, History]]] = []
    for e in (doc.get("runs") or {}).values():
        seen = e.get("seen")
        sums = {
            (str(r[0]), str(r[1]), str(r[2]), str(r[3])): History(*(float(v) for v in r[4:]))
            for r in e.get("sums") or []
        }
        out.append((float(seen) if isinstance(seen, int | float) else None, sums))
    return out
