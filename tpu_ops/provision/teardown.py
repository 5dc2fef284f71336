"""Guaranteed teardown: delete every resource of a run, on every control plane, and confirm it gone.

``teardown`` is safe to call any number of times, from any process; ``ladder.slice_for`` is the
context manager that always calls it, whether the body returns, raises or is interrupted. It goes
through the provider seam, so a run's queued resources and nodes (Cloud TPU API) and its
instances, groups, templates and workload policies (Compute Engine) are found and removed alike,
each provider deleting in its own dependency order.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from tpu_ops.layout import check_run_id
from tpu_ops.provision import ledger as L
from tpu_ops.provision.naming import billed
from tpu_ops.provision.providers import ALL_ZONES, Provider, available
from tpu_ops.provision.records import Resource, TeardownReport
from tpu_ops.settings import Settings


def find_resources(provider: Provider, zones: Sequence[str] = ALL_ZONES, run_id: str | None = None) -> list[Resource]:
    """Resources in ``zones`` that tpu-ops manages through ``provider`` (of ``run_id`` if given)."""
    return provider.resources(zones, run_id)


def teardown(
    run_id: str,
    settings: Settings,
    *,
    zones: Sequence[str] | None = None,
    providers: Sequence[Provider] | None = None,
    timeout_s: float = 900.0,
) -> TeardownReport:
    """Delete every resource of ``run_id`` and confirm it is gone, on each provider.

    ``providers`` defaults to every control plane the settings can reach. Looks in ``zones``
    (default: the zones in the run's ledger and ``settings.tpu_zones``, or every zone when neither
    names one). Raises ``TimeoutError`` if something is still there after ``timeout_s``; calling
    again picks up where it left off.
    """
    check_run_id(run_id)
    t0 = time.monotonic()
    ledger = L.Ledger(settings, run_id)
    if not zones:
        # Where the run has been (its ledger) plus the configured zones; every zone if none known.
        zones = list(dict.fromkeys([*ledger.zones(), *settings.tpu_zones])) or list(ALL_ZONES)
    report = TeardownReport(run_id)
    for provider in providers if providers is not None else available(settings):
        found = provider.resources(zones, run_id)
        if not found:
            continue
        report.deleted += found
        # The ledger bills by slice id (``{run_id}-a{n}``): a queued resource and its node, an
        # instance or an instance group; a group's instances, templates and policies are parts.
        slices = sorted({(r.zone, r.resource_id) for r in found if billed(run_id, r.kind, r.resource_id)})
        for zone, rid in slices:
            ledger.append(L.DELETE_REQUESTED, resource_id=rid, zone=zone)
        provider.delete(found, timeout_s)
        for zone, rid in slices:
            ledger.append(L.GONE, resource_id=rid, zone=zone)
    report.confirmed_gone = True
    report.seconds = time.monotonic() - t0
    return report
