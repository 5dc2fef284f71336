"""The retraining pipeline as one Prefect flow: mirror → train (supervisor) → tear down.

The training step is the supervisor (``flows.train.supervise_task``): it provisions through the
capacity ladder, runs the job on every worker (each worker first verifies the pinned snapshot,
then resumes from the newest complete checkpoint), recovers from preemptions, and tears down.
Export and the audit digest follow on ``main`` once they land.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from flows.mirror import mirror_dataset
from flows.provision import HOOKS, _quota, _tag_current_run, teardown_task
from flows.settings import resolve_settings
from flows.train import supervise_task
from tpu_ops.provision.ledger import ATTEMPT, Ledger
from tpu_ops.provision.prices import load as load_prices
from tpu_ops.provision.records import Attempt
from tpu_ops.runs import collect_reports
from tpu_ops.specs import PipelineSpec, TrainJobSpec
from tpu_ops.specs.common import RunId
from tpu_ops.train.layout import RunLayout


def new_run_id(name: str, now: datetime | None = None) -> str:
    """``<name>-<yymmdd>-<hhmmss>``, within the 40 characters a run id may have."""
    stamp = (now or datetime.now(UTC)).strftime("%y%m%d-%H%M%S")
    return f"{name[:26].rstrip('-')}-{stamp}"


@task(name="workers-verified")
def workers_verified(run_uri: str, hosts: int, gcp_credentials_block: str | None) -> list[dict[str, Any]]:
    """Every worker's pre-flight report of the snapshot (written before its first training step)."""
    out = str(RunLayout(run_uri).state("preflight"))
    return collect_reports(resolve_settings(gcp_credentials_block=gcp_credentials_block), out, hosts, 30.0)


def _attempts(ledger: Ledger) -> list[str]:
    fields = Attempt.__dataclass_fields__
    return [Attempt(**{k: e[k] for k in fields if k in e}).describe() for e in ledger.events() if e["kind"] == ATTEMPT]


@flow(name="retraining-pipeline", log_prints=True, **HOOKS)
def retraining_pipeline(
    spec: PipelineSpec,
    run_id: RunId | None = None,
    aws_credentials_block: str | None = None,
    gcp_credentials_block: str | None = None,
) -> dict[str, Any]:
    """Mirror the dataset, train on a slice through preemptions from the pinned snapshot, tear down."""
    logger = get_run_logger()
    run_id = run_id or spec.run_id or new_run_id(spec.name)
    _tag_current_run(run_id)
    snapshot = mirror_dataset(spec.mirror, aws_credentials_block, gcp_credentials_block)
    job = TrainJobSpec(provision=spec.provision, train=spec.train.model_copy(
        update={"dataset_manifest": snapshot.manifest_uri}))  # fmt: skip
    run_uri = RunLayout.of(spec.train.checkpoint_dir, run_id).run_uri
    hosts = spec.provision.slice.accelerator.hosts
    try:
        with _quota(spec.provision):
            training = supervise_task(job, run_id, gcp_credentials_block)
        reports = workers_verified(run_uri, hosts, gcp_credentials_block)
    finally:
        gone = teardown_task(run_id, list(spec.provision.slice.zones), gcp_credentials_block)
        logger.info("teardown: %d resources deleted, confirmed gone", len(gone.deleted))
    settings = resolve_settings(aws_credentials_block, gcp_credentials_block)
    ledger = Ledger(settings, run_id)
    last = training["incarnations"][-1] if training["incarnations"] else {}
    summary: dict[str, Any] = {
        "run_id": run_id,
        "snapshot_id": snapshot.snapshot_id,
        "manifest": snapshot.manifest_uri,
        "objects_copied": snapshot.objects_copied,
        "objects_skipped": snapshot.objects_skipped,
        "slice": {
            "queued_resource": last.get("queued_resource"),
            "zone": last.get("zone"),
            "tier": last.get("tier"),
            "hosts": hosts,
        },
        "attempts": _attempts(ledger),
        "workers_verified": len({r["worker_number"] for r in reports}),
        "training": {
            k: training[k]
            for k in ("outcome", "final_step", "steps", "wall_s", "productive_s", "goodput", "recoveries")
        },
        "preemptions": training["preemptions"],
        "checkpoints": run_uri,
        "cost": ledger.summary(load_prices(settings)).to_json(),
    }
    t = summary["training"]
    create_markdown_artifact(
        key="pipeline-summary",
        markdown="\n".join(
            [
                f"# Run `{run_id}`",
                "",
                f"- snapshot `{snapshot.snapshot_id}` ({snapshot.manifest_uri}), verified by "
                f"{summary['workers_verified']} workers",
                f"- trained to step {t['final_step']}/{t['steps']} through {t['recoveries']} preemption(s); "
                f"goodput {t['goodput']:.1%} ({t['productive_s']:.1f} s productive of {t['wall_s']:.1f} s)",
                f"- last slice: {summary['slice']}",
                f"- ladder: {'; '.join(summary['attempts'])}",
                f"- cost: {summary['cost']['usd_by_tier']} (total ${summary['cost']['usd_total']})",
            ]
        ),
    )
    return summary
