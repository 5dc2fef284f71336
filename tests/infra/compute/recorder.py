"""Record every answer a fake Compute Engine gives and check each against the ``compute.v1`` discovery
document google-api-python-client ships (imported as ``compute.recorder``; tests/infra is on sys.path).

``Recorder`` wraps the server's WSGI app and keeps (method, path, status, JSON body) of every reply.
``problems`` maps each successful reply to the discovery method with that HTTP method and path, and
checks its body against the method's response schema: every field is in the schema with the right
JSON type (``tpu.discovery``), and the output fields Google always sets are present (``kind``, ``id``,
``selfLink``, ``creationTimestamp``, ``name`` where the schema has them and marks them output-only;
``kind``, ``id``, ``selfLink`` of every list). An error reply must be Google's error JSON.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

from tpu.discovery import Discovery
from werkzeug.wrappers import Request

COMPUTE = Discovery("compute.v1.json", set(), {})
PREFIX = "/compute/v1/"
RESOURCE_FIELDS = ("kind", "id", "selfLink", "creationTimestamp", "name")
LIST_FIELDS = ("kind", "id", "selfLink")
# Deviations we keep on purpose, each with its reason.
KNOWN = [
    # This revision's Quota.metric enum stops at v5e; the fake's v5p/v6e/TPU7x metric names are its own
    # (infra/local/compute/machines.py).
    re.compile(r"\.quotas\[\d+\]\.metric: '(PREEMPTIBLE_)?TPU_PODSLICE_[A-Z0-9]+' not in enum"),
]


@dataclass(frozen=True)
class Reply:
    method: str
    path: str
    status: int
    body: Any


class Recorder:
    """A WSGI middleware in front of a fake's ``JsonApp``: answers as it does, and keeps every reply."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.replies: list[Reply] = []
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        req = Request(environ)
        resp = self.app.handle(req)
        if req.path.startswith(PREFIX):
            body = json.loads(resp.get_data() or b"null")
            with self._lock:
                self.replies.append(Reply(req.method, req.path, resp.status_code, body))
        return resp(environ, start_response)


@cache
def _methods() -> list[tuple[str, re.Pattern[str], str]]:
    """(HTTP method, path regex, response schema) of every method in the discovery document."""
    doc = json.loads(COMPUTE.doc.read_text())
    out = []
    for res in doc["resources"].values():
        for m in res.get("methods", {}).values():
            pattern = re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(m["path"]))
            out.append((m["httpMethod"], re.compile(f"^{pattern}$"), m.get("response", {}).get("$ref", "")))
    return out


def schema_for(method: str, path: str) -> str | None:
    """The response schema of the discovery method ``method path`` stands for (None: no such method)."""
    rel = path.removeprefix(PREFIX)
    found = {schema for verb, rx, schema in _methods() if verb == method and rx.match(rel)}
    assert len(found) <= 1, (method, path, found)
    return found.pop() if found else None


def _output_only(schema: str, field: str) -> bool:
    prop = COMPUTE.schemas[schema].get("properties", {}).get(field)
    if prop is None:
        return False
    return "output only" in prop.get("description", "").lower() or (field == "kind" and "default" in prop)


def _missing(schema: str, body: dict[str, Any], where: str) -> list[str]:
    """The always-set output fields absent from ``body`` (and from the resources a list holds)."""
    props = COMPUTE.schemas[schema].get("properties", {})
    out: list[str] = []
    if schema.endswith("List"):
        out += [f"{where}.{f}: missing from {schema}" for f in LIST_FIELDS if f in props and f not in body]
        item = (props.get("items") or {}).get("items", {}).get("$ref")  # a list's items
        if item:
            out += [e for i, r in enumerate(body.get("items") or []) for e in _missing(item, r, f"{where}.items[{i}]")]
        scoped = (props.get("items") or {}).get("additionalProperties", {}).get("$ref")  # an aggregated list's
        if scoped:
            for scope, holder in (body.get("items") or {}).items():
                for key, prop in COMPUTE.schemas[scoped]["properties"].items():
                    ref = prop.get("items", {}).get("$ref")
                    for i, r in enumerate(holder.get(key) or [] if ref else []):
                        out += _missing(str(ref), r, f"{where}.items[{scope}].{key}[{i}]")
    elif "selfLink" in props:  # a resource
        out += [f"{where}.{f}: missing from {schema}" for f in RESOURCE_FIELDS
                if f in props and _output_only(schema, f) and f not in body]  # fmt: skip
    return out


def problems(replies: Iterable[Reply]) -> list[str]:
    """Every way the replies differ from what Compute Engine's discovery document says it answers."""
    out: list[str] = []
    for r in replies:
        where = f"{r.method} {r.path} ({r.status})"
        if r.status >= 400:
            err = (r.body or {}).get("error") if isinstance(r.body, dict) else None
            if not (isinstance(err, dict) and err.get("code") == r.status and err.get("message") and err.get("errors")):
                out.append(f"{where}: not Google's error JSON: {r.body!r}")
            continue
        schema = schema_for(r.method, r.path)
        if schema is None:
            out.append(f"{where}: no such method in compute.v1")
            continue
        out += [f"{where}: {e}" for e in COMPUTE.validate(schema, r.body) if not any(k.search(e) for k in KNOWN)]
        out += [f"{where}: {e}" for e in _missing(schema, r.body, "$")]
    return out
