"""The ``train`` flow: the training supervisor (provision → watch → recover → teardown) as one task.

The logic lives in ``tpu_ops.train.supervisor``; this module only adds Prefect: the run tag, the
quota lease, the events (``tpu-ops.slice.preempted`` / ``tpu-ops.slice.recovered``) and the
goodput table artifact. The supervisor tears down in ``finally``; the flow's hooks tear down on
failure, cancellation and crash too, and the reaper catches what a ``kill -9`` leaves.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact

from flows.audit import audit_digest, audit_event, audited
from flows.provision import HOOKS, _quota, _tag_current_run
from flows.settings import resolve_settings
from tpu_ops.layout import check_run_id
from tpu_ops.specs import TrainJobSpec
from tpu_ops.specs.common import RunId
from tpu_ops.train.goodput import GoodputReport
from tpu_ops.train.layout import RunLayout


def emit(run_id: str) -> Any:
    """A ``notify`` callback that emits the supervisor's events as Prefect events on the run's resource."""
    from prefect.events import emit_event

    def notify(name: str, payload: dict[str, Any]) -> None:
        audit_event(name.removeprefix("tpu-ops."), run_id, params=payload)
        emit_event(event=name, resource={"prefect.resource.id": f"tpu-ops.run.{run_id}"}, payload=payload)

    return notify


def goodput_artifact(report: GoodputReport) -> None:
    """The goodput report as a Prefect table: one row per preemption, the totals in the description."""
    rows = report.rows() or [{"#": "-", "reason": "no preemption"}]
    create_table_artifact(rows, key=f"goodput-{report.run_id}", description=report.summary())


@task(name="train-supervisor")
def supervise_task(job: TrainJobSpec, run_id: str, gcp_credentials_block: str | None = None) -> dict[str, Any]:
    """One library call: supervise the run to the end (no Prefect retries: recovery is the library's)."""
    from flows.report import RecoveryLog
    from tpu_ops.train.supervisor import Supervisor
    from tpu_ops.train.wheel import agent_wheel

    logger = get_run_logger()
    settings = resolve_settings(gcp_credentials_block=gcp_credentials_block)
    recovery, notify = RecoveryLog(logger.info), emit(run_id)

    def on_event(name: str, payload: dict[str, Any]) -> None:
        recovery.event(name, payload)
        notify(name, payload)

    def on_attempt(a: Any) -> None:
        recovery.attempt(a.describe())
        audit_event("slice.provision_attempt", run_id, params={"attempt": a.describe(), "outcome": a.outcome,
                                                                "tier": a.tier, "zone": a.zone})  # fmt: skip

    sup = Supervisor(job, run_id, settings, wheel=agent_wheel(settings), notify=on_event, on_attempt=on_attempt)
    params = {"steps": job.train.steps, "dataset_manifest": job.train.dataset_manifest,
              "accelerator_type": job.provision.slice.accelerator_type}  # fmt: skip
    try:
        with audited("train.finished", run_id, params=params, settings=settings) as rec:
            report = sup.run()
            rec["params"].update({k: v for k, v in report.to_json().items()
                                  if k in ("outcome", "final_step", "wall_s", "productive_s", "goodput", "recoveries")})
            rec["subjects"].append({"uri": str(RunLayout.of(job.train.checkpoint_dir, run_id).goodput),
                                    "kind": "goodput-report"})  # fmt: skip
    finally:
        goodput_artifact(sup.report)
        logger.info(sup.report.summary())
    return report.to_json()


@flow(name="train", log_prints=True, **HOOKS)
def train(spec: TrainJobSpec, run_id: RunId, gcp_credentials_block: str | None = None) -> dict[str, Any]:
    """Train ``spec.train`` on a slice from ``spec.provision``, recovering from preemptions; always torn down.

    Args:
        spec: The slice and capacity ladder (provision) and the training job (train).
        run_id: The run's id (lowercase letters, digits, '-', ≤ 40); the same id adopts or resumes that run.
        gcp_credentials_block: Name of a Prefect GcpCredentials block; empty: the environment's credentials.
    """
    check_run_id(run_id)
    _tag_current_run(run_id)
    try:
        with _quota(spec.provision):
            return supervise_task(spec, run_id, gcp_credentials_block)
    finally:
        audit_digest(run_id)
