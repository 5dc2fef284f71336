"""The slice lease: the one owner of a run's slice, from first grant to confirmed deletion.

    lease = SliceLease(spec, run_id, settings)
    s = lease.acquire(metadata=...)     # the ladder (adopts a live slice of the run)
    lease.release()                     # after a loss: everything of the run deleted, confirmed gone
    s = lease.acquire(metadata=...)     # the replacement: the ladder walks again
    lease.release()                     # at the end, whatever happened

``with SliceLease(...) as lease`` releases on exit. A process that does not hold the lease (a flow
hook, ``tpu-ops teardown``, the reaper) calls :func:`tpu_ops.provision.teardown.teardown` with the
run id: the same deletion, found by name and label, on every control plane.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from tpu_ops.cloud.clients import Clients
from tpu_ops.provision.allocation import Allocation, gather
from tpu_ops.provision.ladder import provision
from tpu_ops.provision.providers import Provider, for_spec
from tpu_ops.provision.records import Attempt, Slice, TeardownReport
from tpu_ops.provision.teardown import teardown
from tpu_ops.settings import Settings
from tpu_ops.specs.slice import ProvisionSpec


class SliceLease:
    """A run's slice through one provider (see the module docstring)."""

    def __init__(
        self,
        spec: ProvisionSpec,
        run_id: str,
        settings: Settings,
        *,
        provider: Provider | None = None,
        clients: Clients | None = None,
        on_attempt: Callable[[Attempt], None] | None = None,
        **provision_kw: Any,
    ) -> None:
        self.spec, self.run_id, self.settings = spec, run_id, settings
        self.clients = clients or Clients(settings)  # the run's: the ladder's history reads are its too
        self.provider = provider or for_spec(spec, settings, self.clients)
        self.on_attempt, self.provision_kw = on_attempt, provision_kw
        self.current: Slice | None = None

    def acquire(self, metadata: dict[str, str] | None = None) -> Slice:
        """The run's live slice, or a new one through the ladder (a dead one is deleted first)."""
        self.current = provision(self.spec, self.run_id, self.settings, provider=self.provider, clients=self.clients,
                                 metadata=metadata,
                                 on_attempt=self.on_attempt, **self.provision_kw)  # fmt: skip
        return self.current

    def gather(
        self, metadata: Callable[[int], Mapping[str, str]] | None = None, spec: ProvisionSpec | None = None, **kw: Any
    ) -> Allocation:
        """The run's allocation: all ``slice.slices`` slices or none (:mod:`tpu_ops.provision.allocation`;
        ``zone``/``within`` when slices were kept; ``spec``: another shape's, :mod:`tpu_ops.provision.shapes`)."""
        alloc = gather(
            spec or self.spec,
            self.run_id,
            self.settings,
            metadata=metadata,
            give_back=self.release,
            **kw,
            provider=self.provider,
            clients=self.clients,
            on_attempt=self.on_attempt,
            **self.provision_kw,
        )
        self.current = alloc.slices[0]
        return alloc

    def release(self) -> TeardownReport:
        """Delete everything of the run in the spec's zones and confirm it gone (safe to repeat)."""
        self.current = None
        return teardown(self.run_id, self.settings, zones=list(self.spec.slice.zones), providers=[self.provider])

    def __enter__(self) -> SliceLease:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


@contextmanager
def slice_for(spec: ProvisionSpec, run_id: str, settings: Settings, **kw: Any) -> Iterator[Slice]:
    """Provision a slice for the body and tear it down afterwards, whatever happens.

    Teardown also runs when provisioning itself fails half-way (an abandoned request may linger).
    """
    metadata = kw.pop("metadata", None)
    with SliceLease(spec, run_id, settings, **kw) as lease:
        yield lease.acquire(metadata)
