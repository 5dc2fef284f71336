"""Prefect flow ``mirror_dataset``: mirror S3 → GCS as a pinned, verified snapshot.

Thin by design: one task calls :func:`tpu_ops.mirror.engine.mirror`, reporting progress as a
Prefect progress artifact; the flow publishes a summary table artifact and returns the result,
whose ``manifest_uri`` is what the training step pins.
"""

from __future__ import annotations

import hashlib
import time

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_progress_artifact, create_table_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE

from flows.audit import emit
from flows.failures import missing_buckets_named
from flows.settings import open_run
from tpu_ops.audit.events import AuditEvent
from tpu_ops.mirror.engine import mirror
from tpu_ops.mirror.records import MirrorResult, Progress
from tpu_ops.run import Run
from tpu_ops.specs.common import RunId
from tpu_ops.specs.jobs import MirrorSpec

MiB = 1024 * 1024


@task(name="mirror-objects", cache_policy=NO_CACHE)
def mirror_objects(spec: MirrorSpec, run: Run) -> MirrorResult:
    """Run the mirror, updating a progress artifact (by bytes copied) at most once a second."""
    what = f"mirror {spec.source} → {spec.destination}"
    artifact = create_progress_artifact(0.0, _sync=True, description=what)  # type: ignore[call-arg]
    last = [0.0]

    def on_progress(p: Progress) -> None:
        now = time.monotonic()
        if p.phase == "copy" and p.bytes_total and now - last[0] >= 1.0:
            last[0] = now
            update_progress_artifact(artifact, 100.0 * p.bytes_done / p.bytes_total, _sync=True)  # type: ignore

    result = mirror(spec, run.settings, progress=on_progress)
    update_progress_artifact(artifact, 100.0, _sync=True)  # type: ignore
    return result


def summary_rows(r: MirrorResult) -> list[dict[str, str]]:
    """The rows of the summary table artifact."""
    rows = {
        "snapshot id": r.snapshot_id,
        "snapshot name": r.snapshot_name or "",
        "manifest": r.manifest_uri,
        "source": r.source,
        "destination": r.destination,
        "objects copied": f"{r.objects_copied} ({r.bytes_copied / MiB:.1f} MiB)",
        "objects skipped": f"{r.objects_skipped} ({r.bytes_skipped / MiB:.1f} MiB)",
        "objects in snapshot": f"{r.objects_total} ({r.bytes_total / MiB:.1f} MiB)",
        "shards validated": str(r.shards_validated),
        "copies checked against S3's checksum": str(r.objects_s3_checksum_verified),
        "time (s)": ", ".join(f"{k} {v:.2f}" for k, v in r.timings_s.items()),
    }
    return [{"field": k, "value": v} for k, v in rows.items()]


@task(name="publish-summary")
def publish_summary(result: MirrorResult) -> None:
    """The summary table artifact (``mirror-summary``) of a finished mirror."""
    create_table_artifact(  # type: ignore[call-arg]
        _sync=True,
        table=summary_rows(result),
        key="mirror-summary",
        description=f"Snapshot {result.snapshot_id}: manifest {result.manifest_uri}",
    )


def audit_chain(run_id: str | None, spec: MirrorSpec) -> str:
    """The audit chain of a mirror: the pipeline run's, else one per destination (``mirror-<hash>``)."""
    if run_id:
        return run_id
    return "mirror-" + hashlib.sha256(spec.destination.encode()).hexdigest()[:16]


@flow(name="mirror_dataset", log_prints=True)
def mirror_dataset(
    spec: MirrorSpec,
    aws_credentials_block: str | None = None,
    gcp_credentials_block: str | None = None,
    run_id: RunId | None = None,
) -> MirrorResult:
    """Mirror ``spec.source`` into ``spec.destination``; returns the snapshot (manifest URI, counts).

    Credentials come from the named Prefect blocks (else the environment), never parameters.
    Audited in ``run_id``'s chain (a pipeline's run), else in the destination's own chain.

    Args:
        spec: What to mirror, where to, and how (concurrency, part sizes, schema, residency).
        aws_credentials_block: Name of a Prefect AwsCredentials block; empty: the environment's credentials.
        gcp_credentials_block: Name of a Prefect GcpCredentials block; empty: the environment's credentials.
        run_id: The pipeline run this mirror belongs to (its audit chain); empty: a standalone mirror.
    """
    run = open_run(audit_chain(run_id, spec), aws_credentials_block, gcp_credentials_block)
    try:
        with missing_buckets_named(), run.audit.audited(AuditEvent.DATASET_MIRRORED,
                                                        params=spec.model_dump(mode="json")) as rec:  # fmt: skip
            result = mirror_objects(spec, run)
            rec["params"].update(snapshot_id=result.snapshot_id, manifest=result.manifest_uri,
                                 objects_copied=result.objects_copied, objects_total=result.objects_total,
                                 bytes_total=result.bytes_total)  # fmt: skip
            rec["subjects"] += [{"uri": result.source, "kind": "dataset-source"},
                                {"uri": result.manifest_uri, "kind": "dataset-manifest"}]  # fmt: skip
    finally:
        if not run_id:  # a pipeline seals its own chain at its end
            run.audit.digest()
    emit(AuditEvent.SNAPSHOT_COMMITTED, run.id, {"snapshot_id": result.snapshot_id, "manifest": result.manifest_uri})
    publish_summary(result)
    get_run_logger().info("snapshot %s committed: %s", result.snapshot_id, result.manifest_uri)
    return result
