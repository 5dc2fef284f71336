"""Stream S3 objects into GCS: pinned reads, bounded concurrency and memory, verified CRC32C.

Units of work run on a pool of ``concurrency`` threads:

- an object of at most ``SMALL_MAX`` bytes is read (pinned) into memory, its CRC32C computed,
  and uploaded in one multipart request that declares that CRC32C (real GCS rejects a mismatch)
  and carries the provenance metadata;
- a larger object below ``ranged_min`` is streamed: one pinned GET (which also returns S3's
  full-object checksum, if any) feeds, ``BLOCK`` bytes at a time and CRC32C'd in passing, the body of
  one multipart upload request. Splitting a sequential stream into ranged GETs buys nothing but requests
  (moto even reads the whole object for each range). The object is created without the CRC32C in
  its provenance and gets it by a metadata patch once GCS's CRC32C matched ours;
- from ``ranged_min`` on (rclone's multi-thread cutoff is 256 MiB, gcloud's sliced threshold
  150 MiB) the object is read in ranged parts of ``part_bytes`` (at most 32, the compose limit),
  copied in parallel into temporary objects, composed, and the composite CRC32C (combined from the
  parts') is checked against what GCS reports.

Memory per thread is bounded by ``SMALL_MAX`` (or one ``BLOCK`` when streaming), whatever the object
and part sizes; nothing is staged on disk. Every stored object's CRC32C (as GCS reports it) is
compared with ours, because the emulators accept wrong checksums. A mismatch is retried, then fails the
run. Provenance metadata carries the CRC32C we computed, so an object whose stored CRC differs
(say, a run was killed between upload and verification) is never taken as up to date.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import google_crc32c

from tpu_ops.cloud import retry
from tpu_ops.cloud.translate import aws_errors, google_errors
from tpu_ops.errors import IntegrityError, TransientError
from tpu_ops.mirror import crc
from tpu_ops.mirror.records import (
    META_CRC32C,
    META_ETAG,
    META_SIZE,
    META_VERSION,
    RESERVED_DIR,
    Copied,
    SourceObject,
)
from tpu_ops.settings import Settings
from tpu_ops.uris import ObjectUri

log = logging.getLogger(__name__)

MiB = 1024 * 1024
SMALL_MAX = 8 * MiB  # the SDK's single-request upload limit; larger objects are streamed
BLOCK = 4 * MiB  # a part streams from S3 to GCS this many bytes at a time
UPLOAD_TIMEOUT = (60.0, 300.0)  # (connect, read) seconds for one streamed upload
MAX_PARTS = 32  # GCS compose takes at most 32 sources
RANGED_MIN = 256 * MiB  # default: from this size on, ranged parts are copied in parallel and composed
MISMATCH_ATTEMPTS = 3

Fault = Callable[[str, bytes], bytes]
"""Test seam: ``fault(rel_key, data) -> data`` sees bytes after we checksum them, before upload."""


class SourceChangedError(IntegrityError):
    """The source object no longer matches the listed version/ETag: it changed during the run."""


class ChecksumMismatchError(IntegrityError):
    """What GCS stored does not match the bytes we read from S3."""


@dataclass
class CopyContext:
    """Clients and knobs shared by every unit of one mirror run."""

    s3: Any
    gcs: Any  # google.cloud.storage.Client
    source: ObjectUri
    dest: ObjectUri
    settings: Settings
    concurrency: int
    part_bytes: int
    ranged_min: int = RANGED_MIN
    fault: Fault | None = None
    _bucket: Any = field(default=None, repr=False)

    @property
    def bucket(self) -> Any:
        if self._bucket is None:
            self._bucket = self.gcs.bucket(self.dest.bucket)
        return self._bucket


def part_ranges(size: int, part_bytes: int) -> list[tuple[int, int]]:
    """``[start, end)`` byte ranges for a large object: ``part_bytes`` each, at most ``MAX_PARTS``."""
    step = max(part_bytes, -(-size // MAX_PARTS))
    step = -(-step // (256 * 1024)) * (256 * 1024)
    return [(start, min(start + step, size)) for start in range(0, size, step)]


def provenance(src: SourceObject, crc32c_b64: str) -> dict[str, str]:
    """The custom metadata recording which source version a GCS object is a verified copy of."""
    return {
        META_ETAG: src.etag,
        META_VERSION: src.version_id or "",
        META_SIZE: str(src.size),
        META_CRC32C: crc32c_b64,
    }


class _Reader:
    """A file-like view of an S3 body that CRCs what passes through (and may corrupt it, for tests)."""

    def __init__(self, body: Any, rel: str, fault: Fault | None) -> None:
        self._body = body
        self._rel = rel
        self._fault = fault
        self.crc = 0
        self.count = 0

    def read(self, n: int = -1) -> bytes:
        try:
            data: bytes = self._body.read(n) if n is not None and n >= 0 else self._body.read()
        except Exception as exc:  # a broken stream is worth another attempt from the start
            raise TransientError(f"reading s3 object {self._rel!r} failed: {exc}", service="s3") from exc
        self.crc = google_crc32c.extend(self.crc, data)
        self.count += len(data)
        return self._fault(self._rel, data) if self._fault else data


def get_pinned(ctx: CopyContext, src: SourceObject, rng: tuple[int, int] | None) -> dict[str, Any]:
    """GET exactly the listed version of ``src`` (optionally a byte range)."""
    from botocore.exceptions import ClientError

    kw: dict[str, Any] = {"Bucket": ctx.source.bucket, "Key": ctx.source.key(src.rel)}
    if src.version_id:
        kw["VersionId"] = src.version_id
    else:
        kw["IfMatch"] = f'"{src.etag}"'
    if rng is not None:
        kw["Range"] = f"bytes={rng[0]}-{rng[1] - 1}"
    else:
        kw["ChecksumMode"] = "ENABLED"
    with aws_errors("s3"):
        try:
            resp: dict[str, Any] = ctx.s3.get_object(**kw)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("PreconditionFailed", "412", "NoSuchVersion", "NoSuchKey"):
                raise SourceChangedError(
                    f"source object {src.rel!r} changed or vanished during the run ({code}); "
                    "it is not part of this snapshot: re-run to mirror the new version"
                ) from exc
            raise
    etag = str(resp.get("ETag", "")).strip('"')
    if (src.version_id and resp.get("VersionId") not in (None, src.version_id)) or (
        not src.version_id and etag and etag != src.etag
    ):
        resp["Body"].close()
        raise SourceChangedError(f"source object {src.rel!r} changed during the run (got ETag {etag})")
    want = (rng[1] - rng[0]) if rng else src.size
    if int(resp.get("ContentLength", want)) != want:
        resp["Body"].close()
        raise SourceChangedError(f"source object {src.rel!r}: expected {want} bytes, S3 sends {resp['ContentLength']}")
    return resp


def _s3_crc32c(resp: dict[str, Any]) -> int | None:
    """S3's full-object CRC32C when it has one (composite multipart checksums end in ``-N``)."""
    value = resp.get("ChecksumCRC32C")
    if not value or "-" in value or resp.get("ChecksumType") == "COMPOSITE":
        return None
    return crc.from_b64(value)


def _s3_end(resp: dict[str, Any], rel: str) -> None:
    """Read past the last byte of a whole-object body: there must be nothing, and botocore checks
    S3's full-object checksum (CRC32, SHA*) only when a read meets the end."""
    from botocore.exceptions import FlexibleChecksumError

    try:
        extra = resp["Body"].read(1)
    except FlexibleChecksumError as exc:
        raise ChecksumMismatchError(f"{rel!r}: the bytes read do not match S3's checksum ({exc})") from exc
    if extra:
        raise SourceChangedError(f"source object {rel!r}: S3 sends more bytes than listed")


def _has_other_checksum(resp: dict[str, Any]) -> bool:
    """Whether S3 sent a full-object checksum that botocore validates for us."""
    return any(resp.get(k) for k in ("ChecksumCRC32", "ChecksumSHA1", "ChecksumSHA256"))


def _verify(rel: str, stored_size: Any, stored: str | None, size: int, ours: int, what: str) -> None:
    """Compare what GCS reports for a stored object with the size and CRC32C we streamed."""
    if int(stored_size or -1) != size or not stored or crc.from_b64(stored) != ours:
        raise ChecksumMismatchError(
            f"{what} {rel!r}: GCS stored {stored_size} bytes with CRC32C {stored}, "
            f"we sent {size} bytes with CRC32C {crc.to_b64(ours)}"
        )


def copy_small(ctx: CopyContext, src: SourceObject) -> Copied:
    """Copy an object of at most ``SMALL_MAX`` bytes in one verified upload."""
    resp = get_pinned(ctx, src, None)
    reader = _Reader(resp["Body"], src.rel, ctx.fault)
    data = reader.read(src.size)
    if reader.count != src.size:
        raise SourceChangedError(f"source object {src.rel!r}: read {reader.count} bytes, listed {src.size}")
    _s3_end(resp, src.rel)
    s3_crc = _s3_crc32c(resp)
    if s3_crc is not None and s3_crc != reader.crc:
        raise ChecksumMismatchError(
            f"{src.rel!r}: S3 reports CRC32C {crc.to_b64(s3_crc)}, we read {crc.to_b64(reader.crc)}"
        )
    # botocore validates the other full-object checksums (CRC32, SHA*) itself when ChecksumMode is on.
    s3_checked = s3_crc is not None or _has_other_checksum(resp)
    ours = crc.to_b64(reader.crc)
    # The declared CRC32C makes real GCS reject the upload if the bytes do not match.
    stored = _upload(ctx, ctx.dest.key(src.rel), provenance(src, ours), _Bytes(data), crc32c=ours)
    _verify(src.rel, stored.get("size"), stored.get("crc32c"), src.size, reader.crc, "object")
    return Copied(src, ours, 1, s3_checked)


def part_name(ctx: CopyContext, src: SourceObject, index: int) -> str:
    """Temporary object holding part ``index`` of ``src``; stable, so a re-run overwrites it."""
    token = hashlib.sha256(f"{src.rel}\0{src.etag}\0{src.version_id}".encode()).hexdigest()[:32]
    return ctx.dest.key(f"{RESERVED_DIR}/parts/{token}/{index:05d}")


class _RangeBody:
    """``size`` bytes of an S3 body, ``BLOCK`` by ``BLOCK``, CRC32C'd in passing.

    A short source stream raises rather than leaving the upload waiting for bytes.
    """

    def __init__(self, body: Any, rel: str, size: int, fault: Fault | None) -> None:
        self._body = body
        self._rel = rel
        self._size = size
        self._fault = fault
        self.crc = 0
        self.count = 0

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[bytes]:
        while self.count < self._size:
            try:
                data: bytes = self._body.read(min(BLOCK, self._size - self.count))
            except Exception as exc:  # a broken stream is worth another attempt from the start
                raise TransientError(f"reading s3 object {self._rel!r} failed: {exc}", service="s3") from exc
            if not data:
                raise SourceChangedError(f"source object {self._rel!r}: stream ended after {self.count} bytes")
            self.crc = google_crc32c.extend(self.crc, data)
            self.count += len(data)
            yield self._fault(self._rel, data) if self._fault else data


class _StreamBody:
    """One pinned GET of ``src`` (``rng=None``: the whole object) as an upload body of known length.

    requests sends it with a ``Content-Length`` (from ``len``) by iterating it, so the copy costs
    one GET, one upload request and one block of memory. ``crc`` is the CRC32C of everything sent so far;
    after a whole-object GET, ``s3_crc`` is S3's full-object CRC32C (if it has one) and
    ``s3_checked`` says whether S3 sent a full-object checksum at all.
    """

    def __init__(self, ctx: CopyContext, src: SourceObject, rng: tuple[int, int] | None) -> None:
        self._ctx, self._src, self._rng = ctx, src, rng
        self.crc = 0
        self.s3_crc: int | None = None
        self.s3_checked = False

    def __len__(self) -> int:
        return self._rng[1] - self._rng[0] if self._rng else self._src.size

    def __iter__(self) -> Iterator[bytes]:
        resp = get_pinned(self._ctx, self._src, self._rng)
        if self._rng is None:
            self.s3_crc = _s3_crc32c(resp)
            # botocore validates the other full-object checksums itself when ChecksumMode is on.
            self.s3_checked = self.s3_crc is not None or _has_other_checksum(resp)
        body = _RangeBody(resp["Body"], self._src.rel, len(self), self._ctx.fault)
        try:
            yield from body
            if self._rng is None:
                _s3_end(resp, self._src.rel)
        finally:
            resp["Body"].close()
        self.crc = body.crc


class _Bytes:
    """Bytes already in memory, as an upload body."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[bytes]:
        yield self._data


class _Multipart:
    """A ``multipart/related`` upload body: the object's JSON resource, then its bytes (never joined)."""

    def __init__(self, resource: dict[str, Any], body: _StreamBody | _Bytes) -> None:
        boundary = uuid.uuid4().hex
        self.content_type = f"multipart/related; boundary={boundary}"
        self._head = (
            f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{json.dumps(resource)}\r\n"
            f"--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n"
        ).encode()
        self._tail = f"\r\n--{boundary}--\r\n".encode()
        self._body = body

    def __len__(self) -> int:
        return len(self._head) + len(self._body) + len(self._tail)

    def __iter__(self) -> Iterator[bytes]:
        yield self._head
        yield from self._body
        yield self._tail


def _upload(
    ctx: CopyContext, name: str, metadata: dict[str, str], body: _StreamBody | _Bytes, crc32c: str | None = None
) -> dict[str, Any]:
    """Create object ``name`` (with custom ``metadata``) from ``body`` in one request; its JSON resource.

    A multipart upload, the JSON API's one-request form. The SDK's own joins resource and bytes
    into one more copy of the object (and needs it all in memory); its resumable form sends
    several requests. ``crc32c``, when known beforehand, is declared for GCS to check. The stream
    is never resumed: a failed upload is retried whole by the caller.
    """
    from urllib.parse import quote

    from google.api_core.exceptions import from_http_response

    host = ctx.gcs._connection.get_api_base_url_for_mtls()
    url = f"{host}/upload/storage/v1/b/{quote(ctx.dest.bucket, safe='')}/o?uploadType=multipart"
    resource = {"name": name, "contentType": "application/octet-stream", "metadata": metadata}
    if crc32c:
        resource["crc32c"] = crc32c
    data = _Multipart(resource, body)
    with google_errors("gcs"):
        resp = ctx.gcs._http.post(url, data=data, headers={"Content-Type": data.content_type}, timeout=UPLOAD_TIMEOUT)
        if resp.status_code not in (200, 201):
            raise from_http_response(resp)  # type: ignore[no-untyped-call]
        stored: dict[str, Any] = resp.json()
    return stored


def copy_streamed(ctx: CopyContext, src: SourceObject) -> Copied:
    """Copy a larger object in one pinned GET streamed into one upload request.

    The object is created without the CRC32C in its provenance, so it never counts as a copy until
    we verified it: the CRC32C is added by a metadata patch (of that very generation), whose answer
    is checked again.
    """
    name = ctx.dest.key(src.rel)
    body = _StreamBody(ctx, src, None)
    partial = {k: v for k, v in provenance(src, "").items() if k != META_CRC32C}
    stored = _upload(ctx, name, partial, body)
    if body.s3_crc is not None and body.s3_crc != body.crc:
        raise ChecksumMismatchError(
            f"{src.rel!r}: S3 reports CRC32C {crc.to_b64(body.s3_crc)}, we read {crc.to_b64(body.crc)}"
        )
    _verify(src.rel, stored.get("size"), stored.get("crc32c"), src.size, body.crc, "object")
    ours = crc.to_b64(body.crc)
    final = ctx.bucket.blob(name)
    final.metadata = provenance(src, ours)
    with google_errors("gcs"):
        final.patch(if_generation_match=int(stored["generation"]), retry=None)
    _verify(src.rel, final.size, final.crc32c, src.size, body.crc, "object")
    return Copied(src, ours, 1, body.s3_checked)


def copy_part(ctx: CopyContext, src: SourceObject, index: int, rng: tuple[int, int]) -> int:
    """Stream one ranged part into its own temporary object; return its verified CRC32C."""
    size = rng[1] - rng[0]
    body = _StreamBody(ctx, src, rng)
    stored = _upload(ctx, part_name(ctx, src, index), {}, body)
    _verify(src.rel, stored.get("size"), stored.get("crc32c"), size, body.crc, f"part {index} of")
    return body.crc


def compose(ctx: CopyContext, src: SourceObject, crcs: list[int], ranges: list[tuple[int, int]]) -> Copied:
    """Compose verified parts into the final object and check the composite CRC32C."""
    whole = crcs[0]
    for part_crc, (start, end) in zip(crcs[1:], ranges[1:], strict=True):
        whole = crc.combine(whole, part_crc, end - start)
    ours = crc.to_b64(whole)
    parts = [ctx.bucket.blob(part_name(ctx, src, i)) for i in range(len(ranges))]
    final = ctx.bucket.blob(ctx.dest.key(src.rel))
    final.metadata = provenance(src, ours)
    final.content_type = "application/octet-stream"
    with google_errors("gcs"):
        final.compose(parts, retry=None)
    _verify(src.rel, final.size, final.crc32c, src.size, whole, "composed object")
    for p in parts:  # best effort: a leftover part is deleted by the next run
        try:
            with google_errors("gcs"):
                p.delete(retry=None)
        except Exception as exc:
            log.debug("could not delete part %s: %s", p.name, exc)
    return Copied(src, ours, len(parts), False)


def _with_retries(ctx: CopyContext, fn: Callable[[], Any]) -> Any:
    """Transient errors under the one retry policy; a checksum mismatch a few times, then fail."""
    for attempt in range(1, MISMATCH_ATTEMPTS + 1):
        try:
            return retry.call(ctx.settings, fn)
        except ChecksumMismatchError as exc:
            if attempt == MISMATCH_ATTEMPTS:
                raise ChecksumMismatchError(f"{exc} (after {attempt} attempts)") from exc
            log.warning("checksum mismatch, retrying (%d/%d): %s", attempt, MISMATCH_ATTEMPTS, exc)
    raise AssertionError("unreachable")


@dataclass
class _Big:
    src: SourceObject
    ranges: list[tuple[int, int]]
    crcs: list[int | None]
    left: int


def copy_all(
    ctx: CopyContext, objects: list[SourceObject], on_progress: Callable[[int, int], None] | None = None
) -> list[Copied]:
    """Copy ``objects`` with at most ``ctx.concurrency`` units in flight; raise on the first failure.

    ``on_progress(objects_done, bytes_done)`` is called from this (the calling) thread.
    """
    order = sorted(objects, key=lambda o: -o.size)  # big first, so they do not form the tail

    def units() -> Iterator[tuple[str, SourceObject, int]]:
        for src in order:
            if src.size <= SMALL_MAX:
                yield ("small", src, 0)
            elif src.size < ctx.ranged_min:
                yield ("streamed", src, 0)
            else:
                for i in range(len(part_ranges(src.size, ctx.part_bytes))):
                    yield ("part", src, i)

    pending = units()
    ready: deque[tuple[str, SourceObject, int]] = deque()
    bigs: dict[str, _Big] = {}
    flight: dict[Future[Any], tuple[str, SourceObject, int]] = {}
    done: list[Copied] = []
    bytes_done = 0

    def start(pool: ThreadPoolExecutor, unit: tuple[str, SourceObject, int]) -> None:
        kind, src, i = unit
        if kind == "small":
            fn: Callable[[], Any] = lambda: copy_small(ctx, src)  # noqa: E731
        elif kind == "streamed":
            fn = lambda: copy_streamed(ctx, src)  # noqa: E731
        elif kind == "part":
            big = bigs.get(src.rel)
            if big is None:
                rs = part_ranges(src.size, ctx.part_bytes)
                big = bigs[src.rel] = _Big(src, rs, [None] * len(rs), len(rs))
            rng = big.ranges[i]
            fn = lambda: copy_part(ctx, src, i, rng)  # noqa: E731
        else:
            b = bigs[src.rel]
            fn = lambda: compose(ctx, src, [c or 0 for c in b.crcs], b.ranges)  # noqa: E731
        flight[pool.submit(_with_retries, ctx, fn)] = unit

    with ThreadPoolExecutor(ctx.concurrency, thread_name_prefix="mirror") as pool:
        try:
            while True:
                while len(flight) < ctx.concurrency + 2:
                    unit = ready.popleft() if ready else next(pending, None)
                    if unit is None:
                        break
                    start(pool, unit)
                if not flight:
                    break
                finished, _ = wait(flight, return_when=FIRST_COMPLETED)
                for fut in finished:
                    kind, src, i = flight.pop(fut)
                    result = fut.result()
                    if kind == "part":
                        big = bigs[src.rel]
                        big.crcs[i] = result
                        big.left -= 1
                        bytes_done += big.ranges[i][1] - big.ranges[i][0]
                        if big.left == 0:
                            ready.append(("compose", src, 0))
                        continue
                    if kind in ("small", "streamed"):
                        bytes_done += src.size
                    else:
                        bigs.pop(src.rel, None)
                    done.append(result)
                    if on_progress:
                        on_progress(len(done), bytes_done)
        except BaseException:
            for fut in flight:
                fut.cancel()
            raise
    return done
