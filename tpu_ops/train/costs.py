"""A run's cost wherever its GCS state can be read: the supervisor publishes its ledger's billing events.

The cost ledger (:mod:`tpu_ops.provision.ledger`) lives in the state directory of the machine whose
process provisioned the run. So that ``status``, ``logs``, ``cancel`` and ``cost`` elsewhere (a run started
in the Prefect UI is supervised on the machine serving the deployments) show the same figures, the lease
holder copies the events the bill is folded from to ``RUN/_tpu_ops/ledger.json`` before each state save in
which its ledger changed, and once more after teardown (the last save). Only those events, only the fields
the bill reads: never a host, a plan or an error text. A reader merges the copy with its own ledger's
events (a teardown, reaper or cancel there appends its own GONE): the same event in both counts once.

The copy is complete up to the run state's ``ledger_as_of`` (the supervisor stamps it after publishing, at
each state save), so a reader says how old its figure may be while the run goes on.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Final

from tpu_ops.errors import NotFoundError, TpuOpsError
from tpu_ops.layout import RunLayout
from tpu_ops.provision import ledger as L
from tpu_ops.provision.prices import PriceTable
from tpu_ops.settings import Settings
from tpu_ops.train.layout import get_json, put_json
from tpu_ops.train.runstate import RunState, StateStore

# What ``ledger.summarise`` reads, and nothing else.
BILLING_KINDS: Final = frozenset({L.ATTEMPT, L.ACTIVE, L.PREEMPTED, L.DELETE_REQUESTED, L.GONE})
FIELDS: Final = ("t", "kind", "resource_id", "zone", "tier", "chips", "generation", "seconds_waited")


def billing_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events the bill is folded from, each cut to the fields it reads (an attempt that waited
    nothing adds nothing to the queue time: left out)."""
    out = []
    for e in events:
        if e.get("kind") not in BILLING_KINDS:
            continue
        if e["kind"] == L.ATTEMPT and not float(e.get("seconds_waited") or 0.0):
            continue
        keep = FIELDS if e["kind"] != L.ATTEMPT else ("t", "kind", "seconds_waited")
        out.append({k: e[k] for k in keep if k in e})
    return out


def _key(e: dict[str, Any]) -> str:
    return json.dumps(e, sort_keys=True, default=str)


def merge(*sources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every billing event of ``sources`` once (an event is its fields: the same time to the last digit, the
    same kind and slice), ordered by time; events at the same moment keep the order of the first source."""
    seen: dict[str, dict[str, Any]] = {}
    for events in sources:
        for e in billing_events(events):
            seen.setdefault(_key(e), e)
    return sorted(seen.values(), key=lambda e: float(e.get("t", 0)))


def read(gcs: Any, layout: RunLayout) -> dict[str, Any] | None:
    """The published copy (``events``, ``as_of``), None if the run has none (an older run, not yet billed)."""
    try:
        doc = get_json(gcs, layout.ledger)
    except NotFoundError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("events"), list):
        return None
    return {**doc, "events": [e for e in doc["events"] if isinstance(e, dict)]}


def write(gcs: Any, layout: RunLayout, run_id: str, events: list[dict[str, Any]]) -> float:
    """Publish ``events`` (already merged); the time it is complete as of."""
    now = time.time()
    put_json(gcs, layout.ledger, {"version": 1, "run_id": run_id, "as_of": now, "events": events})
    return now


class Publisher:
    """The lease holder's copy: written when its ledger changed since the last one, never otherwise."""

    def __init__(self, gcs: Any, layout: RunLayout, ledger: L.Ledger) -> None:
        self.gcs, self.layout, self.ledger = gcs, layout, ledger
        self._inherited: list[dict[str, Any]] | None = None  # a predecessor's copy (another machine's ledger)
        self._size = -1  # the ledger file's size at the last publish: unchanged, nothing to read or write
        self._last: list[dict[str, Any]] | None = None

    def publish(self) -> float | None:
        """Bring the copy up to date; when it is complete as of (None: GCS failed, the next save tries again)."""
        try:
            if self._inherited is None:  # once: a supervisor that adopted the run keeps its predecessor's events
                self._inherited = self._last = (read(self.gcs, self.layout) or {}).get("events", [])
            size = self.ledger.path.stat().st_size if self.ledger.path.exists() else 0
            if size != self._size:
                events = merge(self._inherited, self.ledger.events())
                if events != self._last:
                    write(self.gcs, self.layout, self.ledger.run_id, events)
                self._size, self._last = size, events
        except TpuOpsError:
            return None  # a copy for readers elsewhere: its failure never fails the run
        return time.time()


class Vouching:
    """The supervisor's state store: each save first brings the copy up to date, then stamps the state with
    the moment it was complete (``ledger_as_of``), so the state saved vouches for the copy."""

    def __init__(self, store: StateStore, layout: RunLayout, ledger: L.Ledger) -> None:
        self.store, self.publisher = store, Publisher(store.gcs, layout, ledger)

    def load(self) -> RunState | None:
        return self.store.load()

    def save(self, state: RunState) -> None:
        state.ledger_as_of = self.publisher.publish() or state.ledger_as_of
        self.store.save(state)


def publish_merged(gcs: Any, layout: RunLayout, ledger: L.Ledger) -> None:
    """A one-off publish by a process that is not the supervisor (the flow's teardown hook, ``cancel``
    elsewhere): what is published merged with this ledger's events. Best effort."""
    try:
        doc = read(gcs, layout) or {}
        ours = billing_events(ledger.events())
        events = merge(doc.get("events", []), ours)
        if ours and events != doc.get("events"):
            write(gcs, layout, ledger.run_id, events)
    except TpuOpsError:
        pass


@dataclass
class KnownCost:
    """A run's cost as this machine can know it."""

    cost: L.RunCost
    published: bool = False  # the published copy held events this state directory's ledger lacks
    as_of: float | None = None  # when the published copy was written (None: nothing published)


def known(
    settings: Settings,
    run_id: str,
    table: PriceTable,
    gcs: Any = None,
    layout: RunLayout | None = None,
    now: float | None = None,
) -> KnownCost:
    """This state directory's ledger merged with the published copy (one GET, when ``layout`` is given)."""
    local = L.Ledger(settings, run_id).events()
    doc = read(gcs, layout) if layout is not None and gcs is not None else None
    if doc is None:
        return KnownCost(L.summarise(run_id, local, table, now))
    mine = {_key(e) for e in billing_events(local)}
    theirs = billing_events(doc["events"])
    events = merge(local, theirs)
    published = any(_key(e) not in mine for e in theirs)
    return KnownCost(L.summarise(run_id, events, table, now), published, float(doc.get("as_of") or 0.0) or None)
