"""Capacity history per (accelerator type, zone, tier, backend), folded from the run records the
runs already keep in the checkpoint bucket: no database of its own.

Each run's ``RUN/_tpu_ops/`` holds what happened to it:

- ``state.json`` (run state: incarnations with ``requested_at``/``ready_at``/``ended_at``, and
  preemptions with their moments), or, from runs before run state existed, ``goodput.json`` (the
  report: incarnations with ``ready_at`` and preemptions with ``reprovision_s``);
- ``capacity.json``, the slice's identity (accelerator type, backend), written by
  :func:`write_identity` when a supervised run starts (neither record above names them).

Per key the fold sums held slice-hours, preemptions, the time each slice took to obtain, each
preemption's recovery overhead (detect + delete + restore; the next slice's obtain time counts to
*its* rung), steps lost, and the requests refused for capacity (``stockouts`` in ``state.json``:
how often the rung is full). The sums, not means, are kept, so ``tpu_ops.provision.choose`` can
shrink them towards its prior by how much they rest on. A run refreshes the history by writing its records;
``tpu-ops capacity stats`` prints it.

A ranking reads the history in one request: ``ROOT/_tpu_ops/capacity-summary.json`` keeps each run's
folded sums, when it was last seen (for aging), and its observations of the 6 h before that with their
times (for the change-point reset, :mod:`tpu_ops.provision.forgetting`). A supervised run publishes its own
entry at each milestone of its state (a slice obtained, preempted, recovered, ended) with a
read-modify-write under the object's generation precondition, retried on 412, so concurrent runs
never lose each other's updates. Where the summary does not exist yet it is built once from a full
scan of the run records (a listing plus two reads per run), then kept.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from tpu_ops.cloud.translate import google_errors
from tpu_ops.errors import CloudError, NotFoundError, TpuOpsError
from tpu_ops.layout import RunLayout, state_root
from tpu_ops.provision.choose import History, astuple
from tpu_ops.provision.forgetting import RECENT_S, Timed, prune, recent_rows
from tpu_ops.uris import ObjectUri

Key = tuple[str, str, str, str]  # (accelerator type, zone, tier, backend)
UNKNOWN: Final = "?"  # a run recorded before its identity was
SUMMARY: Final = "capacity-summary.json"  # under ROOT/_tpu_ops/: every run's sums, read in one request
SUMMARY_VERSION: Final = 1
PUBLISH_ATTEMPTS: Final = 8  # read-modify-write retries when another run wrote the summary in between


def _f(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _add(out: dict[Key, History], key: Key, h: History) -> None:
    out[key] = out.get(key, History()).merged(h)


def observations(
    record: dict[str, Any], identity: dict[str, Any] | None = None, now: float | None = None
) -> list[Timed]:
    """One run's observations one by one, each with when it happened: a slice's hours at its end, a
    preemption at its detection, a refusal when it was met (from its ``state.json`` or ``goodput.json``)."""
    ident = identity or {}
    acc = str(ident.get("accelerator_type") or record.get("accelerator_type") or UNKNOWN)
    backend = str(ident.get("backend") or record.get("backend") or "tpu-api")
    incs = [i for i in record.get("incarnations") or [] if isinstance(i, dict)]
    pres = [p for p in record.get("preemptions") or [] if isinstance(p, dict)]
    out: list[Timed] = []
    started = _f(record.get("started_at"))
    wall = _f(record.get("wall_s"))
    run_end = _f(record.get("finished_at")) or (started + wall if started is not None and wall else None)
    fallback_end = run_end if run_end is not None else (time.time() if now is None else now)

    def key(d: dict[str, Any]) -> Key:
        return (acc, str(d.get("zone", "")), str(d.get("tier", "")), backend)

    for n, inc in enumerate(incs):
        ready = _f(inc.get("ready_at"))
        if ready is None:
            continue
        # When the slice stopped being held: run state says so; an older report has the preemption's
        # detection time, or the run's end for the last incarnation.
        end = _f(inc.get("ended_at"))
        if end is None:
            lost = [p for p in pres if p.get("queued_resource") == inc.get("queued_resource")
                    and (_f(p.get("detected_at")) or 0.0) >= ready]  # fmt: skip
            seen = _f(lost[0].get("detected_at")) if lost else None
            end = seen or _f(inc.get("last_seen_at")) or fallback_end
        requested = _f(inc.get("requested_at"))
        obtain: float | None = ready - requested if requested is not None else None
        if obtain is None and n > 0 and n - 1 < len(pres):
            obtain = _f(pres[n - 1].get("reprovision_s"))  # the report's time to get this replacement
        out.append((end, key(inc), History(
            hours=max(0.0, end - ready) / 3600.0,
            obtained=1 if obtain is not None else 0,
            obtain_s_total=max(0.0, obtain) if obtain is not None else 0.0,
        )))  # fmt: skip
    for refused in record.get("stockouts") or []:
        if isinstance(refused, dict):  # a request the rung refused for capacity: how often it is full
            out.append((_f(refused.get("at")), key(refused), History(stockouts=1)))
    for p in pres:
        parts = [_f(p.get(k)) for k in ("detect_s", "delete_s", "restore_s")]
        measured = p.get("restore_s") is not None
        lost_steps = p.get("steps_lost")
        out.append((_f(p.get("detected_at")), key(p), History(
            preemptions=1,
            recoveries=1 if measured else 0,
            recovery_s_total=sum(v for v in parts if v is not None) if measured else 0.0,
            steps_lost_total=int(lost_steps) if isinstance(lost_steps, int) else 0,
        )))  # fmt: skip
    return out


def fold_run(
    record: dict[str, Any], identity: dict[str, Any] | None = None, now: float | None = None
) -> dict[Key, History]:
    """One run's observations by key, from its ``state.json`` or ``goodput.json`` document."""
    return _summed(observations(record, identity, now))


def _summed(timed: Iterable[Timed]) -> dict[Key, History]:
    out: dict[Key, History] = {}
    for _, k, h in timed:
        _add(out, k, h)
    return out


def last_seen(record: dict[str, Any]) -> float | None:
    """The newest moment a run record speaks of (its end, or its last slice's end or start)."""
    started, wall = _f(record.get("started_at")), _f(record.get("wall_s"))
    times = [_f(record.get("finished_at")), started + wall if started is not None and wall is not None else None]
    for inc in record.get("incarnations") or []:
        if isinstance(inc, dict):
            times += [_f(inc.get(k)) for k in ("ended_at", "last_seen_at", "ready_at")]
    found = [t for t in times if t is not None]
    return max(found) if found else None


def weight(record: dict[str, Any], now: float, half_life_s: float | None) -> float:
    """How much a run's observations count: ``0.5 ** (age / half_life)``, age from :func:`last_seen`
    (1 without a half-life, or when the record has no time: it cannot be aged)."""
    seen = last_seen(record)
    if half_life_s is None or seen is None:
        return 1.0
    return float(0.5 ** (max(0.0, now - seen) / half_life_s))


def fold(
    runs: Iterable[tuple[dict[str, Any], dict[str, Any] | None]],
    now: float | None = None,
    half_life_s: float | None = None,
) -> dict[Key, History]:
    """Every run's observations summed by key; with ``half_life_s``, each run's weighted by its age
    (spot capacity drifts with demand: what a zone did last month says less than what it did today)."""
    now = time.time() if now is None else now
    out: dict[Key, History] = {}
    for record, identity in runs:
        w = weight(record, now, half_life_s)
        for k, h in fold_run(record, identity, now).items():
            _add(out, k, h if w == 1.0 else h.scaled(w))
    return out


# -- reading the bucket ------------------------------------------------------------------------


def _get(gcs: Any, bucket: str, name: str) -> dict[str, Any] | None:
    try:
        with google_errors("gcs"):
            raw = gcs.bucket(bucket).blob(name).download_as_bytes()
        doc = json.loads(raw)
    except (NotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None  # absent, or half-written by a killed process: the run adds nothing
    return doc if isinstance(doc, dict) else None


def read_runs(gcs: Any, root: ObjectUri) -> list[tuple[str, dict[str, Any], dict[str, Any] | None]]:
    """``(run id, record, identity)`` of every run directly under ``root`` (the checkpoint dir)."""
    prefix = root.prefix.rstrip("/") + "/" if root.prefix else ""
    with google_errors("gcs"):
        pages = gcs.list_blobs(root.bucket, prefix=prefix, delimiter="/")
        list(pages)  # the run directories arrive as prefixes once the listing is consumed
        run_dirs = sorted(pages.prefixes)
    out = []
    for d in run_dirs:
        run = RunLayout(f"gs://{root.bucket}/{d}")
        record = _get(gcs, root.bucket, run.run_state.prefix) or _get(gcs, root.bucket, run.goodput.prefix)
        if record is None:
            continue
        out.append((d[len(prefix) :].rstrip("/"), record, _get(gcs, root.bucket, run.capacity.prefix)))
    return out


def load(gcs: Any, root: ObjectUri, now: float | None = None, half_life_s: float | None = None) -> dict[Key, History]:
    """The capacity history of every run under ``root`` (weighted by age with ``half_life_s``): one
    read of the summary; without one, a full scan, kept as the summary for the next ranking."""
    return combine(load_doc(gcs, root), now, half_life_s)


def load_doc(gcs: Any, root: ObjectUri) -> dict[str, Any]:
    """The capacity summary under ``root`` (see :func:`load`)."""
    doc, generation = read_summary(gcs, root)
    if doc is None:
        doc = scan_summary(gcs, root)
        # Nothing to keep when there are no runs; if another run created it meanwhile, or the bucket
        # is read-only, this ranking still has its history.
        with contextlib.suppress(TpuOpsError):
            if doc["runs"]:
                write_summary(gcs, root, doc, generation)
    return doc


# -- the summary: one object, one read per ranking ----------------------------------------------


def summary_uri(root: ObjectUri) -> ObjectUri:
    return state_root(root).child(SUMMARY)


def entry(record: dict[str, Any], identity: dict[str, Any] | None, now: float | None = None) -> dict[str, Any]:
    """One run's line in the summary: its folded sums by key, when it was last seen, and its observations of
    the ``RECENT_S`` before that, each with its time (a change-point reset splits old from recent by them)."""
    from tpu_ops.provision.fleet import holding

    timed = observations(record, identity, now)
    seen = last_seen(record)
    out: dict[str, Any] = {"seen": seen, "sums": [[*k, *astuple(h)] for k, h in sorted(_summed(timed).items())]}
    if seen is not None:  # the run's last RECENT_S by when each observation happened: a change shows by when
        # it was seen, not by when its run was last seen (tpu_ops.provision.forgetting)
        out["recent"] = recent_rows(timed, seen - RECENT_S)
    holds = holding(record)  # the fleet view: which slice the run holds now (tpu_ops.provision.fleet)
    if holds is not None:
        out["holds"] = holds
    return out


def combine(doc: dict[str, Any], now: float | None = None, half_life_s: float | None = None) -> dict[Key, History]:
    """The history a summary holds: every run's sums added (each weighted by age with ``half_life_s``)."""
    now = time.time() if now is None else now
    out: dict[Key, History] = {}
    for e in (doc.get("runs") or {}).values():
        seen = _f(e.get("seen"))
        w = 1.0 if half_life_s is None or seen is None else float(0.5 ** (max(0.0, now - seen) / half_life_s))
        for row in e.get("sums") or []:
            h = History(*(float(v) for v in row[4:]))
            _add(out, (str(row[0]), str(row[1]), str(row[2]), str(row[3])), h if w == 1.0 else h.scaled(w))
    return out


def read_summary(gcs: Any, root: ObjectUri) -> tuple[dict[str, Any] | None, int]:
    """The summary and its generation (one GET); ``(None, 0)`` when absent, ``(None, generation)``
    when unreadable or of another version (it is then rebuilt over that generation)."""
    uri = summary_uri(root)
    blob = gcs.bucket(uri.bucket).blob(uri.prefix)
    try:
        with google_errors("gcs"):
            raw = blob.download_as_bytes()  # the response's headers carry the generation
    except NotFoundError:
        return None, 0
    generation = int(blob.generation or 0)
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None, generation
    if not isinstance(doc, dict) or doc.get("version") != SUMMARY_VERSION:
        return None, generation
    return doc, generation


def write_summary(gcs: Any, root: ObjectUri, doc: dict[str, Any], generation: int) -> None:
    """Write the summary only if it is still at ``generation`` (0: absent); ``CloudError`` 412 if not."""
    uri = summary_uri(root)
    with google_errors("gcs"):
        gcs.bucket(uri.bucket).blob(uri.prefix).upload_from_string(
            json.dumps(doc, sort_keys=True), content_type="application/json", if_generation_match=generation
        )


def scan_summary(gcs: Any, root: ObjectUri) -> dict[str, Any]:
    """The summary built from every run record under ``root`` (the full scan, done once)."""
    return {"version": SUMMARY_VERSION, "runs": {rid: entry(rec, ident) for rid, rec, ident in read_runs(gcs, root)}}


def publish(
    gcs: Any, root: ObjectUri, run_id: str, record: dict[str, Any], identity: dict[str, Any] | None,
    now: float | None = None,
) -> int:  # fmt: skip
    """Put one run's entry into the summary under ``root``; how many writes lost a race first.

    Read, change, write with ``ifGenerationMatch``: when another run wrote in between, GCS answers
    412 and this run reads again, so no update is lost. ``CloudError`` after ``PUBLISH_ATTEMPTS``."""
    mine = entry(record, identity, now)

    def change(old: dict[str, Any]) -> dict[str, Any]:  # the run's last ask for a reservation stays
        return {**mine, "ask": old["ask"]} if "ask" in old else mine

    return update(gcs, root, run_id, change)


def note_ask(gcs: Any, root: ObjectUri, run_id: str, ask: dict[str, float]) -> int:
    """Keep this run's ask for a reservation (:func:`tpu_ops.provision.fleet.ask`) in its summary entry,
    where the next rankings of the fleet read it (:func:`tpu_ops.provision.fleet.asks`)."""
    return update(gcs, root, run_id, lambda old: {**old, "ask": ask})


def update(gcs: Any, root: ObjectUri, run_id: str, change: Callable[[dict[str, Any]], dict[str, Any]]) -> int:
    """Change one run's entry of the summary (read, change, conditional write; again on 412)."""
    for lost in range(PUBLISH_ATTEMPTS):
        doc, generation = read_summary(gcs, root)
        if doc is None:
            doc = scan_summary(gcs, root)
        runs = doc.setdefault("runs", {})
        old = runs.get(run_id)
        runs[run_id] = change(old if isinstance(old, dict) else {})
        prune(doc)
        try:
            write_summary(gcs, root, doc, generation)
            return lost
        except CloudError as exc:
            if exc.status != 412:
                raise
    where = summary_uri(root)
    raise CloudError(f"capacity summary {where}: {PUBLISH_ATTEMPTS} concurrent writes in a row", service="gcs")


def milestones(record: dict[str, Any]) -> tuple[Any, ...]:
    """What a summary entry depends on, short of a live slice's running hours: publish when it changes."""
    incs = tuple((i.get("zone"), i.get("tier"), i.get("ready_at"), i.get("ended_at"))
                 for i in record.get("incarnations") or [] if isinstance(i, dict))  # fmt: skip
    pres = tuple((p.get("restore_s"), p.get("steps_lost"))
                 for p in record.get("preemptions") or [] if isinstance(p, dict))  # fmt: skip
    return incs, pres, record.get("finished_at")


def write_identity(gcs: Any, run: ObjectUri, accelerator_type: str, backend: str, chips: int) -> None:
    """Record what the run's slices are (``RUN/_tpu_ops/capacity.json``) so the history can key them."""
    doc = {"accelerator_type": accelerator_type, "backend": backend, "chips": chips}
    with google_errors("gcs"):
        target = RunLayout(str(run)).capacity
        gcs.bucket(target.bucket).blob(target.prefix).upload_from_string(
            json.dumps(doc, sort_keys=True), content_type="application/json"
        )


@dataclass(frozen=True)
class Stat:
    """One row of ``tpu-ops capacity stats``."""

    accelerator_type: str
    zone: str
    tier: str
    backend: str
    history: History

    def to_json(self) -> dict[str, Any]:
        h = self.history
        return {
            "accelerator_type": self.accelerator_type,
            "zone": self.zone,
            "tier": self.tier,
            "backend": self.backend,
            "hours": round(h.hours, 6),
            "preemptions": h.preemptions,
            "preemptions_per_hour": round(h.preemptions / h.hours, 6) if h.hours > 0 else None,
            "slices_obtained": h.obtained,
            "obtain_s_mean": round(h.obtain_s_total / h.obtained, 3) if h.obtained else None,
            "recovery_s_mean": round(h.recovery_s_total / h.recoveries, 3) if h.recoveries else None,
            "steps_lost_mean": round(h.steps_lost_total / h.preemptions, 3) if h.preemptions else None,
            "stockouts": h.stockouts,
            "refused_share": round(h.stockouts / (h.stockouts + h.obtained), 6) if h.stockouts + h.obtained else None,
        }


def stats(histories: dict[Key, History]) -> list[Stat]:
    return [Stat(*k, h) for k, h in sorted(histories.items())]
