"""Checksumming streams: the one place bytes are CRC32C'd (and, when asked, SHA-256'd) in passing.

The parts every copy between object stores is built from, whatever the direction (S3 → GCS for
the mirror, GCS → S3 for an export):

- :class:`ChecksumStream` reads exactly ``size`` bytes from a file-like source (a botocore
  ``StreamingBody``, a urllib3 response), ``block`` bytes at a time, and yields them while
  computing their CRC32C and optionally their SHA-256. A source that breaks *or ends early* raises
  :class:`~tpu_ops.errors.TransientError`: when a connection closes mid-body, botocore's
  ``read(n)`` returns what it had without raising, so a short read is a fault to retry, never a
  sign that the source changed (only a changed ETag or version is).
- :class:`Body` is what a writer uploads: a sized iterable of bytes, so an HTTP client sends it
  with a ``Content-Length`` block by block and never holds the object.
- :class:`Writer` is the destination side: ``write(name, body, metadata, crc32c)`` stores one
  object in one request and returns what the store reports (:class:`Stored`), for the caller to
  compare with its own checksum.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import google_crc32c

from tpu_ops.errors import TransientError

MiB = 1024 * 1024
BLOCK = 4 * MiB  # bytes read and passed on at a time

Fault = Callable[[str, bytes], bytes]
"""Test seam: ``fault(name, data) -> data`` sees bytes after they are checksummed, before upload."""


class Readable(Protocol):
    """A file-like source: ``read(n)`` returns at most ``n`` bytes, ``b""`` at the end."""

    def read(self, amt: int = ..., /) -> bytes: ...


class Body(Protocol):
    """An upload body: its length, then its bytes block by block."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[bytes]: ...


@dataclass(frozen=True, slots=True)
class Stored:
    """What the destination reports for an object it stored (CRC32C base64, as GCS reports it)."""

    size: int
    crc32c: str | None
    generation: int | None = None


class Writer(Protocol):
    """Stores one object from a :class:`Body` in one request."""

    def write(self, name: str, body: Body, metadata: dict[str, str], *, crc32c: str | None = None) -> Stored: ...


class ChecksumStream:
    """Exactly ``size`` bytes of ``raw``, ``block`` at a time, checksummed as they pass.

    ``crc`` (CRC32C) and ``count`` cover every byte yielded so far; ``sha256`` is the hex digest
    once the stream is exhausted (``sha256=True`` only). ``service`` names the source in errors.
    """

    def __init__(
        self,
        raw: Readable,
        name: str,
        size: int,
        *,
        block: int = BLOCK,
        sha256: bool = False,
        fault: Fault | None = None,
        service: str = "s3",
    ) -> None:
        self._raw, self._name, self._size, self._block = raw, name, size, max(1, block)
        self._fault, self._service = fault, service
        self._sha = hashlib.sha256() if sha256 else None
        self.crc = 0
        self.count = 0

    def __len__(self) -> int:
        return self._size

    @property
    def sha256(self) -> str | None:
        return self._sha.hexdigest() if self._sha is not None else None

    def __iter__(self) -> Iterator[bytes]:
        while self.count < self._size:
            data = self._read(min(self._block, self._size - self.count))
            self.crc = google_crc32c.extend(self.crc, data)
            if self._sha is not None:
                self._sha.update(data)
            self.count += len(data)
            yield self._fault(self._name, data) if self._fault else data

    def _read(self, n: int) -> bytes:
        try:
            data: bytes = self._raw.read(n)
        except Exception as exc:  # a broken stream is worth another attempt from the start
            raise TransientError(f"reading {self._name!r} failed: {exc}", service=self._service) from exc
        if not data:
            raise TransientError(
                f"reading {self._name!r}: the stream ended after {self.count} of {self._size} bytes",
                service=self._service,
            )
        return data

    def read_all(self) -> bytes:
        """Every byte, in memory (one block when ``block >= size``: no extra copy)."""
        return b"".join(self)


class BytesBody:
    """Bytes already in memory, as an upload :class:`Body`."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[bytes]:
        yield self._data


def close_quietly(raw: Any) -> None:
    """Close a response body; a body that cannot be closed is no reason to fail."""
    close = getattr(raw, "close", None)
    if close is not None:
        with contextlib.suppress(Exception):  # the stream is being abandoned either way
            close()
