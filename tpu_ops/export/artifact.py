"""``model.tar.gz`` streamed from GCS into S3: multipart, bounded memory, no local disk, write-once.

The tar stream is written into :class:`MultipartSink`, which cuts it into parts and uploads each
as soon as it is full, computing SHA-256 and CRC32C of the whole object as it goes. Each GCS
object is read through :class:`CheckedReader`, which compares its CRC32C with what GCS stored.
The upload declares S3's full-object CRC32C and completes with ``If-None-Match: *``: the key
appears only when the whole artifact is there, and never replaces one already there. Until the
complete call nothing exists under the key, so an interrupted export leaves nothing a later one
could take as done (the incomplete upload is aborted, or expires by the bucket's lifecycle rule).
"""

from __future__ import annotations

import contextlib
import hashlib
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import google_crc32c

from tpu_ops.cloud.translate import aws_error_code
from tpu_ops.errors import AlreadyExistsError, IntegrityError
from tpu_ops.mirror.crc import from_b64, to_b64
from tpu_ops.mirror.stream import ChecksumStream, close_quietly

MiB = 1024 * 1024
PART_SIZE = 8 * MiB  # S3's minimum is 5 MiB for every part but the last
READ_CHUNK = 4 * MiB


@dataclass(frozen=True)
class Member:
    """One GCS object to put in the archive under ``name``."""

    name: str
    blob: Any  # google.cloud.storage.Blob, reloaded (size and crc32c known)


@dataclass(frozen=True)
class Artifact:
    """An uploaded, verified artifact."""

    uri: str
    bucket: str
    key: str
    size: int
    sha256: str
    crc32c: str
    version_id: str | None
    parts: int
    members: int
    request_ids: tuple[str, ...]
    adopted: bool = False  # an earlier export of the same run had already uploaded it

    def subject(self) -> dict[str, Any]:
        return {"uri": self.uri, "kind": "artifact", "sha256": self.sha256, "crc32c": self.crc32c,
                "size": self.size, "version": self.version_id}  # fmt: skip


class CheckedReader:
    """A file-like view of a GCS blob for ``tarfile``: bytes pass through the mirror's
    :class:`~tpu_ops.mirror.stream.ChecksumStream` (CRC32C in passing, a short read is an error),
    and :meth:`close` compares the CRC32C with the one GCS stored."""

    def __init__(self, blob: Any) -> None:
        self._blob = blob
        self._raw = blob.open("rb", chunk_size=READ_CHUNK)
        self.stream = ChecksumStream(self._raw, f"gs://{blob.bucket.name}/{blob.name}", int(blob.size),
                                     block=READ_CHUNK, service="gcs")  # fmt: skip
        self._blocks = iter(self.stream)
        self._block = memoryview(b"")  # the current block, and how far tarfile has read into it
        self._at = 0

    def read(self, n: int = -1) -> bytes:
        """``n`` bytes unless the blob ends first (``tarfile`` takes a short read for the end of data)."""
        parts: list[bytes] = []
        want = n
        while want != 0:
            if self._at >= len(self._block):
                block = next(self._blocks, None)
                if block is None:
                    break
                self._block, self._at = memoryview(block), 0
            end = len(self._block) if want < 0 else min(len(self._block), self._at + want)
            parts.append(bytes(self._block[self._at : end]))
            want = want - (end - self._at) if want > 0 else want
            self._at = end
        return b"".join(parts)

    def close(self) -> None:
        close_quietly(self._raw)
        crc, where = self.stream.crc, f"gs://{self._blob.bucket.name}/{self._blob.name}"
        if self.stream.count != len(self.stream):
            raise IntegrityError(f"{where}: read {self.stream.count} bytes, GCS says {len(self.stream)}")
        if self._blob.crc32c and crc != from_b64(self._blob.crc32c):
            raise IntegrityError(f"{where}: CRC32C read {to_b64(crc)} differs from GCS's {self._blob.crc32c}")


class MultipartSink:
    """A write-only file: bytes written are uploaded as parts of one multipart upload, hashed on the way."""

    def __init__(self, s3: Any, bucket: str, key: str, metadata: dict[str, str]) -> None:
        self.s3, self.bucket, self.key = s3, bucket, key
        resp = s3.create_multipart_upload(
            Bucket=bucket, Key=key, ChecksumAlgorithm="CRC32C", ChecksumType="FULL_OBJECT",
            ContentType="application/gzip", Metadata=metadata,
        )  # fmt: skip
        self.upload_id: str = resp["UploadId"]
        self.request_ids = [_request_id(resp)]
        self._buf = bytearray()
        self._parts: list[dict[str, Any]] = []
        self._sha = hashlib.sha256()
        self._crc = 0
        self.size = 0

    def write(self, data: bytes) -> int:
        self._buf += data
        self._sha.update(data)
        self._crc = google_crc32c.extend(self._crc, data)
        self.size += len(data)
        while len(self._buf) >= PART_SIZE:
            self._upload(bytes(self._buf[:PART_SIZE]))
            del self._buf[:PART_SIZE]
        return len(data)

    def _upload(self, part: bytes) -> None:
        number = len(self._parts) + 1
        crc = to_b64(google_crc32c.value(part))
        resp = self.s3.upload_part(Bucket=self.bucket, Key=self.key, UploadId=self.upload_id, PartNumber=number,
                                   Body=part, ChecksumCRC32C=crc)  # fmt: skip
        self._parts.append({"ETag": resp["ETag"], "PartNumber": number, "ChecksumCRC32C": crc})

    def complete(self) -> tuple[str, str, str | None]:
        """Upload the last part and complete, unless the key exists. Returns (sha256, crc32c, version)."""
        if self._buf or not self._parts:
            self._upload(bytes(self._buf))
            self._buf.clear()
        crc = to_b64(self._crc)
        try:
            resp = self.s3.complete_multipart_upload(
                Bucket=self.bucket, Key=self.key, UploadId=self.upload_id, MultipartUpload={"Parts": self._parts},
                ChecksumCRC32C=crc, ChecksumType="FULL_OBJECT", IfNoneMatch="*",
            )  # fmt: skip
        except Exception as exc:
            if aws_error_code(exc)[1] in (409, 412):
                raise AlreadyExistsError(f"s3://{self.bucket}/{self.key} already exists; not overwritten",
                                         service="s3", status=aws_error_code(exc)[1]) from exc  # fmt: skip
            raise
        self.request_ids.append(_request_id(resp))
        return self._sha.hexdigest(), crc, resp.get("VersionId")

    def abort(self) -> None:
        """Abort the upload (best effort: if S3 is down, the bucket's lifecycle rule expires it)."""
        with contextlib.suppress(Exception):  # the original error is what the caller must see
            self.s3.abort_multipart_upload(Bucket=self.bucket, Key=self.key, UploadId=self.upload_id)


def _request_id(resp: dict[str, Any]) -> str:
    return str(resp.get("ResponseMetadata", {}).get("RequestId", ""))


def upload_archive(s3: Any, bucket: str, key: str, members: Iterable[Member], metadata: dict[str, str]) -> Artifact:
    """Stream ``members`` as a gzipped tar to ``s3://bucket/key`` and verify it; never overwrites."""
    sink = MultipartSink(s3, bucket, key, metadata)
    count = 0
    try:
        with tarfile.open(fileobj=sink, mode="w|gz") as tar:  # type: ignore[call-overload]
            for m in members:
                info = tarfile.TarInfo(m.name)
                info.size = int(m.blob.size)
                info.mtime = int(m.blob.updated.timestamp()) if m.blob.updated else 0
                info.mode = 0o644
                reader = CheckedReader(m.blob)
                tar.addfile(info, reader)
                reader.close()
                count += 1
        sha, crc, version = sink.complete()
    except BaseException:
        sink.abort()
        raise
    art = Artifact(f"s3://{bucket}/{key}", bucket, key, sink.size, sha, crc, version, len(sink._parts), count,
                   tuple(sink.request_ids))  # fmt: skip
    verify_artifact(s3, art.bucket, art.key, art.sha256, art.crc32c)
    return art


def verify_artifact(s3: Any, bucket: str, key: str, sha256: str | None, crc32c: str | None) -> tuple[str, str, int]:
    """Read the object back: its SHA-256 and CRC32C must match ``sha256``/``crc32c`` (when given) and S3's
    stored full-object CRC32C. Returns (sha256, crc32c, size) of what was read."""
    head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    stored = head.get("ChecksumCRC32C")
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    stream = ChecksumStream(body, f"s3://{bucket}/{key}", int(head["ContentLength"]), block=READ_CHUNK, sha256=True)
    try:
        for _ in stream:
            pass
    finally:
        close_quietly(body)
    got_crc, sha_hex, size = to_b64(stream.crc), str(stream.sha256), stream.count
    where = f"s3://{bucket}/{key}"
    if stored is None or head.get("ChecksumType", "FULL_OBJECT") != "FULL_OBJECT":
        raise IntegrityError(f"{where}: S3 holds no full-object CRC32C for it")
    if got_crc != stored or (crc32c and crc32c != stored):
        raise IntegrityError(f"{where}: CRC32C read back {got_crc}, S3 stored {stored}, uploaded {crc32c}")
    if sha256 and sha_hex != sha256:
        raise IntegrityError(f"{where}: SHA-256 read back {sha_hex} differs from uploaded {sha256}")
    return sha_hex, got_crc, size
