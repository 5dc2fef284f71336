"""Provisioning providers: one per control plane, behind one interface (:mod:`.base`).

    provider = for_spec(spec, settings, run.clients)  # the spec's backend: tpu-api or compute
    provider.create(request); provider.describe(zone, slice_id); provider.delete(resources, timeout_s)
    available(settings)                               # every control plane the settings reach (teardown, reaper)

``tpu-api`` (:mod:`.tpu_api`) provisions Cloud TPU API queued resources; ``compute``
(:mod:`.compute`) provisions Compute Engine instances, or for a multi-host slice a workload
policy, an instance template and a managed instance group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from tpu_ops.provision.providers.base import Host, Phase, Provider, SliceRecord, SliceRequest, SliceState
from tpu_ops.settings import Settings
from tpu_ops.tiers import Backend

if TYPE_CHECKING:
    from tpu_ops.cloud.clients import Clients
    from tpu_ops.specs.slice import ProvisionSpec

ALL_ZONES: Final = ("-",)

__all__ = [
    "ALL_ZONES",
    "Host",
    "Phase",
    "Provider",
    "SliceRecord",
    "SliceRequest",
    "SliceState",
    "available",
    "for_backend",
    "for_spec",
]


def for_backend(backend: str, settings: Settings, clients: Clients | None = None) -> Provider:
    """The provider of ``backend`` (``tpu-api`` or ``compute``); its client comes from ``clients`` (a
    run's) or is built here (its endpoint checked in a dry run either way)."""
    if backend == Backend.TPU_API:
        from tpu_ops.cloud.tpu import TpuApi
        from tpu_ops.provision.providers.tpu_api import TpuApiProvider

        return TpuApiProvider(settings, TpuApi(settings, clients.tpu()) if clients else None)
    if backend == Backend.COMPUTE:
        from tpu_ops.cloud.compute_resize import ComputeResizeApi
        from tpu_ops.provision.providers.compute_resize import ComputeResizeProvider

        # ComputeProvider plus slices through resize requests (flex-start multi-host, calendar)
        return ComputeResizeProvider(
            settings, ComputeResizeApi(settings, clients.compute_options()) if clients else None
        )
    raise ValueError(f"unknown backend {backend!r}; allowed: {', '.join(repr(b.value) for b in Backend)}")


def for_spec(spec: ProvisionSpec, settings: Settings, clients: Clients | None = None) -> Provider:
    """The provider the spec's ``slice.backend`` resolves to (``auto`` decided by generation)."""
    return for_backend(spec.slice.resolved_backend, settings, clients)


def available(settings: Settings, clients: Clients | None = None) -> list[Provider]:
    """Every control plane these settings reach: in a dry run, those with a local endpoint set;
    otherwise both. What teardown and the reaper sweep."""
    out: list[Provider] = []
    if settings.tpu_endpoint or not settings.dry_run:
        out.append(for_backend(Backend.TPU_API, settings, clients))
    if settings.compute_endpoint or not settings.dry_run:
        out.append(for_backend(Backend.COMPUTE, settings, clients))
    return out
