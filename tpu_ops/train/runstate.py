"""A run's state in GCS, and the lease that lets one supervisor at a time write it.

``RUN/_tpu_ops/state.json`` holds what happened to the run: every incarnation of the slice (its id is
written here and into ``job.json`` before the slice is asked for, so an adopting supervisor knows which
workers' reports are current), every preemption with its moments, and the trainer's own step times
(carried by worker 0's heartbeats). The goodput report is derived from it, so any supervisor, first or
adopting, rebuilds the same picture.

``RUN/_tpu_ops/lease.json`` names the supervisor that holds the run (host, pid, a random token) and
until when. It is created with ``ifGenerationMatch=0`` and renewed with ``ifGenerationMatch=<the
generation we wrote>``, so two supervisors can never both believe they hold it. Another supervisor
takes over only once the lease expired, or at once when the holder ran on this host and its process
is gone (a ``kill -9``).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from tpu_ops.cloud.translate import google_errors
from tpu_ops.errors import CloudError, NotFoundError, TpuOpsError
from tpu_ops.provision.ledger import owner_alive
from tpu_ops.uris import ObjectUri

PRECONDITION_FAILED = 412


class LeaseHeldError(TpuOpsError):
    """Another supervisor holds the run's lease."""

    def __init__(self, message: str, holder: dict[str, Any]) -> None:
        super().__init__(message)
        self.holder = holder


class LeaseLostError(TpuOpsError):
    """This supervisor's lease was taken over (it had expired): it must stop without touching the run."""


def _precondition(exc: BaseException) -> bool:
    return isinstance(exc, CloudError) and exc.status == PRECONDITION_FAILED


def read_versioned(gcs: Any, uri: ObjectUri) -> tuple[Any, int]:
    """The JSON at ``uri`` and its generation; ``(None, 0)`` if absent."""
    with google_errors("gcs"):
        blob = gcs.bucket(uri.bucket).get_blob(uri.prefix)
        if blob is None:
            return None, 0
        data = blob.download_as_bytes(if_generation_match=blob.generation)
    return json.loads(data), int(blob.generation)


def write_if(gcs: Any, uri: ObjectUri, doc: Any, generation: int) -> int:
    """Write ``doc`` only if the object is still at ``generation`` (0: absent); the new generation.

    Raises ``CloudError`` with status 412 when someone else wrote it in between.
    """
    with google_errors("gcs"):
        blob = gcs.bucket(uri.bucket).blob(uri.prefix)
        blob.upload_from_string(json.dumps(doc, sort_keys=True), content_type="application/json",
                                if_generation_match=generation)  # fmt: skip
        return int(blob.generation)


# -- the lease ---------------------------------------------------------------------------------


class Lease:
    """One supervisor's hold on a run; ``acquire`` once, then a background thread renews it."""

    def __init__(self, gcs: Any, uri: ObjectUri, ttl_s: float) -> None:
        self.gcs, self.uri, self.ttl_s = gcs, uri, ttl_s
        self.me = {"host": socket.gethostname(), "pid": os.getpid(), "token": uuid.uuid4().hex}
        self.generation = 0
        self.lost: str | None = None
        self._since = 0.0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _doc(self) -> dict[str, Any]:
        now = time.time()
        return {**self.me, "acquired_at": self._since, "renewed_at": now,
                "expires_at": now + self.ttl_s, "ttl_s": self.ttl_s}  # fmt: skip

    def acquire(self) -> dict[str, Any] | None:
        """Take the lease; the previous holder's document if one was taken over. ``LeaseHeldError`` if held."""
        held, gen = read_versioned(self.gcs, self.uri)
        previous = None
        if held is not None:
            expired = float(held.get("expires_at", 0)) < time.time()
            dead = owner_alive(held) is False  # same host, process gone
            if not (expired or dead):
                left = float(held["expires_at"]) - time.time()
                raise LeaseHeldError(
                    f"another supervisor holds this run: pid {held.get('pid')} on host {held.get('host')} "
                    f"(lease {self.uri}, renewed {time.time() - float(held.get('renewed_at', 0)):.0f}s ago, "
                    f"expires in {left:.0f}s). Stop it, or wait for its lease to expire.",
                    held,
                )
            previous = held
        self._since = time.time()
        try:
            self.generation = write_if(self.gcs, self.uri, self._doc(), gen)
        except CloudError as exc:
            if not _precondition(exc):
                raise
            now_held, _ = read_versioned(self.gcs, self.uri)
            holder = now_held or {}
            raise LeaseHeldError(
                f"another supervisor took this run a moment ago: pid {holder.get('pid')} on host "
                f"{holder.get('host')} (lease {self.uri})",
                holder,
            ) from None
        return previous

    def renew(self) -> None:
        """Extend the lease; ``LeaseLostError`` if someone else wrote it since (it had expired)."""
        with self._lock:
            if self.lost:
                raise LeaseLostError(self.lost)
            try:
                self.generation = write_if(self.gcs, self.uri, self._doc(), self.generation)
            except CloudError as exc:
                if not _precondition(exc):
                    return  # a transient failure: the next renewal tries again, well within the TTL
                holder, _ = read_versioned(self.gcs, self.uri)
                self.lost = (f"lease {self.uri} was taken over by pid {(holder or {}).get('pid')} on host "
                             f"{(holder or {}).get('host')}")  # fmt: skip
                raise LeaseLostError(self.lost) from None

    def check(self) -> None:
        """Raise ``LeaseLostError`` if the renewer found the lease taken."""
        if self.lost:
            raise LeaseLostError(self.lost)

    def start(self) -> None:
        """Renew every third of the TTL in a daemon thread, while the supervisor blocks in provisioning."""

        def loop() -> None:
            while not self._stop.wait(self.ttl_s / 3):
                try:
                    self.renew()
                except LeaseLostError:
                    return
                except TpuOpsError:
                    continue

        self._thread = threading.Thread(target=loop, name="tpu-ops-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop renewing and delete the lease (only if it is still ours)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            if self.lost or not self.generation:
                return
            try:
                with google_errors("gcs"):
                    self.gcs.bucket(self.uri.bucket).blob(self.uri.prefix).delete(if_generation_match=self.generation)
            except (NotFoundError, CloudError):
                pass  # taken over or already gone: not ours to delete
            self.generation = 0


def live_holder(gcs: Any, uri: ObjectUri) -> dict[str, Any] | None:
    """The holder of the lease at ``uri`` while its lease is valid (not expired, process not known dead)."""
    doc, _ = read_versioned(gcs, uri)
    if not isinstance(doc, dict) or float(doc.get("expires_at", 0)) < time.time() or owner_alive(doc) is False:
        return None
    return doc


# -- the run's state ---------------------------------------------------------------------------


@dataclass
class SliceState:
    """One slice of an incarnation's allocation, as recorded in ``state.json``."""

    index: int  # its place in the allocation (slice 0's host 0 coordinates the job)
    resource_id: str
    zone: str
    tier: str
    hosts: int  # 0: not known (a state file written before slices were recorded)
    kept: bool = False  # held over from the previous incarnation (the lost slice was replaced), not obtained anew
    repaired: bool = False  # a new node Google made in the kept request's place (multislice on the TPU API)


@dataclass
class IncarnationState:
    """One provisioning of the run's allocation, as recorded in ``state.json``.

    ``queued_resource``, ``zone`` and ``tier`` are slice 0's (what single-slice readers use);
    ``slices`` every slice of the allocation (empty in state files written before it was recorded).
    """

    number: int
    id: str
    requested_at: float
    queued_resource: str = ""
    zone: str = ""
    tier: str = ""
    ready_at: float | None = None
    resume_step: int | None = None
    ended_at: float | None = None
    end: str = ""  # preempted | moved | done | failed | "" while live (moved: left for another slice, no step lost)
    kept_until: int | None = None  # the step the next incarnation resumed from (or the final step)
    first_step_at: float | None = None
    last_step: int | None = None
    last_seen_at: float | None = None  # the newest heartbeat of this incarnation
    timeline: list[list[Any]] = field(default_factory=list)  # worker 0's [kind, step, start, end] records
    tokens_per_step: float | None = None  # what one step does across the slice, as the trainer said
    model_flops_per_step: float | None = None  # (worker 0's heartbeat: agent.job.WORK_FIELDS)
    shape: str = ""  # what it trained on (elastic shapes: maybe smaller than the target, docs/elastic.md)
    chips: int = 0  # the allocation's chips (goodput counts chip-seconds)
    slices: list[SliceState] = field(default_factory=list)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> IncarnationState:
        d = dict(doc)
        slices = [SliceState(**s) for s in d.pop("slices", None) or []]
        return cls(**d, slices=slices)

    def allocation(self) -> list[SliceState]:
        """Every slice of this incarnation; for an older state file, slice 0 as recorded then (hosts unknown)."""
        if self.slices or not self.queued_resource:
            return list(self.slices)
        return [SliceState(0, self.queued_resource, self.zone, self.tier, 0)]


@dataclass
class PreemptionState:
    """One lost slice: its moments and what recovering from it cost."""

    number: int
    incarnation: int
    reason: str
    queued_resource: str
    zone: str
    tier: str
    detected_at: float
    last_seen_at: float | None
    last_step: int | None
    unsupervised: bool = False  # happened while no supervisor ran (found by the next one)
    resume_step: int | None = None
    steps_lost: int | None = None
    detect_s: float = 0.0
    delete_s: float = 0.0
    reprovision_s: float = 0.0
    restore_s: float | None = None

    def resumed_from(self, step: int | None) -> None:
        """The next incarnation resumed from ``step``: the steps lost are those reached past it. The step
        resumed from was saved, so it was reached, whatever the last heartbeat said (the workers catch up
        to the step they agree on after the notice, and may save it after their last heartbeat)."""
        self.resume_step = step
        if step is not None and (self.last_step is None or step > self.last_step):
            self.last_step = step
        self.steps_lost = max(0, (self.last_step or 0) - (step or 0))


@dataclass
class MoveState:
    """A voluntary move at a checkpoint (``train.moves``, docs/moves.md): make-before-break, no step lost.

    ``phase``: asked (the target requested; the old slice trains) → stopping (the target's workers are up,
    the old ones were told to stop) → moved; or refused (the target's request failed), abandoned (given up
    on: the target deleted, the old slice trains on or the normal recovery runs)."""

    number: int
    incarnation: int  # the one moved from (its number); the one moved to gets the next number if moved
    to_id: str  # the new incarnation's id (its agents' --incarnation)
    checkpoint: int  # the committed step that prompted the move
    from_resource: str
    from_tier: str
    from_zone: str
    to_resource: str
    to_tier: str
    to_zone: str
    why: str
    stay_usd: float
    move_usd: float
    asked_at: float
    phase: str = "asked"
    granted_at: float | None = None  # the target ready (both slices held from here)
    stopped_at: float | None = None  # the old workers told to stop
    ended_at: float | None = None  # moved: the old slice deleted; else when given up
    resume_step: int | None = None  # the step the new slice resumed from
    detail: str = ""  # why a move was refused or abandoned

    @property
    def overlap_s(self) -> float:
        """Seconds both slices were held (the target granted → the old one deleted)."""
        if self.granted_at is None:
            return 0.0
        return max(0.0, (self.ended_at or self.granted_at) - self.granted_at)


@dataclass
class RunState:
    """Everything the report is derived from."""

    run_id: str
    started_at: float
    steps: int
    outcome: str = "running"  # running | done | failed
    finished_at: float | None = None
    final_step: int | None = None
    error: str = ""
    incarnations: list[IncarnationState] = field(default_factory=list)
    preemptions: list[PreemptionState] = field(default_factory=list)
    supervisors: list[dict[str, Any]] = field(default_factory=list)
    stockouts: list[dict[str, Any]] = field(default_factory=list)  # requests refused for capacity: zone, tier, at
    moves: list[MoveState] = field(default_factory=list)  # voluntary moves at checkpoints (train.moves)
    ledger_as_of: float | None = None  # RUN/_tpu_ops/ledger.json held every billing event up to then (train.costs)

    @property
    def live(self) -> IncarnationState | None:
        """The incarnation not yet ended, if any."""
        last = self.incarnations[-1] if self.incarnations else None
        return last if last is not None and not last.end else None

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RunState:
        d = dict(doc)
        incs = [IncarnationState.from_json(i) for i in d.pop("incarnations", [])]
        pres = [PreemptionState(**p) for p in d.pop("preemptions", [])]
        moves = [MoveState(**m) for m in d.pop("moves", None) or []]
        d.pop("version", None)
        return cls(**d, incarnations=incs, preemptions=pres, moves=moves)

    def to_json(self) -> dict[str, Any]:
        return {"version": 1, **asdict(self)}


class StateStore:
    """Reads and writes ``state.json`` with generation preconditions (only the lease holder writes)."""

    def __init__(self, gcs: Any, uri: ObjectUri) -> None:
        self.gcs, self.uri = gcs, uri
        self.generation = 0

    def load(self) -> RunState | None:
        doc, self.generation = read_versioned(self.gcs, self.uri)
        return None if doc is None else RunState.from_json(doc)

    def save(self, state: RunState) -> None:
        """Write ``state``; ``LeaseLostError`` if someone else wrote it since we read it."""
        try:
            self.generation = write_if(self.gcs, self.uri, state.to_json(), self.generation)
        except CloudError as exc:
            if _precondition(exc):
                raise LeaseLostError(f"run state {self.uri} was written by another supervisor") from None
            raise
