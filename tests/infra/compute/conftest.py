"""A fake Compute Engine on a manual clock, google-cloud-compute clients on it, and a loopback guard;
``gcloud_fake``: a fake on the wall clock with every reply recorded, and ``gcloud`` pointed at it."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from compute.gcloud_harness import Gcloud
from compute.helpers import loopback_only
from compute.recorder import Recorder
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


@pytest.fixture(scope="module")
def gcloud_fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """One fake per test module on the wall clock (gcloud waits on its operations), every reply it gives
    recorded (``replies``, for ``compute.recorder.problems``), and ``gcloud`` (a ``Gcloud``) driving it."""
    backend = ComputeBackend()
    server = ComputeServer(backend)
    server.app = recorder = Recorder(server.app)
    with server:
        gcloud = Gcloud(server.url, tmp_path_factory.mktemp("gcloud-config"))
        yield SimpleNamespace(backend=backend, url=server.url, replies=recorder.replies, gcloud=gcloud)
