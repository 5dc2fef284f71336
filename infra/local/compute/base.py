"""What every resource family of the fake Compute Engine shares, written once.

A collection (``records.Kind``) says where its records live and how its paths read
(``projects/<p>/zones/<z>/instances/<n>``, ``.../regions/<r>|global/instanceTemplates/<n>``,
``.../<scope>/operations/<n>``). ``ComputeBase`` holds the state and the mechanics every family
repeats: name validation, 404 and 409 errors, ``requestId`` idempotency, operations, filtered and
paged lists, aggregated lists, and get / list / insert / delete wrapped in ``_call`` with the REST
path that faults match. The core (``infra.local.core``) gives the lock, faults, events, paging and
error model underneath.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar, cast

from infra.local.compute import exceptions as cexc
from infra.local.compute import geography
from infra.local.compute.capacity import Capacity
from infra.local.compute.filters import compile_filter
from infra.local.compute.records import (
    GROUPS,
    INSTANCES,
    OPERATIONS,
    POLICIES,
    TEMPLATES,
    Group,
    Instance,
    Key,
    Kind,
    Operation,
    Policy,
    R,
    Template,
)
from infra.local.core import exceptions as exc
from infra.local.core.backend import FakeBackend, NodeEvent, operation_id, page
from infra.local.core.clock import Clock

GOOGLE_BASE = "https://compute.googleapis.com/compute/v1/"
API = "/compute/v1/"  # REST paths (what injected faults match) are API + a resource path
T = TypeVar("T")
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


class Paging(TypedDict, total=False):
    """A list call's ``filter``, ``maxResults`` and ``pageToken`` (keywords of every ``list_*``)."""

    flt: str | None
    max_results: int | None
    token: str | None


AGGREGATED: dict[str, Kind[Any]] = {
    k.collection: k for k in (INSTANCES, GROUPS, POLICIES, TEMPLATES, OPERATIONS) if k.aggregated
}


@dataclass
class Latency:
    provision_s: float = 0.0  # PROVISIONING -> RUNNING
    delete_s: float = 0.0  # STOPPING -> gone


def seconds(d: Any, field: str) -> float:
    """A Compute Engine ``Duration`` (``{"seconds": "3600", "nanos": 0}``) in seconds."""
    if not isinstance(d, dict) or "seconds" not in d:
        raise cexc.Invalid(f"Invalid value for field '{field}': {d!r}; expected {{seconds}}")
    return float(d["seconds"]) + float(d.get("nanos") or 0) / 1e9


def last(link: str) -> str:
    return link.rstrip("/").rsplit("/", 1)[-1]


def check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise cexc.Invalid(
            f"Invalid value for field '{what}': {name!r}. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{{0,61}}"
            "[a-z0-9])?)'",
        )
    return name


class ComputeBase(FakeBackend[NodeEvent]):
    """The state of every project and zone, and the mechanics the resource families share."""

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        latency: Latency | None = None,
        preempt_notice_s: float = 30.0,
        link_base: str = GOOGLE_BASE,
    ) -> None:
        super().__init__(clock=clock)
        self._initial = (latency or Latency(), preempt_notice_s)
        self.latency = Latency(**vars(self._initial[0]))
        self.preempt_notice_s = preempt_notice_s
        self.link_base = link_base  # the server sets its own URL: links never point off loopback
        self.wait_s = 2.0  # longest an operations.wait call holds (wall seconds)
        self.capacity = Capacity()
        self.created_at = self.clock.now()  # the project's and the reservations' creationTimestamp
        self._uids = itertools.count(4_000_000_000_000_000_001)
        self._ips = itertools.count(0)
        self._clear()

    def _clear(self) -> None:
        self._instances: dict[Key, Instance] = {}
        self._templates: dict[Key, Template] = {}
        self._policies: dict[Key, Policy] = {}
        self._groups: dict[Key, Group] = {}
        self._ops: dict[Key, Operation] = {}
        self._failures: dict[str, dict[str, Any]] = {}  # instance path -> why its insert failed
        self._hosted: set[tuple[str, int]] = set()  # (instance path, uid) whose host runs
        self._guest: dict[tuple[str, str, str], str] = {}  # (instance path, namespace, key) -> value
        self._requests: dict[str, Key] = {}  # requestId -> its operation's key
        self.op_polls = 1  # reads of a new operation that answer RUNNING before it may be DONE
        self.op_s = 10.0  # ... or fake seconds after it began, whichever comes first
        self._op_faults: list[list[Any]] = []  # [collection, operationType, error code, count left]

    def _call(self, method: str, path: str, fn: Callable[[], T]) -> T:
        """Every API method: under a zone or region that does not exist, Compute Engine's 404."""

        def checked() -> T:
            geography.check_path(path, self.capacity.zones)
            return fn()

        return super()._call(method, path, checked)

    # -- records -------------------------------------------------------------------------------
    def _table(self, kind: Kind[R]) -> dict[Key, R]:
        return cast(dict[Key, R], getattr(self, kind.attr))

    def _get(self, kind: Kind[R], project: str, where: str, name: str) -> R:
        """The record, or Compute Engine's 404."""
        rec = self._table(kind).get((project, where, name))
        if rec is None:
            raise cexc.not_found(kind.path(project, where, name))
        return rec

    def _new_name(self, kind: Kind[Any], project: str, where: str, body: dict[str, Any]) -> str:
        """``body["name"]`` if valid and free, else Compute Engine's 400 or 409."""
        name = check_name(body.get("name"), "resource.name")
        if (project, where, name) in self._table(kind):
            raise cexc.already_exists(kind.path(project, where, name))
        return name

    def _render(self, rec: Any) -> dict[str, Any]:
        """A record's JSON (a family whose JSON needs more than its record overrides this)."""
        return cast(dict[str, Any], rec.to_json(self.link_base))

    def _group_of(self, inst: Instance) -> Group | None:
        """The group managing ``inst`` (zonal or regional), if any."""
        if not inst.group:
            return None
        return self._groups.get((inst.project, inst.group_where or inst.zone, inst.group))

    def _members(self, grp: Group) -> list[Instance]:
        found = (self._instances.get((grp.project, grp.zone, n)) for n in grp.instances)
        return [i for i in found if i is not None]

    # -- operations and requestId ----------------------------------------------------------------
    def _once(self, request_id: str | None, run: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
        """``requestId``: a retried request returns the first one's operation and does nothing again."""

        def wrapped() -> dict[str, Any]:
            if request_id and request_id in self._requests:
                return self._ops[self._requests[request_id]].to_json(self.link_base)
            out = run()
            if request_id:
                parts = str(out["selfLink"]).removeprefix(self.link_base).split("/")
                self._requests[request_id] = (parts[1], "/".join(parts[2:-2]), parts[-1])
            return out

        return wrapped

    def _new_op(self, project: str, scope: str, op_type: str, target: str, target_id: int) -> Operation:
        now = self.clock.now()
        op = Operation(project, scope, operation_id(now), next(self._uids), op_type, target, target_id, now)
        op.polls_left = self.op_polls
        self._ops[(project, scope, op.name)] = op
        return op

    def _done_op(self, project: str, scope: str, op_type: str, target: str, target_id: int) -> dict[str, Any]:
        """The operation of a change already made: RUNNING now, DONE once read ``op_polls`` times."""
        return self._new_op(project, scope, op_type, target, target_id).to_json(self.link_base)

    # -- asynchronous failures (the control: the next operation of a kind fails after it ran) -----
    def fail_operations(self, collection: str, op_type: str, error: str = "ZONE_RESOURCE_POOL_EXHAUSTED",
                        count: int = 1) -> dict[str, Any]:  # fmt: skip
        """The next ``count`` ``op_type`` (insert|delete) calls on ``collection`` are accepted, change
        nothing, and their operation ends (RUNNING, then DONE) with ``error`` and its HTTP status."""
        kinds = {k.collection for k in AGGREGATED.values()}
        if collection not in kinds or op_type not in ("insert", "delete") or count < 1:
            raise exc.InvalidArgument(
                f"operations: collection in {sorted(kinds)}, operationType insert|delete, count >= 1; got "
                f"{collection!r}, {op_type!r}, {count!r}"
            )
        cexc.async_error(error, "p", "z", "r")  # refuses an unknown code now, not at the call
        with self._lock:
            self._op_faults.append([collection, op_type, error, int(count)])
            return {"operation_faults_pending": sum(f[3] for f in self._op_faults)}

    def _failing(
        self, kind: Kind[Any], op_type: str, project: str, where: str, path: str, uid: int
    ) -> dict[str, Any] | None:
        """If an asynchronous failure is set for this call, its RUNNING operation (nothing changed)."""
        for f in self._op_faults:
            if f[3] > 0 and f[0] == kind.collection and f[1] == op_type:
                f[3] -= 1
                scope = kind.scope(where)
                zone = where if kind.where == "zone" else ""
                region = zone.rsplit("-", 1)[0] if zone else where
                err = cexc.async_error(f[2], project, zone, region)
                op = self._new_op(project, scope, op_type, path, uid)
                op.fail_with = (err, cexc.http_of(err))
                return op.to_json(self.link_base)
        return None

    # -- lists -----------------------------------------------------------------------------------
    def _list(
        self,
        kind: str,
        items: list[dict[str, Any]],
        flt: str | None = None,
        max_results: int | None = None,
        token: str | None = None,
        path: str = "",
    ) -> dict[str, Any]:
        """``{kind, id, selfLink, items?, nextPageToken?}``: ``items`` filtered, then one page of them
        (``path``: the collection's, e.g. ``projects/<p>/zones/<z>/instances``)."""
        pred = compile_filter(flt)
        chunk, nxt = page([i for i in items if pred(i)], max_results, token)
        out: dict[str, Any] = {"kind": kind, "id": path or kind}
        if path:
            out["selfLink"] = self.link_base + path
        if chunk:
            out["items"] = chunk
        if nxt:
            out["nextPageToken"] = nxt
        return out

    def _scoped(self, project: str, collection: str) -> list[tuple[str, dict[str, Any]]] | None:
        """(scope, JSON) of every ``collection`` resource of ``project`` (None: no aggregated list of it).
        A family whose resources are not in a ``Kind`` table (reservations, machine types) adds to this."""
        kind = AGGREGATED.get(collection)
        if kind is None:
            return None
        recs = [(w, r) for (p, w, _), r in self._table(kind).items() if p == project]
        return [(getattr(r, "scope", None) or kind.scope(w), self._render(r)) for w, r in recs]

    def aggregated_list(self, project: str, collection: str, flt: str | None = None) -> dict[str, Any]:
        """``{items: {"zones/<z>"|"regions/<r>"|"global": {<collection>: [...]}}}``; scopes with no match
        are left out; one page (the fake holds few resources). What a reaper walks."""
        path = f"projects/{project}/aggregated/{collection}"

        def run() -> dict[str, Any]:
            scoped = self._scoped(project, collection)
            if scoped is None:
                raise cexc.not_found(path)
            pred = compile_filter(flt)
            items: dict[str, dict[str, list[dict[str, Any]]]] = {}
            for scope, res in sorted(scoped, key=lambda sr: (sr[0], sr[1]["name"])):
                if pred(res):
                    items.setdefault(scope, {collection: []})[collection].append(res)
            list_kind = f"compute#{collection[:-1]}AggregatedList"
            return {"kind": list_kind, "id": path, "items": items, "selfLink": self.link_base + path}

        return self._call("GET", API + path, run)

    # -- get / list / insert / delete, as every family serves them ------------------------------
    def _get_call(self, kind: Kind[Any], project: str, where: str, name: str) -> dict[str, Any]:
        return self._call(
            "GET", API + kind.path(project, where, name), lambda: self._render(self._get(kind, project, where, name))
        )

    def _list_call(
        self, kind: Kind[R], project: str, where: str, page: Paging, order: Callable[[R], Any] | None = None
    ) -> dict[str, Any]:
        """The records of one zone / region / scope, by name (or ``order``), filtered, one page."""

        def run() -> dict[str, Any]:
            recs = [r for (p, w, _), r in sorted(self._table(kind).items()) if p == project and w == where]
            if order is not None:
                recs.sort(key=order)
            return self._list(kind.kind + "List", [self._render(r) for r in recs], **page,
                              path=kind.path(project, where))  # fmt: skip

        return self._call("GET", API + kind.path(project, where), run)

    def _insert_call(
        self,
        kind: Kind[Any],
        project: str,
        where: str,
        request_id: str | None,
        run: Callable[[], dict[str, Any]],
        body: dict[str, Any],
    ) -> dict[str, Any]:
        def once() -> dict[str, Any]:
            if any(f[3] > 0 and f[0] == kind.collection and f[1] == "insert" for f in self._op_faults):
                name = self._new_name(kind, project, where, body)
                failed = self._failing(
                    kind, "insert", project, where, kind.path(project, where, name), next(self._uids)
                )
                if failed is not None:
                    return failed
            return run()

        return self._call("POST", API + kind.path(project, where), self._once(request_id, once))

    def _delete_call(
        self,
        kind: Kind[R],
        project: str,
        where: str,
        name: str,
        request_id: str | None,
        run: Callable[[R], dict[str, Any]],
    ) -> dict[str, Any]:
        """``run(record)`` on the record (404 if none) -> its delete operation."""

        def once() -> dict[str, Any]:
            rec = self._get(kind, project, where, name)
            return self._failing(kind, "delete", project, where, rec.path, rec.uid) or run(rec)

        return self._call("DELETE", API + kind.path(project, where, name), self._once(request_id, once))

    def _insert_now(
        self,
        kind: Kind[R],
        project: str,
        where: str,
        body: dict[str, Any],
        request_id: str | None,
        build: Callable[[str], R],
    ) -> dict[str, Any]:
        """Insert a record whose operation ends at once: name checked, ``build(name)`` validates the
        body and makes the record, which is stored."""

        def run() -> dict[str, Any]:
            name = self._new_name(kind, project, where, body)
            rec = build(name)
            self._table(kind)[(project, where, name)] = rec
            return self._done_op(project, kind.scope(where), "insert", rec.path, rec.uid)

        return self._insert_call(kind, project, where, request_id, run, body)

    def _delete_unused(
        self, kind: Kind[R], key: Key, request_id: str | None, what: str, uses: Callable[[Group, R], bool]
    ) -> dict[str, Any]:
        """Delete a record at once unless a group ``uses`` it (then Compute Engine's resourceInUse)."""
        project, where, name = key

        def run(rec: R) -> dict[str, Any]:
            users = [g for g in self._groups.values() if uses(g, rec)]
            if users:
                raise cexc.in_use(what, rec.path, users[0].path)
            del self._table(kind)[key]
            return self._done_op(project, kind.scope(where), "delete", rec.path, rec.uid)

        return self._delete_call(kind, project, where, name, request_id, run)
