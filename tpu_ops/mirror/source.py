"""Pinned reads of the listed S3 source, checksummed while read, checked against S3's own checksum.

Every read names the listed ``VersionId`` (versioned bucket) or sends ``If-Match: <listed ETag>``,
so an object overwritten during the run is either read as listed or detected
(:class:`~tpu_ops.errors.SourceChangedError`), never mixed in. A whole-object read asks S3 for its
full-object checksum; :func:`check_against_s3` is the one place it is compared with ours.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tpu_ops.cloud.translate import aws_error_code, aws_errors
from tpu_ops.errors import ChecksumMismatchError, SourceChangedError
from tpu_ops.mirror import crc
from tpu_ops.mirror.records import SourceObject
from tpu_ops.mirror.stream import BLOCK, ChecksumStream, Fault, close_quietly
from tpu_ops.uris import ObjectUri

_GONE = ("PreconditionFailed", "412", "NoSuchVersion", "NoSuchKey")


def get_pinned(s3: Any, uri: ObjectUri, src: SourceObject, rng: tuple[int, int] | None) -> dict[str, Any]:
    """GET exactly the listed version of ``src`` under ``uri`` (optionally the byte range ``[start, end)``)."""
    kw: dict[str, Any] = {"Bucket": uri.bucket, "Key": uri.key(src.rel)}
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
            resp: dict[str, Any] = s3.get_object(**kw)
        except Exception as exc:
            code = aws_error_code(exc)[0]
            if code in _GONE:
                raise SourceChangedError(
                    f"source object {src.rel!r} changed or vanished during the run ({code}); "
                    "it is not part of this snapshot: re-run to mirror the new version"
                ) from exc
            raise
    etag = str(resp.get("ETag", "")).strip('"')
    if (src.version_id and resp.get("VersionId") not in (None, src.version_id)) or (
        not src.version_id and etag and etag != src.etag
    ):
        close_quietly(resp["Body"])
        raise SourceChangedError(f"source object {src.rel!r} changed during the run (got ETag {etag})")
    want = (rng[1] - rng[0]) if rng else src.size
    if int(resp.get("ContentLength", want)) != want:
        close_quietly(resp["Body"])
        raise SourceChangedError(f"source object {src.rel!r}: expected {want} bytes, S3 sends {resp['ContentLength']}")
    return resp


def check_against_s3(resp: dict[str, Any], rel: str, ours: int) -> bool:
    """After a whole-object body was read: compare with S3's full-object checksum, if it sent one.

    Reads past the last byte, because botocore checks the checksums it validates itself (CRC32,
    SHA*) only when a read meets the end; compares S3's full-object CRC32C (composite multipart
    values, ``...-N``, are not comparable) with ``ours``. Returns whether any S3 checksum was checked.
    """
    try:
        with aws_errors("s3"):
            extra = resp["Body"].read(1)
    except ChecksumMismatchError as exc:  # botocore's FlexibleChecksumError, translated
        raise ChecksumMismatchError(f"{rel!r}: the bytes read do not match S3's checksum ({exc.__cause__})") from exc
    if extra:
        raise SourceChangedError(f"source object {rel!r}: S3 sends more bytes than listed")
    value = resp.get("ChecksumCRC32C")
    if value and "-" not in value and resp.get("ChecksumType") != "COMPOSITE":
        if crc.from_b64(value) != ours:
            raise ChecksumMismatchError(f"{rel!r}: S3 reports CRC32C {value}, we read {crc.to_b64(ours)}")
        return True
    return any(resp.get(k) for k in ("ChecksumCRC32", "ChecksumSHA1", "ChecksumSHA256"))


class PinnedRead:
    """One pinned GET of ``src`` (``rng=None``: the whole object) as a checksummed upload body.

    The GET is sent when iteration starts, so a retried upload re-reads from the start. After a
    full iteration ``crc`` is the CRC32C of every byte (``sha256`` too, if asked) and, for a
    whole object, ``s3_checked`` says whether S3's own checksum confirmed it; a mismatch raises
    before the last byte leaves, so the upload it feeds never completes.
    """

    def __init__(
        self,
        s3: Any,
        uri: ObjectUri,
        src: SourceObject,
        rng: tuple[int, int] | None = None,
        *,
        block: int = BLOCK,
        sha256: bool = False,
        fault: Fault | None = None,
    ) -> None:
        self._s3, self._uri, self._src, self._rng = s3, uri, src, rng
        self._block, self._sha256, self._fault = block, sha256, fault
        self.crc = 0
        self.sha256: str | None = None
        self.s3_checked = False

    def __len__(self) -> int:
        return self._rng[1] - self._rng[0] if self._rng else self._src.size

    def __iter__(self) -> Iterator[bytes]:
        resp = get_pinned(self._s3, self._uri, self._src, self._rng)
        stream = ChecksumStream(
            resp["Body"], self._src.rel, len(self), block=self._block, sha256=self._sha256, fault=self._fault
        )
        try:
            yield from stream
            if self._rng is None:
                self.s3_checked = check_against_s3(resp, self._src.rel, stream.crc)
        finally:
            close_quietly(resp["Body"])
        self.crc, self.sha256 = stream.crc, stream.sha256

    def read_all(self) -> bytes:
        """The whole range in memory, checked like a full iteration."""
        return b"".join(self)
