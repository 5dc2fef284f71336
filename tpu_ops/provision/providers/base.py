"""The provider seam: one interface per control plane, typed records across it.

The ladder, teardown, the reaper and the supervisor speak only this interface (SkyPilot's
``sky/provision`` does the same: one set of functions, one module per cloud). A provider turns a
``SliceRequest`` into cloud resources and reports them back as ``SliceRecord`` and ``Resource``;
no SDK object, raw operation or API dict crosses it.

A slice is in one ``Phase``; callers ask which named set it is in, not for strings::

    SliceState.PENDING   waiting for capacity or booting
    SliceState.RUNNING   every host up: hand it out
    SliceState.LOST      granted, then lost (preempted, suspended, an instance stopped or repaired)
    SliceState.TERMINAL  nothing more will come of it: lost, failed (never granted) or being deleted
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar, Final

from tpu_ops.accelerators import AcceleratorType
from tpu_ops.provision.records import Resource
from tpu_ops.tiers import Tier


class Phase(StrEnum):
    """A slice's phase as the ladder sees it, whatever the control plane calls it."""

    WAITING = "waiting"  # queued for capacity
    BOOTING = "booting"  # granted, hosts not all up yet
    RUNNING = "running"  # every host up
    LOST = "lost"  # granted and then lost: delete it, maybe make a new one
    FAILED = "failed"  # never granted (capacity, a FAILED request)
    DELETING = "deleting"


class SliceState:
    """Phases grouped by what the caller does about them."""

    PENDING: Final = frozenset({Phase.WAITING, Phase.BOOTING})
    RUNNING: Final = frozenset({Phase.RUNNING})
    LOST: Final = frozenset({Phase.LOST})
    TERMINAL: Final = frozenset({Phase.LOST, Phase.FAILED, Phase.DELETING})


@dataclass(frozen=True)
class Host:
    """One worker VM of a slice: its rank, name and internal address."""

    index: int
    name: str
    endpoint: str
    state: str = ""


@dataclass(frozen=True)
class SliceRecord:
    """A slice as a provider describes it (one queued resource + node, one instance, or one group)."""

    backend: str
    slice_id: str
    zone: str
    state: Phase
    raw_state: str  # what the control plane said, for messages
    tier: str
    accelerator_type: str
    hosts: tuple[Host, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    created_at: float | None = None
    reservation: str = ""
    detail: str = ""  # why it failed or was lost
    stockout: bool = False  # a FAILED slice failed for lack of capacity
    # Hosts up (and billed) while the slice is not whole yet: a group that is not BULK came up partly.
    partial_hosts: int = 0
    # One request for several slices (the TPU API's multislice): each slice's own record, in slice order.
    parts: tuple[SliceRecord, ...] = ()

    @property
    def endpoints(self) -> tuple[str, ...]:
        return tuple(h.endpoint for h in sorted(self.hosts, key=lambda h: h.index))


@dataclass(frozen=True)
class SliceRequest:
    """What the ladder asks a provider for: one slice of ``accelerator`` on ``tier`` in ``zone``."""

    run_id: str
    attempt: int
    slice_id: str
    zone: str
    region: str
    tier: Tier
    accelerator: AcceleratorType
    runtime_version: str
    valid_until_s: int
    labels: Mapping[str, str] = field(default_factory=dict)
    reservation: str = ""  # a name or a full path, for the reservation tier
    network: str | None = None
    service_account: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    max_run_duration_s: int | None = None  # flex-start (and any bounded run)
    slices: int = 1  # above 1: every slice of the allocation in this one request (``multislice_request``)


class Provider(abc.ABC):
    """One control plane. Creates are not retried here (the ladder checks for the slice first);
    reads and deletes retry transient errors by the one retry policy."""

    name: ClassVar[str]
    # Tiers this control plane can serve; a rung outside is refused at validation.
    tiers: ClassVar[frozenset[str]]
    # True: k slices are one request granted whole (the TPU API's multislice queued resource), described as
    # one record with ``parts``; False: one request per slice (Compute Engine: a group each).
    multislice_request: ClassVar[bool] = False

    @abc.abstractmethod
    def create(self, req: SliceRequest) -> None:
        """Ask for the slice. Raises ``CapacityError``/``QuotaError`` (move on), ``AlreadyExistsError``
        (it is there: adopt it), ``TransientError`` (check, then try again)."""

    @abc.abstractmethod
    def describe(self, zone: str, slice_id: str) -> SliceRecord | None:
        """The slice, or None when nothing of that id exists. Raises the translated error of a
        create that failed after it was accepted (e.g. ``CapacityError`` for a stockout)."""

    @abc.abstractmethod
    def slices(self, zones: Sequence[str], run_id: str) -> list[SliceRecord]:
        """Every slice of ``run_id`` in ``zones`` (adopt on a re-run, clean dead ones)."""

    @abc.abstractmethod
    def resources(self, zones: Sequence[str], run_id: str | None = None) -> list[Resource]:
        """Every cloud resource this provider manages in ``zones`` (of ``run_id`` if given), finest
        grain: what teardown deletes and the reaper prices."""

    @abc.abstractmethod
    def slice_resources(self, zone: str, slice_id: str) -> list[Resource]:
        """The resources that make up one slice (what deleting it must remove)."""

    @abc.abstractmethod
    def request_delete(self, resources: Sequence[Resource]) -> None:
        """Ask for deletion of what can go now (dependency order), without waiting."""

    @abc.abstractmethod
    def delete(self, resources: Sequence[Resource], timeout_s: float) -> None:
        """Delete ``resources`` in dependency order and wait until each is confirmed gone.
        Raises ``TimeoutError`` if something lingers; calling again picks up where it left off."""

    def delete_slice(self, zone: str, slice_id: str, timeout_s: float) -> list[Resource]:
        """Delete one slice whole and confirm it gone; returns what was there."""
        found = self.slice_resources(zone, slice_id)
        if found:
            self.delete(found, timeout_s)
        return found

    def await_delete(self, zone: str, slice_id: str, timeout_s: float) -> bool:
        """A delete of the slice asked by a process that died before it saw the slice gone: True once it is gone
        (nothing asked again of what the control plane was deleting); False, asking nothing, when no delete of
        it is under way or it outlasts ``timeout_s`` (then the caller asks). By default only a slice already
        gone is seen (the TPU API's ``request_delete`` skips what is DELETING anyway)."""
        return self.describe(zone, slice_id) is None

    def abandon(self, zone: str, slice_id: str) -> bool:
        """Ask for deletion of a slice the ladder leaves behind, without waiting; True if asked."""
        found = self.slice_resources(zone, slice_id)
        self.request_delete(found)
        return bool(found)
