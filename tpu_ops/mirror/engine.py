"""``mirror(spec, settings)``: list → plan → validate → copy → commit the manifest.

Nothing is written before the schema validation passes and the destination bucket's location is
allowed; the manifest is written last, after every object is verified, so a killed or failed run
leaves no snapshot behind, and its re-run copies only what is missing or different.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from tpu_ops.cloud.translate import google_errors
from tpu_ops.errors import PolicyError
from tpu_ops.mirror import manifest, sts
from tpu_ops.mirror.listing import DestListing, SourceListing, list_dest, list_source
from tpu_ops.mirror.plan import Plan, plan
from tpu_ops.mirror.records import Copied, MirrorResult, Progress, SourceObject
from tpu_ops.mirror.scheduler import copy_all
from tpu_ops.mirror.strategies import CopyContext
from tpu_ops.mirror.stream import Fault
from tpu_ops.settings import Settings
from tpu_ops.specs.jobs import MirrorSpec
from tpu_ops.uris import parse_gs, parse_s3

log = logging.getLogger(__name__)

ProgressFn = Callable[[Progress], None]
MiB = 1024 * 1024


def make_s3(settings: Settings, concurrency: int) -> Any:
    """An S3 client with a connection pool sized for ``concurrency`` threads."""
    from tpu_ops.cloud import clients

    return clients.boto3_client(settings, "s3", text_timestamps=True, max_pool_connections=concurrency + 4)


def make_gcs(settings: Settings, concurrency: int) -> Any:
    """A GCS client with a connection pool sized for ``concurrency`` threads."""
    from tpu_ops.cloud import clients
    from tpu_ops.mirror.gcs_transport import tune

    return tune(clients.storage_client(settings), concurrency + 4)


def make_clients(settings: Settings, concurrency: int) -> tuple[Any, Any]:
    """S3 and GCS clients with connection pools sized for ``concurrency`` threads."""
    return make_s3(settings, concurrency), make_gcs(settings, concurrency)


def check_location(gcs: Any, bucket: str, allowed: list[str]) -> str:
    """Refuse a destination bucket whose location is not in ``allowed`` (empty = any)."""
    with google_errors("gcs"):
        location = str(gcs.get_bucket(bucket).location or "").upper()
    if allowed and location not in allowed:
        raise PolicyError(
            f"data residency: bucket gs://{bucket} is in {location or 'an unknown location'}, "
            f"not in the allowed locations {', '.join(allowed)}; refusing to write"
        )
    return location


@dataclass
class _Listed:
    """Both listings, and the clients that made them."""

    source: SourceListing
    dest: DestListing
    gcs: Any
    s3: Any


def mirror(
    spec: MirrorSpec,
    settings: Settings,
    progress: ProgressFn | None = None,
    *,
    clients: tuple[Any, Any] | None = None,
    fault: Fault | None = None,
) -> MirrorResult:
    """Mirror ``spec.source`` to ``spec.destination`` as a verified snapshot; see the module doc.

    ``clients`` = (boto3 S3 client, google storage client) to reuse; ``fault`` is a test seam that
    may alter bytes after they are checksummed (see ``stream.Fault``).
    """
    t0 = time.perf_counter()
    emit = progress or (lambda p: None)
    src_uri, dst_uri = parse_s3(spec.source), parse_gs(spec.destination)
    emit(Progress("list"))
    listed = _list(spec, settings, clients)
    timings = {"list": time.perf_counter() - t0}

    t = time.perf_counter()
    todo = plan(listed.source.objects, listed.dest.objects)
    timings["plan"] = time.perf_counter() - t
    mib = spec.part_size_mib * MiB, spec.ranged_min_mib * MiB
    ctx = CopyContext(listed.s3, listed.gcs, src_uri, dst_uri, settings, spec.concurrency, *mib, fault=fault)
    emit(Progress("plan", 0, len(todo.copy), 0, todo.bytes_copy))

    t = time.perf_counter()
    validated, schema_rel = _validate(ctx, spec, listed.source.objects, todo.copy, emit)
    timings["validate"] = time.perf_counter() - t

    t = time.perf_counter()
    n, total = len(todo.copy), todo.bytes_copy
    emit(Progress("copy", 0, n, 0, total))
    engine = sts.choose(spec.engine, settings, n, total)
    copier = sts.copy_all if engine == "sts" else copy_all
    copied = copier(ctx, todo.copy, lambda i, b: emit(Progress("copy", i, n, b, total))) if todo.copy else []
    timings["copy"] = time.perf_counter() - t

    t = time.perf_counter()
    emit(Progress("commit"))
    rows = [manifest.entry(s.rel, s.size, d.crc32c, s.etag, s.version_id) for s, d in todo.skip]
    rows += [manifest.entry(c.source.rel, c.source.size, c.crc32c, c.source.etag, c.source.version_id) for c in copied]
    doc = manifest.build(
        rows, source=str(src_uri), destination=str(dst_uri), versioned=listed.source.versioned, name=spec.snapshot
    )
    manifest_uri = manifest.commit(listed.gcs, dst_uri, doc)
    _delete_quietly(listed.gcs, dst_uri.bucket, listed.dest.stale_parts)
    timings["commit"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - t0
    emit(Progress("done", n, n, total, total))
    return _result(spec, listed.source, todo, copied, doc, manifest_uri, (validated, schema_rel), timings, engine)


def _result(
    spec: MirrorSpec,
    source: SourceListing,
    todo: Plan,
    copied: list[Copied],
    doc: dict[str, Any],
    manifest_uri: str,
    validated: tuple[int, str | None],
    timings: dict[str, float],
    engine: str,
) -> MirrorResult:
    return MirrorResult(
        snapshot_id=doc["snapshot_id"],
        manifest_uri=manifest_uri,
        snapshot_name=spec.snapshot,
        source=doc["source"],
        destination=doc["destination"],
        source_versioned=source.versioned,
        objects_total=len(doc["objects"]),
        bytes_total=doc["totals"]["bytes"],
        objects_copied=len(copied),
        bytes_copied=sum(c.source.size for c in copied),
        objects_skipped=len(todo.skip),
        bytes_skipped=todo.bytes_skip,
        shards_validated=validated[0],
        schema_file=validated[1],
        objects_s3_checksum_verified=sum(c.s3_checksum_checked for c in copied),
        engine=engine,
        timings_s={k: round(v, 4) for k, v in timings.items()},
    )


def _list(spec: MirrorSpec, settings: Settings, clients: tuple[Any, Any] | None) -> _Listed:
    """List source and destination at once (and check the destination's location first)."""
    src_uri, dst_uri = parse_s3(spec.source), parse_gs(spec.destination)
    s3 = clients[0] if clients else make_s3(settings, spec.concurrency)
    with ThreadPoolExecutor(2, thread_name_prefix="list") as pool:
        # The S3 listing waits on the network while this thread builds the GCS client (whose
        # import is much of a no-change run's cost), so the two overlap.
        f_src = pool.submit(list_source, s3, src_uri)
        gcs = clients[1] if clients else make_gcs(settings, spec.concurrency)
        allowed = spec.allowed_locations
        f_loc = pool.submit(check_location, gcs, dst_uri.bucket, allowed) if allowed else None
        f_dst = pool.submit(list_dest, gcs, dst_uri)
        if f_loc is not None:
            f_loc.result()  # a residency refusal wins over listing errors
        dest = f_dst.result()
        source = f_src.result()
    return _Listed(source, dest, gcs, s3)


def _validate(
    ctx: CopyContext,
    spec: MirrorSpec,
    listed: list[SourceObject],
    to_copy: list[SourceObject],
    emit: ProgressFn,
) -> tuple[int, str | None]:
    """Validate the shards about to be copied (all of them if the schema itself changed)."""
    from tpu_ops.mirror.validate import load_schema, validate

    schema_file = spec.schema_file
    schema_obj = next((o for o in listed if o.rel == schema_file), None)
    if schema_obj is None and spec.require_schema:
        raise PolicyError(
            f"{ctx.source}/{schema_file} does not exist and require_schema is set: a curated dataset "
            "declares its shards there; nothing was copied"
        )
    if schema_obj is None:
        if to_copy:
            log.warning("no schema file %s/%s: shards are copied without validation", ctx.source, schema_file)
        return 0, None
    if not to_copy:
        return 0, schema_file  # nothing will be copied: keep the no-change run cheap
    emit(Progress("validate"))
    schema = load_schema(ctx, schema_obj)
    check = listed if any(o.rel == schema_file for o in to_copy) else to_copy
    return validate(ctx, schema, check), schema_file


def _delete_quietly(gcs: Any, bucket: str, names: list[str]) -> None:
    """Remove temporary parts left by interrupted runs (best effort)."""
    b = gcs.bucket(bucket)
    for name in names:
        try:
            with google_errors("gcs"):
                b.blob(name).delete(retry=None)
        except Exception as exc:
            log.debug("could not delete leftover part %s: %s", name, exc)
