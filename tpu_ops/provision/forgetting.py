"""Forgetting by default: the capacity history weighs recent evidence more, and a rung whose preemption
rate moves well outside what its older evidence predicts starts again from the recent evidence alone.

A capacity history that only sums believes, after a zone's spot capacity changes, what it saw before
for as long as the old hours outweigh the new ones (issue 30: after two zones swap their spot rates,
the fleet ranks the now-flaky zone first dozens of times). Two remedies, both on by default:

- **recency weighting**: each run's observations count ``0.5 ** (age / half_life)`` (``half_life``:
  ``choose.half_life``, age from now; else ``DEFAULT_HALF_LIFE_S``, one day, age from the newest
  observation, so an idle fleet keeps what it last saw);
- **a change-point reset**: per rung, the observations of the last ``RECENT_S`` (6 h, counted the same
  way, each by when it happened: a slice at its end, a preemption at its detection; a run's entry lists its
  last ``RECENT_S`` one by one) are compared
  with the rate the older ones give (shrunk towards the tier's prior, as the ranking believes it). If
  the recent preemption count falls outside the central ``1 - CHANGE_P`` (99%) Poisson interval of
  what that rate predicts over the recent hours, the older observations of that rung are dropped: its
  confidence resets, and its belief rests on the prior and the recent hours.

Pure functions; :func:`weigh` takes an :class:`Entry` per run, as the capacity summary keeps them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from tpu_ops.provision.choose import History, astuple, believe, poisson_cdf

Key = tuple[str, str, str, str]
DEFAULT_HALF_LIFE_S: Final = 24 * 3600.0
RECENT_S: Final = 6 * 3600.0
CHANGE_P: Final = 0.01  # outside the central 99% of the prediction: a change, not bad luck
MIN_OLD_HOURS: Final = 2.0  # below this, the old evidence predicts too little to contradict
MIN_RECENT_HOURS: Final = 1.0  # below this, the recent evidence says too little to overturn
RECENT_BUCKET_S: Final = 600.0  # a summary entry's recent observations: one row per key and 10 minutes
Timed = tuple[float | None, Key, History]  # one observation: when it happened (None: not said), its key, its sums


class Entry(NamedTuple):
    """One run as the summary keeps it: when it was last seen, its sums by key, and its observations of
    the ``RECENT_S`` before that with their times (None: an entry written before it listed them)."""

    seen: float | None
    sums: dict[Key, History]
    recent: tuple[tuple[float, Key, History], ...] | None = None


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


def _less(h: History, minus: History | None) -> History:
    if minus is None:
        return h
    return History(*(max(0.0, a - b) for a, b in zip(astuple(h), astuple(minus), strict=True)))


def split(e: Entry, now: float) -> tuple[dict[Key, History], dict[Key, History]]:
    """``e``'s sums as (older, last ``RECENT_S``) at ``now``: by each listed observation's time; an entry that
    lists none is recent or old whole, by when its run was last seen."""
    if e.recent is None:
        whole = dict(e.sums)
        return ({}, whole) if e.seen is not None and now - e.seen <= RECENT_S else (whole, {})
    recent: dict[Key, History] = {}
    for at, k, h in e.recent:
        if now - at <= RECENT_S:
            recent[k] = recent.get(k, History()).merged(h)
    return {k: _less(h, recent.get(k)) for k, h in e.sums.items()}, recent


def weigh(
    entries: Iterable[Entry], now: float, half_life_s: float | None = None
) -> tuple[dict[Key, History], dict[Key, Change]]:
    """The history ``entries`` make once weighed by age (each run by when it was last seen), and the rungs
    reset by a change (their observations older than ``RECENT_S`` dropped). ``half_life_s`` None:
    ``DEFAULT_HALF_LIFE_S``."""
    listed = list(entries)
    if half_life_s is None:
        # By default, age counts from the newest evidence, not from now: a fleet idle for a month still
        # believes what it last saw (nothing newer contradicts it), while within a busy fleet old runs fade.
        now = max((e.seen for e in listed if e.seen is not None), default=now)
    half = DEFAULT_HALF_LIFE_S if half_life_s is None else half_life_s
    parts = [(e, *split(e, now)) for e in listed]
    old: dict[Key, History] = {}
    recent: dict[Key, History] = {}
    for _, o, r in parts:
        for into, sums in ((old, o), (recent, r)):
            for k, h in sums.items():
                into[k] = into.get(k, History()).merged(h)
    changes = {k: c for k in recent if (c := changed(k[2], old.get(k, History()), recent[k])) is not None}
    out: dict[Key, History] = {}
    for e, _, r in parts:
        w = 1.0 if e.seen is None else float(0.5 ** (max(0.0, now - e.seen) / half))
        for k, h in e.sums.items():
            kept = r.get(k) if k in changes else h
            if kept is not None:
                out[k] = out.get(k, History()).merged(kept.scaled(w))
    return out, changes


def recent_rows(timed: list[Timed], since: float) -> list[list[Any]]:
    """The observations from ``since`` as summary rows ``[at, *key, *sums]``; those of one key within one
    ``RECENT_BUCKET_S`` share a row, at the newest one's time (a run refused every minute stays small)."""
    rows: dict[tuple[Key, int], tuple[float, History]] = {}
    for at, k, h in timed:
        if at is not None and at >= since:
            bucket = (k, int(at // RECENT_BUCKET_S))
            last, sums = rows.get(bucket, (at, History()))
            rows[bucket] = (max(last, at), sums.merged(h))
    return [[at, *k, *astuple(h)] for (k, _), (at, h) in sorted(rows.items(), key=lambda r: (r[1][0], r[0][0]))]


def prune(doc: dict[str, Any]) -> None:
    """Drop the recent rows no reader can count as recent again: older than ``RECENT_S`` before the newest
    run's last sight (a reader's now is at least that). The list stays, empty: the entry is still split by
    time, all of it old, so the summary grows with the runs of the last hours, not with every run's past."""
    entries = [e for e in (doc.get("runs") or {}).values() if isinstance(e, dict)]
    newest = max((float(e["seen"]) for e in entries if isinstance(e.get("seen"), int | float)), default=None)
    if newest is None:
        return
    for e in entries:
        if isinstance(e.get("recent"), list):
            e["recent"] = [r for r in e["recent"] if float(r[0]) >= newest - RECENT_S]


def _history(row: list[Any], at: int) -> tuple[Key, History]:
    return (str(row[at]), str(row[at + 1]), str(row[at + 2]), str(row[at + 3])), History(
        *(float(v) for v in row[at + 4 :])
    )


def entry(e: dict[str, Any]) -> Entry:
    """One run's line of a capacity summary (:func:`tpu_ops.provision.history.entry`) as :func:`weigh` takes it."""
    seen = e.get("seen")
    sums = dict(_history(r, 0) for r in e.get("sums") or [])
    rows = e.get("recent")
    recent = None if rows is None else tuple((float(r[0]), *_history(r, 1)) for r in rows)
    return Entry(float(seen) if isinstance(seen, int | float) else None, sums, recent)


def summary_entries(doc: dict[str, Any]) -> list[Entry]:
    """A capacity summary's runs as :func:`weigh` takes them."""
    return [entry(e) for e in (doc.get("runs") or {}).values()]
