"""The HTTP side every fake shares: route, dispatch, JSON bodies, Google's error JSON, controls.

A fake's ``Responses`` subclasses ``JsonApp``, sets ``routes`` and writes one method per route
(``handler(req, **path_args) -> JSON``); ``dispatch`` can be overridden to pass more (e.g. the
enum encoding asked for). No state lives here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from werkzeug.wrappers import Request, Response

from infra.local.core import exceptions as exc
from infra.local.core.routing import Routes, known_in, match_in

if TYPE_CHECKING:
    from infra.local.core.oauth import TokenAuthority


def json_response(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body), status=status, mimetype="application/json")


def json_body(req: Request) -> dict[str, Any]:
    """The request's JSON object ({} if empty); anything else is INVALID_ARGUMENT."""
    if not req.get_data():
        return {}
    try:
        data = json.loads(req.get_data())
    except ValueError as e:
        raise exc.InvalidArgument(f"request body is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise exc.InvalidArgument("request body must be a JSON object")
    return data


class JsonApp:
    """A WSGI application: ``routes`` -> handler methods; errors as Google's error JSON.

    With ``auth`` set (the local stack sets it), every request but the ``/_fake/*`` controls must
    carry a bearer token ``auth`` issued, or is refused 401 ``UNAUTHENTICATED`` as Google refuses it.
    """

    routes: Routes = []
    auth: TokenAuthority | None = None
    fake_name = "fake"

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        return self.handle(Request(environ))(environ, start_response)

    def handle(self, req: Request) -> Response:
        if self.auth is not None:
            from infra.local.core.oauth import unauthenticated

            try:
                self.auth.guard(req, self.fake_name)
            except exc.ApiError as e:
                return unauthenticated(e)
        try:
            found = match_in(self.routes, req.method, req.path)
            if found is None:
                if known_in(self.routes, req.path):
                    raise exc.ApiError(f"method {req.method} not allowed on {req.path}", status="UNIMPLEMENTED")
                raise exc.NotFound(f"no such path {req.path}")
            handler, args = found
            return json_response(self.dispatch(req, handler, args))
        except exc.ApiError as e:
            return json_response(e.to_http_json(), e.http)

    def dispatch(self, req: Request, handler: str, args: dict[str, str]) -> Any:
        return getattr(self, handler)(req, **args)

    _body = staticmethod(json_body)


class ControlledBackend(Protocol):
    def reset(self) -> None: ...

    def add_fault(
        self, path_regex: str, status: int, count: int = 1, method: str | None = None, message: str | None = None
    ) -> None: ...

    def faults_pending(self) -> int: ...

    def state(self) -> dict[str, Any]: ...


class ControlMixin:
    """Handlers of ``routing.CONTROL_PATHS``: ``/_fake/reset``, ``/_fake/faults``, ``/_fake/state``."""

    backend: ControlledBackend

    def fake_reset(self, req: Request) -> dict[str, Any]:
        self.backend.reset()
        return {}

    def fake_faults(self, req: Request) -> dict[str, Any]:
        """``{"path": regex, "status": 503, "count": 3, "method": "POST"?, "message": ...?}`` or a list."""
        try:
            body = json.loads(req.get_data() or b"[]")
            for f in body if isinstance(body, list) else [body]:
                self.backend.add_fault(
                    f["path"], int(f["status"]), int(f.get("count", 1)), f.get("method"), f.get("message")
                )
        except (ValueError, KeyError, TypeError) as e:
            raise exc.InvalidArgument(f"faults: expected {{path, status, count?, method?, message?}}: {e}") from None
        return {"faults_pending": self.backend.faults_pending()}

    def fake_state(self, req: Request) -> dict[str, Any]:
        return self.backend.state()
