"""The calendar rung without a cloud: the spec's rung, the gate's decision table, and the fit table."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpu_ops.errors import SpecError
from tpu_ops.provision.calendar import CALENDAR, CalendarWindow, gate, reserved, rows
from tpu_ops.provision.ladder import plan
from tpu_ops.provision.ledger import Ledger
from tpu_ops.provision.records import Outcome
from tpu_ops.settings import Settings
from tpu_ops.specs.loader import parse_spec
from tpu_ops.specs.slice import ProvisionSpec

NOW = 1_800_000_000.0
HOUR = 3600.0


def _spec(ladder: list[object], backend: str = "compute", accelerator: str = "v5p-32") -> ProvisionSpec:
    return parse_spec(ProvisionSpec, {
        "slice": {"accelerator_type": accelerator, "region": "us-east5", "zones": ["us-east5-a", "us-east5-b"],
                  "backend": backend},
        "ladder": ladder, "budget_usd": 10_000, "hours": 1,
    })  # fmt: skip


def test_calendar_rung_shorthand_object_and_plan() -> None:
    spec = _spec(["calendar:cal@us-east5-a", {"kind": "calendar", "name": "cal2", "zone": "us-east5-b",
                                              "max_run_duration": "2h"}, "spot"])  # fmt: skip
    steps = plan(spec)
    assert [(s.tier, s.zone, s.reservation, s.max_run_duration_s) for s in steps[:2]] == [
        ("calendar", "us-east5-a", "cal", 86400), ("calendar", "us-east5-b", "cal2", 7200)]  # fmt: skip


@pytest.mark.parametrize(
    ("ladder", "backend", "words"),
    [
        ([{"kind": "calendar"}], "compute", "a calendar rung needs its name"),
        (["calendar:cal"], "compute", "needs a zone"),
        (["calendar:cal@us-central1-a"], "compute", "not one of the slice's zones"),
        (["calendar:cal@us-east5-a"], "tpu-api", "cannot be served by backend 'tpu-api'"),
    ],
)
def test_bad_calendar_rungs_are_refused_in_one_line(ladder: list[object], backend: str, words: str) -> None:
    with pytest.raises(SpecError, match=words):
        _spec(ladder, backend=backend, accelerator="v5p-32" if backend == "compute" else "v4-32")


def _window(start: float, end: float, mode: str = "CALENDAR") -> CalendarWindow:
    return CalendarWindow("cal", "us-east5-a", start, end, mode, "APPROVED", "cal-res", "v5p", 16)


@pytest.mark.parametrize(
    ("window", "left_s", "finish_by", "go", "wait_s", "late", "why"),
    [
        (None, 600, None, False, 0, False, "not found"),
        (_window(NOW - HOUR, NOW + HOUR, mode="DEFAULT"), 600, None, False, 0, False, "not in calendar mode"),
        (_window(NOW - 2 * HOUR, NOW - HOUR), 600, None, False, 0, False, "ended at"),
        (_window(NOW - HOUR, NOW + HOUR), 600, None, True, 0, False, ""),
        (_window(NOW + 300, NOW + 86400), 600, None, True, 300, False, ""),
        (_window(NOW + 900, NOW + 86400), 600, None, False, 0, True, "after the overall timeout"),
        (_window(NOW + 300, NOW + 86400), 600, NOW + 200, False, 0, True, "after finish_by"),
    ],
)  # fmt: skip
def test_gate_waits_for_a_window_it_can_reach_and_walks_on_otherwise(
    tmp_path: Path, window: CalendarWindow | None, left_s: float, finish_by: float | None, go: bool, wait_s: float,
    late: bool, why: str,
) -> None:  # fmt: skip
    ledger = Ledger(Settings(dry_run=True, state_dir=tmp_path), "run-gate")
    g = gate(window, "cal", "us-east5-a", left_s=left_s, finish_by=finish_by, ledger=ledger, attempt=1, now=NOW)
    assert (g.go, round(g.wait_s), g.late) == (go, wait_s, late)
    assert why in g.reason
    said = [e for e in ledger.events() if e["kind"] == CALENDAR]
    if window is not None and window.mode == "CALENDAR" and (window.start or 0) > NOW:
        assert [e["decision"] for e in said] == ["wait" if go else "walk-on"]  # a window ahead is always said
        assert said[0]["opens_at"] == window.start
    else:
        assert said == []


def test_reserved_and_fit_table() -> None:
    assert reserved("ct5p-hightpu-4t", 4, "") == ("v5p", 16)
    assert reserved("", 64, "VM_FAMILY_CLOUD_TPU_LITE_POD_SLICE_CT6E") == ("v6e", 64)
    assert reserved("n2-standard-8", 3, "") == ("", 0)
    spec = _spec(["calendar:a@us-east5-a", "spot"])
    windows = [
        CalendarWindow("a", "us-east5-a", NOW + HOUR, NOW + 86400, "CALENDAR", "APPROVED", "", "v5p", 16),
        CalendarWindow("b", "us-east5-b", NOW - HOUR, NOW + HOUR, "CALENDAR", "FULFILLED", "b-res", "v5p", 32),
        CalendarWindow("c", "us-east5-a", NOW, NOW + HOUR, "CALENDAR", "FULFILLED", "", "v6e", 64),
        CalendarWindow("d", "us-east5-a", NOW - 9 * HOUR, NOW - HOUR, "CALENDAR", "FULFILLED", "", "v5p", 16),
        CalendarWindow("e", "us-east5-a", NOW, NOW + HOUR, "DEFAULT", "FULFILLED", "", "v5p", 16),
        CalendarWindow("f", "us-central1-a", NOW, NOW + HOUR, "CALENDAR", "FULFILLED", "", "v5p", 16),
        CalendarWindow("g", "us-east5-a", NOW + HOUR, NOW + 86400, "CALENDAR", "DECLINED", "g-res", "v5p", 16),
    ]
    got = {r["name"]: (r["usable"], r["in ladder"]) for r in rows(spec, windows, now=NOW)}
    assert got == {
        "a": ("yes, opens in 1.0 h", "yes"),
        "b": ("yes, open now", "no"),
        "c": ("no: v6e, not v5p", "no"),
        "d": ("no: ended", "no"),
        "g": ("no: DECLINED", "no"),
    }


@pytest.mark.parametrize(
    ("status", "outcome", "words"),
    [
        ("DECLINED", Outcome.STOCKOUT, "Google rejected the request at review"),
        ("FAILED", Outcome.STOCKOUT, "provided no reservation for its window"),
        ("CANCELLED", Outcome.FAILED, "was cancelled"),
        ("DRAFTING", Outcome.FAILED, "never submitted"),
    ],
)
def test_a_request_that_will_deliver_nothing_is_walked_past_at_once(
    tmp_path: Path, status: str, outcome: str, words: str
) -> None:
    """Its window opens within the overall timeout, so an approved one would be waited for; not this one."""
    ledger = Ledger(Settings(dry_run=True, state_dir=tmp_path), "run-gate")
    window = CalendarWindow("cal", "us-east5-a", NOW + 300, NOW + 86400, "CALENDAR", status, "cal-res", "v5p", 16)
    g = gate(window, "cal", "us-east5-a", left_s=600, finish_by=None, ledger=ledger, attempt=1, now=NOW)
    assert (g.go, g.wait_s, g.outcome) == (False, 0.0, outcome)
    assert g.reason == f"calendar reservation 'cal' in us-east5-a is {status}: " + g.reason.split(": ", 1)[1]
    assert words in g.reason
    said = [e for e in ledger.events() if e["kind"] == CALENDAR]
    assert [(e["decision"], e["status"], e["reservation"]) for e in said] == [("refused", status, "cal")]
    assert Outcome.audit_outcome(g.outcome) == ("refused" if outcome == Outcome.STOCKOUT else "failure")
