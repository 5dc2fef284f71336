"""The ledger file itself, against what mutation testing of ``provision/ledger.py`` left alive
(docs/mutation-testing.md): where it lives, the exact line an event becomes, its mode, a stamp
when none is given, the owner, the open and handed-off slices, whose process is alive, and the
total's rounding. No cloud, no server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpu_ops.provision import ledger as L
from tpu_ops.provision.prices import shipped
from tpu_ops.settings import Settings


def ledger(tmp_path: Path) -> L.Ledger:
    return L.Ledger(Settings(state_dir=tmp_path / "state" / "deep"), "run-1")


def test_the_file_lives_under_the_state_dir_and_is_created_with_its_parents(tmp_path: Path) -> None:
    led = ledger(tmp_path)
    assert led.path == tmp_path / "state" / "deep" / "ledger" / "run-1.jsonl"
    old = os.umask(0o022)
    try:
        led.append(L.ACTIVE, t=1.5, resource_id="r-a", chips=8, at=Path("/x"))
    finally:
        os.umask(old)
    assert led.path.stat().st_mode & 0o777 == 0o644
    # one line, keys sorted, the run's id in it, what JSON cannot hold written as text
    assert led.path.read_bytes() == (
        b'{"at": "/x", "chips": 8, "kind": "active", "resource_id": "r-a", "run_id": "run-1", "t": 1.5}\n'
    )


def test_an_event_without_a_time_is_stamped_now(tmp_path: Path) -> None:
    led = ledger(tmp_path)
    before = time.time()
    led.append(L.ATTEMPT, seconds_waited=1.0)
    (event,) = led.events()
    assert before <= event["t"] <= time.time()


def test_the_owner_is_the_last_claim_and_none_before_any(tmp_path: Path) -> None:
    led = ledger(tmp_path)
    assert led.owner() is None
    led.append(L.OWNER, t=1.0, host="h1", pid=1)
    led.append(L.OWNER, t=2.0, host="h2", pid=2)
    assert (led.owner() or {})["host"] == "h2"


def test_a_slice_is_open_from_active_until_gone_whatever_the_others_do(tmp_path: Path) -> None:
    led = ledger(tmp_path)
    assert not led.is_open("r-a")  # never seen
    led.append(L.ACTIVE, t=1.0, resource_id="r-a")
    led.append(L.ACTIVE, t=2.0, resource_id="r-b")
    led.append(L.GONE, t=3.0, resource_id="r-b")
    assert led.is_open("r-a") and not led.is_open("r-b")
    led.append(L.GONE, t=4.0, resource_id="r-a")
    assert not led.is_open("r-a")


def test_a_handed_off_slice_is_held_until_its_teardown(tmp_path: Path) -> None:
    led = ledger(tmp_path)
    assert not led.handed_off()
    led.append(L.ACTIVE, t=1.0, resource_id="r-a")
    assert not led.handed_off()  # billing, but still the provisioning process's
    led.hand_off("r-a")
    led.hand_off("r-b")
    assert led.handed_off()
    assert [e["resource_id"] for e in led.events() if e["kind"] == L.HANDOFF] == ["r-a", "r-b"]
    led.append(L.DELETE_REQUESTED, resource_id="r-a")
    assert led.handed_off()  # r-b is still out there
    led.append(L.GONE, resource_id="r-b")
    assert not led.handed_off()


def test_whose_process_is_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    here = socket.gethostname()
    assert L.owner_alive(None) is None and L.owner_alive({}) is None
    assert L.owner_alive({"host": "elsewhere", "pid": os.getpid()}) is None  # unknowable from here
    assert L.owner_alive({"host": here, "pid": os.getpid()}) is True
    assert L.owner_alive({"host": here, "pid": "not a pid"}) is None
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    assert L.owner_alive({"host": here, "pid": int(done.stdout)}) is False  # exited and reaped

    def not_yours(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")  # another user's process: it exists

    monkeypatch.setattr(os, "kill", not_yours)
    assert L.owner_alive({"host": here, "pid": 1}) is True


def test_the_total_is_rounded_to_4_places(tmp_path: Path) -> None:
    """1 chip of v5p spot ($2.10/chip-hour) for 1000 s: $0.583333... stored as 0.5833."""
    led = ledger(tmp_path)
    led.append(L.ACTIVE, t=0.0, resource_id="r-a", tier="spot", chips=1, generation="v5p")
    led.append(L.GONE, t=1000.0, resource_id="r-a")
    doc = led.summary(shipped(), now=5000.0).to_json()
    assert (doc["usd_total"], doc["usd_by_tier"]) == (0.5833, {"spot": 0.5833})
    assert json.loads(json.dumps(doc)) == doc
