"""The fake's resize requests and future reservations, fetched raw over HTTP, fit the offline
``compute.v1`` discovery document (InstanceGroupManagerResizeRequest, FutureReservation, their lists)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from compute.helpers import PROJECT, ZONE
from tpu.discovery import Discovery

from infra.local.compute.models import ComputeBackend
from infra.local.compute.server import ComputeServer
from infra.local.core.clock import ManualClock

COMPUTE = Discovery("compute.v1.json", set(), {})
Z = f"/compute/v1/projects/{PROJECT}/zones/{ZONE}"
HOUR = 3600


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _group(b: ComputeBackend, name: str, model: str, reservation: str = "") -> None:
    sched = {"provisioningModel": model, "onHostMaintenance": "TERMINATE", "maxRunDuration": {"seconds": "3600"},
             "instanceTerminationAction": "DELETE"}  # fmt: skip
    props: dict = {"machineType": "ct5p-hightpu-4t", "scheduling": sched}
    if reservation:
        key = "compute.googleapis.com/reservation-name"
        props["reservationAffinity"] = {"consumeReservationType": "SPECIFIC_RESERVATION", "key": key,
                                        "values": [reservation]}  # fmt: skip
    b.insert_template(PROJECT, "", {"name": f"{name}-tpl", "properties": props})
    tpl = f"projects/{PROJECT}/global/instanceTemplates/{name}-tpl"
    b.insert_group(PROJECT, ZONE, {"name": name, "baseInstanceName": name, "targetSize": 0, "instanceTemplate": tpl})


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    clock = ManualClock()
    b = ComputeBackend(clock=clock)
    with ComputeServer(b) as server:
        now = clock.now()
        b.insert_future_reservation(PROJECT, ZONE, {
            "name": "open", "reservationMode": "CALENDAR", "reservationName": "open-res",
            "timeWindow": {"startTime": _iso(now + 60), "endTime": _iso(now + 60 + 86400)},
            "aggregateReservation": {"vmFamily": "VM_FAMILY_CLOUD_TPU_POD_SLICE_CT5P", "reservedResources": [
                {"accelerator": {"acceleratorCount": 8}}]},
        })  # fmt: skip
        b.insert_future_reservation(PROJECT, ZONE, {
            "name": "later", "reservationMode": "CALENDAR", "namePrefix": "later",
            "timeWindow": {"startTime": _iso(now + 30 * 86400), "duration": {"seconds": str(7 * 86400)}},
            "specificSkuProperties": {"totalCount": "2", "instanceProperties": {"machineType": "ct5p-hightpu-4t"}},
        })  # fmt: skip
        b.configure_capacity({ZONE: {"FLEX_START": 4, "CALENDAR": {"v5p": 8}}})
        b.insert_future_reservation(PROJECT, ZONE, {  # 8 + 8 chips of v5p over 8: Google declines it
            "name": "refused", "reservationMode": "CALENDAR", "reservationName": "refused-res",
            "timeWindow": {"startTime": _iso(now + 120), "endTime": _iso(now + 120 + 86400)},
            "aggregateReservation": {"vmFamily": "VM_FAMILY_CLOUD_TPU_POD_SLICE_CT5P", "reservedResources": [
                {"accelerator": {"acceleratorCount": 8}}]},
        })  # fmt: skip
        for name in ("ok", "waits", "cancelled"):
            _group(b, name, "FLEX_START")
        _group(b, "failed", "RESERVATION_BOUND", reservation="nowhere")
        _group(b, "cal", "RESERVATION_BOUND", reservation="open-res")
        for name, by in (("ok", 1), ("waits", 4), ("cancelled", 2), ("failed", 1), ("cal", 2)):
            b.insert_resize_request(PROJECT, ZONE, name, {"name": "rr", "resizeBy": by,
                                                          "requestedRunDuration": {"seconds": "3600"}})  # fmt: skip
        clock.advance(120)
        b.tick()
        b.cancel_resize_request(PROJECT, ZONE, "cancelled", "rr")
        yield server.url


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return dict(json.loads(resp.read()))


def test_resize_requests_and_future_reservations_fit_the_discovery_document(url: str) -> None:
    states = {}
    for group in ("ok", "waits", "cancelled", "failed", "cal"):
        body = _get(f"{url}{Z}/instanceGroupManagers/{group}/resizeRequests/rr")
        assert COMPUTE.validate("InstanceGroupManagerResizeRequest", body) == [], (group, body)
        states[group] = body["state"]
        listed = _get(f"{url}{Z}/instanceGroupManagers/{group}/resizeRequests")
        assert COMPUTE.validate("InstanceGroupManagerResizeRequestsListResponse", listed) == []
    assert states == {"ok": "SUCCEEDED", "waits": "ACCEPTED", "cancelled": "CANCELLED", "failed": "FAILED",
                      "cal": "SUCCEEDED"}  # fmt: skip
    for name in ("open", "later", "refused"):
        body = _get(f"{url}{Z}/futureReservations/{name}")
        assert COMPUTE.validate("FutureReservation", body) == [], body
    assert _get(f"{url}{Z}/futureReservations/open")["status"]["procurementStatus"] == "FULFILLED"
    assert _get(f"{url}{Z}/futureReservations/refused")["status"] == {"procurementStatus": "DECLINED"}
    assert COMPUTE.validate("FutureReservationsListResponse", _get(f"{url}{Z}/futureReservations")) == []
    agg = _get(f"{url}/compute/v1/projects/{PROJECT}/aggregated/futureReservations")
    assert COMPUTE.validate("FutureReservationsAggregatedListResponse", agg) == []
    assert [f["name"] for f in agg["items"][f"zones/{ZONE}"]["futureReservations"]] == ["later", "open", "refused"]
    ops = _get(f"{url}{Z}/operations")
    assert COMPUTE.validate("OperationList", ops) == []
