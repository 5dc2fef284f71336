"""A run's capacity: an allocation of k ≥ 1 slices, obtained and given back whole.

``gather`` walks the ladder once per slice (slice ``i``'s resources are ``{run_id}-a{i*1000+n}``,
:mod:`tpu_ops.provision.naming`): the first slice anywhere the ladder finds it, the others in that
slice's zone (multislice joins slices over the data-center network of one zone). All k or none:
the later slices must come within ``queue_timeout`` of the first; if they do not, every slice
held is deleted (through teardown, so the ledger closes each one) and an ``allocation-partial``
record says what was held and for how long, so the run's cost shows the partial hold. A single
slice (``slices: 1``) is exactly the ladder's one walk.

On a plane that grants a multislice whole (``Provider.multislice_request``: the Cloud TPU API's queued
resource with a node count) the k slices are one request and one walk: Google grants every node or none,
so nothing is ever held partly there and no ``allocation-partial`` record is written; the slices are the
request's nodes (``{run_id}-a{n}-{i}``), each billed as its own slice. One node spec means one metadata
for all nodes: the agent reads its slice from the node (``MEGASCALE_SLICE_ID`` in ``tpu-env``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

from tpu_ops.errors import ProvisioningError
from tpu_ops.provision import ledger as L
from tpu_ops.provision.ladder import provision
from tpu_ops.provision.launch import SLICE_KEY
from tpu_ops.provision.records import Slice
from tpu_ops.settings import Settings
from tpu_ops.specs.slice import ProvisionSpec

PARTIAL: Final = "allocation-partial"  # ledger record: slices held while gathering, then given back


@dataclass(frozen=True)
class Allocation:
    """The slices a run holds, in slice order (slice 0's host 0 coordinates the job)."""

    slices: tuple[Slice, ...]

    @property
    def zone(self) -> str:
        return self.slices[0].zone

    @property
    def hosts(self) -> int:
        return sum(s.hosts for s in self.slices)

    @property
    def chips(self) -> int:
        return sum(s.chips for s in self.slices)

    def document(self, incarnation: str) -> dict[str, Any]:
        """The allocation document the workers start from (``tpu_ops.agent.job.allocation_doc``)."""
        from tpu_ops.agent.job import allocation_doc

        return allocation_doc(incarnation, [(s.queued_resource, list(s.endpoints)) for s in self.slices])


def _rest(spec: ProvisionSpec, zone: str, within: timedelta | None = None) -> ProvisionSpec:
    """The spec for the slices after the first: its zone only, and the queue timeout (or ``within``) to come in."""
    rungs = [r for r in spec.ladder if r.zone in (None, zone)]
    sl = spec.slice.model_copy(update={"zones": [zone]})
    wait = within or min(spec.queue_timeout, spec.overall_timeout)
    return spec.model_copy(update={"slice": sl, "ladder": rungs or spec.ladder, "overall_timeout": wait})


def gather(
    spec: ProvisionSpec,
    run_id: str,
    settings: Settings,
    *,
    metadata: Callable[[int], Mapping[str, str]] | None = None,
    give_back: Callable[[], Any],
    zone: str | None = None,
    within: timedelta | None = None,
    **kw: Any,
) -> Allocation:
    """All ``spec.slice.slices`` slices, or ``ProvisioningError`` after giving back what was held.

    ``metadata(i)`` is slice ``i``'s launch metadata; ``give_back()`` deletes everything of the run
    (the lease's release); ``kw`` go to the ladder (provider, clients, on_attempt, progress). With ``zone``
    (slices kept from the last allocation, which every walk adopts) every slice is in that zone and the
    missing ones must come ``within`` that time.
    """
    k = spec.slice.slices
    provider = kw.get("provider")
    if k > 1 and provider is not None and provider.multislice_request:
        md = {key: v for key, v in (metadata(0) if metadata else {}).items() if key != SLICE_KEY}
        try:  # one request for all k: granted whole or not at all
            whole = provision(_rest(spec, zone, within) if zone else spec, run_id, settings, metadata=md, **kw)
        except ProvisioningError:
            if zone:  # the kept slices' request did not come back: give everything back
                give_back()
            raise
        return Allocation(whole.parts or (whole,))
    held: list[Slice] = []
    started = 0.0
    for i in range(k):
        this = _rest(spec, zone, within) if zone else spec if i == 0 else _rest(spec, held[0].zone)
        md = dict(metadata(i)) if metadata else {}
        try:
            held.append(provision(this, run_id, settings, metadata=md, slice_index=i, **kw))
        except ProvisioningError as exc:
            if not held and not zone:
                raise
            _give_back(run_id, settings, held, started, k, give_back)
            raise ProvisioningError(
                f"run {run_id}: an allocation of {k} slices needs them all; slice {i} did not come within "
                f"queue_timeout ({timedelta(seconds=spec.queue_timeout.total_seconds())}) of slice 0, so the "
                f"{len(held)} held were given back (their cost is in the ledger):\n{exc}",
                list(getattr(exc, "attempts", [])),
            ) from exc
        started = started or time.time()
    return Allocation(tuple(held))


def _give_back(
    run_id: str, settings: Settings, held: list[Slice], since: float, k: int, give_back: Callable[[], Any]
) -> None:
    ledger = L.Ledger(settings, run_id)
    if held:
        ids, chips = [s.queued_resource for s in held], sum(s.chips for s in held)
        held_s = round(time.time() - since, 3)
        ledger.append(PARTIAL, slices=ids, wanted=k, zone=held[0].zone, chips=chips, held_s=held_s)
    give_back()
