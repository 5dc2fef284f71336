"""Google's review of calendar-mode future reservations on the fake, driven by google-cloud-compute.

A calendar request is not approved because it was asked for: Google reviews it (PENDING_APPROVAL ->
APPROVED or DECLINED, "rejected by GCP") and a request approved whose capacity is not there when its
window opens is FAILED ("No additional reservations were provided"). The compute.v1
``FutureReservationStatus`` has no field giving the reason; the fake adds none. The fake's calendar
capacity is set per zone and TPU generation through ``/_fake/capacity`` (``CALENDAR``).

Cancel and delete follow "Delete a future reservation request in calendar mode"
(compute/docs/instances/delete-future-reservations-calendar-mode): a request is cancelled "to prevent
Compute Engine from provisioning your requested resources", then kept or deleted; it is deleted "after
you cancel a request or after the request reaches its end time". The fake cancels one only while it is
pending approval or approved, before its window (docs/calendar.md says why).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any

import pytest
from compute.helpers import PROJECT, ZONE
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1
from test_compute_resize import _group, _resize, _state

HOUR, DAY = 3600, 86400
CT5P, CT6E = "VM_FAMILY_CLOUD_TPU_POD_SLICE_CT5P", "VM_FAMILY_CLOUD_TPU_LITE_POD_SLICE_CT6E"


def _post(url: str, body: object) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return dict(json.loads(resp.read()))


def _raw(fake: Any, name: str) -> dict[str, Any]:
    url = f"{fake.url}/compute/v1/projects/{PROJECT}/zones/{ZONE}/futureReservations/{name}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return dict(json.loads(resp.read()))


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _book(fake: Any, name: str, start_in: float, chips: int, family: str = CT5P, days: int = 1) -> None:
    kw: dict[str, Any] = {"credentials": AnonymousCredentials(), "client_options": ClientOptions(api_endpoint=fake.url)}
    start = fake.clock.now() + start_in
    fr = compute_v1.FutureReservation(
        name=name, reservation_mode="CALENDAR", reservation_name=f"{name}-res",
        time_window=compute_v1.FutureReservationTimeWindow(start_time=_iso(start), end_time=_iso(start + days * DAY)),
        aggregate_reservation=compute_v1.AllocationAggregateReservation(
            vm_family=family, reserved_resources=[compute_v1.AllocationAggregateReservationReservedResourceInfo(
                accelerator=compute_v1.AllocationAggregateReservationReservedResourceInfoAccelerator(
                    accelerator_count=chips))]),
    )  # fmt: skip
    compute_v1.FutureReservationsClient(**kw).insert_unary(project=PROJECT, zone=ZONE, future_reservation_resource=fr)


def _frs(fake: Any) -> Any:
    kw: dict[str, Any] = {"credentials": AnonymousCredentials(), "client_options": ClientOptions(api_endpoint=fake.url)}
    return compute_v1.FutureReservationsClient(**kw)


def _status(fake: Any, name: str) -> str:
    return str(_frs(fake).get(project=PROJECT, zone=ZONE, future_reservation=name).status.procurement_status)


def _tick(fake: Any, s: float = 1) -> None:
    fake.clock.advance(s)
    fake.backend.tick()


def test_a_request_whose_chips_do_not_fit_its_window_is_declined_and_nothing_waits_for_it(fake: Any) -> None:
    caps = _post(f"{fake.url}/_fake/capacity", {ZONE: {"CALENDAR": {"v5p": 32}}})
    assert caps["zones"][ZONE]["CALENDAR"] == {"*": 4096, "v5p": 32}
    _book(fake, "first", 2 * HOUR, 16)
    _tick(fake)
    assert _status(fake, "first") == "APPROVED"
    _book(fake, "overlaps", 2 * HOUR + DAY / 2, 32)  # 16 + 32 > 32 during the half day they share
    _book(fake, "fits", 2 * HOUR + DAY / 2, 16)  # 16 + 16: room for it
    _book(fake, "after", 2 * HOUR + DAY, 32)  # "first" has ended by then, but "fits" runs on: 16 + 32
    _book(fake, "v6e", 2 * HOUR, 64, family=CT6E)  # another generation: its own capacity
    _tick(fake)
    got = {n: _status(fake, n) for n in ("first", "overlaps", "fits", "after", "v6e")}
    assert got == {"first": "APPROVED", "overlaps": "DECLINED", "fits": "APPROVED", "after": "DECLINED",
                   "v6e": "APPROVED"}  # fmt: skip
    # Google's status says DECLINED and nothing more: no invented reason field, nothing auto-created.
    assert _raw(fake, "overlaps")["status"] == {"procurementStatus": "DECLINED"}
    # A resize request that targets the reservation it would have made fails now, not at its window.
    _group(fake, "g", "RESERVATION_BOUND", reservation="overlaps-res")
    _resize(_rrs(fake), "g")
    _tick(fake)
    assert _state(_rrs(fake), "g") == "FAILED"
    _tick(fake, 2 * HOUR + DAY / 2)  # its window: nothing is delivered
    assert _status(fake, "overlaps") == "DECLINED"
    with pytest.raises(gexc.NotFound):
        fake.reservations.get(project=PROJECT, zone=ZONE, reservation="overlaps-res")
    assert _status(fake, "first") == "FULFILLED" and _status(fake, "fits") == "FULFILLED"


def test_an_approved_request_whose_capacity_went_before_its_window_fails_then(fake: Any) -> None:
    _book(fake, "cal", HOUR, 16)
    _tick(fake)
    assert _status(fake, "cal") == "APPROVED"  # the default capacity approves it (what the dry run needs)
    _group(fake, "g", "RESERVATION_BOUND", reservation="cal-res")
    _resize(_rrs(fake), "g")
    _tick(fake, 60)
    assert _state(_rrs(fake), "g") == "ACCEPTED"  # waits for the window
    _post(f"{fake.url}/_fake/capacity", {ZONE: {"CALENDAR": 0}})
    _tick(fake, HOUR)
    assert _status(fake, "cal") == "FAILED"
    assert _raw(fake, "cal")["status"] == {"procurementStatus": "FAILED"}
    with pytest.raises(gexc.NotFound):
        fake.reservations.get(project=PROJECT, zone=ZONE, reservation="cal-res")
    assert _state(_rrs(fake), "g") == "FAILED"
    with pytest.raises(gexc.BadRequest, match="FAILED: it can be deleted only after it is cancelled or after its"):
        _frs(fake).delete_unary(project=PROJECT, zone=ZONE, future_reservation="cal")  # its window is still on


def test_a_request_cancelled_before_its_window_delivers_nothing_frees_its_chips_and_can_be_deleted(fake: Any) -> None:
    _post(f"{fake.url}/_fake/capacity", {ZONE: {"CALENDAR": {"v5p": 16}}})
    _book(fake, "a", 2 * HOUR, 16)
    _tick(fake)
    _book(fake, "b", 2 * HOUR, 16)  # the zone's 16 chips are held by "a"
    _tick(fake)
    assert (_status(fake, "a"), _status(fake, "b")) == ("APPROVED", "DECLINED")
    _group(fake, "g", "RESERVATION_BOUND", reservation="a-res")
    _resize(_rrs(fake), "g")
    _tick(fake, 60)
    assert _state(_rrs(fake), "g") == "ACCEPTED"  # waits for a's window
    op = _frs(fake).cancel_unary(project=PROJECT, zone=ZONE, future_reservation="a")
    assert not op.error.errors and op.operation_type == "cancel" and op.target_link.endswith("/futureReservations/a")
    assert _raw(fake, "a")["status"] == {"procurementStatus": "CANCELLED"}  # kept, for reference
    _tick(fake)
    assert _state(_rrs(fake), "g") == "FAILED"  # nothing will come for it
    _book(fake, "c", 2 * HOUR, 16)  # a's chips are free again
    _tick(fake)
    assert _status(fake, "c") == "APPROVED"
    _tick(fake, 2 * HOUR)  # the window opens: "a" is not provisioned, "c" is
    assert (_status(fake, "a"), _status(fake, "c")) == ("CANCELLED", "FULFILLED")
    with pytest.raises(gexc.NotFound):
        fake.reservations.get(project=PROJECT, zone=ZONE, reservation="a-res")
    with pytest.raises(gexc.BadRequest, match="FULFILLED: only a request pending approval or approved, before its"):
        _frs(fake).cancel_unary(project=PROJECT, zone=ZONE, future_reservation="c")  # its window is on
    assert _status(fake, "c") == "FULFILLED"
    fake.reservations.get(project=PROJECT, zone=ZONE, reservation="c-res")  # still there
    _frs(fake).delete_unary(project=PROJECT, zone=ZONE, future_reservation="a")
    with pytest.raises(gexc.NotFound):
        _frs(fake).get(project=PROJECT, zone=ZONE, future_reservation="a")
    assert sorted(f.name for f in _frs(fake).list(project=PROJECT, zone=ZONE)) == ["b", "c"]


def test_a_request_neither_cancelled_nor_ended_cannot_be_deleted_then_can_once_its_window_ends(fake: Any) -> None:
    _post(f"{fake.url}/_fake/capacity", {ZONE: {"CALENDAR": {"v5p": 16}}})
    _book(fake, "on", HOUR, 16)
    _tick(fake)
    _book(fake, "no", HOUR, 16)
    _tick(fake)
    assert (_status(fake, "on"), _status(fake, "no")) == ("APPROVED", "DECLINED")
    for name, status in (("on", "APPROVED"), ("no", "DECLINED")):
        with pytest.raises(gexc.BadRequest, match=f"{status}: it can be deleted only after it is cancelled or after"):
            _frs(fake).delete_unary(project=PROJECT, zone=ZONE, future_reservation=name)
    with pytest.raises(gexc.BadRequest, match="DECLINED: only a request pending approval or approved"):
        _frs(fake).cancel_unary(project=PROJECT, zone=ZONE, future_reservation="no")
    _tick(fake, HOUR)
    assert _status(fake, "on") == "FULFILLED"
    with pytest.raises(gexc.BadRequest, match="FULFILLED: it can be deleted only after it is cancelled or after"):
        _frs(fake).delete_unary(project=PROJECT, zone=ZONE, future_reservation="on")
    fake.reservations.get(project=PROJECT, zone=ZONE, reservation="on-res")  # the refused delete removed nothing
    _tick(fake, DAY)  # both windows end: the auto-created reservation went with "on"'s
    for name in ("on", "no"):
        _frs(fake).delete_unary(project=PROJECT, zone=ZONE, future_reservation=name)
    assert list(_frs(fake).list(project=PROJECT, zone=ZONE)) == []


def test_a_bad_calendar_capacity_is_refused_naming_the_allowed_keys(fake: Any) -> None:
    with pytest.raises(urllib.error.HTTPError) as err:
        _post(f"{fake.url}/_fake/capacity", {ZONE: {"CALENDAR": {"v9": 8}}})
    assert err.value.code == 400 and "['tpu7x', 'v5p', 'v6e', '*']" in err.value.read().decode()


def _rrs(fake: Any) -> Any:
    kw: dict[str, Any] = {"credentials": AnonymousCredentials(), "client_options": ClientOptions(api_endpoint=fake.url)}
    return compute_v1.InstanceGroupManagerResizeRequestsClient(**kw)


def test_a_reservation_is_coming_by_the_moment_the_scheduler_judged_the_windows_at(fake: Any) -> None:
    """The resize scheduler's pass delivers the windows open at its ``now``, then tries its requests: a
    reservation not there yet is "coming" by that same ``now``, not by a later read of the clock, which once
    fell just past the start under load and failed a request the next pass would have filled (CI)."""
    from infra.local.compute.placement import RESERVATION_KEY

    _book(fake, "cal", start_in=60, chips=16)
    start = next(fr.start for fr in fake.backend._futures.values() if fr.name == "cal")
    props = {"reservationAffinity": {"key": RESERVATION_KEY, "values": ["cal-res"]}}
    fake.clock.advance(start + 1 - fake.clock.now())  # the clock is past the start already
    assert fake.backend._reservation_coming(PROJECT, ZONE, props, start - 0.001)
    assert not fake.backend._reservation_coming(PROJECT, ZONE, props, start)
