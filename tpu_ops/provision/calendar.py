"""The calendar rung: a calendar-mode (future) reservation's window, and whether the ladder waits for it.

A ``calendar`` rung names a future reservation in calendar mode (Google: "Create a future reservation
request in calendar mode"; booking one commits money, so tpu-ops only consumes them: its owner may
cancel one before it is provisioned, tpu-ops never does). Its window
is read from Compute Engine. Before the window opens the ladder says when it opens (a ledger event
``calendar`` and a log line) and either waits for it, if it opens before the overall timeout and the
spec's ``choose.finish_by``, or walks on to the next rung. A window that has ended, or a reservation
that does not exist, is a rung that cannot be served: the ladder walks on at once.

Google reviews a submitted request (``status.procurementStatus`` PENDING_APPROVAL, then APPROVED or
DECLINED) and one approved may still be FAILED when its window opens ("No additional reservations
were provided"). A request Google declined or failed is a refusal of the rung, as a stock-out is
(outcome ``stockout``, the ledger event with ``decision: refused``), seen at the gate or, while the
ladder waits for the window, at each poll (:func:`recheck`): it is never waited on. The compute.v1
``FutureReservationStatus`` has no field saying why, so the message says what the status means.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from tpu_ops.errors import TransientError
from tpu_ops.provision import ledger as L
from tpu_ops.provision.records import Outcome
from tpu_ops.tiers import Tier

if TYPE_CHECKING:
    from tpu_ops.specs.slice import ProvisionSpec

log = logging.getLogger(__name__)

CALENDAR: Final = "calendar"  # the ledger event
# procurementStatus after which the request delivers nothing -> (Google's refusal?, what it means)
REFUSALS: Final = {
    "DECLINED": (True, "Google rejected the request at review (the API gives no reason); it will deliver nothing"),
    "FAILED": (True, "the request failed: Compute Engine provided no reservation for its window"),
    "CANCELLED": (False, "the request was cancelled; it will deliver nothing"),
    "DRAFTING": (False, "the request is a draft that was never submitted"),
}


@dataclass(frozen=True)
class CalendarWindow:
    """A calendar-mode reservation as the ladder needs it (epoch seconds; None if the API gave none)."""

    name: str
    zone: str
    start: float | None
    end: float | None
    mode: str  # CALENDAR | DEFAULT
    status: str  # procurementStatus
    reservation: str  # the reservation it creates for its window ("" before Google names it)
    generation: str = ""  # TPU generation it reserves ("" if not a TPU)
    chips: int = 0

    def opens_in(self, now: float) -> float:
        return max(0.0, (self.start or 0.0) - now)

    def is_open(self, now: float) -> bool:
        return (self.start or 0.0) <= now < (self.end or float("inf"))

    def ended(self, now: float) -> bool:
        return self.end is not None and now >= self.end

    @property
    def refusal(self) -> str:
        """Why the request will deliver nothing, naming it and its status ("" while it may)."""
        if self.status not in REFUSALS:
            return ""
        return f"calendar reservation {self.name!r} in {self.zone} is {self.status}: {REFUSALS[self.status][1]}"


# ``aggregateReservation.vmFamily`` -> TPU generation (the compute.v1 discovery document's enum)
FAMILIES: Final = {
    "VM_FAMILY_CLOUD_TPU_POD_SLICE_CT5P": "v5p",
    "VM_FAMILY_CLOUD_TPU_LITE_POD_SLICE_CT6E": "v6e",
    "VM_FAMILY_CLOUD_TPU_POD_SLICE_TPU7X": "tpu7x",
    "VM_FAMILY_CLOUD_TPU_LITE_POD_SLICE_CT5LP": "v5e",
    "VM_FAMILY_CLOUD_TPU_POD_SLICE_CT4P": "v4",
}
# machine type prefix -> TPU generation (its chips per VM end the name: ``ct5p-hightpu-4t``)
MACHINE_PREFIXES: Final = {"ct5p-": "v5p", "ct6e-": "v6e", "tpu7x-": "tpu7x"}


def reserved(machine_type: str, count: int, vm_family: str) -> tuple[str, int]:
    """(generation, chips) a future reservation holds: ``count`` VMs of ``machine_type``, or
    ``count`` chips of ``vm_family`` (an aggregate reservation)."""
    if vm_family:
        return FAMILIES.get(vm_family, ""), count
    gen = next((g for p, g in MACHINE_PREFIXES.items() if machine_type.startswith(p)), "")
    per_vm = machine_type.rsplit("-", 1)[-1].removesuffix("t")
    return gen, count * int(per_vm) if gen and per_vm.isdigit() else 0


def rows(spec: ProvisionSpec, windows: list[CalendarWindow], now: float | None = None) -> list[dict[str, Any]]:
    """The calendar-mode reservations of the spec's zones, each with whether the spec could use it."""
    now = time.time() if now is None else now
    acc = spec.slice.accelerator
    named = {(r.short_name, r.zone) for r in spec.ladder if r.kind == Tier.CALENDAR}
    out = []
    for w in sorted(windows, key=lambda w: (w.start or 0.0, w.zone, w.name)):
        if w.mode != "CALENDAR" or w.zone not in spec.slice.zones:
            continue
        if w.refusal:
            use = f"no: {w.status}"
        elif w.ended(now):
            use = "no: ended"
        elif w.generation != acc.generation:
            use = f"no: {w.generation or 'not TPU'}, not {acc.generation}"
        elif w.chips < acc.chips:
            use = f"no: {w.chips} chips < {acc.chips}"
        else:
            use = "yes, open now" if w.is_open(now) else f"yes, opens in {w.opens_in(now) / 3600:.1f} h"
        out.append({"name": w.name, "zone": w.zone, "opens": when(w.start), "ends": when(w.end), "status": w.status,
                    "chips": w.chips, "generation": w.generation, "usable": use,
                    "in ladder": "yes" if (w.name, w.zone) in named else "no"})  # fmt: skip
    return out


def when(t: float | None) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%SZ") if t is not None else "?"


@dataclass(frozen=True)
class Gate:
    """What the ladder does at a calendar step: go ahead (waiting ``wait_s`` for the window) or walk on."""

    go: bool
    wait_s: float = 0.0
    reason: str = ""
    late: bool = False  # walks on because the window opens too late (not because it cannot be served)
    refused: bool = False  # walks on because Google declined or failed the request

    @property
    def outcome(self) -> str:
        """The attempt's outcome when the gate walks on."""
        return Outcome.TIMEOUT if self.late else Outcome.STOCKOUT if self.refused else Outcome.FAILED


def gate(
    window: CalendarWindow | None,
    name: str,
    zone: str,
    *,
    left_s: float,
    finish_by: float | None,
    ledger: L.Ledger,
    attempt: int,
    now: float | None = None,
) -> Gate:
    """Decide a calendar step. ``left_s``: seconds to the overall timeout; ``finish_by``: epoch or None."""
    now = time.time() if now is None else now
    if window is None:
        return Gate(False, reason=f"calendar reservation {name!r} not found in {zone}")
    if window.mode != "CALENDAR":
        return Gate(False, reason=f"future reservation {name!r} is not in calendar mode ({window.mode})")
    if window.refusal:
        return _refuse(window, ledger, attempt)
    if window.ended(now):
        return Gate(False, reason=f"calendar reservation {name!r} ended at {when(window.end)}")
    opens_in = window.opens_in(now)
    if opens_in <= 0:
        return Gate(True)
    limits = [("the overall timeout", left_s)]
    if finish_by is not None:
        limits.append(("finish_by", finish_by - now))
    late = [what for what, s in limits if opens_in >= s]
    decision = f"walk on: it opens after {' and '.join(late)}" if late else "wait for it"
    ledger.append(CALENDAR, attempt=attempt, reservation=name, zone=zone, opens_at=window.start, ends_at=window.end,
                  opens_in_s=round(opens_in, 1), decision="walk-on" if late else "wait")  # fmt: skip
    log.warning("calendar reservation %s in %s opens at %s (in %.0f s), ends at %s: %s", name, zone,
                when(window.start), opens_in, when(window.end), decision)  # fmt: skip
    if late:
        return Gate(False, reason=f"calendar reservation {name!r} opens at {when(window.start)}, after {late[0]}",
                    late=True)  # fmt: skip
    return Gate(True, wait_s=opens_in)


def step_gate(provider: Any, spec: ProvisionSpec, zone: str, name: str, attempt: int, deadline_mono: float,
              ledger: L.Ledger) -> Gate:  # fmt: skip
    """The gate of a calendar step of ``spec``, its window read through ``provider.calendar_window``."""
    read = getattr(provider, "calendar_window", None)
    if read is None:
        return Gate(False, reason=f"backend {getattr(provider, 'name', '?')!r} has no calendar reservations")
    finish_by = spec.choose.finish_by.timestamp() if spec.choose is not None and spec.choose.finish_by else None
    return gate(read(zone, name), name, zone, left_s=deadline_mono - time.monotonic(), finish_by=finish_by,
                ledger=ledger, attempt=attempt)  # fmt: skip


def _refuse(window: CalendarWindow, ledger: L.Ledger, attempt: int) -> Gate:
    """Walk on from a request that will deliver nothing: said in the ledger and the log."""
    ledger.append(CALENDAR, attempt=attempt, reservation=window.name, zone=window.zone, opens_at=window.start,
                  ends_at=window.end, status=window.status, decision="refused")  # fmt: skip
    log.warning("%s: walking on", window.refusal)
    return Gate(False, reason=window.refusal, refused=REFUSALS[window.status][0])


def recheck(provider: Any, zone: str, name: str, ledger: L.Ledger, attempt: int) -> Gate | None:
    """While the ladder waits for a window: the gate that walks on if Google has since declined or
    failed the request, else None (also when it cannot be read this time: the next poll reads again)."""
    try:
        window = provider.calendar_window(zone, name)
    except TransientError:
        return None
    return _refuse(window, ledger, attempt) if window is not None and window.refusal else None
