"""The retraining pipeline as one Prefect flow: mirror → provision → run on every worker → tear down.

Training, export and the audit trail are not built yet; today every worker of the slice runs the
pre-flight agent, which proves that the snapshot it will read is exactly the pinned manifest.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from flows.mirror import mirror_dataset
from flows.provision import HOOKS, _quota, _tag_current_run, provision_task, teardown_task
from flows.settings import resolve_settings
from tpu_ops.provision.ledger import Ledger
from tpu_ops.provision.prices import load as load_prices
from tpu_ops.runs import collect_reports, preflight_uri, run_uri
from tpu_ops.specs import PipelineSpec
from tpu_ops.specs.common import RunId
from tpu_ops.startup import render_startup_script


def new_run_id(name: str, now: datetime | None = None) -> str:
    """``<name>-<yymmdd>-<hhmmss>``, within the 40 characters a run id may have."""
    stamp = (now or datetime.now(UTC)).strftime("%y%m%d-%H%M%S")
    return f"{name[:26].rstrip('-')}-{stamp}"


@task(name="wait-for-workers")
def wait_for_workers(
    out_uri: str, hosts: int, timeout_s: float, gcp_credentials_block: str | None
) -> list[dict[str, Any]]:
    """Every worker's pre-flight report (fails if one is missing or found a difference)."""
    return collect_reports(resolve_settings(gcp_credentials_block=gcp_credentials_block), out_uri, hosts, timeout_s)


@flow(name="retraining-pipeline", log_prints=True, **HOOKS)
def retraining_pipeline(
    spec: PipelineSpec,
    run_id: RunId | None = None,
    worker_timeout_s: float = 600.0,
    aws_credentials_block: str | None = None,
    gcp_credentials_block: str | None = None,
) -> dict[str, Any]:
    """Mirror the dataset, provision a slice, run every worker against the pinned snapshot, tear down."""
    logger = get_run_logger()
    run_id = run_id or spec.run_id or new_run_id(spec.name)
    _tag_current_run(run_id)
    snapshot = mirror_dataset(spec.mirror, aws_credentials_block, gcp_credentials_block)
    reports_uri = preflight_uri(run_uri(spec.train.checkpoint_dir, run_id))
    script = render_startup_script(
        run_id,
        ["preflight", "--run-id", run_id, "--manifest", snapshot.manifest_uri, "--out", reports_uri],
    )
    try:
        with _quota(spec.provision):
            tpu = provision_task(spec.provision, run_id, gcp_credentials_block, metadata={"startup-script": script})
            logger.info("slice %s (%s, %s) in %s: %d hosts", tpu.node, spec.provision.slice.accelerator_type,
                        tpu.tier, tpu.zone, tpu.hosts)  # fmt: skip
            reports = wait_for_workers(reports_uri, tpu.hosts, worker_timeout_s, gcp_credentials_block)
    finally:
        gone = teardown_task(run_id, list(spec.provision.slice.zones), gcp_credentials_block)
        logger.info("teardown: %d resources deleted, confirmed gone", len(gone.deleted))
    settings = resolve_settings(aws_credentials_block, gcp_credentials_block)
    cost = Ledger(settings, run_id).summary(load_prices(settings)).to_json()
    attempts = [a.describe() for a in tpu.attempts]
    summary: dict[str, Any] = {
        "run_id": run_id,
        "snapshot_id": snapshot.snapshot_id,
        "manifest": snapshot.manifest_uri,
        "objects_copied": snapshot.objects_copied,
        "objects_skipped": snapshot.objects_skipped,
        "slice": {"node": tpu.node, "zone": tpu.zone, "tier": tpu.tier, "hosts": tpu.hosts},
        "attempts": attempts,
        "workers_verified": len(reports),
        "cost": cost,
    }
    create_markdown_artifact(
        key="pipeline-summary",
        markdown="\n".join(
            [
                f"# Run `{run_id}`",
                "",
                f"- snapshot `{snapshot.snapshot_id}` ({snapshot.manifest_uri})",
                f"- slice `{tpu.node}`: {tpu.tier} in {tpu.zone}, {tpu.hosts} hosts",
                f"- ladder: {'; '.join(attempts)}",
                f"- {len(reports)} workers verified the snapshot",
                f"- cost: {cost}",
            ]
        ),
    )
    return summary
