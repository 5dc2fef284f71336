"""Export a run: its final checkpoint (or trainer export dir) as ``model.tar.gz`` in S3, then a
SageMaker model package pending approval whose metadata ties it to the data, the run and the trail.

Order, so that a failure at any point leaves nothing a later export would take as done:
artifact uploaded and verified (write-once) → audit record of the artifact (its hash becomes the
package's ``audit_head``) → package registered → audit record ``model.exported``. A repeated export
of the same run adopts the artifact already there (after reading it back) and the package already
registered for the run, rather than writing anything twice.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from tpu_ops.audit.events import AuditEvent
from tpu_ops.audit.records import Actor, link_to
from tpu_ops.audit.trail import AuditTrail
from tpu_ops.cloud.translate import aws_error_code, aws_errors, google_errors
from tpu_ops.errors import CheckpointError, IntegrityError, SpecError
from tpu_ops.export import registry
from tpu_ops.export.artifact import Artifact, Member, upload_archive, verify_artifact
from tpu_ops.layout import RunLayout
from tpu_ops.specs.jobs import ExportSpec
from tpu_ops.train.checkpoints import COMMIT_MARKER, latest_complete_step, step_uri
from tpu_ops.uris import ObjectUri, parse_gs, parse_s3

ARTIFACT_NAME = "model.tar.gz"


@dataclass(frozen=True)
class Source:
    """What gets packaged: the trainer's export dir, or a complete checkpoint step."""

    kind: str  # "export-dir" | "checkpoint"
    uri: str
    step: int | None


@dataclass(frozen=True)
class ExportResult:
    """What an export produced (or adopted)."""

    run_id: str
    source: Source
    artifact: Artifact
    package_arn: str
    package_created: bool
    snapshot_id: str | None
    manifest_uri: str | None
    manifest_sha256: str | None
    audit_head: dict[str, Any]
    package_status: str = registry.PENDING

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _read_json(gcs: Any, uri: ObjectUri) -> Any | None:
    with google_errors("gcs"):
        blob = gcs.bucket(uri.bucket).get_blob(uri.prefix)
        return None if blob is None else json.loads(blob.download_as_bytes())


def find_source(gcs: Any, run_uri: str, checkpoint_subdir: str = "") -> Source:
    """``RUN/export/`` if the trainer committed it, else the newest complete step; ``CheckpointError`` if neither."""
    run = parse_gs(run_uri)
    with google_errors("gcs"):
        if gcs.bucket(run.bucket).get_blob(run.key(f"export/{COMMIT_MARKER}")) is not None:
            return Source("export-dir", str(run.child("export")), None)
    steps_uri = str(run.child(checkpoint_subdir)) if checkpoint_subdir else run_uri
    step = latest_complete_step(gcs, steps_uri)
    if step is None:
        raise CheckpointError(f"run {run_uri} has no complete checkpoint (no <step>/{COMMIT_MARKER}) and no export/")
    return Source("checkpoint", step_uri(steps_uri, step), step)


def members(gcs: Any, source: Source) -> list[Member]:
    """The objects under ``source`` (names relative to it), sorted so the archive is reproducible."""
    src = parse_gs(source.uri)
    out = []
    with google_errors("gcs"):
        for blob in gcs.list_blobs(src.bucket, prefix=src.prefix + "/"):
            if not blob.name.endswith("/"):
                out.append(Member(src.relative(blob.name), blob))
    if not out:
        raise CheckpointError(f"{source.uri} holds no objects")
    return sorted(out, key=lambda m: m.name)


def dataset_of(gcs: Any, run_uri: str, manifest_uri: str | None) -> tuple[str | None, str | None, str | None]:
    """(snapshot id, manifest URI, manifest sha256): from ``manifest_uri`` or the run's ``job.json``."""
    job = _read_json(gcs, RunLayout(run_uri).job) or {}
    manifest_uri = manifest_uri or job.get("dataset_manifest")
    if not manifest_uri:
        return None, None, None
    m = parse_gs(manifest_uri)
    with google_errors("gcs"):
        blob = gcs.bucket(m.bucket).get_blob(m.prefix)
        if blob is None:
            raise CheckpointError(f"dataset manifest {manifest_uri} of run {run_uri} does not exist")
        body = blob.download_as_bytes()
    doc = json.loads(body)
    snapshot = doc.get("snapshot_id") if isinstance(doc, dict) else None
    snapshot = snapshot or m.prefix.rsplit("/", 1)[-1].removesuffix(".json")
    return str(snapshot), str(m), hashlib.sha256(body).hexdigest()


def job_subdir(gcs: Any, run_uri: str) -> str:
    """The run's ``checkpoint_subdir`` from its ``job.json`` ("" when absent)."""
    job = _read_json(gcs, RunLayout(run_uri).job) or {}
    return str(job.get("checkpoint_subdir") or "")


def artifact_key(spec: ExportSpec, run_id: str) -> tuple[str, str]:
    """(bucket, key) of the run's artifact: ``<destination>/<run_id>/model.tar.gz``."""
    dest = parse_s3(spec.destination)
    return dest.bucket, dest.key(f"{run_id}/{ARTIFACT_NAME}")


def existing_artifact(s3: Any, bucket: str, key: str) -> Artifact | None:
    """The artifact already at ``key``, read back and checked against S3's CRC32C; None if absent."""
    try:
        head = s3.head_object(Bucket=bucket, Key=key)
    except Exception as exc:
        if aws_error_code(exc)[0] in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
    sha, crc, size = verify_artifact(s3, bucket, key, None, None)
    return Artifact(f"s3://{bucket}/{key}", bucket, key, size, sha, crc, head.get("VersionId"), 0,
                    int(head.get("Metadata", {}).get("members", "0")), (), adopted=True)  # fmt: skip


def export_run(
    spec: ExportSpec,
    run_uri: str,
    run_id: str,
    *,
    gcs: Any,
    s3: Any,
    sm: Any,
    trail: AuditTrail,
    actor: Actor | None = None,
    manifest_uri: str | None = None,
) -> ExportResult:
    """Package, upload, verify and register the run's model; every step is audited in the run's chain."""
    if spec.approval_status != registry.PENDING:
        raise SpecError(f"approval_status {spec.approval_status!r}: an export registers packages as "
                        f"{registry.PENDING}; approval is its own audited step (tpu-ops approve)",
                        [{"field": "approval_status", "value": spec.approval_status}])  # fmt: skip
    source = find_source(gcs, run_uri, job_subdir(gcs, run_uri))
    snapshot, manifest, manifest_sha = dataset_of(gcs, run_uri, manifest_uri)
    bucket, key = artifact_key(spec, run_id)
    with aws_errors("s3"):  # a cut connection is a one-line TransientError, not a botocore traceback
        art = existing_artifact(s3, bucket, key)
        if art is None:
            meta = {"run-id": run_id, "source": source.uri[:1000]}
            art = upload_archive(s3, bucket, key, members(gcs, source), meta)
    subjects = [{"uri": source.uri, "kind": source.kind}, art.subject()]
    if manifest:
        subjects.insert(0, {"uri": manifest, "kind": "dataset-manifest", "sha256": manifest_sha})
    # dataset_manifest None says "the train spec named none" (lineage shows it), not "unknown"
    params = {"run_id": run_id, "run_uri": run_uri, "step": source.step, "snapshot_id": snapshot,
              "dataset_manifest": manifest, "adopted": art.adopted, "parts": art.parts,
              "members": art.members}  # fmt: skip
    written = trail.record(run_id, AuditEvent.MODEL_ARTIFACT_UPLOADED, actor, params=params, subjects=subjects,
                           request_ids=list(art.request_ids))  # fmt: skip
    if written.record is None:
        raise IntegrityError("the audit trail is unreachable (record spooled); refusing to register a package "
                             "without an audit head")  # fmt: skip
    head = link_to(written.record).model_dump()
    with aws_errors("sagemaker"):
        registry.ensure_group(sm, spec.model_package_group, "tpu-ops exports")
        pkg = registry.find_for_run(sm, spec.model_package_group, run_id)
        created = pkg is None
        if pkg is None:
            arn = registry.register(sm, spec.model_package_group, spec.image_uri, art.uri,
                                    package_metadata(run_id, snapshot, manifest, source, art, head),
                                    f"tpu-ops run {run_id} ({source.kind} {source.uri})")  # fmt: skip
    status = registry.PENDING if pkg is None else pkg.status
    if pkg is not None:
        arn = pkg.arn
        if pkg.metadata.get("artifact_sha256") != art.sha256:
            raise IntegrityError(f"package {arn} of run {run_id} names artifact sha256 "
                                 f"{pkg.metadata.get('artifact_sha256')}, but S3 holds {art.sha256}")  # fmt: skip
        head = {"chain": run_id, "seq": int(pkg.metadata.get("audit_seq", "0") or 0),
                "hash": pkg.metadata.get("audit_head", "")}  # fmt: skip
    subjects.append({"uri": arn, "kind": "model-package"})
    trail.record(run_id, AuditEvent.MODEL_EXPORTED, actor, params={**params, "package_created": created},
                 subjects=subjects, links=[link_to(written.record)])  # fmt: skip
    return ExportResult(run_id, source, art, arn, created, snapshot, manifest, manifest_sha, head, status)


NO_DATASET = "none recorded (no dataset_manifest)"


def package_metadata(
    run_id: str, snapshot: str | None, manifest: str | None, source: Source, art: Artifact, head: dict[str, Any]
) -> dict[str, str]:
    """The package's ``CustomerMetadataProperties``: SageMaker refuses empty values, so absent ones are left
    out, and a run whose train spec named no dataset manifest says so in ``dataset``."""
    meta = {
        "run_id": run_id, "snapshot_id": snapshot or "", "manifest_uri": manifest or "",
        "checkpoint_uri": source.uri[:256], "checkpoint_step": "" if source.step is None else str(source.step),
        "artifact_uri": art.uri[:256], "artifact_sha256": art.sha256, "artifact_crc32c": art.crc32c,
        "audit_chain": run_id, "audit_seq": str(head["seq"]), "audit_head": head["hash"],
    }  # fmt: skip
    if not manifest:
        meta["dataset"] = NO_DATASET
    return {k: v for k, v in meta.items() if v}


def failure_text(exc: BaseException) -> str:
    """A one-line description of a failed export for its audit record."""
    return f"{type(exc).__name__}: {exc}"[:2000]
