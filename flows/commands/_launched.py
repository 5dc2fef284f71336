"""The detached process ``tpu-ops launch`` starts when no Prefect API is configured:
``python -m flows.commands._launched RUN_ID``.

It reads the launch record and the validated spec ``launch`` wrote under
``<state_dir>/launches/RUN_ID/`` and runs the spec: a train job through the supervisor (no Prefect),
a pipeline through its flow (Prefect's ephemeral server, as ``dry-run`` does), a provision spec
through the ladder (the slice is handed off: it stays until ``tpu-ops cancel`` or ``teardown``).
SIGTERM ends it through the same ``finally`` as a failure: the slice is released. How it ended goes
back into the launch record.
"""

from __future__ import annotations

import json
import signal
import sys
import time
import traceback
from types import FrameType
from typing import Any


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the supervisor's finally: the slice is released


def _train(settings: Any, record: Any, doc: dict[str, Any]) -> str:
    from tpu_ops.audit.events import AuditEvent
    from tpu_ops.run import Run
    from tpu_ops.specs import TrainJobSpec
    from tpu_ops.train.supervisor import supervise
    from tpu_ops.train.wheel import agent_wheel

    job = TrainJobSpec.model_validate(doc)
    run = Run.of_job(record.run_id, settings, job)

    def notify(event: AuditEvent, payload: dict[str, Any]) -> None:
        if event == AuditEvent.SLICE_PROVISIONED:
            # No Prefect flow run vouches for this run: a served reaper would take it for an unknown
            # run's slice. Held like a provisioned slice instead, until released, cancelled or the TTL.
            run.ledger.hand_off(str(payload["queued_resource"]))
        run.audit.record(event, params=payload)
        print(f"tpu-ops: {event.value}: {json.dumps(payload, default=str)}", flush=True)

    params = {"steps": job.train.steps, "accelerator_type": job.provision.slice.accelerator_type, "launched": True}
    try:
        with run.audit.audited(AuditEvent.TRAIN_FINISHED, params=params):
            report = supervise(job, run, wheel=agent_wheel(settings), notify=notify)
    finally:
        run.audit.digest()
    print(report.summary(), flush=True)
    return str(report.outcome)


def _pipeline(settings: Any, record: Any, doc: dict[str, Any]) -> str:
    from flows.pipeline import retraining_pipeline
    from tpu_ops.specs import PipelineSpec

    out = retraining_pipeline(PipelineSpec.model_validate(doc))
    if not isinstance(out, dict):  # a Failed state (an invalid spec): launch checked it, so rare
        raise RuntimeError(f"pipeline failed: {out}")
    return str(out.get("training", {}).get("outcome", "done"))


def _provision(settings: Any, record: Any, doc: dict[str, Any]) -> str:
    from tpu_ops.provision import provision
    from tpu_ops.provision.ledger import Ledger
    from tpu_ops.specs import ProvisionSpec

    result = provision(ProvisionSpec.model_validate(doc), record.run_id, settings).to_json()
    Ledger(settings, record.run_id).hand_off(result["queued_resource"])
    print(f"tpu-ops: slice {result['queued_resource']} up in {result['zone']} ({result['tier']}), "
          f"{result['hosts']} hosts; handed off until `tpu-ops cancel {record.run_id}`", flush=True)  # fmt: skip
    return "provisioned"


def main(run_id: str) -> int:
    from flows.settings import resolve_settings
    from tpu_ops.train import launches
    from tpu_ops.train.cancel import outcome

    signal.signal(signal.SIGTERM, _stop)
    settings = resolve_settings()
    record = launches.load(settings, run_id)
    if record is None:
        print(f"no launch record for run {run_id} under {settings.state_dir}", file=sys.stderr)
        return 2
    doc = json.loads((launches.launch_dir(settings, run_id) / "spec.json").read_text(encoding="utf-8"))
    runner = {"train-job": _train, "pipeline": _pipeline, "provision": _provision}[record.kind]
    code, result, error = 0, "", ""
    try:
        result = runner(settings, record, doc)
    except BaseException as exc:  # every way out is recorded, then the process ends
        result, error = outcome(exc), f"{type(exc).__name__}: {exc}"
        if result == "cancelled":
            print(f"tpu-ops: {exc}", flush=True)
        else:
            traceback.print_exc()
        code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 1
        code = 0 if result == "cancelled" else code
    finally:
        launches.update(settings, run_id, ended_at=time.time(), exit_code=code, outcome=result, error=error)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
