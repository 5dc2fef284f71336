"""``ladder: auto`` through the real ladder, on the fake Compute Engine over HTTP (google-cloud-compute)
with the capacity history in fake-gcs-server: the ranking decides where the slice lands, the plan is
kept in the ledger and beside the run's records, and a later walk ranks with the steps then left."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tpu_ops.provision import provision, teardown
from tpu_ops.provision.ledger import Ledger
from tpu_ops.provision.ranking import CHOICE_EVENT, plan_rows
from tpu_ops.settings import Settings
from tpu_ops.specs.slice import ProvisionSpec


@pytest.fixture(scope="module")
def compute() -> Iterator[Any]:
    from infra.local.compute.server import ComputeServer

    with ComputeServer() as server:
        yield server


@pytest.fixture
def compute_url(compute: Any) -> Iterator[str]:
    """The fake's URL; after the test, nothing of it is left (teardown confirmed every instance gone)."""
    yield compute.url
    assert compute.backend.state()["instances"] == 0


@pytest.fixture
def settings(compute_url: str, gcs_env: dict[str, str], tmp_path: Path, google_auth: Any) -> Settings:
    return Settings(
        **google_auth.settings_overrides(),
        dry_run=True, gcp_project="tpu-ops-local", compute_endpoint=compute_url,
        gcs_endpoint=gcs_env["TPU_OPS_GCS_ENDPOINT"], poll_interval_s=0.02, retry_attempts=4,
        retry_initial_delay_s=0.01, retry_max_delay_s=0.05, state_dir=tmp_path / "state",
    )  # fmt: skip


def _spec(history: str) -> ProvisionSpec:
    return ProvisionSpec.model_validate({
        "slice": {"accelerator_type": "v5p-8", "region": "us-east5", "zones": ["us-east5-a", "us-east5-b"]},
        "ladder": "auto", "budget_usd": 1000, "hours": 1, "queue_timeout": "5s", "overall_timeout": "60s",
        "choose": {"history": history, "steps": 3600, "checkpoint_every": 600},
    })  # fmt: skip


def _seed_history(settings: Settings, bucket: str) -> None:
    """Past runs: spot in zone a preempted 20 times in 10 h; spot in zone b never, in 100 h."""
    from tpu_ops.cloud.clients import storage_client

    gcs = storage_client(settings)
    b = gcs.create_bucket(bucket)
    for run, zone, hours, preempted in (("old-a", "us-east5-a", 10.0, 20), ("old-b", "us-east5-b", 100.0, 0)):
        state = {
            "incarnations": [{"zone": zone, "tier": "spot", "requested_at": 0.0, "ready_at": 60.0,
                              "ended_at": 60.0 + hours * 3600}],
            "preemptions": [{"zone": zone, "tier": "spot", "detect_s": 5.0, "delete_s": 5.0, "restore_s": 50.0,
                             "steps_lost": 100}] * preempted,
        }  # fmt: skip
        b.blob(f"ckpt/{run}/_tpu_ops/state.json").upload_from_string(json.dumps(state))
        ident = {"accelerator_type": "v5p-8", "backend": "compute", "chips": 4}
        b.blob(f"ckpt/{run}/_tpu_ops/capacity.json").upload_from_string(json.dumps(ident))


def _plans(settings: Settings, run_id: str) -> list[dict[str, Any]]:
    return [e["plan"] for e in Ledger(settings, run_id).events() if e["kind"] == CHOICE_EVENT]


def test_auto_lands_where_history_says_and_keeps_the_plan(settings: Settings) -> None:
    from tpu_ops.cloud.clients import storage_client

    _seed_history(settings, "ranked")
    spec = _spec("gs://ranked/ckpt")
    try:
        s = provision(spec, "rk-1", settings, progress=lambda: None)
        # written order: spot a (#1), spot b (#2), on-demand a (#3), on-demand b (#4); ranked: spot b first
        assert (s.zone, s.tier) == ("us-east5-b", "spot")
        assert [a.number for a in s.attempts] == [2]
        (plan,) = _plans(settings, "rk-1")
        assert plan["method"] == "cost" and plan["backend"] == "compute"
        assert [(r["zone"], r["tier"]) for r in plan["rungs"]][:2] == [("us-east5-b", "spot"), ("us-east5-a", "spot")]
        assert plan["rungs"][0]["why"] == "cheapest per kept step"
        assert plan["rungs"][0]["history_hours"] == 100.0
        rows = plan_rows(plan)  # the provision flow's table artifact
        assert [r["rung"] for r in rows][:2] == ["spot in us-east5-b", "spot in us-east5-a"]
        assert rows[0]["$/kept step"] == f"{plan['rungs'][0]['usd_per_step']:.6f}"
        assert rows[0]["why"] == "cheapest per kept step" and rows[0]["preempt/h"] == "0.019 (100.0 h seen)"
        kept = json.loads(storage_client(settings).bucket("ranked").blob("ckpt/rk-1/_tpu_ops/plan.json")
                          .download_as_bytes())  # fmt: skip
        assert kept == json.loads(json.dumps(plan))
        # A later walk (the supervisor's, after a preemption) ranks what is left: 3000 of 3600 steps kept.
        teardown("rk-1", settings, zones=list(spec.slice.zones))
        provision(spec, "rk-1", settings, progress=lambda: 3000)
        assert [p["steps_left"] for p in _plans(settings, "rk-1")] == [3600, 600]
    finally:
        teardown("rk-1", settings, zones=list(spec.slice.zones))


def test_auto_without_history_keeps_the_written_order_and_says_so(settings: Settings) -> None:
    spec = _spec("gs://ranked-none/ckpt")  # no such bucket: no history, never a refusal
    try:
        s = provision(spec, "rk-2", settings)
        assert (s.zone, s.tier) == ("us-east5-a", "spot")
        (plan,) = _plans(settings, "rk-2")
        assert plan["method"] == "written-order"
        assert plan["note"].startswith("ladder: auto (spot, on-demand in each zone); no history for any rung")
        assert [r["position"] for r in plan["rungs"]] == [1, 2, 3, 4]
        assert [r["order"] for r in plan["rungs"]] == [1, 2, 3, 4]
    finally:
        teardown("rk-2", settings, zones=list(spec.slice.zones))


ZONES = ("us-east5-a", "us-east5-b")


def _no_spot(compute: Any) -> dict[str, Any]:
    """Spot stocked out in both zones, on-demand plenty; returns the zones' capacity to restore."""
    was = compute.backend.capacity.to_json()["zones"]
    compute.backend.configure_capacity({z: {"SPOT": 0, "STANDARD": 64} for z in ZONES})
    return {z: was.get(z, was["*"]) for z in ZONES}


def _patient(history: str, wait: str, overall: str = "60s") -> ProvisionSpec:
    spec = _spec(history).model_dump(mode="json")
    spec["choose"].update(wait=wait, max_duration="3h")
    spec["overall_timeout"] = overall
    return ProvisionSpec.model_validate(spec)


def test_with_choose_wait_the_ladder_waits_for_spot_instead_of_buying_on_demand(
    settings: Settings, compute: Any
) -> None:
    import threading
    import time

    _seed_history(settings, "patient")
    spec = _patient("gs://patient/ckpt", wait="1s")
    before = _no_spot(compute)

    def free_spot_once_waiting() -> None:  # capacity comes back while the ladder waits
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if any(e["kind"] == "waiting" for e in Ledger(settings, "rk-3").events()):
                compute.backend.configure_capacity({"us-east5-b": {"SPOT": 64, "STANDARD": 64}})
                return
            time.sleep(0.02)

    helper = threading.Thread(target=free_spot_once_waiting)
    helper.start()
    try:
        s = provision(spec, "rk-3", settings, progress=lambda: None)
        helper.join(30)
        # spot b (#2) and spot a (#1) refused; waited instead of on-demand (#3, #4); then spot b granted
        assert (s.zone, s.tier) == ("us-east5-b", "spot")
        assert [(a.number, a.outcome) for a in s.attempts] == [(2, "stockout"), (1, "stockout"), (2, "active")]
        events = Ledger(settings, "rk-3").events()
        assert [e["seconds"] for e in events if e["kind"] == "waiting"] == [1.0]
        first, second = _plans(settings, "rk-3")
        assert first["try_now"] == 2 and first["wait_s"] == 1.0 and "wait 1 s and ask again" in first["note"]
        assert [r["tier"] for r in first["rungs"]] == ["spot", "spot", "on-demand", "on-demand"]
        assert second["try_now"] == 2  # ranked again after the wait
    finally:
        helper.join(30)
        compute.backend.configure_capacity(before)
        teardown("rk-3", settings, zones=list(spec.slice.zones))


def test_without_time_to_wait_the_ladder_buys_on_demand_at_once(settings: Settings, compute: Any) -> None:
    _seed_history(settings, "impatient")
    # An hour's wait does not fit in the ladder's overall timeout: no waiting, on to on-demand.
    spec = _patient("gs://impatient/ckpt", wait="1h", overall="60s")
    before = _no_spot(compute)
    try:
        s = provision(spec, "rk-4", settings, progress=lambda: None)
        assert (s.zone, s.tier) == ("us-east5-a", "on-demand")
        assert [(a.number, a.outcome) for a in s.attempts] == [(2, "stockout"), (1, "stockout"), (3, "active")]
        assert not [e for e in Ledger(settings, "rk-4").events() if e["kind"] == "waiting"]
    finally:
        compute.backend.configure_capacity(before)
        teardown("rk-4", settings, zones=list(spec.slice.zones))


def _another_run_holds_the_only_reservation_vm(compute: Any) -> Any:
    """Zone a gets a 1-VM reservation ``team-res``, held by another run's VM ``other-run``; returns the zones'
    capacity before, to restore."""
    from infra.local.compute.models import RESERVATION_KEY

    was = compute.backend.capacity.to_json()["zones"]
    compute.backend.configure_capacity({"us-east5-a": {"SPOT": 64, "STANDARD": 64, "reservations": {
        "team-res": {"count": 1, "machineType": "ct5p-hightpu-4t"}}}})  # fmt: skip
    body = {"name": "other-run", "machineType": "zones/us-east5-a/machineTypes/ct5p-hightpu-4t",
            "scheduling": {"provisioningModel": "RESERVATION_BOUND", "onHostMaintenance": "TERMINATE"},
            "reservationAffinity": {"consumeReservationType": "SPECIFIC_RESERVATION", "key": RESERVATION_KEY,
                                    "values": ["team-res"]}}  # fmt: skip
    compute.backend.insert_instance("tpu-ops-local", "us-east5-a", body)
    compute.backend.tick()
    return was


def test_a_run_with_time_to_spare_queues_for_the_full_reservation_and_gets_the_vm_it_frees(
    settings: Settings, compute: Any
) -> None:
    """``choose.queue`` through the real ladder (issue 30, ninth look): the reservation's only VM is held by
    another run and this one has hours of slack, so its walk tries no rung and waits (a ``waiting`` ledger
    event, the plan saying why); when the other run gives the VM back, the next walk gets it. No spot or
    on-demand slice is requested meanwhile."""
    import threading
    import time

    from tpu_ops.provision import ledger as L

    _seed_history(settings, "queued")
    ladder = ["reservation:team-res@us-east5-a", "spot", "on-demand"]
    base = _spec("gs://queued/ckpt").model_dump(mode="json")
    base["choose"] = {**base["choose"], "max_duration": "10h", "queue": "1s"}  # 1 h of work, 10 h to do it
    spec = ProvisionSpec.model_validate({**base, "ladder": ladder})
    was = _another_run_holds_the_only_reservation_vm(compute)
    got: list[Any] = []
    walk = threading.Thread(target=lambda: got.append(provision(spec, "rk-q", settings, progress=lambda: None)))
    try:
        walk.start()
        waited = lambda: [e for e in Ledger(settings, "rk-q").events() if e["kind"] == L.WAITING]  # noqa: E731
        t_end = time.monotonic() + 30.0
        while not waited() and time.monotonic() < t_end:
            time.sleep(0.05)
        assert waited(), "the walk never queued"
        assert waited()[0]["seconds"] == 1.0
        assert compute.backend.state()["instances"] == 1  # only the other run's VM: nothing requested
        first = _plans(settings, "rk-q")[0]
        assert first["try_now"] == 0 and first["wait_s"] == 1.0 and "queued: the reservation is full" in first["note"]
        compute.backend.delete_instance("tpu-ops-local", "us-east5-a", "other-run")  # the other run is done
        compute.backend.tick()
        walk.join(timeout=60.0)
        assert not walk.is_alive() and got, "the queued walk never got a slice"
        (s,) = got
        assert (s.zone, s.tier) == ("us-east5-a", "reservation") and [a.tier for a in s.attempts] == ["reservation"]
    finally:
        walk.join(timeout=60.0)
        if any(i["name"] == "other-run" for i in compute.backend.list_instances("tpu-ops-local", "us-east5-a").get(
            "items", [])):
            compute.backend.delete_instance("tpu-ops-local", "us-east5-a", "other-run")
        compute.backend.tick()
        compute.backend.configure_capacity({"us-east5-a": was.get("us-east5-a", was["*"])})
        teardown("rk-q", settings, zones=list(spec.slice.zones))


def test_a_full_reservation_is_tried_last_through_the_fleet_view_and_the_ask_is_kept(
    settings: Settings, compute: Any
) -> None:
    """The production ladder builds the fleet view as the fleet simulator does (issue 30): the
    reservation's own ``inUseCount`` (Compute Engine's ``reservations.get``, over HTTP) says it is
    full, so the ranking tries it after every other rung instead of being refused first; the run's ask
    is kept in the capacity summary, where the next rankings read it."""
    from tpu_ops.cloud.clients import storage_client

    _seed_history(settings, "viewed")
    ladder = ["reservation:team-res@us-east5-a", "spot", "on-demand"]
    spec = ProvisionSpec.model_validate({**_spec("gs://viewed/ckpt").model_dump(mode="json"), "ladder": ladder})
    was = _another_run_holds_the_only_reservation_vm(compute)
    try:
        s = provision(spec, "rk-5", settings, progress=lambda: None)
        assert (s.zone, s.tier) == ("us-east5-b", "spot") and [a.tier for a in s.attempts] == ["spot"]
        (plan,) = _plans(settings, "rk-5")
        assert plan["method"] == "cost" and "fleet: the reservation full now (fleet view)" in plan["note"]
        assert plan["rungs"][-1]["tier"] == "reservation" and plan["rungs"][-1]["why"].startswith("full now")
        doc = json.loads(storage_client(settings).bucket("viewed").blob("ckpt/_tpu_ops/capacity-summary.json")
                         .download_as_bytes())  # fmt: skip
        assert doc["runs"]["rk-5"]["ask"]["gain"] > 0
    finally:
        compute.backend.delete_instance("tpu-ops-local", "us-east5-a", "other-run")
        compute.backend.tick()
        compute.backend.configure_capacity({"us-east5-a": was.get("us-east5-a", was["*"])})
        teardown("rk-5", settings, zones=list(spec.slice.zones))
