"""One contract, both control planes: the ladder, adoption, the budget guard, kill -9 + reaper,
teardown and run-id checks behave the same on the Cloud TPU API and on Compute Engine.

Each provider runs against its fake over HTTP through Google's own client (google-cloud-tpu,
google-cloud-compute), with a socket guard that fails the test if any request leaves loopback.
The slice is 4 hosts on both: v4-32 (TPU API) and v5p-32 (Compute Engine: workload policy +
template + a group of 4 instances; BULK only for reservation-bound and flex-start).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tpu_ops.errors import BudgetError, SpecError
from tpu_ops.provision import Outcome, provision, teardown
from tpu_ops.provision.ledger import ATTEMPT, Ledger
from tpu_ops.provision.providers import Provider, SliceState, for_backend
from tpu_ops.provision.reaper import reap
from tpu_ops.specs.slice import ProvisionSpec

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "infra" / "compute"))
from loopback_guard import loopback_only  # noqa: E402


class Harness:
    """One control plane's fake, as the contract needs it: capacity, latency, counts, a trap."""

    backend: str
    accelerator: str
    region: str
    zones: tuple[str, str]

    def __init__(self, url: str, tmp: Path, google: Any, fakes: Any) -> None:
        self.url = url.rstrip("/")
        self.settings = fakes.settings(tmp, google, **{self.endpoint_field: self.url})
        self._req = partial(fakes.call, self.url)
        self._slice_request = fakes.slice_request

    endpoint_field = ""

    def reset(self) -> None:
        self._req("POST", "/_fake/reset")

    def state(self) -> dict[str, Any]:
        return dict(self._req("GET", "/_fake/state"))

    def trap(self) -> None:
        """A fault on every create path: consumed if any create reaches the server."""
        self._req("POST", "/_fake/faults", [{"path": ".", "status": 500, "count": 1, "method": "POST"}])

    def provider(self) -> Provider:
        return for_backend(self.backend, self.settings)

    def spec(self, ladder: list[Any], **kw: Any) -> ProvisionSpec:
        return self._slice_request(ladder, self.accelerator, self.region, self.zones, self.backend, **kw)

    def reservation(self) -> str:
        return f"reservation:res-a@{self.zones[0]}"


class TpuApiHarness(Harness):
    backend, accelerator, region = "tpu-api", "v4-32", "us-central2"
    zones = ("us-central2-a", "us-central2-b")
    endpoint_field = "tpu_endpoint"

    def small_reservation_and_spot_only_in_b(self) -> None:
        a, b = self.zones
        self._req("POST", "/_fake/capacity", {a: {"reservations": {"res-a": 8}, "spot": 0}, b: {"spot": 4096}})

    def slow(self, seconds: float) -> None:
        self._req("POST", "/_fake/latency", {"provision_s": seconds})

    def left(self) -> int:
        st = self.state()
        return int(st["queued_resources"]) + int(st["nodes"])

    def preempt(self, zone: str, slice_id: str) -> None:
        self._req("POST", f"/_fake/nodes/{zone}/{slice_id}:preempt")

    def creates(self) -> int:
        return int(self.state()["operations"])


class ComputeHarness(Harness):
    backend, accelerator, region = "compute", "v5p-32", "us-east5"
    zones = ("us-east5-a", "us-east5-b")
    endpoint_field = "compute_endpoint"

    def small_reservation_and_spot_only_in_b(self) -> None:
        a, b = self.zones
        res = {"res-a": {"count": 2, "machineType": "ct5p-hightpu-4t"}}  # 2 VMs reserved; v5p-32 needs 4
        self._req("POST", "/_fake/capacity", {a: {"reservations": res, "SPOT": 0}, b: {"SPOT": 4096}})

    def slow(self, seconds: float) -> None:
        self._req("POST", "/_fake/latency", {"provision_s": seconds})

    def left(self) -> int:
        st = self.state()
        keys = ("instances", "instance_templates", "resource_policies", "instance_group_managers")
        return sum(int(st[k]) for k in keys)

    def preempt(self, zone: str, slice_id: str) -> None:
        host = sorted(n.rsplit("/", 1)[-1] for n in self.state()["instance_states"] if f"/{slice_id}-" in n)[0]
        self._req("POST", f"/_fake/zones/{zone}/instances/{host}:preempt")

    def creates(self) -> int:
        return int(self.state()["operations"])


@pytest.fixture(params=["tpu-api", "compute"])
def cp(request: pytest.FixtureRequest, tmp_path: Path, fakes: Any) -> Iterator[Harness]:
    """Each control plane's harness, reset; after the test nothing of it is left, and no request
    (operation polling included) left loopback."""
    google = request.getfixturevalue("google_auth")
    if request.param == "tpu-api":
        h: Harness = TpuApiHarness(request.getfixturevalue("tpu_url"), tmp_path, google, fakes)
    else:
        h = ComputeHarness(request.getfixturevalue("compute_url"), tmp_path, google, fakes)
    h.reset()
    with loopback_only() as blocked:
        yield h
    assert blocked == [], f"requests left loopback: {blocked}"
    assert h.left() == 0, h.state()


def test_ladder_lands_where_capacity_is_and_records_every_attempt(cp: Any) -> None:
    cp.small_reservation_and_spot_only_in_b()
    za, zb = cp.zones
    spec = cp.spec([cp.reservation(), "spot"])
    try:
        s = provision(spec, "run-ladder", cp.settings)
        assert [(a.tier, a.zone, a.outcome) for a in s.attempts] == [
            ("reservation", za, Outcome.STOCKOUT),
            ("spot", za, Outcome.STOCKOUT),
            ("spot", zb, Outcome.ACTIVE),
        ]
        assert (s.backend, s.zone, s.tier, s.hosts, len(s.endpoints)) == (cp.backend, zb, "spot", 4, 4)
        events = [e for e in Ledger(cp.settings, "run-ladder").events() if e["kind"] == ATTEMPT]
        assert [(e["tier"], e["zone"], e["outcome"], e["backend"]) for e in events] == [
            (a.tier, a.zone, a.outcome, cp.backend) for a in s.attempts
        ]
    finally:
        teardown("run-ladder", cp.settings, zones=list(cp.zones))


def test_rerun_adopts_the_live_slice(cp: Any) -> None:
    spec = cp.spec(["spot"])
    try:
        first = provision(spec, "run-adopt", cp.settings)
        before = cp.creates()
        second = provision(spec, "run-adopt", cp.settings)
        assert (second.slice_id, second.zone, second.endpoints) == (first.slice_id, first.zone, first.endpoints)
        assert second.attempts[-1].outcome == Outcome.ADOPTED
        assert cp.creates() == before  # adopting made nothing new
    finally:
        teardown("run-adopt", cp.settings, zones=list(cp.zones))


def test_budget_guard_refuses_before_any_api_call(cp: Any) -> None:
    cp.trap()
    spec = cp.spec(["spot", "on-demand"], budget_usd=5, hours=1)
    with pytest.raises(BudgetError) as info:
        provision(spec, "run-broke", cp.settings)
    assert info.value.budget_usd == 5 and info.value.estimate_usd > 5
    st = cp.state()
    assert st["faults_pending"] == 1 and cp.creates() == 0, st  # no request reached the server


@pytest.mark.parametrize("bad", ["../etc", "Run-1", "run;rm -rf", "run-", "a" * 41, "run id", ""])
def test_hostile_run_ids_are_refused_before_any_call(cp: Any, bad: str) -> None:
    cp.trap()
    with pytest.raises(SpecError, match="run id"):
        provision(cp.spec(["spot"]), bad, cp.settings)
    with pytest.raises(SpecError, match="run id"):
        teardown(bad, cp.settings, zones=list(cp.zones))
    assert cp.state()["faults_pending"] == 1


def test_teardown_leaves_nothing_and_is_idempotent(cp: Any) -> None:
    provision(cp.spec(["spot"]), "run-gone", cp.settings)
    assert cp.left() > 0
    report = teardown("run-gone", cp.settings, zones=list(cp.zones))
    assert report.confirmed_gone and cp.left() == 0
    kinds = {r.kind for r in report.deleted}
    if cp.backend == "compute":
        assert kinds == {"instance", "instance-group", "instance-template", "workload-policy"}
    else:
        assert kinds == {"queued-resource", "node"}
    assert teardown("run-gone", cp.settings, zones=list(cp.zones)).deleted == []


def test_preempted_slice_is_deleted_whole_and_recreated(cp: Any) -> None:
    spec = cp.spec(["spot"])
    provider = cp.provider()
    try:
        first = provision(spec, "run-pre", cp.settings, provider=provider)
        cp.preempt(first.zone, first.slice_id)
        rec = provider.describe(first.zone, first.slice_id)
        assert rec is not None and rec.state in SliceState.LOST, rec
        second = provision(spec, "run-pre", cp.settings, provider=provider)
        assert second.slice_id == first.slice_id and second.hosts == 4
        again = provider.describe(second.zone, second.slice_id)
        assert again is not None and again.state in SliceState.RUNNING
        if cp.backend == "compute":  # a new group of new hosts, not a repaired one
            assert not set(second.host_names) & set(first.host_names)
        events = [e["kind"] for e in Ledger(cp.settings, "run-pre").events()]
        assert "preempted" in events and events.count("gone") >= 1
    finally:
        teardown("run-pre", cp.settings, zones=list(cp.zones))


def test_kill_9_mid_create_is_reaped_templates_and_policies_included(
    cp: Any, tmp_path: Path, waiter: Callable[..., Any]
) -> None:
    cp.slow(120)  # hosts stay PROVISIONING: the process is still waiting when it is killed
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(cp.spec(["spot"]).model_dump(mode="json")))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_OPS_")}
    env.update({
        "TPU_OPS_DRY_RUN": "true", "TPU_OPS_GCP_PROJECT": "tpu-ops-local",
        f"TPU_OPS_{cp.endpoint_field.upper()}": cp.url, "TPU_OPS_STATE_DIR": str(cp.settings.state_dir),
        "TPU_OPS_POLL_INTERVAL_S": "0.05", "NO_GCE_CHECK": "true", "PYTHONPATH": str(ROOT),
        "TPU_OPS_GCP_CREDENTIALS_FILE": str(cp.settings.gcp_credentials_file),
    })  # fmt: skip
    cmd = [sys.executable, "-m", "flows.cli", "provision", "--no-flow", "--spec", str(spec_file), "--run-id", "run-k9"]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        provider = cp.provider()
        want = 4 if cp.backend == "compute" else 1  # policy + template + group + hosts, or the queued resource
        waiter(lambda: len(provider.resources(list(cp.zones), "run-k9")) >= want, timeout=60,
               what="the provisioning process to create its slice")  # fmt: skip
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    found = {r.kind for r in provider.resources(list(cp.zones), "run-k9")}
    if cp.backend == "compute":
        assert {"instance-group", "instance-template", "workload-policy"} <= found, found
    report = reap(cp.settings, providers=[provider])  # every zone: aggregated lists on Compute Engine
    assert [(r.run_id, r.reason, r.deleted) for r in report.reaped] == [
        ("run-k9", "the process that provisioned it is gone", True)
    ]
    assert provider.resources(list(cp.zones), "run-k9") == [] and cp.left() == 0


def test_every_compute_client_stays_on_loopback_and_result_would_not(
    compute_url: str, tmp_path: Path, google_auth: Any, fakes: Any
) -> None:
    """The adapter polls operations with clients of its own endpoint; the SDK's own ``.result()``
    would ask Google's real host (the guard records and refuses that, proving it is armed)."""
    from google.cloud import compute_v1

    from tpu_ops.cloud.clients import compute_options
    from tpu_ops.cloud.compute import ComputeApi

    h = ComputeHarness(compute_url, tmp_path, google_auth, fakes)
    h.reset()
    api = ComputeApi(h.settings)
    with loopback_only() as blocked:
        ref = api.insert_policy(h.region, "guard-wp", "2x2x4", "guard")
        assert api.operation(ref) == (False, None)  # RUNNING first, as Google's
        assert api.operation(ref) == (True, None)
        assert api.delete_policy(h.region, "guard-wp")
    assert blocked == []
    # The SDK's own way: insert(...).result() polls a pending operation through a client of its own.
    from tpu_ops.cloud.compute_types import VmSpec, vm_body

    client = compute_v1.InstancesClient(**compute_options(h.settings))
    zone = h.zones[0]
    vm = compute_v1.Instance({"name": "guard-vm", **vm_body(VmSpec("ct5p-hightpu-4t", "f", "p", "SPOT"), zone)})
    with loopback_only() as blocked:
        op = client.insert(project=h.settings.gcp_project, zone=zone, instance_resource=vm)
        with pytest.raises(Exception):  # whatever the transport raises for a refused lookup
            op.result(timeout=5)
    assert any("googleapis.com" in b for b in blocked), blocked
    assert api.delete_instance(zone, "guard-vm")


def test_the_lease_acquires_releases_and_acquires_again(cp: Any) -> None:
    from tpu_ops.provision import SliceLease

    with SliceLease(cp.spec(["spot"]), "run-lease", cp.settings) as lease:
        first = lease.acquire({"startup-script": "true"})
        assert lease.current == first and cp.left() > 0
        assert lease.release().confirmed_gone and cp.left() == 0 and lease.current is None
        second = lease.acquire({"startup-script": "true"})
        assert second.slice_id == first.slice_id and second.hosts == 4
    assert cp.left() == 0  # released on exit


def test_a_single_host_slice_recreated_under_its_name_is_not_taken_for_the_preempted_one(
    compute_url: str, tmp_path: Path, google_auth: Any, fakes: Any
) -> None:
    """Compute Engine keeps the ``compute.instances.preempted`` operation of a deleted instance; the
    new instance of the same name (the same slice id after recovery) must read as running."""
    h = ComputeHarness(compute_url, tmp_path, google_auth, fakes)
    h.accelerator = "v5p-8"
    h.reset()
    provider = h.provider()
    spec = h.spec(["spot"])
    with loopback_only() as blocked:
        try:
            first = provision(spec, "run-one", h.settings, provider=provider)
            h._req("POST", f"/_fake/zones/{first.zone}/instances/{first.slice_id}:preempt")
            lost = provider.describe(first.zone, first.slice_id)
            assert lost is not None and lost.state in SliceState.LOST
            second = provision(spec, "run-one", h.settings, provider=provider)
            assert second.slice_id == first.slice_id and second.attempts[-1].outcome == Outcome.ACTIVE
            again = provider.describe(second.zone, second.slice_id)
            assert again is not None and again.state in SliceState.RUNNING, again
        finally:
            teardown("run-one", h.settings, zones=list(h.zones))
    assert blocked == [] and h.left() == 0
