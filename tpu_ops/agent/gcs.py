"""GCS through its JSON API with the standard library only (what a bare TPU VM image can run).

Auth is the VM's service account: a bearer token from the metadata server, cached until shortly
before it expires. ``STORAGE_EMULATOR_HOST`` (the variable Google's own clients honour) points
the client at an emulator; without it, ``https://storage.googleapis.com``. Transient answers
(429, 5xx, connection errors, timeouts) are retried with exponential backoff and jitter.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from tpu_ops.agent.metadata import Metadata, MetadataError

GOOGLE = "https://storage.googleapis.com"
TRANSIENT = frozenset({408, 429, 500, 502, 503, 504})


class GcsError(Exception):
    """A GCS call failed; ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class NotFound(GcsError):
    """404: no such object or bucket."""


class PreconditionFailed(GcsError):
    """412: an ``ifGenerationMatch`` condition did not hold."""


def split_gs(uri: str) -> tuple[str, str]:
    """``gs://bucket/key`` → ``(bucket, key)``; refuses other schemes and ``..``/``.`` segments."""
    if not uri.startswith("gs://"):
        raise ValueError(f"{uri!r} is not a gs:// URI")
    bucket, _, key = uri[len("gs://") :].partition("/")
    key = key.strip("/")
    if not bucket or any(part in (".", "..") for part in key.split("/")):
        raise ValueError(f"{uri!r}: no bucket, or a '.'/'..' segment in the key")
    return bucket, key


def join(prefix: str, *parts: str) -> str:
    """``prefix`` (a key or gs:// URI) and more segments, joined with single slashes."""
    return "/".join([prefix.rstrip("/"), *(p.strip("/") for p in parts if p)])


class Gcs:
    """The calls the agent, the bootstrap's successor and the reference trainer need."""

    def __init__(
        self,
        endpoint: str | None = None,
        token: Callable[[], str | None] | None = None,
        *,
        attempts: int = 6,
        timeout_s: float = 30.0,
    ) -> None:
        base = endpoint or GOOGLE
        self.base = (base if "://" in base else "http://" + base).rstrip("/")
        if not self.base.startswith(("http://", "https://")):
            raise ValueError(f"GCS endpoint {base!r} is not an http(s) address")
        self._token = token or (lambda: None)
        self.attempts = attempts
        self.timeout_s = timeout_s

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, metadata: Metadata | None = None) -> Gcs:
        """The VM's client: ``STORAGE_EMULATOR_HOST`` or Google, token from the metadata server.

        Against an emulator the token is optional (a trainer run outside a worker has no metadata
        server); against Google a missing token is an error on the first call.
        """
        env = os.environ if env is None else env
        endpoint = env.get("STORAGE_EMULATOR_HOST") or None
        if endpoint and metadata is None and not (env.get("TPU_OPS_METADATA_HOST") or env.get("GCE_METADATA_HOST")):
            # Outside a VM against an emulator: asking metadata.google.internal would leave loopback.
            return cls(endpoint, lambda: None)
        md = metadata or Metadata.from_env(env)
        cache: dict[str, Any] = {}

        def token() -> str | None:
            if cache.get("token") and cache["until"] > time.monotonic():
                return str(cache["token"])
            try:
                doc = json.loads(md.get("instance/service-accounts/default/token"))
            except MetadataError:
                if endpoint:
                    return None  # an emulator needs no token
                raise
            cache["token"] = doc["access_token"]
            cache["until"] = time.monotonic() + max(0.0, float(doc.get("expires_in", 60)) - 60)
            return str(doc["access_token"])

        return cls(endpoint, token)

    # -- HTTP ----------------------------------------------------------------------------------
    def _call(self, method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> bytes:
        hdrs = dict(headers or {})
        delay = 0.2
        for attempt in range(self.attempts):
            tok = self._token()
            if tok:
                hdrs["Authorization"] = f"Bearer {tok}"
            req = urllib.request.Request(url, data=body, method=method, headers=hdrs)  # noqa: S310 - http(s) checked
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
                    return bytes(resp.read())
            except urllib.error.HTTPError as exc:
                detail = exc.read()[:300].decode(errors="replace")
                where = url.split("?")[0]
                if exc.code == 404:
                    raise NotFound(f"GCS {method} {where}: 404", 404) from None
                if exc.code == 412:
                    raise PreconditionFailed(f"GCS {method} {where}: 412 precondition failed", 412) from None
                if exc.code not in TRANSIENT or attempt == self.attempts - 1:
                    raise GcsError(f"GCS {method} {where}: HTTP {exc.code} {detail}", exc.code) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                if attempt == self.attempts - 1:
                    raise GcsError(f"GCS {method} {url.split('?')[0]}: {exc}") from None
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 10.0)
        raise AssertionError("unreachable")

    def _object_url(self, bucket: str, key: str, upload: bool = False) -> str:
        b = urllib.parse.quote(bucket, safe="")
        if upload:
            return f"{self.base}/upload/storage/v1/b/{b}/o"
        return f"{self.base}/storage/v1/b/{b}/o/{urllib.parse.quote(key, safe='')}"

    # -- objects -------------------------------------------------------------------------------
    def read(self, bucket: str, key: str) -> bytes:
        """An object's bytes; ``NotFound`` if absent."""
        return self._call("GET", self._object_url(bucket, key) + "?alt=media")

    def read_json(self, bucket: str, key: str) -> Any:
        return json.loads(self.read(bucket, key))

    def stat(self, bucket: str, key: str) -> dict[str, Any]:
        """An object's metadata (``size``, ``crc32c``, ``generation``, ...); ``NotFound`` if absent."""
        return dict(json.loads(self._call("GET", self._object_url(bucket, key))))

    def exists(self, bucket: str, key: str) -> bool:
        try:
            self.stat(bucket, key)
        except NotFound:
            return False
        return True

    def write(
        self,
        bucket: str,
        key: str,
        data: bytes | str,
        content_type: str = "application/octet-stream",
        if_generation_match: int | None = None,
    ) -> dict[str, Any]:
        """Upload ``data`` in one request (media upload); returns the new object's metadata."""
        query = {"uploadType": "media", "name": key}
        if if_generation_match is not None:
            query["ifGenerationMatch"] = str(if_generation_match)
        url = self._object_url(bucket, key, upload=True) + "?" + urllib.parse.urlencode(query)
        raw = data.encode() if isinstance(data, str) else data
        out = self._call("POST", url, raw, {"Content-Type": content_type})
        return dict(json.loads(out)) if out else {}

    def write_json(self, bucket: str, key: str, doc: Any) -> None:
        self.write(bucket, key, json.dumps(doc, sort_keys=True, default=str), "application/json")

    def delete(self, bucket: str, key: str) -> None:
        with contextlib.suppress(NotFound):
            self._call("DELETE", self._object_url(bucket, key))

    def list_objects(self, bucket: str, prefix: str = "", match_glob: str | None = None) -> Iterator[dict[str, Any]]:
        """Every object under ``prefix`` (all pages); ``match_glob`` is a hint an emulator may ignore."""
        token: str | None = None
        while True:
            query = {"prefix": prefix} if prefix else {}
            if match_glob:
                query["matchGlob"] = match_glob
            if token:
                query["pageToken"] = token
            url = f"{self.base}/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o"
            page = json.loads(self._call("GET", url + ("?" + urllib.parse.urlencode(query) if query else "")))
            yield from page.get("items", [])
            token = page.get("nextPageToken")
            if not token:
                return

    def list_json(self, bucket: str, prefix: str) -> list[Any]:
        """Every JSON document directly under ``prefix/``, skipping ones that vanish or are half-written."""
        out = []
        for item in self.list_objects(bucket, prefix.rstrip("/") + "/"):
            try:
                out.append(self.read_json(bucket, item["name"]))
            except (NotFound, ValueError):
                continue
        return out

    def download_prefix(self, uri: str, dest: str) -> list[str]:
        """Copy every object under ``gs://bucket/prefix/`` into ``dest`` (sub-paths kept); the local paths."""
        bucket, prefix = split_gs(uri)
        head = prefix + "/" if prefix else ""
        root = os.path.realpath(dest)
        written = []
        for item in self.list_objects(bucket, head):
            rel = item["name"][len(head) :]
            if not rel or rel.endswith("/") or any(p in ("", ".", "..") for p in rel.split("/")):
                continue  # folder placeholders and keys that would leave dest are skipped
            path = os.path.realpath(os.path.join(root, rel))
            if not path.startswith(root + os.sep):
                continue
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = path + ".part"
            with open(tmp, "wb") as f:
                f.write(self.read(bucket, item["name"]))
            os.replace(tmp, path)
            written.append(path)
        return written
