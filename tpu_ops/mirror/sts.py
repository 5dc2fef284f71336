"""The Storage Transfer Service engine: STS copies exactly the planned objects; tpu-ops verifies them.

``copy_all(ctx, objects, on_copy)`` has the local engine's contract (verified ``Copied`` records
out, the caller commits the manifest), so a snapshot cannot tell which engine copied it:

1. the planned keys go into a transfer manifest (a CSV under ``DEST/_tpu_ops/sts/``), so STS
   reads nothing it need not (unchanged objects are not even listed by it);
2. a one-off transfer job (S3 source with a role ARN or access keys, GCS sink, that manifest,
   ``overwriteWhen: ALWAYS``) is created and run through :mod:`tpu_ops.cloud.transfer`; its
   operation's counters are the progress;
3. a failed operation becomes a tpu-ops error naming the objects (``AccessDeniedError`` for a
   permission problem, ``NotFoundError``, else ``CloudError``); the job is deleted either way;
4. every copied object is verified against the source listing: the same size; S3's full-object
   CRC32C where it has one, else the MD5 a single-part ETag is, else the CRC32C STS recorded
   (STS checks its copies end to end); and the source must still be the listed version (STS
   copies the latest one). Only then does it get its provenance metadata, with a generation
   precondition, so an object is never labelled for bytes we did not check.

Importing this module imports no cloud SDK (the local engine's fast path stays fast).
"""

from __future__ import annotations

import base64
import csv
import io
import logging
import math
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tpu_ops.cloud import transfer
from tpu_ops.cloud.transfer import SERVICE, TransferProgress
from tpu_ops.cloud.translate import aws_error_code, aws_errors, google_errors
from tpu_ops.errors import (
    AccessDeniedError,
    ChecksumMismatchError,
    CloudError,
    ConfigError,
    NotFoundError,
    SourceChangedError,
)
from tpu_ops.mirror import crc
from tpu_ops.mirror.records import RESERVED_DIR, Copied, SourceObject
from tpu_ops.mirror.strategies import CopyContext, provenance
from tpu_ops.polling import poll
from tpu_ops.settings import Settings

log = logging.getLogger(__name__)

ENGINES = ("local", "sts", "auto")
_SHOWN = 10  # objects named in an error message


def choose(engine: str, settings: Settings, objects: int, size: int) -> str:
    """The engine to copy ``objects`` planned objects of ``size`` bytes: ``auto`` picks STS from
    ``mirror_sts_min_objects`` objects or ``mirror_sts_min_bytes`` bytes on."""
    if engine != "auto":
        return engine
    big = objects >= settings.mirror_sts_min_objects or size >= settings.mirror_sts_min_bytes
    return "sts" if objects and big else "local"


def _aws_source(ctx: CopyContext) -> dict[str, Any]:
    """``awsS3DataSource``: a role STS assumes (federated identity) or the AWS keys."""
    src: dict[str, Any] = {"bucket_name": ctx.source.bucket, "path": _dir(ctx.source.prefix)}
    s = ctx.settings
    if s.sts_aws_role_arn:
        src["role_arn"] = s.sts_aws_role_arn
    elif s.aws_session_token:
        raise ConfigError(
            "engine sts: the AWS credentials are temporary (they carry a session token), which Storage "
            "Transfer Service cannot take; set TPU_OPS_STS_AWS_ROLE_ARN to a role it assumes instead"
        )
    elif s.aws_access_key_id and s.aws_secret_access_key:
        src["aws_access_key"] = {
            "access_key_id": s.aws_access_key_id.get_secret_value(),
            "secret_access_key": s.aws_secret_access_key.get_secret_value(),
        }
    else:
        raise ConfigError(
            "engine sts: Storage Transfer Service needs AWS access: set TPU_OPS_STS_AWS_ROLE_ARN (a role "
            "it assumes by federated identity) or AWS keys (e.g. from a Prefect AwsCredentials block)"
        )
    return src


def _dir(prefix: str) -> str:
    return prefix + "/" if prefix else ""


def _write_list(ctx: CopyContext, objects: list[SourceObject], job_id: str) -> str:
    """Upload the transfer manifest (one relative key per CSV row); return its ``gs://`` URI."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for o in objects:
        writer.writerow([o.rel])
    name = ctx.dest.key(f"{RESERVED_DIR}/sts/{job_id}.csv")
    with google_errors("gcs"):
        ctx.bucket.blob(name).upload_from_string(buf.getvalue().encode(), content_type="text/csv")
    return f"gs://{ctx.dest.bucket}/{name}"


def copy_all(ctx: CopyContext, objects: list[SourceObject], on_copy: Callable[[int, int], None]) -> list[Copied]:
    """Copy ``objects`` with STS and verify each; see the module doc."""
    client = transfer.transfer_client(ctx.settings)
    source = _aws_source(ctx)  # a credentials problem stops the run before anything is written
    job_id = "tpu-ops-" + uuid.uuid4().hex[:20]
    location = _write_list(ctx, objects, job_id)
    project = ctx.settings.gcp_project
    job = {
        "name": f"transferJobs/{job_id}",
        "project_id": project,
        "description": f"tpu-ops mirror {ctx.source} -> {ctx.dest}"[:1024],
        "status": "ENABLED",
        "transfer_spec": {
            "aws_s3_data_source": source,
            "gcs_data_sink": {"bucket_name": ctx.dest.bucket, "path": _dir(ctx.dest.prefix)},
            "transfer_manifest": {"location": location},
            "transfer_options": {"overwrite_when": "ALWAYS"},
        },
    }
    created = running = final = None
    try:
        created = transfer.create_job(client, job)
        log.info("storage transfer job %s for %d objects", created, len(objects))
        running = transfer.run_job(client, created, project)
        final = _follow(client, running, ctx.settings, on_copy)
    finally:
        if running and final is None:  # interrupted: stop STS copying for a run that will not commit
            _cancel(client, running)
        _cleanup(client, ctx, created, project, location)
    _raise_failures(final, ctx)
    return verify(ctx, objects)


def _follow(client: Any, name: str, settings: Settings, on_copy: Callable[[int, int], None]) -> TransferProgress:
    """Poll the operation until it ends, reporting its copy counters; return its last state."""

    def check() -> TransferProgress | None:
        top = transfer.progress(client, name)
        on_copy(top.objects_copied, top.bytes_copied)
        return top if top.done else None

    every = settings.poll_interval_s
    return poll(check, timeout_s=math.inf, interval_s=every, max_interval_s=every, what=f"transfer {name}")


def _cancel(client: Any, name: str) -> None:
    try:
        transfer.cancel(client, name)
    except Exception as exc:
        log.warning("could not cancel storage transfer operation %s: %s", name, exc)


def _cleanup(client: Any, ctx: CopyContext, job_name: str | None, project: str, location: str) -> None:
    """Delete the one-off job and its transfer manifest (best effort: neither holds data)."""
    try:
        if job_name:
            transfer.delete_job(client, job_name, project)
        with google_errors("gcs"):
            ctx.bucket.blob(location.split("/", 3)[3]).delete()
    except Exception as exc:
        log.warning("could not clean up storage transfer job %s or %s: %s", job_name, location, exc)


def _raise_failures(top: TransferProgress, ctx: CopyContext) -> None:
    """Turn a failed or aborted operation into a tpu-ops error naming what failed."""
    if top.status == "SUCCESS":
        return
    by_code = top.errors
    lines = [f"{code}: " + ", ".join(v[:_SHOWN]) + (" ..." if len(v) > _SHOWN else "") for code, v in by_code.items()]
    detail = "; ".join(lines) or "no error details"
    what = (
        f"storage transfer {top.name} {top.status} ({top.objects_failed} object(s) failed): {detail}; "
        "nothing was committed"
    )
    if "PERMISSION_DENIED" in by_code or "UNAUTHENTICATED" in by_code:
        raise AccessDeniedError(
            what + f". STS needs s3:ListBucket and s3:GetObject on {ctx.source} for its role or keys",
            service=SERVICE,
            status=403,
        )
    if set(by_code) == {"NOT_FOUND"}:
        raise NotFoundError(what, service=SERVICE, status=404)
    raise CloudError(what, service=SERVICE)


def _dest_listing(ctx: CopyContext) -> dict[str, Any]:
    """Every object under the destination prefix with size, checksums and generation, by key."""
    prefix = _dir(ctx.dest.prefix)
    with google_errors("gcs"):
        blobs = ctx.gcs.list_blobs(
            ctx.dest.bucket, prefix=prefix, fields="items(name,size,crc32c,md5Hash,generation),nextPageToken"
        )
        return {b.name[len(prefix) :]: b for b in blobs}


def verify(ctx: CopyContext, objects: list[SourceObject]) -> list[Copied]:
    """Check every copied object against the source listing, then label it; see the module doc."""
    stored = _dest_listing(ctx)

    def one(src: SourceObject) -> Copied:
        blob = stored.get(src.rel)
        if blob is None:
            raise NotFoundError(f"storage transfer reported success; {ctx.dest}/{src.rel} is missing", service=SERVICE)
        s3_crc = _check_source(ctx, src)
        _check_copy(ctx, src, blob, s3_crc)
        blob.metadata = provenance(src, blob.crc32c)
        with google_errors("gcs"):
            blob.patch(if_generation_match=blob.generation)
        return Copied(src, blob.crc32c, 1, s3_crc is not None)

    with ThreadPoolExecutor(ctx.concurrency, thread_name_prefix="sts-verify") as pool:
        return list(pool.map(one, objects))


def _check_source(ctx: CopyContext, src: SourceObject) -> int | None:
    """The source must still be the listed version (STS copied the latest); S3's CRC32C if any."""
    kw: dict[str, Any] = {"Bucket": ctx.source.bucket, "Key": ctx.source.key(src.rel), "ChecksumMode": "ENABLED"}
    if not src.version_id:
        kw["IfMatch"] = f'"{src.etag}"'
    with aws_errors("s3"):
        try:
            head = ctx.s3.head_object(**kw)
        except Exception as exc:
            code = aws_error_code(exc)[0]
            if code in ("PreconditionFailed", "412", "404", "NoSuchKey", "NotFound"):
                raise SourceChangedError(
                    f"source object {src.rel!r} changed or vanished while Storage Transfer Service copied it "
                    f"({code}); re-run to mirror the new version"
                ) from exc
            raise
    etag = str(head.get("ETag", "")).strip('"')
    if etag != src.etag or (src.version_id and head.get("VersionId") != src.version_id):
        raise SourceChangedError(
            f"source object {src.rel!r} changed while Storage Transfer Service copied it (now ETag {etag}, "
            f"version {head.get('VersionId')}); re-run to mirror the new version"
        )
    value = head.get("ChecksumCRC32C")
    if value and "-" not in value and head.get("ChecksumType") != "COMPOSITE":
        return crc.from_b64(value)
    return None


def _check_copy(ctx: CopyContext, src: SourceObject, blob: Any, s3_crc: int | None) -> None:
    """Size, then the strongest checksum available for this source object."""
    where = f"{ctx.dest}/{src.rel}"
    if int(blob.size or 0) != src.size:
        raise ChecksumMismatchError(f"{where}: {blob.size} bytes stored, {src.size} listed at the source")
    if not blob.crc32c:
        raise ChecksumMismatchError(f"{where}: GCS reports no CRC32C for the copy")
    if s3_crc is not None and crc.from_b64(blob.crc32c) != s3_crc:
        raise ChecksumMismatchError(f"{where}: CRC32C {blob.crc32c} differs from the source's S3 checksum")
    md5 = base64.b64decode(blob.md5_hash).hex() if blob.md5_hash else None
    if s3_crc is None and _is_md5(src.etag) and md5 is not None and md5 != src.etag.lower():
        raise ChecksumMismatchError(f"{where}: MD5 differs from the source's ETag {src.etag}")


def _is_md5(etag: str) -> bool:
    return len(etag) == 32 and all(c in "0123456789abcdef" for c in etag.lower())
