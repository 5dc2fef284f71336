"""A fake GCE/TPU-VM metadata server for one worker host, on 127.0.0.1 (a free port).

``tpu_vm_values`` is what a Cloud TPU API worker sees, ``compute_vm_values`` what a Compute
Engine TPU VM sees (``worker-id``, host names in ``worker-network-endpoints``).

Serves what a TPU VM's startup script and Google's libraries read: ``instance/attributes/*``
(``agent-worker-number``, ``worker-network-endpoints``, ``tpu-env``, ``startup-script`` and the
node's other metadata), ``project/project-id``, ``instance/zone|hostname|id|name`` and a fake
``service-accounts/default/token``. Like the real one it requires ``Metadata-Flavor: Google``
and answers with that header; ``PUT instance/guest-attributes/<ns>/<key>`` is forwarded to the
fake TPU API so ``nodes.getGuestAttributes`` sees it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

PREFIX = "/computeMetadata/v1/"
TOKEN = "instance/service-accounts/default/token"  # noqa: S105 - a metadata path, not a secret
GuestAttributeSink = Callable[[str, str, str], None]  # (namespace, key, value)


class MetadataServer:
    """``values`` maps metadata paths under ``computeMetadata/v1/`` to their text; ``token`` (if
    given) answers ``instance/service-accounts/default/token`` afresh on each read, as the real server
    hands out a current token of the VM's service account (the local stack's: one its OAuth endpoint issued)."""

    def __init__(
        self,
        values: dict[str, str],
        guest_sink: GuestAttributeSink | None = None,
        token: Callable[[], str] | None = None,
    ) -> None:
        self.values = dict(values)
        self.token = token
        self.guest_sink = guest_sink
        self.guest_attributes: dict[str, str] = {}
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self.host = f"127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def start(self) -> MetadataServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def _lookup(self, path: str, recursive: bool) -> tuple[int, str, str]:
        if path == TOKEN and self.token is not None:
            return 200, self.token(), "application/json"
        if path in self.values:
            # The real server types the token as JSON, and google-auth parses it only when so typed.
            ctype = "application/json" if path.endswith("/token") else "application/text"
            return 200, self.values[path], ctype
        if path.endswith("/") or path == "":
            children = sorted({k[len(path) :].split("/")[0] + ("/" if "/" in k[len(path) :] else "")
                               for k in self.values if k.startswith(path)})  # fmt: skip
            if not children:
                return 404, "not found", "text/html"
            if recursive:
                flat = {
                    k[len(path) :]: v
                    for k, v in self.values.items()
                    if k.startswith(path) and "/" not in k[len(path) :]
                }
                return 200, json.dumps(flat), "application/json"
            return 200, "\n".join(children), "application/text"
        return 404, "not found", "text/html"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def _send(self, code: int, body: str, ctype: str = "application/text") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _path(self) -> tuple[str, dict[str, list[str]]] | None:
                url = urlsplit(self.path)
                if url.path in ("/", ""):
                    self._send(200, "computeMetadata/\n")  # what google-auth's ping sees
                    return None
                if self.headers.get("Metadata-Flavor") != "Google":
                    self._send(403, "Missing required header: Metadata-Flavor: Google", "text/html")
                    return None
                if not url.path.startswith(PREFIX):
                    self._send(404, "not found", "text/html")
                    return None
                return url.path[len(PREFIX) :], parse_qs(url.query)

            def do_GET(self) -> None:
                found = self._path()
                if found is None:
                    return
                path, query = found
                if path.startswith("instance/guest-attributes/"):
                    key = path.removeprefix("instance/guest-attributes/")
                    if key in server.guest_attributes:
                        self._send(200, server.guest_attributes[key])
                        return
                recursive = query.get("recursive", ["false"])[0].lower() == "true"
                self._send(*server._lookup(path, recursive))

            def do_PUT(self) -> None:
                found = self._path()
                if found is None:
                    return
                path, _ = found
                parts = path.removeprefix("instance/guest-attributes/").split("/")
                if not path.startswith("instance/guest-attributes/") or len(parts) != 2:
                    self._send(400, "only instance/guest-attributes/<namespace>/<key> is writable", "text/html")
                    return
                value = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                server.guest_attributes["/".join(parts)] = value
                if server.guest_sink is not None:
                    server.guest_sink(parts[0], parts[1], value)
                self._send(200, "")

        return Handler


def tpu_vm_values(node: dict[str, Any], project: str, zone: str, worker: int) -> dict[str, str]:
    """The metadata a worker of ``node`` (v2 API JSON) sees, keyed by path under computeMetadata/v1/."""
    node_id = node["name"].rsplit("/", 1)[1]
    ips = [e["ipAddress"] for e in node.get("networkEndpoints", [])]
    accel = node.get("acceleratorType", "")
    tpu_env = {
        "ACCELERATOR_TYPE": accel,
        "NODE_ID": node_id,
        "WORKER_ID": str(worker),
        "ZONE": zone,
        "PROJECT": project,
        "RUNTIME_VERSION": node.get("runtimeVersion", ""),
        "TOPOLOGY": node.get("acceleratorConfig", {}).get("topology", ""),
        "TYPE": str(node.get("acceleratorConfig", {}).get("type", "")),
        "HOSTS": str(len(ips)),
        **(node.get("_tpuEnv") or {}),  # a multislice node's MEGASCALE_* (the fake TPU API's event carries them)
    }
    attrs: dict[str, str] = {str(k): str(v) for k, v in (node.get("metadata") or {}).items()}
    attrs.update({
        "agent-worker-number": str(worker),
        # The format JAX parses: comma-separated "<a>:<b>:<ip>" entries, one per worker.
        "worker-network-endpoints": ",".join(f"unknown:unknown:{ip}" for ip in ips),
        "tpu-env": "".join(f"{k}: '{v}'\n" for k, v in tpu_env.items()),
        "accelerator-type": accel,
        "instance-id": node.get("id", ""),
    })  # fmt: skip
    values = {f"instance/attributes/{k}": v for k, v in attrs.items()}
    host = f"t1v-n-{node.get('id', '0')[-8:]}-w-{worker}"
    values.update(_vm_values(project, zone, ips[worker] if worker < len(ips) else "127.0.0.1"))
    values.update({
        "instance/hostname": f"{host}.{zone}.c.{project}.internal",
        "instance/name": host,
        "instance/id": f"{node.get('id', '0')}{worker}",
    })  # fmt: skip
    return values


def _vm_values(project: str, zone: str, ip: str) -> dict[str, str]:
    """What every fake VM's metadata server answers alike: project, zone, IP, service account."""
    return {
        "project/project-id": project,
        "project/numeric-project-id": "123456789012",
        "instance/zone": f"projects/123456789012/zones/{zone}",
        "instance/network-interfaces/0/ip": ip,
        "instance/service-accounts/default/email": f"tpu-vm@{project}.iam.gserviceaccount.com",
        "instance/service-accounts/default/scopes": "https://www.googleapis.com/auth/cloud-platform",
        "instance/service-accounts/default/token": json.dumps(
            {"access_token": "fake-local-token", "expires_in": 3599, "token_type": "Bearer"}
        ),
    }


def compute_vm_values(node: dict[str, Any], project: str, zone: str, worker: int) -> dict[str, str]:
    """The metadata a Compute Engine TPU VM (one instance of a slice) sees: ``worker-id`` instead
    of ``agent-worker-number`` and ``worker-network-endpoints`` naming the slice's hosts."""
    name = node["name"].rsplit("/", 1)[1]
    ips = [e["ipAddress"] for e in node.get("networkEndpoints", [])]
    hostnames = [str(h) for h in node.get("hostnames", [])]
    # Host names with each host's IP (``name:id:ip``, a form JAX and the agent read): the fake's host
    # names resolve nowhere, so the JAX coordinator address must be worker 0's IP.
    endpoints = ",".join(f"{h}:{i}:{ip}" for i, (h, ip) in enumerate(zip(hostnames, ips, strict=True)))
    accel = str(node.get("acceleratorType", ""))
    tpu_env = {
        "ACCELERATOR_TYPE": accel,
        "WORKER_ID": str(worker),
        "ZONE": zone,
        "PROJECT": project,
        "TOPOLOGY": str(node.get("topology", "")),
        "HOSTS": str(len(ips)),
    }
    attrs: dict[str, str] = {str(k): str(v) for k, v in (node.get("metadata") or {}).items()}
    attrs.update({
        "worker-id": str(worker),
        "worker-network-endpoints": endpoints,
        "tpu-env": "".join(f"{k}: '{v}'\n" for k, v in tpu_env.items()),
        "accelerator-type": accel,
    })  # fmt: skip
    values = {f"instance/attributes/{k}": v for k, v in attrs.items()}
    values.update(_vm_values(project, zone, ips[worker] if worker < len(ips) else "127.0.0.1"))
    values.update({
        "instance/hostname": str(node.get("hostname", name)),
        "instance/name": name,
        "instance/id": str(node.get("id", "0")),
        "instance/machine-type": f"projects/123456789012/machineTypes/{node.get('machineType', '')}",
    })  # fmt: skip
    return values
