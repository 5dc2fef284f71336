"""``tpu-ops cancel RUN``: stop a launched run, tear down everything it holds, and audit it.

1. Ask the run to stop: its Prefect flow run is cancelled (when it has one; the flow's hooks tear
   down); else, or if it has not stopped within a minute, the cancel marker ``RUN/_tpu_ops/CANCEL``
   tells the supervisor to end the run at its next poll (slice released, report written, outcome
   ``cancelled``) wherever it runs.
2. Wait (``--wait``, bounded) for the supervisor to end; a detached one still running then (it may be
   inside a long provisioning wait) gets SIGTERM, which also unwinds through its teardown.
3. The run's teardown on every control plane, confirmed gone (what ``tpu-ops teardown`` does).
4. One ``run.cancelled`` record in the run's audit chain: who, what was torn down.

A run that already ended (done, failed, cancelled, gone) is left as it is: only step 3 runs.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import signal
import socket
import time
from typing import Any
from uuid import UUID

KILL_WAIT_S = 30.0
PREFECT_WAIT_S = 60.0  # a flow run not stopped by then (its runner gone?) gets the cancel marker too


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("cancel", help="Stop a launched run, tear down its slices, audit it.")
    p.add_argument("run_id", metavar="RUN", help="a run id (`tpu-ops status` lists them)")
    p.add_argument("--wait", type=_seconds, default=120.0, metavar="S",
                   help="seconds the supervisor has to stop by itself before it is signalled (120)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    p.set_defaults(handler=run)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: seconds from 0 to 3600")
    return value


def _cancel_flow_run(flow_run_id: str) -> str:
    """Ask Prefect to cancel the flow run; the state it was in."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelling

    with get_client(sync_client=True) as client:
        fr = client.read_flow_run(UUID(flow_run_id))
        state = fr.state.type.value if fr.state else "?"
        if fr.state is None or not fr.state.is_final():
            client.set_flow_run_state(UUID(flow_run_id), Cancelling(message="tpu-ops cancel"), force=True)
        return str(state)


def _flow_run_final(flow_run_id: str) -> bool:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        fr = client.read_flow_run(UUID(flow_run_id))
    return bool(fr.state is not None and fr.state.is_final())


def _stopped(record: Any) -> bool:
    from tpu_ops.train.launches import PREFECT

    if record.mode == PREFECT and record.flow_run_id:
        return _flow_run_final(record.flow_run_id)
    return record.supervisor_alive() is not True


def _wait(settings: Any, run: Any, seconds: float) -> Any:
    """``run``'s record once it stopped (None if not within ``seconds``); re-read from this state directory
    when it has one (a run started in the UI has none: its flow run says)."""
    from tpu_ops.polling import poll
    from tpu_ops.train import launches

    run_id = run.run_id

    def check() -> Any:
        record = launches.load(settings, run_id) or run
        return record if _stopped(record) else None

    try:
        return poll(check, timeout_s=max(seconds, 0.01), interval_s=0.5, max_interval_s=2.0,
                    what=f"run {run_id} to stop")  # fmt: skip
    except TimeoutError:
        return None


def _gone(report: Any) -> list[str]:
    """What a teardown deleted, one ``kind id (zone)`` each."""
    return [f"{r.kind} {r.resource_id} ({r.zone})" for r in report.deleted]


def _published(settings: Any, record: Any, client: Any, report: Any) -> Any:
    """``report``; what this teardown deleted (its GONE events, in this state directory's ledger) added to the
    copy of the run's ledger its supervisor publishes, so that status elsewhere counts it too (train.costs)."""
    if report.deleted and record.layout is not None:
        from tpu_ops.provision.ledger import Ledger
        from tpu_ops.train.costs import publish_merged

        publish_merged(client, record.layout, Ledger(settings, record.run_id))
    return report


def _ended(args: argparse.Namespace, record: Any, before: Any, report: Any) -> int:
    """A run that already ended is not cancelled (its outcome and audit chain stay as they are); its teardown
    still confirms nothing of it is left."""
    gone = _gone(report)
    at = f" at step {before.step}" if before.step is not None else ""
    if args.json:
        out = {"run_id": record.run_id, "state": before.state, "already_ended": True, "step": before.step,
               "torn_down": gone, "confirmed_gone": report.confirmed_gone}  # fmt: skip
        print(json.dumps(out, indent=2, default=str))
    else:
        print(f"run {record.run_id} already ended ({before.state}{at}): nothing to cancel; torn down: "
              f"{', '.join(gone) or 'nothing left to delete'}; confirmed gone in {report.seconds:.1f}s")  # fmt: skip
    return 0


def run(args: argparse.Namespace) -> int:
    from flows.commands._common import shell_settings
    from flows.commands._runs import find, gcs
    from flows.commands.status import cost_phrase
    from tpu_ops.audit.events import AuditEvent
    from tpu_ops.provision import teardown
    from tpu_ops.run import Run
    from tpu_ops.train import cancel, launches
    from tpu_ops.train.status import ENDED, run_status

    settings = shell_settings()
    record = find(settings, args.run_id)
    client = gcs(settings)
    before = run_status(settings, record, client)
    if before.state in ENDED:  # nothing to stop: no cancel marker, no flow-run change, no run.cancelled record
        report = teardown(record.run_id, settings, zones=record.zones or None)
        return _ended(args, record, before, _published(settings, record, client, report))
    by = f"{getpass.getuser()}@{socket.gethostname()}"
    if launches.update(settings, record.run_id, cancelled_at=time.time(), cancelled_by=by) is None:
        record.cancelled_at, record.cancelled_by = time.time(), by  # started in the UI: no record here to keep it
    stopped, how = None, "had already exited"
    if record.flow_run_id:  # Prefect stops its flow run (the run page then says Cancelled, not Failed)
        _cancel_flow_run(record.flow_run_id)
        stopped, how = _wait(settings, record, min(args.wait, PREFECT_WAIT_S)), "cancelled by Prefect"
    if stopped is None and record.layout is not None:  # the supervisor's own way out, wherever it runs
        cancel.request(client, record.layout, reason=f"tpu-ops cancel by {by}")
        stopped, how = _wait(settings, record, args.wait), "stopped by itself"
    if stopped is None and record.pid and record.supervisor_alive():
        how = _signal(settings, record)
    report = _published(settings, record, client, teardown(record.run_id, settings, zones=record.zones or None))
    if stopped is not None and record.mode == launches.PREFECT and not record.outcome:
        # No detached process records a flow run's end here: status reads this once neither Prefect nor
        # the run state answers (a local stack started anew), instead of 'cancelling' for ever.
        saved = launches.update(settings, record.run_id, outcome=cancel.CANCELLED)
        record.outcome = cancel.CANCELLED if saved is None else record.outcome  # started in the UI: no record here
    after = run_status(settings, launches.load(settings, record.run_id) or record, client)
    gone = _gone(report)
    params = {"state_before": before.state, "step": after.step, "supervisor": how,
              "cost_usd": after.cost_usd if after.cost_known else None,
              "torn_down": gone, "confirmed_gone": report.confirmed_gone, "by": by}  # fmt: skip
    Run(record.run_id, settings).audit.record(AuditEvent.RUN_CANCELLED, params=params)
    out = {"run_id": record.run_id, "state": after.state, **params}
    text = (f"run {record.run_id} cancelled (was {before.state}"
            + (f", at step {after.step}" if after.step is not None else "") + f"); supervisor {how}; "
            f"torn down: {', '.join(gone) or 'nothing left to delete'}; confirmed gone in {report.seconds:.1f}s; "
            + cost_phrase(after))  # fmt: skip
    print(json.dumps(out, indent=2, default=str) if args.json else text)
    return 0


def _signal(settings: Any, record: Any) -> str:
    """SIGTERM the detached supervisor's process group (it tears down on the way out); SIGKILL if it hangs."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(record.pid, signal.SIGTERM)
    if _wait(settings, record, KILL_WAIT_S) is not None:
        return "stopped on SIGTERM"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(record.pid, signal.SIGKILL)
    return "killed (SIGKILL)"
