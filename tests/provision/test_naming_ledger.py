"""Run naming and the cost ledger (no cloud needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpu_ops.errors import SpecError
from tpu_ops.layout import check_run_id
from tpu_ops.provision import ledger as L
from tpu_ops.provision.naming import (
    attempt_of,
    belongs_to,
    billed,
    multislice_node,
    resource_id,
    run_labels,
    run_of,
    slice_of,
)
from tpu_ops.provision.prices import shipped
from tpu_ops.settings import Settings


def test_resource_ids_are_derived_from_run_and_attempt() -> None:
    rid = resource_id("a" * 40, 12)
    assert rid == "a" * 40 + "-a12" and len(rid) <= 63
    assert attempt_of("run-1", "run-1-a3") == 3
    assert attempt_of("run-1", "run-1-a3-a1") is None  # that is run "run-1-a3"'s attempt
    assert belongs_to("run-1", "other", {"tpu-ops-run": "run-1"})
    assert not belongs_to("run-1", "run-10-a1", {})


# A final newline slipped past ``^...$`` with ``match`` (``$`` matches before it); Unicode digits
# pass ``\d`` and ``str.isdigit``: the rule must take the whole string, ASCII only.
ODD = ["run\n", "run\r\n", "run\r", "ru\x00n", "run\x00", "run\u0663", "run\uff13", "r\u0663", "\nrun", "run\t"]


def test_a_multislice_requests_nodes_are_its_slices_and_billed_as_such() -> None:
    assert multislice_node("run-a1-1") == ("run-a1", 1) and multislice_node("run-a1") is None
    assert multislice_node("run-a1001") is None  # Compute Engine's slice 1 keeps its own id form
    assert [slice_of("run", r) for r in ("run-a1", "run-a1001", "run-a1-0", "run-a3-2")] == [0, 1, 0, 2]
    assert slice_of("run", "other-a1-1") is None and slice_of("run-a1", "run-a1-1") is None  # run-a1's id is run-a1-a1
    assert billed("run", "node", "run-a1-1") and billed("run", "queued-resource", "run-a1")
    # a Compute Engine group's instance named {group}-xxxx (4 random characters, maybe all digits) is a part
    assert not billed("run", "instance", "run-a1-1234") and billed("run", "instance-group", "run-a1")
    assert attempt_of("run", "run-a1-1") is None  # the ladder's attempt numbers are the request's


@pytest.mark.parametrize("bad", ["", "Run", "1run", "run-", "r" * 41, "run_1", "run.1", *ODD])
def test_bad_run_ids(bad: str) -> None:
    with pytest.raises(SpecError, match="run id") as caught:
        check_run_id(bad)
    line = str(caught.value)
    assert "\n" not in line and "\x00" not in line and repr(bad) in line  # one line, the id shown escaped
    assert caught.value.errors[0]["field"] == "run_id"


def test_labels_are_valid_gcp_labels_and_carry_no_secrets() -> None:
    labels = run_labels("run-1", "spot", 2, now=1_790_000_000.5)
    assert labels == {
        "tpu-ops-managed": "true",
        "tpu-ops-run": "run-1",
        "tpu-ops-created": "1790000000",
        "tpu-ops-tier": "spot",
        "tpu-ops-attempt": "2",
    }
    import re

    for k, v in labels.items():
        assert re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", k) and re.fullmatch(r"[a-z0-9_-]{0,63}", v)
    assert run_of("x", labels) == "run-1" and run_of("x", {"tpu-ops-run": "run-1"}) is None


def test_ledger_bills_running_preempted_and_deleting_by_tier(tmp_path: Path) -> None:
    led = L.Ledger(Settings(state_dir=tmp_path), "run-1")
    t0 = 1_000_000.0
    led.append(L.ATTEMPT, t=t0, number=1, seconds_waited=30.0, zone="z-a")
    led.append(L.ACTIVE, t=t0, resource_id="run-1-a1", zone="z-a", tier="spot", chips=64, generation="v5p")
    led.append(L.PREEMPTED, t=t0 + 3600, resource_id="run-1-a1")
    led.append(L.DELETE_REQUESTED, t=t0 + 5400, resource_id="run-1-a1")
    led.append(L.GONE, t=t0 + 5400 + 360, resource_id="run-1-a1")
    # The same id recreated on on-demand, still running at "now".
    led.append(L.ACTIVE, t=t0 + 6000, resource_id="run-1-a1", zone="z-a", tier="on-demand", chips=64, generation="v5p")
    cost = led.summary(shipped(), now=t0 + 6000 + 1800)
    assert len(cost.slices) == 2 and cost.open_slices == 1
    assert cost.chip_hours_by_phase == pytest.approx({"running": 64 * 1.5, "preempted": 64 * 0.5, "deleting": 64 * 0.1})
    assert cost.chip_hours_by_tier == pytest.approx({"spot": 64 * 1.6, "on-demand": 64 * 0.5})
    t = shipped()
    assert cost.usd_total == pytest.approx(64 * 1.6 * t.price("v5p", "spot") + 64 * 0.5 * t.price("v5p", "on-demand"))
    assert cost.queue_seconds == 30.0
    assert led.zones() == ["z-a"]
    assert led.is_open("run-1-a1")


def test_ledger_skips_a_torn_line(tmp_path: Path) -> None:
    led = L.Ledger(Settings(state_dir=tmp_path), "run-1")
    led.claim()
    with led.path.open("a") as f:
        f.write('{"kind": "act')  # a writer killed mid-line
    assert led.owner() is not None and L.owner_alive(led.owner()) is True


def test_a_torn_line_in_the_middle_drops_nothing_after_it(tmp_path: Path) -> None:
    """A writer killed mid-line, then a new writer appending after it (the file has no newline fix-up):
    every event after the torn line still counts, so the cost is not undercounted."""
    led = L.Ledger(Settings(state_dir=tmp_path), "run-1")
    led.append("claim", t=0.0)
    with led.path.open("a") as f:
        f.write('{"kind": "act\n')  # cut short, then the next writer's first line
    led.append("later", t=5.0)
    led.append("later", t=6.0)
    assert [e["kind"] for e in led.events()] == ["claim", "later", "later"]


def test_plan_numbers_attempts_consecutively() -> None:
    from tpu_ops.provision import plan
    from tpu_ops.specs.slice import ProvisionSpec

    spec = ProvisionSpec.model_validate(
        {
            "slice": {
                "accelerator_type": "v4-32",
                "region": "us-central2",
                "zones": ["us-central2-a", "us-central2-b"],
            },
            "ladder": ["reservation:res-a@us-central2-b", "spot", "on-demand"],
            "budget_usd": 1000,
            "hours": 1,
        }
    )
    steps = [(s.number, s.tier, s.zone[-1], s.reservation) for s in plan(spec)]
    assert steps == [
        (1, "reservation", "b", "res-a"),
        (2, "spot", "a", ""),
        (3, "spot", "b", ""),
        (4, "on-demand", "a", ""),
        (5, "on-demand", "b", ""),
    ]


def test_run_cost_to_json_pins_every_figure(tmp_path: Path) -> None:
    """The stored cost document, worked out by hand: slice a (8 chips, spot) runs 1000 s, is preempted
    100 s, deleting 30 s, gone; slice b (4 chips, on-demand) runs 700 s up to now, still open. Prices
    of the shipped table: v5p spot $2.10, on-demand $4.20 per chip-hour. Rounding: 6 places for
    chip-hours, 4 for dollars, 3 for seconds."""
    led = L.Ledger(Settings(state_dir=tmp_path), "run-1")
    led.append(L.ATTEMPT, t=0.0, number=1, seconds_waited=12.3456, zone="z-a")
    led.append(L.ACTIVE, t=0.0, resource_id="r-a", zone="z-a", tier="spot", chips=8, generation="v5p")
    led.append(L.PREEMPTED, t=1000.0, resource_id="r-a")
    led.append(L.DELETE_REQUESTED, t=1100.0, resource_id="r-a")
    led.append(L.GONE, t=1130.0, resource_id="r-a")
    led.append(L.ACTIVE, t=2000.0, resource_id="r-b", zone="z-b", tier="on-demand", chips=4, generation="v5p")
    assert led.summary(shipped(), now=2700.0).to_json() == {
        "run_id": "run-1",
        "chip_hours_by_tier": {"spot": 2.511111, "on-demand": 0.777778},  # 8 x 1130 s, 4 x 700 s
        "usd_by_tier": {"spot": 5.2733, "on-demand": 3.2667},
        "chip_hours_by_phase": {"running": 3.0, "preempted": 0.222222, "deleting": 0.066667},
        "usd_total": 8.54,
        "queue_seconds": 12.346,
        "open_slices": 1,
        "price_date": shipped().date,
        "slices": [
            {"resource_id": "r-a", "zone": "z-a", "tier": "spot", "chips": 8, "open": False,
             "hours": {"running": 0.277778, "preempted": 0.027778, "deleting": 0.008333}},
            {"resource_id": "r-b", "zone": "z-b", "tier": "on-demand", "chips": 4, "open": True,
             "hours": {"running": 0.194444, "preempted": 0.0, "deleting": 0.0}},
        ],
    }  # fmt: skip
