"""The one module that touches the GCS SDK's private transport (``client._http``, ``client._connection``).

google-cloud-storage has no public way to send an upload body of unknown origin block by block
in one request (its multipart form joins resource and bytes in memory; its resumable form takes
several requests), nor to stream a download to a caller block by block. Both go through the
client's own authorized session here, so credentials, endpoint (emulator or mTLS) and the
connection pool stay the SDK's. Nothing else in tpu-ops reaches into those attributes; a test
enforces it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

from tpu_ops.cloud.translate import google_errors, google_http_error
from tpu_ops.mirror.stream import Body, Readable, Stored

UPLOAD_TIMEOUT = (60.0, 300.0)  # (connect, read) seconds for one streamed upload
DOWNLOAD_TIMEOUT = (60.0, 300.0)


def tune(gcs: Any, pool_size: int) -> Any:
    """Size ``gcs``'s connection pool for ``pool_size`` threads; settle proxy/CA settings once.

    requests re-reads proxy and CA-bundle variables on every request (a scan of the whole
    environment, ~0.5 ms per upload); they are settled here, by requests' own rules, for the
    endpoint the uploads use.
    """
    from requests.adapters import HTTPAdapter

    session = gcs._http
    adapter = HTTPAdapter(pool_connections=4, pool_maxsize=pool_size)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    env = session.merge_environment_settings(_base_url(gcs), {}, None, None, None)
    session.proxies, session.verify, session.trust_env = env["proxies"], env["verify"], False
    return gcs


def _base_url(gcs: Any) -> str:
    return str(gcs._connection.get_api_base_url_for_mtls())


class _Multipart:
    """A ``multipart/related`` upload body: the object's JSON resource, then its bytes (never joined)."""

    def __init__(self, resource: dict[str, Any], body: Body) -> None:
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


class GcsWriter:
    """A :class:`~tpu_ops.mirror.stream.Writer` into one GCS bucket: one multipart request per object.

    ``crc32c``, when known beforehand, is declared for GCS to check. The stream is never resumed:
    a failed upload is retried whole by the caller.
    """

    def __init__(self, gcs: Any, bucket: str) -> None:
        self._gcs = gcs
        self._url = f"{_base_url(gcs)}/upload/storage/v1/b/{quote(bucket, safe='')}/o?uploadType=multipart"

    def write(self, name: str, body: Body, metadata: dict[str, str], *, crc32c: str | None = None) -> Stored:
        """Create object ``name`` with custom ``metadata`` from ``body``; what GCS stored."""
        resource: dict[str, Any] = {"name": name, "contentType": "application/octet-stream", "metadata": metadata}
        if crc32c:
            resource["crc32c"] = crc32c
        data = _Multipart(resource, body)
        with google_errors("gcs"):
            resp = self._gcs._http.post(
                self._url, data=data, headers={"Content-Type": data.content_type}, timeout=UPLOAD_TIMEOUT
            )
            if resp.status_code not in (200, 201):
                raise google_http_error(resp, "gcs")
            doc: dict[str, Any] = resp.json()
        return Stored(int(doc.get("size") or -1), doc.get("crc32c"), int(doc["generation"]))


def open_object(gcs: Any, bucket: str, name: str, generation: int | None = None) -> tuple[Readable, int]:
    """Stream object ``name`` (pinned to ``generation`` if given): a raw body with ``read(n)`` and its size.

    Pair it with :class:`~tpu_ops.mirror.stream.ChecksumStream` to checksum while reading; close
    it with :func:`~tpu_ops.mirror.stream.close_quietly` if abandoned early.
    """
    url = f"{_base_url(gcs)}/download/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}?alt=media"
    if generation is not None:
        url += f"&generation={generation}"
    with google_errors("gcs"):
        resp = gcs._http.get(url, stream=True, timeout=DOWNLOAD_TIMEOUT, headers={"Accept-Encoding": "identity"})
        if resp.status_code != 200:
            resp.content  # noqa: B018 - the error body, for the message
            raise google_http_error(resp, "gcs")
    raw: Readable = resp.raw
    return raw, int(resp.headers.get("Content-Length", -1))
