"""Which control plane a spec gets, what each can serve, the shape table, flex-start, the endpoint setting."""

from __future__ import annotations

from typing import Any

import pytest

from tpu_ops.accelerators import lookup
from tpu_ops.errors import ConfigError, SpecError
from tpu_ops.provision.cost import check_budget
from tpu_ops.provision.ladder import plan
from tpu_ops.provision.prices import shipped
from tpu_ops.provision.providers import for_backend
from tpu_ops.settings import Settings
from tpu_ops.specs import ProvisionSpec, parse_spec


def _spec(acc: str, ladder: list[Any], backend: str = "auto", region: str = "us-east5") -> dict[str, Any]:
    return {
        "slice": {"accelerator_type": acc, "region": region, "zones": [f"{region}-a"], "backend": backend},
        "ladder": ladder, "budget_usd": 100_000, "hours": 1,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("acc", "backend", "why"),
    [
        ("v5p-32", "compute", "v5p is offered on Compute Engine"),
        ("v6e-8", "compute", "v6e is offered on Compute Engine"),
        ("tpu7x-128", "compute", "tpu7x is offered on Compute Engine"),
        ("v4-32", "tpu-api", "Compute Engine does not offer v4"),
        ("v5litepod-16", "tpu-api", "Compute Engine does not offer v5e"),
    ],
)
def test_auto_picks_compute_for_the_generations_it_serves_and_says_why(acc: str, backend: str, why: str) -> None:
    spec = ProvisionSpec.model_validate(_spec(acc, ["spot"]))
    assert spec.slice.resolved_backend == backend
    assert why in spec.slice.backend_reason and spec.slice.backend_reason.startswith("auto:")


@pytest.mark.parametrize(
    ("acc", "backend", "ladder", "words"),
    [
        ("v4-32", "tpu-api", ["spot", "flex-start"], "ladder[1] (flex-start) cannot be served by backend 'tpu-api'"),
        ("v5p-32", "tpu-api", [{"kind": "flex-start"}], "ladder[0] (flex-start) cannot be served by backend 'tpu-api'"),
        ("v4-32", "compute", ["spot"], "backend 'compute' cannot serve v4-32 (v4)"),
        ("v5litepod-16", "compute", ["spot"], "backend 'compute' cannot serve v5litepod-16 (v5e)"),
        ("tpu7x-8", "tpu-api", ["spot"], "backend 'tpu-api' cannot serve tpu7x-8 (tpu7x)"),
    ],
)
def test_a_rung_or_shape_the_backend_cannot_serve_is_refused_naming_both(
    acc: str, backend: str, ladder: list[Any], words: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(ProvisionSpec, _spec(acc, ladder, backend))
    assert words in str(info.value)


def test_flex_start_carries_its_max_run_duration_into_the_plan() -> None:
    spec = ProvisionSpec.model_validate(_spec("v5p-32", ["spot", {"kind": "flex-start", "max_run_duration": "36h"}]))
    steps = plan(spec)
    assert [(s.tier, s.max_run_duration_s) for s in steps] == [("spot", None), ("flex-start", 36 * 3600)]
    with pytest.raises(SpecError, match="max_run_duration"):
        parse_spec(ProvisionSpec, _spec("v5p-32", [{"kind": "flex-start", "max_run_duration": "8d"}]))


@pytest.mark.parametrize(
    ("acc", "hosts", "machine", "topology"),
    [
        ("v5p-32", 4, "ct5p-hightpu-4t", "2x2x4"),
        ("v5p-128", 16, "ct5p-hightpu-4t", "4x4x4"),
        ("v6e-8", 1, "ct6e-standard-8t", "2x4"),
        ("v6e-64", 16, "ct6e-standard-4t", "8x8"),
        ("tpu7x-128", 16, "tpu7x-standard-4t", "4x4x4"),
        ("v4-32", 4, "", "2x2x4"),
    ],
)
def test_shape_table(acc: str, hosts: int, machine: str, topology: str) -> None:
    row = lookup(acc)
    assert (row.hosts, row.machine_type, row.topology) == (hosts, machine, topology)
    assert row.chips_per_host * row.hosts == row.chips


def test_prices_cover_flex_start_and_say_what_google_does_not_publish() -> None:
    t = shipped()
    assert t.price("v5p", "flex-start") == t.price("v5p", "on-demand")  # a ceiling, not a guess
    with pytest.raises(ConfigError, match="no price for tpu7x on-demand"):
        check_budget(ProvisionSpec.model_validate(_spec("tpu7x-8", ["on-demand"])), t)
    import json
    from importlib import resources

    raw = json.loads(resources.files("tpu_ops.provision").joinpath("prices.json").read_text())
    assert "publishes no per-chip-hour spot or flex-start figure" in raw["compute_engine"]["not_published"]


def test_missing_or_remote_compute_endpoint_fails_fast_in_a_dry_run(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match=r"compute_endpoint is not set .*TPU_OPS_COMPUTE_ENDPOINT"):
        for_backend("compute", Settings(dry_run=True, state_dir=tmp_path))
    with pytest.raises(ConfigError, match="not on loopback"):
        for_backend("compute", Settings(dry_run=True, compute_endpoint="http://10.1.2.3:8080", state_dir=tmp_path))


@pytest.mark.parametrize(("acc", "hosts"), [("v6e-8", 1), ("v5p-32", 4)])
def test_flex_start_on_compute_engine_asks_for_a_bounded_run(
    compute_url: str, tmp_path: Any, acc: str, hosts: int, google_auth: Any
) -> None:
    """A flex-start rung becomes provisioningModel FLEX_START with maxRunDuration (and, for a single
    instance, requestValidForDuration = the queue timeout), on the instance or the group's template."""
    from google.cloud import compute_v1

    from tpu_ops.cloud.clients import compute_options
    from tpu_ops.provision import provision, teardown

    settings = Settings(dry_run=True, compute_endpoint=compute_url, poll_interval_s=0.02, state_dir=tmp_path,
                        **google_auth.settings_overrides())  # fmt: skip
    body = _spec(acc, [{"kind": "flex-start", "max_run_duration": "6h"}], "compute")
    body.update(queue_timeout="5m")
    spec = ProvisionSpec.model_validate(body)
    zone = spec.slice.zones[0]
    try:
        s = provision(spec, "run-flex", settings)
        assert (s.tier, s.hosts, s.backend) == ("flex-start", hosts, "compute")
        opts = compute_options(settings)
        project = settings.gcp_project
        vms = [i for i in compute_v1.InstancesClient(**opts).list(project=project, zone=zone)
               if i.name.startswith("run-flex-a1")]  # fmt: skip
        assert len(vms) == hosts
        for vm in vms:
            assert vm.scheduling.provisioning_model == "FLEX_START"
            assert vm.scheduling.max_run_duration.seconds == 6 * 3600
            assert vm.scheduling.instance_termination_action == "DELETE"
        if hosts == 1:
            assert vms[0].params.request_valid_for_duration.seconds == 300
        else:
            (tpl,) = [t for t in compute_v1.InstanceTemplatesClient(**opts).list(project=project)
                      if t.name.startswith("run-flex-a1-t")]  # fmt: skip
            assert tpl.properties.scheduling.provisioning_model == "FLEX_START"
            assert tpl.properties.labels["tpu-ops-run"] == "run-flex"
    finally:
        teardown("run-flex", settings, zones=[zone])


def test_a_shared_reservation_path_becomes_compute_engines_affinity_value() -> None:
    from tpu_ops.provision.providers.compute import reservation_value

    assert reservation_value("res-a") == "res-a"
    assert reservation_value("projects/shared-host/zones/us-east5-a/reservations/big") == (
        "projects/shared-host/reservations/big"
    )
