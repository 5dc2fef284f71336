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
*its* rung) and steps lost. The sums, not means, are kept, so ``tpu_ops.provision.choose`` can shrink
them towards its prior by how much they rest on. A run refreshes the history by writing its records;
``tpu-ops capacity stats`` prints it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from tpu_ops.cloud.translate import google_errors
from tpu_ops.errors import NotFoundError
from tpu_ops.layout import RunLayout
from tpu_ops.provision.choose import History
from tpu_ops.uris import ObjectUri

Key = tuple[str, str, str, str]  # (accelerator type, zone, tier, backend)
UNKNOWN: Final = "?"  # a run recorded before its identity was


def _f(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _add(out: dict[Key, History], key: Key, h: History) -> None:
    out[key] = out.get(key, History()).merged(h)


def fold_run(
    record: dict[str, Any], identity: dict[str, Any] | None = None, now: float | None = None
) -> dict[Key, History]:
    """One run's observations by key, from its ``state.json`` or ``goodput.json`` document."""
    ident = identity or {}
    acc = str(ident.get("accelerator_type") or record.get("accelerator_type") or UNKNOWN)
    backend = str(ident.get("backend") or record.get("backend") or "tpu-api")
    incs = [i for i in record.get("incarnations") or [] if isinstance(i, dict)]
    pres = [p for p in record.get("preemptions") or [] if isinstance(p, dict)]
    out: dict[Key, History] = {}
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
        _add(out, key(inc), History(
            hours=max(0.0, end - ready) / 3600.0,
            obtained=1 if obtain is not None else 0,
            obtain_s_total=max(0.0, obtain) if obtain is not None else 0.0,
        ))  # fmt: skip
    for p in pres:
        parts = [_f(p.get(k)) for k in ("detect_s", "delete_s", "restore_s")]
        measured = p.get("restore_s") is not None
        lost_steps = p.get("steps_lost")
        _add(out, key(p), History(
            preemptions=1,
            recoveries=1 if measured else 0,
            recovery_s_total=sum(v for v in parts if v is not None) if measured else 0.0,
            steps_lost_total=int(lost_steps) if isinstance(lost_steps, int) else 0,
        ))  # fmt: skip
    return out


def fold(runs: Iterable[tuple[dict[str, Any], dict[str, Any] | None]], now: float | None = None) -> dict[Key, History]:
    """Every run's observations summed by key."""
    out: dict[Key, History] = {}
    for record, identity in runs:
        for k, h in fold_run(record, identity, now).items():
            _add(out, k, h)
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


def load(gcs: Any, root: ObjectUri, now: float | None = None) -> dict[Key, History]:
    """The capacity history of every run under ``root``."""
    return fold(((rec, ident) for _, rec, ident in read_runs(gcs, root)), now)


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
        }


def stats(histories: dict[Key, History]) -> list[Stat]:
    return [Stat(*k, h) for k, h in sorted(histories.items())]
