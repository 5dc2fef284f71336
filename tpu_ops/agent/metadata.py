"""A small client for the VM metadata server (real, or the host simulator's fake). Standard library only.

Reads ``computeMetadata/v1/*`` with the ``Metadata-Flavor: Google`` header. ``GCE_METADATA_HOST``
(the variable Google's libraries honour; ``TPU_OPS_METADATA_HOST`` overrides it) names a fake.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_HOST = "metadata.google.internal"
# Which worker this VM is: TPU API VMs answer agent-worker-number; Compute Engine TPU VMs in a
# managed instance group have been seen answering worker-id instead.
WORKER_NUMBER_KEYS = ("agent-worker-number", "worker-id")


class MetadataError(Exception):
    """The metadata server did not answer, or not with what was asked; ``status`` 404 = no such key."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class WorkerIdentity:
    """Who this worker is within its slice."""

    worker_number: int
    worker_count: int
    node_id: str
    zone: str
    endpoints: tuple[str, ...]  # one address (IP or host name) per worker, in worker order

    def to_json(self) -> dict[str, object]:
        return {"worker_number": self.worker_number, "worker_count": self.worker_count, "node_id": self.node_id,
                "zone": self.zone, "endpoints": list(self.endpoints)}  # fmt: skip


def parse_endpoints(raw: str) -> tuple[str, ...]:
    """``worker-network-endpoints`` in either form: ``name:id:ip,...`` (the IP is kept) or a list of
    host names (comma- or whitespace-separated)."""
    out = []
    for entry in re.split(r"[,\s]+", raw.strip()):
        if not entry:
            continue
        out.append(entry.rsplit(":", 1)[-1] if entry.count(":") >= 2 else entry)
    return tuple(out)


def parse_tpu_env(text: str) -> dict[str, str]:
    """``tpu-env``: lines of ``KEY: 'value'``."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            env[key.strip()] = value.strip().strip("'\"")
    return env


class Metadata:
    """``GET http://HOST/computeMetadata/v1/<path>``, with retries on connection errors and 5xx."""

    def __init__(self, host: str = DEFAULT_HOST, timeout_s: float = 5.0, attempts: int = 4) -> None:
        self.base = (host if "://" in host else f"http://{host}").rstrip("/")
        if not self.base.startswith(("http://", "https://")):
            raise MetadataError(f"metadata host {host!r} is not an http(s) address")
        self.timeout_s = timeout_s
        self.attempts = attempts

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Metadata:
        env = os.environ if env is None else env
        return cls(env.get("TPU_OPS_METADATA_HOST") or env.get("GCE_METADATA_HOST") or DEFAULT_HOST)

    def get(self, path: str) -> str:
        url = f"{self.base}/computeMetadata/v1/{path}"
        req = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})  # noqa: S310 - scheme checked
        for attempt in range(self.attempts):
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
                    return bytes(resp.read()).decode()
            except urllib.error.HTTPError as exc:
                if exc.code < 500 or attempt == self.attempts - 1:
                    raise MetadataError(f"metadata {path}: HTTP {exc.code}", exc.code) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                if attempt == self.attempts - 1:
                    raise MetadataError(f"metadata server {self.base} unreachable: {exc}") from None
            time.sleep(0.2 * 2**attempt)
        raise AssertionError("unreachable")

    def attribute(self, key: str) -> str:
        return self.get(f"instance/attributes/{key}")

    def optional(self, key: str) -> str | None:
        """An attribute, or None when the server says it does not exist."""
        try:
            return self.attribute(key)
        except MetadataError as exc:
            if exc.status == 404:
                return None
            raise

    def tpu_env(self) -> dict[str, str]:
        return parse_tpu_env(self.optional("tpu-env") or "")

    def worker_number(self) -> int:
        """``agent-worker-number``, else ``worker-id``, else ``tpu-env``'s WORKER_ID, else 0 (one host)."""
        for key in WORKER_NUMBER_KEYS:
            value = self.optional(key)
            if value is not None and value.strip():
                return int(value.strip())
        return int(self.tpu_env().get("WORKER_ID") or 0)

    def identity(self) -> WorkerIdentity:
        """This worker's number, the slice's worker list, node id and zone."""
        number = self.worker_number()
        endpoints = parse_endpoints(self.optional("worker-network-endpoints") or "")
        if not endpoints:  # a single-host VM may not list itself
            endpoints = (self.get("instance/network-interfaces/0/ip").strip(),)
        env = self.tpu_env()
        zone = env.get("ZONE") or self.get("instance/zone").rsplit("/", 1)[-1]
        node = env.get("NODE_ID") or self.get("instance/name").strip()
        if not 0 <= number < len(endpoints):
            raise MetadataError(f"worker number {number} is outside the slice's {len(endpoints)} endpoints")
        return WorkerIdentity(number, len(endpoints), node, zone, endpoints)


def dumps(identity: WorkerIdentity) -> str:
    """JSON of an identity, for reports."""
    return json.dumps(identity.to_json(), sort_keys=True)
