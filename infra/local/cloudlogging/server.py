"""Fake Cloud Logging v2 over HTTP/JSON: ``POST /v2/entries:write`` and ``POST /v2/entries:list``.

Enough for ``google-cloud-logging``'s HTTP client (``_use_grpc=False``) and for the filter
``ml-goodput-measurement`` sends: comparisons (``= != < <= > >= :``) on ``logName``, ``severity``,
``timestamp``, ``insertId`` and ``jsonPayload.<field>``, joined by ``AND``/``OR``/``NOT`` and
parentheses (``OR`` binds tighter than ``AND``, as in the real query language). Entries are kept in
memory, ordered by timestamp, then insertion.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from datetime import UTC, datetime
from typing import Any

from werkzeug.serving import BaseWSGIServer, make_server
from werkzeug.wrappers import Request, Response

from infra.local.core.exceptions import ApiError
from infra.local.core.oauth import TokenAuthority, unauthenticated
from infra.local.tpu.server import _QuietHandler

_TOKEN = re.compile(
    r"\s*(?:(?P<paren>[()])|(?P<kw>AND|OR|NOT)(?=[\s(])|"
    r'(?P<field>[A-Za-z_][\w.]*)\s*(?P<op><=|>=|!=|=|<|>|:)\s*(?P<value>"(?:[^"\\]|\\.)*"|[^\s()]+))'
)


class FilterError(ValueError):
    """A filter this fake cannot parse (answered with HTTP 400, as the real API does)."""


def _timestamp(value: str) -> datetime:
    dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def _field(entry: dict[str, Any], name: str) -> Any:
    node: Any = entry
    for part in name.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _compare(entry: dict[str, Any], name: str, op: str, raw: str) -> bool:
    value = json.loads(raw) if raw.startswith('"') else raw
    have = _field(entry, name)
    if have is None:
        return op == "!="
    left: Any
    right: Any
    if name in ("timestamp", "receiveTimestamp"):
        left, right = _timestamp(str(have)), _timestamp(str(value))
    elif isinstance(have, int | float) and not isinstance(have, bool):
        try:
            left, right = float(have), float(value)
        except ValueError:
            left, right = str(have), str(value)
    else:
        left, right = str(have), str(value)
    if op == ":":
        return str(right) in str(left)
    ops = {"=": left == right, "!=": left != right, "<": left < right, "<=": left <= right,
           ">": left > right, ">=": left >= right}  # fmt: skip
    return bool(ops[op])


def parse(text: str) -> Any:
    """The filter as a nested tuple: ``("and"|"or", [..])``, ``("not", x)`` or ``("cmp", field, op, value)``."""
    tokens: list[tuple[str, ...]] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None:
            raise FilterError(f"cannot parse the filter at {text[pos : pos + 40]!r}")
        pos = m.end()
        if m.group("paren"):
            tokens.append((m.group("paren"),))
        elif m.group("kw"):
            tokens.append((m.group("kw"),))
        else:
            tokens.append(("cmp", m.group("field"), m.group("op"), m.group("value")))
    at = [0]

    def peek() -> tuple[str, ...] | None:
        return tokens[at[0]] if at[0] < len(tokens) else None

    def take() -> tuple[str, ...]:
        tok = peek()
        if tok is None:
            raise FilterError("the filter ends too early")
        at[0] += 1
        return tok

    def atom() -> Any:
        tok = take()
        if tok[0] == "NOT":
            return ("not", atom())
        if tok[0] == "(":
            inner = conj()
            if take()[0] != ")":
                raise FilterError("unbalanced parentheses")
            return inner
        if tok[0] != "cmp":
            raise FilterError(f"unexpected {tok[0]!r}")
        return tok

    def disj() -> Any:
        parts = [atom()]
        while (tok := peek()) is not None and tok[0] == "OR":
            take()
            parts.append(atom())
        return ("or", parts) if len(parts) > 1 else parts[0]

    def conj() -> Any:
        parts = [disj()]
        while (tok := peek()) is not None and tok[0] not in (")",):
            if tok[0] == "AND":
                take()
            parts.append(disj())  # adjacency is an implicit AND
        return ("and", parts) if len(parts) > 1 else parts[0]

    if not tokens:
        return ("and", [])
    tree = conj()
    if peek() is not None:
        raise FilterError("unbalanced parentheses")
    return tree


def matches(tree: Any, entry: dict[str, Any]) -> bool:
    kind = tree[0]
    if kind == "and":
        return all(matches(t, entry) for t in tree[1])
    if kind == "or":
        return any(matches(t, entry) for t in tree[1])
    if kind == "not":
        return not matches(tree[1], entry)
    return _compare(entry, tree[1], tree[2], tree[3])


class LoggingBackend:
    """The entries, in memory."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def reset(self) -> None:
        with self._lock:
            self.entries.clear()

    def write(self, body: dict[str, Any]) -> None:
        now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        defaults = {k: body[k] for k in ("logName", "resource", "labels") if k in body}
        with self._lock:
            for raw in body.get("entries", []):
                entry = {**defaults, **raw}
                if not entry.get("logName"):
                    raise FilterError("entries.write: an entry has no logName")
                entry.setdefault("timestamp", now)
                entry.setdefault("severity", "DEFAULT")
                entry["receiveTimestamp"] = now
                entry.setdefault("insertId", f"{next(self._ids):012d}")
                self.entries.append(entry)

    def list(self, body: dict[str, Any]) -> dict[str, Any]:
        tree = parse(str(body.get("filter") or ""))
        scopes = [str(r).rstrip("/") + "/" for r in body.get("resourceNames") or []]
        with self._lock:
            scoped = [e for e in self.entries if not scopes or any(e["logName"].startswith(s) for s in scopes)]
            found = [e for e in scoped if matches(tree, e)]
        desc = str(body.get("orderBy") or "timestamp asc").strip().lower().endswith("desc")
        found.sort(key=lambda e: (_timestamp(e["timestamp"]), e["insertId"]), reverse=desc)
        start = int(body.get("pageToken") or 0)
        size = int(body.get("pageSize") or 1000) or 1000
        page = found[start : start + size]
        out: dict[str, Any] = {"entries": page}
        if start + size < len(found):
            out["nextPageToken"] = str(start + size)
        return out


class CloudLoggingServer:
    """``start()`` binds 127.0.0.1 on a free port; ``url`` has no trailing slash."""

    def __init__(self, backend: LoggingBackend | None = None, auth: TokenAuthority | None = None) -> None:
        self.backend = backend or LoggingBackend()
        self.auth = auth  # set: refuse a request without a token it issued (401), as Google does
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def app(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        if self.auth is not None:
            try:
                self.auth.check(request.headers.get("Authorization"), "logging")
            except ApiError as e:
                return unauthenticated(e)(environ, start_response)
        try:
            body = json.loads(request.get_data() or b"{}")
            if request.method == "POST" and request.path == "/v2/entries:write":
                self.backend.write(body)
                resp = Response("{}", content_type="application/json")
            elif request.method == "POST" and request.path == "/v2/entries:list":
                resp = Response(json.dumps(self.backend.list(body)), content_type="application/json")
            else:
                resp = _error(404, f"no such method: {request.method} {request.path}")
        except (FilterError, ValueError) as exc:
            resp = _error(400, str(exc))
        return resp(environ, start_response)

    def start(self) -> CloudLoggingServer:
        self._server = make_server("127.0.0.1", 0, self.app, threaded=True, request_handler=_QuietHandler)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-logging-http", daemon=True)  # fmt: skip
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


def _error(code: int, message: str) -> Response:
    status = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND"}.get(code, "UNKNOWN")
    return Response(json.dumps({"error": {"code": code, "message": message, "status": status}}), status=code,
                    content_type="application/json")  # fmt: skip
