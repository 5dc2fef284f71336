"""The ``train`` flow: the training supervisor (provision → watch → recover → teardown) as one task.

The logic lives in ``tpu_ops.train.supervisor``; this module only adds Prefect: the run tag, the
quota lease, the events (``tpu-ops.slice.preempted`` / ``tpu-ops.slice.recovered``) and the
goodput table artifact. The supervisor tears down in ``finally``; the flow's hooks tear down on
failure, cancellation and crash too, and the reaper catches what a ``kill -9`` leaves.
"""

from __future__ import annotations

from typing import Any

from prefect import State, flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed

from flows.audit import emit
from flows.budget import refusal
from flows.failures import missing_buckets_named
from flows.provision import HOOKS, _quota, _tag_current_run
from flows.settings import open_run
from tpu_ops.audit.events import AuditEvent
from tpu_ops.run import Run
from tpu_ops.specs import TrainJobSpec
from tpu_ops.specs.common import RunId
from tpu_ops.train.goodput import GoodputReport


def notifier(run: Run) -> Any:
    """A ``notify`` callback: each of the supervisor's events recorded in the run's chain and emitted
    as a Prefect event on the run's resource."""

    def notify(event: AuditEvent, payload: dict[str, Any]) -> None:
        run.audit.record(event, params=payload)
        emit(event, run.id, payload)

    return notify


def goodput_artifact(report: GoodputReport) -> None:
    """The goodput report as a Prefect table: one row per preemption, the totals in the description."""
    rows = report.rows() or [{"#": "-", "reason": "no preemption"}]
    create_table_artifact(rows, key=f"goodput-{report.run_id}", description=report.summary())


@task(name="train-supervisor", cache_policy=NO_CACHE)
def supervise_task(job: TrainJobSpec, run: Run) -> dict[str, Any]:
    """One library call: supervise the run to the end (no Prefect retries: recovery is the library's)."""
    from flows.report import RecoveryLog
    from tpu_ops.provision.records import Outcome
    from tpu_ops.train.supervisor import Supervisor
    from tpu_ops.train.wheel import agent_wheel

    logger = get_run_logger()
    recovery, notify = RecoveryLog(logger.info), notifier(run)

    def on_event(event: AuditEvent, payload: dict[str, Any]) -> None:
        recovery.event(event, payload)
        notify(event, payload)

    def on_attempt(a: Any) -> None:
        recovery.attempt(a.describe())
        outcome = Outcome.audit_outcome(a.outcome)  # a stock-out is refused, not a success
        run.audit.record(AuditEvent.SLICE_PROVISION_ATTEMPT, params={"attempt": a.describe(), "outcome": a.outcome,
                                                                      "tier": a.tier, "zone": a.zone},
                         outcome=outcome, error=None if outcome == "success" else a.detail or a.outcome)  # fmt: skip

    sup = Supervisor(job, run, wheel=agent_wheel(run.settings), notify=on_event, on_attempt=on_attempt)
    params = {"steps": job.train.steps, "dataset_manifest": job.train.dataset_manifest,
              "accelerator_type": job.provision.slice.accelerator_type}  # fmt: skip
    try:
        with run.audit.audited(AuditEvent.TRAIN_FINISHED, params=params) as rec:
            report = sup.run()
            rec["params"].update({k: v for k, v in report.to_json().items()
                                  if k in ("outcome", "final_step", "wall_s", "productive_s", "goodput", "recoveries")})
            rec["subjects"].append({"uri": str(run.layout.goodput), "kind": "goodput-report"})
    finally:
        goodput_artifact(sup.report)
        logger.info(sup.report.summary())
    return report.to_json()


@flow(name="train", log_prints=True, **HOOKS)
def train(
    spec: TrainJobSpec, run_id: RunId, gcp_credentials_block: str | None = None,
    aws_credentials_block: str | None = None, inject_preemption: bool = False,
) -> dict[str, Any] | State:  # fmt: skip
    """Train ``spec.train`` on a slice from ``spec.provision``, recovering from preemptions; always torn down.

    Args:
        spec: The slice and capacity ladder (provision) and the training job (train).
        run_id: The run's id (lowercase letters, digits, '-', ≤ 40); the same id adopts or resumes that run.
        gcp_credentials_block: Name of a Prefect GcpCredentials block; empty: the environment's credentials.
        aws_credentials_block: Name of a Prefect AwsCredentials block (the audit trail's); empty: the environment's.
        inject_preemption: Local stack only: preempt the slice once after the first checkpoint, to watch the recovery.
    """
    over = refusal(spec.provision)  # before the run is opened: an over-budget spec costs nothing
    if over:
        get_run_logger().error("%s", over)
        return Failed(message=over)
    from flows.chaos import injected_preemption

    t = spec.train
    run = open_run(run_id, aws_credentials_block, gcp_credentials_block, checkpoint_dir=t.checkpoint_dir,
                   checkpoint_subdir=t.checkpoint_subdir)  # fmt: skip
    _tag_current_run(run.id)
    try:
        with injected_preemption(inject_preemption, run.settings, spec.provision, run.layout, run.id,
                                 get_run_logger().info), _quota(spec.provision), missing_buckets_named():  # fmt: skip
            return supervise_task(spec, run)
    finally:
        run.audit.digest()
