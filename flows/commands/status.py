"""``tpu-ops status [RUN] [--json]``: launched runs (and, with a Prefect API, the runs started in its UI or
on a schedule: :mod:`flows.commands._ui_runs`) with their state, step, slices and hosts alive,
cost and goodput so far (from the run state in GCS and the cost ledger, this state directory's merged with the
copy the run's supervisor publishes beside its state: :mod:`tpu_ops.train.status`, :mod:`tpu_ops.train.costs`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "status",
        help="Show runs (launched here, or started in the Prefect UI or on a schedule): state, step, slices, "
        "hosts alive, cost and goodput so far.",
        description="Without RUN: one line per run launched with this state directory (TPU_OPS_STATE_DIR, "
        "default .tpu-ops) and, with a Prefect API configured (PREFECT_API_URL), per run of the tpu-ops "
        "deployments started in the UI or on a schedule in the last 7 days (the newest 50 flow runs), newest "
        "first. With RUN: that run in detail.",
    )
    p.add_argument("run_id", nargs="?", metavar="RUN", help="a run id (without one: every run)")
    p.add_argument("--json", action="store_true", help="print JSON (an object for RUN, else a list)")
    p.set_defaults(handler=run)


# A run supervised elsewhere (a Prefect worker) that published no copy of its ledger (train.costs; an older run).
NO_LEDGER = "cost not known here (its ledger is in the state directory where its supervisor runs)"


STARTED = {"ui": "started from the Prefect UI or API", "schedule": "started on a schedule"}
"""How ``detail`` says where a run found through Prefect was started (``launches.UI``, ``SCHEDULE``)."""


def cost_phrase(s: Any) -> str:
    """``cost $X`` (to the hundredth of a cent) of a run's status, or that it is not known here."""
    return f"cost ${s.cost_usd:,.4f}{as_of(s)}" if s.cost_known else "cost not known here"


def as_of(s: Any, now: float | None = None) -> str:
    """`` (as of 12 s ago)`` when the cost is the supervisor's published copy (a run supervised elsewhere, still
    going): what happened since its last state save is not in it yet. Empty otherwise."""
    if getattr(s, "cost_as_of", None) is None:
        return ""
    age = max(0.0, (time.time() if now is None else now) - s.cost_as_of)
    return f" (as of {age:.0f} s ago)" if age < 120 else f" (as of {age / 60:.0f} min ago)"


def _money(usd: float) -> str:
    return f"${usd:,.4f}" if usd < 1 else f"${usd:,.2f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _step(s: Any) -> str:
    if s.steps is None:
        return "-"
    return f"{s.step if s.step is not None else '-'}/{s.steps}"


def detail(s: Any) -> str:
    """One run's status as text."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.launched_at))
    how = STARTED.get(s.origin, "launched")
    lines = [f"run {s.run_id} ({s.kind}, {how} {when}): {s.state}" + (f" at step {_step(s)}" if s.steps else "")]
    many = len(s.slices) > 1
    for sl in s.slices:
        hosts = f"{sl.hosts} hosts" if s.kind == "provision" else f"{sl.hosts_alive}/{sl.hosts} hosts alive"
        name = f"{sl.index} ({sl.slice_id})" if many else sl.slice_id
        how = ", repaired by Google (a new node)" if sl.repaired else ", new"
        how = ", kept from the incarnation before" if sl.kept else how
        kept = how if many and s.kind != "provision" else ""
        lines.append(f"  slice {name}: {sl.tier} in {sl.zone}, {hosts}{kept}")
    if len(s.incarnations) > 1:  # what each incarnation held: which slices were kept, which replaced
        for inc in s.incarnations:
            held = ", ".join(_held(sl) for sl in inc["slices"]) or "no slice yet"
            lines.append(f"  incarnation {inc['number']} ({inc['end'] or 'live'}): {held}")
    if not s.slices and s.state in ("starting", "provisioning", "recovering"):
        lines.append("  slice: none yet" if s.state != "recovering" else "  slice: being replaced")
    if s.preemptions:
        lines.append(f"  preemptions {s.preemptions}, recovered {s.recoveries}")
    for m in s.moves:  # voluntary moves at checkpoints (docs/moves.md)
        lines.append(f"  move {m['number']} at step {m['checkpoint']}: {m['from']} -> {m['to']}, {m['phase']}"
                     + (f" ({m['overlap_s']:g} s both held)" if m["phase"] == "moved" else "") + f": {m['why']}")
    billing = f"cost so far {_money(s.cost_usd)} ({s.open_slices} slice(s) billing){as_of(s)}"
    cost = (f"cost {_money(s.cost_usd)}" if s.ended and not s.open_slices else billing) if s.cost_known else NO_LEDGER
    lines.append(f"  {cost}; goodput {_pct(s.goodput)}" + (f" of {s.wall_s:.0f} s" if s.wall_s else ""))
    if s.usd_per_million_tokens is not None:
        lines.append(f"  ${s.usd_per_million_tokens:,.2f} per million tokens; MFU {_pct(s.mfu)}")
    if s.ui_url:
        lines.append(f"  UI: {s.ui_url}")
    elif s.supervisor_pid:
        where = {True: ", running on this machine", False: ", exited"}.get(s.supervisor_alive, "")
        lines.append(f"  supervisor: pid {s.supervisor_pid}{where}")
    if s.state == "cancelled" and s.cancelled_by:
        lines.append(f"  cancelled by {s.cancelled_by}")
    if s.error:
        lines.append(f"  error: {s.error}")
    return "\n".join(lines)


def _held(sl: dict[str, Any]) -> str:
    hosts = f", {sl['hosts']} hosts" if sl["hosts"] else ""
    how = ", kept" if sl["kept"] else ", repaired" if sl.get("repaired") else ""
    return f"slice {sl['index']} {sl['resource_id']} ({sl['tier']}{hosts}{how})"


def table(rows: list[Any]) -> str:
    """One line per run."""
    head = ("RUN", "KIND", "FROM", "STATE", "STEP", "SLICES", "HOSTS", "COST", "GOODPUT")
    body = [(s.run_id, s.kind, s.origin or "-", s.state, _step(s), str(len(s.slices)),
             f"{s.hosts_alive}/{sum(sl.hosts for sl in s.slices)}" if s.slices else "-",
             _money(s.cost_usd) if s.cost_known else "-", _pct(s.goodput)) for s in rows]  # fmt: skip
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [head, *body])


def run(args: argparse.Namespace) -> int:
    from flows.commands._common import shell_settings
    from flows.commands._runs import find, flow_run_end, gcs
    from tpu_ops.train import launches
    from tpu_ops.train.status import run_status

    settings = shell_settings()
    if args.run_id:
        record = find(settings, args.run_id)
        s = run_status(settings, record, gcs(settings), flow_run=flow_run_end(record))
        print(json.dumps(s.to_json(), indent=2) if args.json else detail(s))
        return 0
    records = launches.every(settings)
    ui, asked = _ui_records(records)
    client = gcs(settings) if records or ui else None
    rows = [_status(settings, r, client) for r in records]
    rows += [_status(settings, r, client, end) for r, end in ui]
    rows.sort(key=lambda s: s.launched_at, reverse=True)
    if args.json:
        print(json.dumps([s.to_json() for s in rows], indent=2))
    elif not rows:
        also = f" nor started from the tpu-ops deployments at {asked} in the last 7 days" if asked else ""
        print(f"no runs launched with state directory {settings.state_dir}{also} (tpu-ops launch SPEC starts one)")
    else:
        print(table(rows))
    return 0


def _ui_records(local: list[Any]) -> tuple[list[tuple[Any, tuple[str, str] | None]], str]:
    """The recent runs of the tpu-ops deployments with no launch record here (started in the UI or on a
    schedule), each with how its flow run ended, and the API's URL if it answered; none without a Prefect
    API, one line on stderr if it does not answer."""
    from flows.commands import _ui_runs

    url = _ui_runs.api_url()
    if not url:
        return [], ""
    try:
        found = _ui_runs.recent()
    except _ui_runs.Unreachable as exc:
        print(f"runs started in the Prefect UI or on a schedule not listed: the Prefect API at {url} did not "
              f"answer ({exc})", file=sys.stderr)  # fmt: skip
        return [], ""
    known = {r.run_id for r in local} | {r.flow_run_id for r in local if r.flow_run_id}
    return [(r, end) for r, end in found if r.run_id not in known and r.flow_run_id not in known], url


def _status(settings: Any, record: Any, client: Any, end: Any = ...) -> Any:
    """The run's status (``end``: how its flow run ended, when already known); when its state cannot be
    read (a stack long gone), a row saying so."""
    from flows.commands._runs import flow_run_end
    from tpu_ops.errors import TpuOpsError
    from tpu_ops.train.status import RunStatus, run_status

    try:
        return run_status(settings, record, client, flow_run=flow_run_end(record) if end is ... else end)
    except TpuOpsError as exc:
        return RunStatus(record.run_id, record.kind, record.mode, "unknown", record.launched_at, error=str(exc))
