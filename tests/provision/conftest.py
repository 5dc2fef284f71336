"""Fixtures for provisioning tests: the fake Cloud TPU API over HTTP, fast settings, a clean slate.

Every test leaves the fake with zero queued resources and zero nodes: the autouse fixture below
resets the fake before the test and asserts that after it.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tpu_ops.settings import Settings
from tpu_ops.specs.slice import ProvisionSpec


def fake_call(url: str, method: str, path: str, body: Any = None) -> Any:
    """One request to a fake's control endpoints (``/_fake/*``) over HTTP, like any client; its JSON answer."""
    data = json.dumps(body).encode() if body is not None else (b"{}" if method == "POST" else None)
    req = urllib.request.Request(url.rstrip("/") + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read() or b"{}")


def slice_request(
    ladder: list[Any], accelerator: str, region: str, zones: Sequence[str], backend: str = "", **kw: Any
) -> ProvisionSpec:
    """A slice request: ``accelerator`` in ``zones`` of ``region`` up ``ladder``, budget $10,000 for 1 h, a 2 s
    queue timeout (``kw`` overrides any top-level field)."""
    sl: dict[str, Any] = {"accelerator_type": accelerator, "region": region, "zones": list(zones)}
    if backend:
        sl["backend"] = backend
    body = {"slice": sl, "ladder": ladder, "budget_usd": 10_000, "hours": 1}
    return ProvisionSpec.model_validate({**body, "queue_timeout": "2s", "overall_timeout": "60s", **kw})


def fast_settings(tmp: Path, google: Any, **endpoint: Any) -> Settings:
    """Fast settings against a fake (``endpoint``: e.g. ``compute_endpoint=url``): tiny poll and retry
    delays, state in ``tmp``."""
    return Settings(
        **google.settings_overrides(),
        dry_run=True,
        gcp_project="tpu-ops-local",
        poll_interval_s=0.02,
        retry_attempts=8,
        retry_initial_delay_s=0.01,
        retry_max_delay_s=0.05,
        state_dir=tmp / "state",
        **endpoint,
    )


class FakeTpu:
    """Control endpoints of the fake TPU API (``/_fake/*``), over HTTP like any client."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def _req(self, method: str, path: str, body: Any = None) -> Any:
        return fake_call(self.url, method, path, body)

    def reset(self) -> None:
        self._req("POST", "/_fake/reset")

    def state(self) -> dict[str, Any]:
        return dict(self._req("GET", "/_fake/state"))

    def capacity(self, spec: dict[str, Any]) -> None:
        self._req("POST", "/_fake/capacity", spec)

    def faults(self, *faults: dict[str, Any]) -> dict[str, Any]:
        return dict(self._req("POST", "/_fake/faults", list(faults)))

    def latency(self, provision_s: float | None = None, delete_s: float | None = None) -> None:
        self._req("POST", "/_fake/latency", {"provision_s": provision_s, "delete_s": delete_s})

    def preempt(self, zone: str, node: str) -> dict[str, Any]:
        return dict(self._req("POST", f"/_fake/nodes/{zone}/{node}:preempt"))


def wait_for(check: Callable[[], Any], timeout: float = 20.0, what: str = "condition", interval: float = 0.02) -> Any:
    """Poll until ``check()`` is truthy; fail the test naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@pytest.fixture(scope="session")
def tpu_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The fake TPU API of the local stack, or one started here if the stack does not serve it."""
    stack = request.getfixturevalue("local_stack")
    url = getattr(stack, "tpu_endpoint", None)
    if url:
        yield str(url)
        return
    from infra.local.tpu.server import TpuServer

    with TpuServer() as server:
        yield server.url


@pytest.fixture(scope="session")
def compute_url(local_stack: Any) -> Iterator[str]:
    """The fake Compute Engine of the local stack, or one started here if the stack has none."""
    url = getattr(local_stack, "compute_endpoint", None)
    if url:
        yield str(url)
        return
    from infra.local.compute.server import ComputeServer

    with ComputeServer() as server:
        yield server.url


@pytest.fixture
def fake(tpu_url: str) -> FakeTpu:
    return FakeTpu(tpu_url)


@pytest.fixture(autouse=True)
def _nothing_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """Reset the fake before every test that uses it; after it, the fake holds zero queued resources
    and nodes. Pure tests (prices, names, ledgers) need no stack."""
    if "tpu_url" not in request.fixturenames:
        yield
        return
    fake: FakeTpu = request.getfixturevalue("fake")
    fake.reset()
    yield
    state = wait_for(
        lambda: (s := fake.state()) and s["queued_resources"] == 0 and s["nodes"] == 0 and s,
        timeout=5.0,
        what="the fake to hold no queued resources and no nodes",
    )
    assert state["queued_resources"] == 0 and state["nodes"] == 0, state


@pytest.fixture
def settings(tpu_url: str, tmp_path: Path, google_auth: Any) -> Settings:
    """Fast settings against the fake: tiny poll and retry delays, state in a temp dir."""
    return fast_settings(tmp_path, google_auth, tpu_endpoint=tpu_url)


def make_spec(**kw: Any) -> ProvisionSpec:
    """A v4-32 request over two zones: reservation, spot, on-demand; short queue timeout."""
    ladder = kw.pop("ladder", ["reservation:res-a@us-central2-a", "spot", "on-demand"])
    zones = ("us-central2-a", "us-central2-b")
    return slice_request(ladder, "v4-32", "us-central2", zones, **{"hours": 2, "queue_timeout": "1s", **kw})


@pytest.fixture
def spec_factory() -> Callable[..., ProvisionSpec]:
    return make_spec


@pytest.fixture
def waiter() -> Callable[..., Any]:
    return wait_for


@pytest.fixture(scope="session")
def fakes() -> SimpleNamespace:
    """What the provisioning tests share to drive a fake: ``call`` (``fake_call``), ``settings``
    (``fast_settings``) and ``slice_request``."""
    return SimpleNamespace(call=fake_call, settings=fast_settings, slice_request=slice_request)
