"""A fake Compute Engine on a manual clock, google-cloud-compute clients on it, and a loopback guard."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from compute.helpers import loopback_only
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from infra.local.compute.models import ComputeBackend
from infra.local.compute.server import ComputeServer
from infra.local.core.clock import ManualClock


@pytest.fixture(scope="module")
def server() -> Iterator[ComputeServer]:
    with ComputeServer(ComputeBackend(clock=ManualClock())) as srv:
        yield srv


@pytest.fixture
def fake(server: ComputeServer) -> Iterator[SimpleNamespace]:
    """The fake, reset, with a client of each kind on it; fails the test if a request left loopback."""
    server.backend.reset()
    opts = ClientOptions(api_endpoint=server.url)
    kw: dict[str, Any] = {"credentials": AnonymousCredentials(), "client_options": opts}
    with loopback_only() as blocked:
        yield SimpleNamespace(
            url=server.url,
            backend=server.backend,
            clock=server.backend.clock,
            instances=compute_v1.InstancesClient(**kw),
            templates=compute_v1.InstanceTemplatesClient(**kw),
            region_templates=compute_v1.RegionInstanceTemplatesClient(**kw),
            policies=compute_v1.ResourcePoliciesClient(**kw),
            groups=compute_v1.InstanceGroupManagersClient(**kw),
            reservations=compute_v1.ReservationsClient(**kw),
            regions=compute_v1.RegionsClient(**kw),
            zones=compute_v1.ZonesClient(**kw),
            projects=compute_v1.ProjectsClient(**kw),
            zone_ops=compute_v1.ZoneOperationsClient(**kw),
            region_ops=compute_v1.RegionOperationsClient(**kw),
            global_ops=compute_v1.GlobalOperationsClient(**kw),
            blocked=blocked,
        )
    assert blocked == [], f"requests left loopback: {blocked}"
