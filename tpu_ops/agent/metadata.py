"""A small client for the VM metadata server (real, or the host simulator's fake)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

from tpu_ops.errors import CloudError, NotFoundError, TransientError
from tpu_ops.settings import Settings


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """Who this worker is within its slice."""

    worker_number: int
    worker_count: int
    node_id: str
    zone: str
    endpoints: tuple[str, ...]


class MetadataClient:
    """Reads ``instance/attributes/*`` with the ``Metadata-Flavor: Google`` header."""

    def __init__(self, settings: Settings, timeout_s: float = 5.0) -> None:
        settings.check_safe("metadata_host")
        host = settings.metadata_host
        self.base = host if "://" in host else f"http://{host}"
        if not self.base.startswith(("http://", "https://")):
            raise CloudError(f"metadata host {host!r} is not an http(s) address", service="metadata")
        self.timeout_s = timeout_s

    def get(self, path: str) -> str:
        """GET ``computeMetadata/v1/<path>`` as text."""
        url = f"{self.base}/computeMetadata/v1/{path}"
        req = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})  # noqa: S310 - scheme checked
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310 - scheme checked
                return str(resp.read().decode())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise NotFoundError(f"metadata {path} not found", service="metadata", status=404) from None
            raise (TransientError if exc.code >= 500 else CloudError)(
                f"metadata {path}: HTTP {exc.code}", service="metadata", status=exc.code
            ) from None
        except (urllib.error.URLError, TimeoutError) as exc:
            raise TransientError(f"metadata server {self.base} unreachable: {exc}", service="metadata") from None

    def attribute(self, key: str) -> str:
        """One instance attribute (``agent-worker-number``, ``tpu-env``, ...)."""
        return self.get(f"instance/attributes/{key}")

    def tpu_env(self) -> dict[str, str]:
        """``tpu-env`` parsed: lines of ``KEY: 'value'``."""
        env: dict[str, str] = {}
        for line in self.attribute("tpu-env").splitlines():
            key, sep, value = line.partition(":")
            if sep:
                env[key.strip()] = value.strip().strip("'\"")
        return env

    def identity(self) -> WorkerIdentity:
        """This worker's number, the slice's worker list, node id and zone."""
        try:
            number = int(self.attribute("agent-worker-number").strip())
        except NotFoundError:  # Compute Engine TPU VMs say worker-id instead
            number = int(self.attribute("worker-id").strip())
        raw = self.attribute("worker-network-endpoints").strip()
        # The TPU API gives "id:uid:ip,..." entries (keep the IP, the last field); Compute Engine host names.
        endpoints = tuple(e.split(":")[-1] for e in raw.split(",") if e)
        env = self.tpu_env()
        zone = env.get("ZONE") or self.get("instance/zone").rsplit("/", 1)[-1]
        return WorkerIdentity(number, len(endpoints), env.get("NODE_ID", ""), zone, endpoints)


def dumps(identity: WorkerIdentity) -> str:
    """JSON of an identity, for reports."""
    return json.dumps(
        {
            "worker_number": identity.worker_number,
            "worker_count": identity.worker_count,
            "node_id": identity.node_id,
            "zone": identity.zone,
            "endpoints": list(identity.endpoints),
        },
        sort_keys=True,
    )
