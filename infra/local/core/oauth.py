"""A fake Google OAuth 2.0 token endpoint, and the check our fakes make of each request's token.

Google's service-account flow (https://developers.google.com/identity/protocols/oauth2/service-account,
"Preparing to make an authorized API call"): the client signs a JWT with the key's private key (RS256,
``kid`` = the key's ``private_key_id``; claims ``iss`` = the account's e-mail, ``scope``, ``aud`` =
``https://oauth2.googleapis.com/token`` (also accepted: this endpoint's own URL), ``iat``, ``exp``
at most one hour later) and POSTs it as ``grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=JWT``
to ``token_uri``; the answer is ``{"access_token", "expires_in": 3599, "token_type": "Bearer"}``; a refusal is
HTTP 400 ``{"error": "invalid_grant", "error_description": "Invalid JWT Signature."}`` and the like.

``TokenAuthority`` plays that endpoint: it knows the public half of the keys it made (``new_key``),
verifies the JWT's signature against them, and hands out opaque tokens that expire. Our fakes
(Compute Engine, TPU, Storage Transfer, Cloud Logging) call ``check`` on every request but their
``/_fake/*`` controls (moto's ``/moto-api`` is unsigned too): no token, or one it did not issue or
that expired, is 401 ``UNAUTHENTICATED`` with Google's message.

Google's APIs also take a *self-signed JWT* as the bearer token (https://google.aip.dev/auth/4111:
RS256 with the key, ``kid``, ``iss`` = ``sub`` = the account, a ``scope`` claim or ``aud`` = the
service's URL, at most an hour), and that is what every GAPIC client sends with a service-account key
(google-auth's ``service_account.Credentials`` with ``always_use_jwt_access``, which
``TpuClient``, ``compute_v1`` and ``StorageTransferServiceClient`` set): ``check`` verifies those
against the same keys. ``issued`` and ``seen`` record which key (or VM service account) each token
came from and which fake saw it, for tests.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from werkzeug.wrappers import Request, Response

from infra.local.core import exceptions as exc

JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
TOKEN_PATH = "/token"  # noqa: S105 - a URL path, not a secret
GOOGLE_TOKEN_URI = "https://oauth2.googleapis.com/token"  # noqa: S105 - the ``aud`` Google wants (google-auth sends it)
LIFETIME_S = 3599  # what Google hands out
MAX_JWT_S = 3600  # "Token must be a short-lived token (60 minutes)"
SKEW_S = 300
MISSING = (
    "Request is missing required authentication credential. Expected OAuth 2 access token, login cookie or "
    "other valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project."
)
INVALID = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other "
    "valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project."
)


class OAuthError(Exception):
    """A refused token request: Google's ``error`` code and ``error_description``."""

    def __init__(self, error: str, description: str) -> None:
        super().__init__(description)
        self.error, self.description = error, description


@dataclass
class Grant:
    """One access token: whom it names (a key's e-mail, or a VM's service account) and how."""

    subject: str
    key_id: str | None  # the service-account key that signed the request; None: a VM's metadata token
    expires: float


@dataclass
class _Key:
    email: str
    public_key: Any  # cryptography RSAPublicKey


@dataclass
class TokenAuthority:
    """The keys the fake endpoint trusts, the tokens it issued, the tokens each fake saw."""

    token_uri: str = ""
    keys: dict[str, _Key] = field(default_factory=dict)
    issued: dict[str, Grant] = field(default_factory=dict)
    seen: list[tuple[str, str]] = field(default_factory=list)  # (fake, token), in order
    accepted: list[tuple[str, Grant | None]] = field(default_factory=list)  # (fake, whose token; None: refused)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- keys --------------------------------------------------------------------------------------
    def new_key(self, email: str, project: str, *, trusted: bool = True) -> dict[str, Any]:
        """A fresh service-account key JSON (Google's format) whose ``token_uri`` is this endpoint;
        ``trusted=False`` makes one the endpoint does not know (a deleted key, another project's)."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        key_id = secrets.token_hex(20)
        if trusted:
            with self._lock:
                self.keys[key_id] = _Key(email, private.public_key())
        pem = private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        return {
            "type": "service_account",
            "project_id": project,
            "private_key_id": key_id,
            "private_key": pem,
            "client_email": email,
            "client_id": str(secrets.randbelow(10**20)),
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",  # never called: the JWT grant needs none
            "token_uri": self.token_uri,
            "universe_domain": "googleapis.com",
        }

    # -- the endpoint ------------------------------------------------------------------------------
    def exchange(self, form: dict[str, str]) -> dict[str, Any]:
        """Answer a token request (the POST form); raises ``OAuthError`` as Google refuses."""
        grant_type = form.get("grant_type", "")
        if grant_type != JWT_BEARER:
            raise OAuthError("unsupported_grant_type", f"Invalid grant_type: {grant_type}")
        assertion = form.get("assertion", "")
        key_id, claims = self._verify(assertion, (GOOGLE_TOKEN_URI, self.token_uri))
        if not claims.get("scope") and not claims.get("target_audience"):
            raise OAuthError("invalid_scope", "Invalid OAuth scope or ID token audience provided.")
        return {"access_token": self.issue(str(claims["iss"]), key_id), "expires_in": LIFETIME_S,
                "token_type": "Bearer"}  # fmt: skip

    def _verify(self, assertion: str, audiences: tuple[str, ...] | None = None) -> tuple[str, dict[str, Any]]:
        """The signing key's id and the claims of an RS256 JWT signed by a key we know, or ``OAuthError``.

        ``audiences``: the ``aud`` values accepted (None: a self-signed JWT, which names a scope or
        a Google API's URL)."""
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        try:
            head_b64, body_b64, sig_b64 = assertion.split(".")
            header, claims = json.loads(_unb64(head_b64)), json.loads(_unb64(body_b64))
            signature = _unb64(sig_b64)
        except (ValueError, TypeError):
            raise OAuthError("invalid_grant", "Invalid JWT: malformed assertion.") from None
        if header.get("alg") != "RS256":
            raise OAuthError("invalid_grant", "Invalid JWT Signature.")
        with self._lock:
            key = self.keys.get(str(header.get("kid", "")))
        if key is None:  # a key the endpoint does not know (deleted, another project's)
            raise OAuthError("invalid_grant", "Invalid JWT Signature.")
        try:
            key.public_key.verify(signature, f"{head_b64}.{body_b64}".encode(), padding.PKCS1v15(), hashes.SHA256())
        except InvalidSignature:
            raise OAuthError("invalid_grant", "Invalid JWT Signature.") from None
        if claims.get("iss") != key.email:
            raise OAuthError("invalid_grant", "Invalid JWT: the issuer is not the key's service account.")
        aud = str(claims.get("aud") or "")
        if audiences is None:
            if not claims.get("scope") and not (aud.startswith("https://") and aud.endswith(".googleapis.com/")):
                raise OAuthError("invalid_grant", "Invalid JWT: neither a scope nor a Google API audience.")
        elif aud not in audiences:
            raise OAuthError(
                "invalid_grant", f"Invalid JWT: Failed audience check. The expected value was {GOOGLE_TOKEN_URI}"
            )
        now = time.time()
        iat, exp = float(claims.get("iat", 0)), float(claims.get("exp", 0))
        if not (iat - SKEW_S <= now <= exp + SKEW_S and 0 < exp - iat <= MAX_JWT_S):
            raise OAuthError("invalid_grant", "Invalid JWT: Token must be a short-lived token (60 minutes) and in a "
                             "reasonable timeframe. Check your iat and exp values in the JWT claim.")  # fmt: skip
        return str(header["kid"]), claims

    def issue(self, subject: str, key_id: str | None = None, lifetime_s: float = LIFETIME_S) -> str:
        """A new opaque access token for ``subject``; ``key_id`` None for a VM's metadata token."""
        token = "ya29.local-" + secrets.token_urlsafe(32)
        with self._lock:
            self.issued[token] = Grant(subject, key_id, time.time() + lifetime_s)
        return token

    def app(self, environ: dict[str, Any], start_response: Any) -> Any:
        """The token endpoint as a WSGI app (``POST /token``)."""
        req = Request(environ)
        if req.method != "POST" or req.path != TOKEN_PATH:
            body, status = {"error": "invalid_request", "error_description": f"no such endpoint {req.path}"}, 404
        else:
            form = {k: v[0] for k, v in parse_qs(req.get_data(as_text=True)).items()}
            try:
                body, status = self.exchange(form), 200
            except OAuthError as e:
                body, status = {"error": e.error, "error_description": e.description}, 400
        return Response(json.dumps(body), status=status, mimetype="application/json")(environ, start_response)

    # -- what the fakes call -----------------------------------------------------------------------
    def check(self, authorization: str | None, fake: str) -> None:
        """Raise 401 ``UNAUTHENTICATED`` unless ``authorization`` is ``Bearer <a live token issued here>``."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""
        grant = self.grant_of(token)
        with self._lock:
            self.seen.append((fake, token))  # "" for a request without one
            self.accepted.append((fake, grant))  # None: refused
        if not token:
            raise exc.ApiError(MISSING, status="UNAUTHENTICATED", reason="required")
        if grant is None:
            raise exc.ApiError(INVALID, status="UNAUTHENTICATED", reason="authError")

    def grant_of(self, token: str) -> Grant | None:
        """Whose live token ``token`` is: one issued here, or a self-signed JWT of a key we know; else None."""
        with self._lock:
            grant = self.issued.get(token)
        if grant is None and token.count(".") == 2:
            try:
                key_id, claims = self._verify(token)
            except OAuthError:
                return None
            grant = Grant(str(claims["iss"]), key_id, float(claims["exp"]))
        return grant if grant is not None and grant.expires >= time.time() else None

    def guard(self, req: Request, fake: str) -> None:
        """``check`` a fake's request, except its ``/_fake/*`` controls."""
        if not req.path.startswith("/_fake/"):
            self.check(req.headers.get("Authorization"), fake)

    # -- for tests ---------------------------------------------------------------------------------
    def tokens_of(self, key_id: str | None = None, subject: str | None = None) -> set[str]:
        """The tokens issued to a key (by ``private_key_id``) or to a subject (a service account)."""
        with self._lock:
            found = self.issued.items()
            return {t for t, g in found if key_id in (None, g.key_id) and subject in (None, g.subject)}

    def grants_seen(self, fake: str | None = None) -> list[Grant | None]:
        """Whose token each request to the fakes carried (None: no token, or one refused), in order."""
        with self._lock:
            return [g for f, g in self.accepted if fake is None or f == fake]

    def seen_by(self, fake: str | None = None) -> list[str]:
        """The tokens the fakes saw (every request, refused ones included), in order."""
        with self._lock:
            return [t for f, t in self.seen if fake is None or f == fake]

    def forget_seen(self) -> None:
        with self._lock:
            self.seen.clear()
            self.accepted.clear()

    def revoke_all(self) -> None:
        """Forget every issued token (clients must fetch new ones: a restarted endpoint)."""
        with self._lock:
            self.issued.clear()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def unauthenticated(e: exc.ApiError) -> Response:
    """Google's 401: the error JSON and ``WWW-Authenticate``."""
    resp = Response(json.dumps(e.to_http_json()), status=e.http, mimetype="application/json")
    resp.headers["WWW-Authenticate"] = 'Bearer realm="https://accounts.google.com/"'
    return resp
