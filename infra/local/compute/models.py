"""The fake Compute Engine as a thread-safe state machine, usable without HTTP.

Every public API method mirrors one REST method (JSON in and out, resources by project/zone/name)
and checks injected faults against the REST path it stands for. Time comes from a clock
(``ManualClock`` in tests); state advances on every call and on ``tick()``.

Instance: PROVISIONING -> RUNNING (after ``provision_s``); delete: STOPPING -> gone (after
``delete_s``); spot preemption: STOPPING (the guest gets SIGTERM) -> ``preempt_notice_s`` of fake
time later TERMINATED (or deleted, per ``instanceTerminationAction``), with a
``compute.instances.preempted`` zone operation. A FLEX_START instance without capacity waits
PENDING for up to ``params.requestValidForDuration``. An insert without capacity (per zone and
provisioning model, or reservation count, or regional quota) ends in an operation error
(``ZONE_RESOURCE_POOL_EXHAUSTED`` / ``QUOTA_EXCEEDED``) and leaves no instance.
Every operation answers RUNNING first and ends (DONE) once read ``op_polls`` times or ``op_s`` of fake
time after it began; a failed one carries ``error`` and ``httpErrorStatusCode``/``httpErrorMessage``
(a stock-out: 503). ``fail_operations`` makes the next insert/delete of a collection fail that way.
Managed instance group with ``targetSizePolicy.mode: BULK`` (refused over a SPOT or STANDARD
template, as Google refuses it): its insert operation ends at once; it
creates no VM until all ``targetSize`` can be created (until then ``status.bulkInstanceOperation``
carries the error), then creates them together. Listeners get ``NodeEvent``s for the host
simulator: ``ready`` when a slice (an instance, or all of a group's) is RUNNING, ``terminating``
(SIGTERM) and ``stopped`` (kill).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from infra.local.compute.autoscalers import AutoscalersMixin
from infra.local.compute.base import GOOGLE_BASE, NAME_RE, ComputeBase, Latency
from infra.local.compute.catalog import CatalogMixin
from infra.local.compute.futures import FutureReservationsMixin
from infra.local.compute.hosts import PREEMPTED
from infra.local.compute.images import ImagesMixin
from infra.local.compute.instance_groups import InstanceGroupsMixin
from infra.local.compute.operations import OperationsMixin
from infra.local.compute.placement import PROVISIONING_MODELS, RESERVATION_KEY
from infra.local.compute.policies import PoliciesMixin
from infra.local.compute.regional_groups import RegionalGroupsMixin
from infra.local.compute.templates import TemplatesMixin
from infra.local.core import exceptions as exc

__all__ = [
    "GOOGLE_BASE",
    "NAME_RE",
    "PREEMPTED",
    "PROVISIONING_MODELS",
    "RESERVATION_KEY",
    "ComputeBackend",
    "Latency",
]


class ComputeBackend(
    FutureReservationsMixin,
    RegionalGroupsMixin,
    TemplatesMixin,
    PoliciesMixin,
    OperationsMixin,
    AutoscalersMixin,
    InstanceGroupsMixin,
    ImagesMixin,
    CatalogMixin,
    ComputeBase,
):
    """All projects and zones of the fake service. Thread-safe; see the module docstring.

    One mixin a resource family (``instances``, ``groups`` and ``regional_groups``, ``templates``,
    ``policies``, ``operations``, ``autoscalers``, ``instance_groups``, ``images``, ``catalog``;
    ``hosts``: guests and preemption), on ``base.ComputeBase``.
    """

    # -- the time-driven state machine ------------------------------------------------------------
    def _advance(self) -> None:
        now = self.clock.now()
        for _ in range(6):  # zero latency settles create -> running -> ready in one call
            changed = self._advance_instances(now)
            changed |= self._advance_futures(now) | self._advance_resizes(now)  # before groups grow
            for grp in list(self._groups.values()):
                changed |= self._advance_group(grp, now)
            changed |= self._start_hosts()
            if not changed:
                break
        self._settle_ops(now)

    # -- control (what /_fake/* exposes; ``preempt`` is in ``hosts``) -----------------------------
    def configure_capacity(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._reconfigure(lambda: self.capacity.configure(spec), (ValueError, KeyError, TypeError))

    def set_quotas(self, spec: dict[str, dict[str, int]]) -> dict[str, Any]:
        return self._reconfigure(lambda: self.capacity.set_quotas(spec), (ValueError, AttributeError, TypeError))

    def _reconfigure(self, change: Callable[[], None], errors: tuple[type[Exception], ...]) -> dict[str, Any]:
        """Change capacity or quotas; a bad spec is INVALID_ARGUMENT. Returns them all."""

        def run() -> dict[str, Any]:
            try:
                change()
            except errors as e:
                raise exc.InvalidArgument(str(e)) from None
            return self.capacity.to_json()

        return self._locked(run)

    def set_latency(self, provision_s: float | None = None, delete_s: float | None = None,
                    preempt_notice_s: float | None = None, op_polls: int | None = None,
                    op_s: float | None = None) -> dict[str, float]:  # fmt: skip
        with self._lock:
            if op_polls is not None:
                self.op_polls = int(op_polls)
            if op_s is not None:
                self.op_s = float(op_s)
            if provision_s is not None:
                self.latency.provision_s = float(provision_s)
            if delete_s is not None:
                self.latency.delete_s = float(delete_s)
            if preempt_notice_s is not None:
                self.preempt_notice_s = float(preempt_notice_s)
            return {**vars(self.latency), "preempt_notice_s": self.preempt_notice_s, "op_polls": self.op_polls,
                    "op_s": self.op_s}  # fmt: skip

    def reset(self) -> None:
        """Forget everything (every running guest is stopped); capacity, quotas, latency to defaults."""
        try:
            with self._lock:
                for inst in self._instances.values():
                    self._stop_host(inst, "reset")
                self._clear()
                self._faults.clear()
                self.capacity.reset()
                self.latency = Latency(**vars(self._initial[0]))
                self.preempt_notice_s = self._initial[1]
        finally:
            self._flush()

    def state(self) -> dict[str, Any]:
        """Counts and states: what tests assert "nothing left" on."""

        def run() -> dict[str, Any]:
            chips: dict[str, dict[str, int]] = {}
            for i in self._holding():
                key = f"RESERVATION_BOUND/{i.reservation}" if i.reservation else i.model
                chips.setdefault(i.zone, {}).setdefault(key, 0)
                chips[i.zone][key] += i.machine.chips
            return {
                "instances": len(self._instances),
                "instance_templates": len(self._templates),
                "resource_policies": len(self._policies),
                "instance_group_managers": len(self._groups),
                "resize_requests": len(self._resizes),
                "future_reservations": len(self._futures),
                "operations": len(self._ops),
                "instance_states": {i.path: i.status for i in self._instances.values()},
                "chips_in_use": chips,
                "capacity": self.capacity.to_json(),
                "latency": {**vars(self.latency), "preempt_notice_s": self.preempt_notice_s},
                "faults_pending": self.faults_pending(),
            }

        return self._locked(run)

    def set_guest_attribute(self, name: str, worker: int, namespace: str, key: str, value: str) -> None:
        """Where the host simulator's metadata servers forward guest attributes (kept, not served)."""
        with self._lock:
            self._guest[(name, namespace, key)] = value
