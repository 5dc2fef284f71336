"""Fixtures for provisioning tests: the fake Cloud TPU API over HTTP, fast settings, a clean slate.

Every test leaves the fake with zero queued resources and zero nodes: the autouse fixture below
resets the fake before the test and asserts that after it.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tpu_ops.settings import Settings
from tpu_ops.specs.slice import ProvisionSpec


class FakeTpu:
    """Control endpoints of the fake TPU API (``/_fake/*``), over HTTP like any client."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def _req(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else (b"{}" if method == "POST" else None)
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read() or b"{}")

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
    return Settings(
        **google_auth.settings_overrides(),
        dry_run=True,
        gcp_project="tpu-ops-local",
        tpu_endpoint=tpu_url,
        poll_interval_s=0.02,
        retry_attempts=8,
        retry_initial_delay_s=0.01,
        retry_max_delay_s=0.05,
        state_dir=tmp_path / "state",
    )


def make_spec(**kw: Any) -> ProvisionSpec:
    """A v4-32 request over two zones: reservation, spot, on-demand; short queue timeout."""
    body: dict[str, Any] = {
        "slice": {"accelerator_type": "v4-32", "region": "us-central2", "zones": ["us-central2-a", "us-central2-b"]},
        "ladder": ["reservation:res-a@us-central2-a", "spot", "on-demand"],
        "budget_usd": 10_000,
        "hours": 2,
        "queue_timeout": "1s",
        "overall_timeout": "60s",
    }
    body.update(kw)
    return ProvisionSpec.model_validate(body)


@pytest.fixture
def spec_factory() -> Callable[..., ProvisionSpec]:
    return make_spec


@pytest.fixture
def waiter() -> Callable[..., Any]:
    return wait_for
