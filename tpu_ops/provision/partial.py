"""A slice that came up partly: some hosts up (and billed), never all.

A Compute Engine group that is not BULK (spot and on-demand multi-host slices, as Google's TPU pages
create them) creates its hosts one by one and can stop short: 3 of 4 hosts run, are billed, and
are useless. The ladder treats such a slice as not obtained: it waits for every host up to the
queue timeout (:class:`Hold` remembers since when and how many hosts were up), then
:func:`release` deletes it whole and writes the hold to the ledger as a slice of its own
(``active`` from the first host up, with the chips that were up, then ``delete-requested`` and
``gone``), so the run's cost shows what the partial hold cost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tpu_ops.accelerators import AcceleratorType
from tpu_ops.errors import TpuOpsError
from tpu_ops.provision import ledger as L
from tpu_ops.provision.providers.base import Provider, SliceRecord


@dataclass
class Hold:
    """Hosts up while the slice was not whole: since when (epoch seconds), and at most how many."""

    since: float = 0.0
    hosts: int = 0

    def see(self, rec: SliceRecord | None) -> None:
        if rec is not None and rec.partial_hosts > 0:
            self.since = self.since or time.time()
            self.hosts = max(self.hosts, rec.partial_hosts)

    def __bool__(self) -> bool:
        return self.hosts > 0


def release(
    hold: Hold,
    *,
    ledger: L.Ledger,
    provider: Provider,
    zone: str,
    slice_id: str,
    tier: str,
    accelerator: AcceleratorType,
    why: str,
    timeout_s: float,
) -> str:
    """Delete the partly created slice whole, record what it held and for how long; the attempt's detail."""
    chips = hold.hosts * accelerator.chips_per_host
    ledger.append(L.ACTIVE, resource_id=slice_id, zone=zone, tier=tier, chips=chips, generation=accelerator.generation,
                  accelerator_type=accelerator.name, backend=provider.name, partial_hosts=hold.hosts,
                  t=hold.since)  # fmt: skip
    ledger.append(L.DELETE_REQUESTED, resource_id=slice_id, zone=zone)
    held_s = time.time() - hold.since
    try:
        provider.delete_slice(zone, slice_id, timeout_s)
    except (TpuOpsError, TimeoutError) as exc:
        gone = f"delete asked, not confirmed ({type(exc).__name__}): teardown and the reaper finish it"
    else:
        ledger.append(L.GONE, resource_id=slice_id, zone=zone)
        gone = "deleted whole"
    return (f"{hold.hosts} of {accelerator.hosts} hosts up ({chips} chips billed for {held_s:.0f}s), never all "
            f"({why}): {gone}")  # fmt: skip
