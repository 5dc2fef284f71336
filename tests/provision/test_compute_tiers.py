"""Compute Engine as Google runs it, through the provider and the ladder against the fake over HTTP.

- Multi-host spot and on-demand slices are created as "Request TPU Spot VMs" and "Create a MIG with
  multi-host TPU slice" do (a group that is not BULK over a SPOT / STANDARD template); BULK only
  for reservation-bound (and flex-start), as "Create a MIG that uses the bulk mode" allows.
- A slice that comes up partly is deleted whole after the queue timeout, and the ledger shows it.
- Every operation the provider waits on that fails asynchronously (RUNNING, then DONE with an
  error) raises the project's error: one test per call site.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tpu_ops.accelerators import ACCELERATOR_TYPES
from tpu_ops.cloud.compute import ComputeApi
from tpu_ops.errors import CapacityError, CloudError, DeadlineError, ProvisioningError, QuotaError
from tpu_ops.provision import Outcome, provision, teardown
from tpu_ops.provision.allocation import PARTIAL
from tpu_ops.provision.lease import SliceLease
from tpu_ops.provision.ledger import ACTIVE, DELETE_REQUESTED, GONE, Ledger
from tpu_ops.provision.naming import slice_of
from tpu_ops.provision.prices import load
from tpu_ops.provision.providers import SliceRequest, for_backend
from tpu_ops.provision.providers.compute import ComputeProvider
from tpu_ops.settings import Settings
from tpu_ops.specs.slice import ProvisionSpec
from tpu_ops.tiers import Tier

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "infra" / "compute"))
from loopback_guard import loopback_only

REGION, ZA, ZB = "us-east5", "us-east5-a", "us-east5-b"


class Fake:
    def __init__(self, url: str, fakes: Any) -> None:
        self.url = url.rstrip("/")
        self.req = partial(fakes.call, self.url)
        self._slice_request = fakes.slice_request

    def spec(self, ladder: list[Any], accelerator: str = "v5p-32", **kw: Any) -> ProvisionSpec:
        return self._slice_request(ladder, accelerator, REGION, (ZA, ZB), "compute", **kw)

    def fail_next(
        self, collection: str, op_type: str = "insert", error: str = "ZONE_RESOURCE_POOL_EXHAUSTED", count: int = 1
    ) -> None:
        body = {"collection": collection, "operationType": op_type, "error": error, "count": count}
        self.req("POST", "/_fake/operations:fail", body)

    def left(self) -> int:
        st = self.req("GET", "/_fake/state")
        return sum(int(st[k]) for k in ("instances", "instance_templates", "resource_policies",
                                        "instance_group_managers"))  # fmt: skip


@pytest.fixture
def env(compute_url: str, tmp_path: Path, google_auth: Any, fakes: Any) -> Iterator[tuple[Fake, Settings]]:
    fake = Fake(compute_url, fakes)
    fake.req("POST", "/_fake/reset")
    settings = fakes.settings(tmp_path, google_auth, compute_endpoint=compute_url)
    with loopback_only() as blocked:
        yield fake, settings
    assert blocked == [], f"requests left loopback: {blocked}"
    assert fake.left() == 0, fake.req("GET", "/_fake/state")


def _request(tier: Tier, accelerator: str = "v5p-32", zone: str = ZA, reservation: str = "") -> SliceRequest:
    return SliceRequest(run_id="run-ops", attempt=1, slice_id="run-ops-a1", zone=zone, region=REGION, tier=tier,
                        accelerator=ACCELERATOR_TYPES[accelerator], runtime_version="v2-alpha-tpuv5",
                        valid_until_s=60, reservation=reservation)  # fmt: skip


def _template_and_group(api: ComputeApi, slice_id: str) -> tuple[Any, Any]:
    igm = api.client("InstanceGroupManagersClient").get(project=api.project, zone=ZA, instance_group_manager=slice_id)
    tpl = api.client("InstanceTemplatesClient").get(
        project=api.project, instance_template=igm.instance_template.rsplit("/", 1)[-1]
    )
    return tpl, igm


@pytest.mark.parametrize(("tier", "model", "termination"), [("spot", "SPOT", "STOP"), ("on-demand", "STANDARD", "")])
def test_multi_host_spot_and_on_demand_slices_are_created_as_google_documents(env, tier, model, termination):
    _, settings = env
    run = f"run-{tier}"
    try:
        s = provision(env[0].spec([tier]), run, settings)
        assert (s.tier, s.hosts, s.attempts[-1].outcome) == (tier, 4, Outcome.ACTIVE)
        api = ComputeApi(settings)
        tpl, igm = _template_and_group(api, s.slice_id)
        sched = tpl.properties.scheduling
        assert (sched.provisioning_model, sched.on_host_maintenance) == (model, "TERMINATE")
        assert sched.instance_termination_action == termination  # "--instance-termination-action=STOP" for spot
        assert igm.target_size_policy.mode != "BULK" and igm.target_size == 4
        assert igm.resource_policies.workload_policy.endswith(f"/resourcePolicies/{s.slice_id}-wp")
    finally:
        teardown(run, settings, zones=[ZA, ZB])


def test_a_reservation_bound_slice_is_a_bulk_group(env):
    fake, settings = env
    fake.req("POST", "/_fake/capacity", {ZA: {"reservations": {"res": {"count": 4, "machineType": "ct5p-hightpu-4t"}}}})
    try:
        s = provision(env[0].spec([f"reservation:res@{ZA}"]), "run-res", settings)
        tpl, igm = _template_and_group(ComputeApi(settings), s.slice_id)
        assert igm.target_size_policy.mode == "BULK"
        assert tpl.properties.scheduling.provisioning_model == "RESERVATION_BOUND"
    finally:
        teardown("run-res", settings, zones=[ZA, ZB])


@pytest.mark.parametrize("tier", [Tier.SPOT, Tier.ON_DEMAND])
def test_a_bulk_group_over_spot_or_on_demand_is_refused_as_google_refuses_it(env, tier):
    """What the provider no longer sends: the fake answers Google's 400, and it arrives translated."""
    _, settings = env
    provider = ComputeProvider(settings)
    req = _request(tier)
    spec = provider.vm_spec(req, "tpu-ops test")
    api = provider.api
    for ref in (api.insert_policy(REGION, "run-ops-a1-wp", "2x2x4", "x"), api.insert_template("run-ops-a1-t", spec)):
        provider._settle(ref)
    with pytest.raises(CloudError) as err:
        api.insert_group(ZA, "run-ops-a1", "run-ops-a1-t", REGION, "run-ops-a1-wp", 4, "x", tier, bulk=True)
    assert err.value.status == 400
    assert "Bulk mode is only supported with instance templates that specify either a reservation-bound or " \
           "flex-start provisioning model" in str(err.value)  # fmt: skip
    provider.delete_slice(ZA, "run-ops-a1", 30)


def test_a_slice_that_comes_up_partly_is_deleted_whole_after_the_queue_timeout_and_costs_in_the_ledger(env):
    fake, settings = env
    fake.req("POST", "/_fake/capacity", {ZA: {"SPOT": 12}, ZB: {"SPOT": 4096}})  # zone a: 3 of the 4 hosts
    try:
        s = provision(env[0].spec(["spot"]), "run-part", settings)
        first, second = s.attempts
        assert (first.zone, first.outcome) == (ZA, Outcome.PARTIAL), first
        assert first.seconds_waited >= 2.0  # waited for every host up to the queue timeout
        assert "3 of 4 hosts up" in first.detail and "deleted whole" in first.detail, first.detail
        assert (second.zone, second.outcome, s.zone, s.hosts) == (ZB, Outcome.ACTIVE, ZB, 4)
        left = fake.req("GET", "/_fake/state")["instance_states"]
        assert not [p for p in left if f"/zones/{ZA}/" in p], left  # nothing of the partial slice is left
        ledger = Ledger(settings, "run-part")
        held = [e for e in ledger.events() if e.get("resource_id") == first.resource_id and e["kind"] != "attempt"]
        assert [e["kind"] for e in held] == [ACTIVE, DELETE_REQUESTED, GONE]
        assert (held[0]["chips"], held[0]["partial_hosts"], held[0]["tier"]) == (12, 3, "spot")
        cost = ledger.summary(load(settings))
        (part,) = [c for c in cost.slices if c.resource_id == first.resource_id]
        assert not part.open and part.chips == 12 and part.hours["running"] * 3600 >= 1.5, part
        assert cost.usd_by_tier["spot"] > 0
    finally:
        teardown("run-part", settings, zones=[ZA, ZB])


def test_an_allocation_one_slice_short_gives_everything_back_with_the_partial_hold_in_the_ledger(env):
    """Compute Engine gathers an allocation slice by slice (a group each): what was held while the rest did not
    come is given back after queue_timeout and billed (the TPU API grants a multislice whole: nothing held)."""
    fake, settings = env
    fake.req("POST", "/_fake/capacity", {ZA: {"SPOT": 16}, ZB: {"SPOT": 4096}})  # one v5p-32 in zone a
    spec = fake.spec(["spot"])
    spec = spec.model_copy(update={"slice": spec.slice.model_copy(update={"slices": 2})})
    with pytest.raises(ProvisioningError, match="allocation of 2 slices needs them all; slice 1") as info:
        SliceLease(spec, "run-ms-short", settings).gather()
    attempts = info.value.attempts  # slice 1's: zone a only (an allocation lives in one zone)
    assert (
        attempts
        and {a.zone for a in attempts} == {ZA}
        and {a.outcome for a in attempts} <= {"stockout", "timeout", "partial"}
    )
    assert fake.left() == 0  # everything given back
    events = Ledger(settings, "run-ms-short").events()
    (partial,) = [e for e in events if e["kind"] == PARTIAL]
    assert partial["slices"] == ["run-ms-short-a1"] and partial["wanted"] == 2 and partial["chips"] == 16
    assert partial["held_s"] > 0  # slice 0 was held (and billed) while slice 1 was asked for
    kinds = [e["kind"] for e in events if e.get("resource_id") == "run-ms-short-a1"]
    assert ACTIVE in kinds and kinds[-1] == GONE
    cost = Ledger(settings, "run-ms-short").summary(load(settings))
    (held,) = [c for c in cost.slices if c.resource_id == "run-ms-short-a1"]
    assert cost.usd_total > 0 and held.chip_hours > 0 and not held.open  # the hold is billed, and closed
    assert slice_of("run-ms-short", "run-ms-short-a1001") == 1


# -- an operation that fails asynchronously, at every place the provider waits on one ----------
@pytest.mark.parametrize(
    ("accelerator", "collection", "error", "raised"),
    [
        ("v5p-8", "instances", "ZONE_RESOURCE_POOL_EXHAUSTED", CapacityError),  # a single-host slice's insert
        ("v5p-32", "resourcePolicies", "QUOTA_EXCEEDED", QuotaError),  # the workload policy (create waits)
        ("v5p-32", "instanceTemplates", "ZONE_RESOURCE_POOL_EXHAUSTED", CapacityError),  # the template
        ("v5p-32", "instanceGroupManagers", "INTERNAL_ERROR", CloudError),  # the group's insert
    ],
)
def test_an_operation_that_fails_asynchronously_raises_the_projects_error(env, accelerator, collection, error, raised):
    fake, settings = env
    provider = for_backend("compute", settings)
    req = _request(Tier.SPOT, accelerator)
    fake.fail_next(collection, error=error)
    try:
        with pytest.raises(raised) as err:
            provider.create(req)  # the prerequisites' operations are waited on here
            for _ in range(200):  # the slice's own create: describe says nothing yet, then raises
                rec = provider.describe(ZA, req.slice_id)
                assert rec is None, rec
        assert error in str(err.value)
        if isinstance(err.value, CapacityError):
            assert (err.value.zone, err.value.tier) == (ZA, "spot")
        assert getattr(err.value, "status", None) in (503, 403, 500)  # httpErrorStatusCode, carried
    finally:
        provider.delete_slice(ZA, req.slice_id, 30)


def test_the_ladder_walks_on_past_an_asynchronous_stockout(env):
    fake, settings = env
    fake.fail_next("instances")
    try:
        s = provision(env[0].spec(["spot"], accelerator="v5p-8"), "run-async", settings)
        assert [(a.zone, a.outcome) for a in s.attempts] == [(ZA, Outcome.STOCKOUT), (ZB, Outcome.ACTIVE)]
        assert "ZONE_RESOURCE_POOL_EXHAUSTED" in s.attempts[0].detail
    finally:
        teardown("run-async", settings, zones=[ZA, ZB])


@pytest.mark.parametrize(("accelerator", "collection"), [("v5p-8", "instances"), ("v5p-32", "instanceGroupManagers")])
def test_a_delete_that_fails_asynchronously_is_asked_again_and_named_at_the_deadline(env, accelerator, collection):
    _, settings = env
    provider = for_backend("compute", settings)
    req = _request(Tier.SPOT, accelerator)
    provider.create(req)
    fake = env[0]
    fake.fail_next(collection, "delete", "INTERNAL_ERROR", count=1000)
    with pytest.raises(DeadlineError, match="INTERNAL_ERROR"):  # the operation's error, not a bare timeout
        provider.delete_slice(ZA, req.slice_id, 1.0)
    fake.req("POST", "/_fake/reset")
    provider.create(req)
    fake.fail_next(collection, "delete", "INTERNAL_ERROR", count=2)
    provider.delete_slice(ZA, req.slice_id, 30)  # asked again after each failed delete: gone
    assert provider.describe(ZA, req.slice_id) is None
