"""The local stack's Google OAuth endpoint and the token check of our fakes.

A key the endpoint knows obtains a token through Google's JWT-bearer grant; our fakes (Compute
Engine, TPU, Storage Transfer, Cloud Logging) take that token, or a self-signed JWT of a known key
(what GAPIC clients send), and refuse anything else with Google's 401. A JWT whose signature does
not verify is refused by both.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest

from infra.local.core.oauth import JWT_BEARER, MISSING

PROJECT = "tpu-ops-local"
ZONE = "us-central2-b"


def _paths(stack: Any) -> dict[str, tuple[str, str, bytes | None]]:
    """fake name -> (method, URL, body) of one harmless read on it."""
    return {
        "fake-compute": ("GET", f"{stack.compute_endpoint}/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances", None),
        "fake-tpu": ("GET", f"{stack.tpu_endpoint}/v2/projects/{PROJECT}/locations/{ZONE}/nodes", None),
        "fake-sts": ("GET", f"{stack.sts_endpoint}/v1/transferJobs?filter=" + urllib.parse.quote(
            json.dumps({"projectId": PROJECT})), None),
        "logging": ("POST", f"{stack.logging_endpoint}/v2/entries:list", b"{}"),
    }  # fmt: skip


def _call(method: str, url: str, body: bytes | None, token: str | None) -> tuple[int, dict[str, Any], Any]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"{}"), resp.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), e.headers


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _jwt(key: dict[str, Any], claims: dict[str, Any], signer: dict[str, Any] | None = None) -> str:
    """An RS256 JWT naming ``key`` (its ``kid``), signed with ``signer``'s private key (default: ``key``'s)."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding

    head = _b64(json.dumps({"alg": "RS256", "typ": "JWT", "kid": key["private_key_id"]}).encode())
    body = _b64(json.dumps(claims).encode())
    private = serialization.load_pem_private_key((signer or key)["private_key"].encode(), None)
    sig = private.sign(f"{head}.{body}".encode(), padding.PKCS1v15(), hashes.SHA256())  # type: ignore[union-attr,call-arg]
    return f"{head}.{body}.{_b64(sig)}"


def _grant(auth: Any, assertion: str) -> tuple[int, dict[str, Any]]:
    form = urllib.parse.urlencode({"grant_type": JWT_BEARER, "assertion": assertion}).encode()
    status, body, _ = _call("POST", auth.token_uri, form, None)
    return status, body


def _claims(key: dict[str, Any], **kw: Any) -> dict[str, Any]:
    now = int(time.time())
    claims = {"iss": key["client_email"], "scope": "https://www.googleapis.com/auth/cloud-platform",
              "aud": "https://oauth2.googleapis.com/token", "iat": now, "exp": now + 3600}  # fmt: skip
    claims.update(kw)
    return claims


def test_a_token_the_key_obtained_opens_every_fake_and_nothing_else_does(local_stack: Any) -> None:
    auth = local_stack.google_auth
    token = local_stack.mint_token()  # google-auth's own JWT-bearer grant with the stack's key
    assert token in auth.authority.tokens_of(key_id=auth.key_id)
    for fake, (method, url, body) in _paths(local_stack).items():
        assert _call(method, url, body, token)[0] == 200, fake
        status, err, headers = _call(method, url, body, None)
        assert (status, err["error"]["status"], err["error"]["message"]) == (401, "UNAUTHENTICATED", MISSING), fake
        assert headers["WWW-Authenticate"].startswith("Bearer"), fake
        status, err, _ = _call(method, url, body, "ya29.not-one-it-issued")
        assert (status, err["error"]["status"]) == (401, "UNAUTHENTICATED"), fake
        assert "invalid authentication credentials" in err["error"]["message"], fake
    # the controls stay open, as moto's /moto-api does
    assert _call("GET", f"{local_stack.compute_endpoint}/_fake/state", None, None)[0] == 200


def test_a_jwt_not_signed_by_the_key_it_names_is_refused(local_stack: Any) -> None:
    auth = local_stack.google_auth
    key, other = auth.key, auth.authority.new_key("intruder@tpu-ops-local.iam.gserviceaccount.com", PROJECT)
    status, body = _grant(auth, _jwt(key, _claims(key)))
    assert status == 200 and body["token_type"] == "Bearer" and body["expires_in"] == 3599
    forged = _jwt(key, _claims(key), signer=other)  # the stack key's kid, another key's signature
    assert _grant(auth, forged) == (400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."})
    method, url, data = _paths(local_stack)["fake-compute"]
    self_signed = _jwt(key, _claims(key, aud="https://compute.googleapis.com/"))
    assert _call(method, url, data, self_signed)[0] == 200  # what GAPIC clients send (AIP-4111)
    forged = _jwt(key, _claims(key, aud="https://compute.googleapis.com/"), signer=other)
    assert _call(method, url, data, forged)[0] == 401


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"aud": "https://example.com/token"}, "invalid_grant"),
        ({"iat": int(time.time()) - 7200, "exp": int(time.time()) - 3600}, "invalid_grant"),  # expired
        ({"iss": "someone-else@tpu-ops-local.iam.gserviceaccount.com"}, "invalid_grant"),
        ({"scope": ""}, "invalid_scope"),
    ],
    ids=["audience", "expired", "issuer", "no-scope"],
)
def test_the_endpoint_checks_the_claims_as_google_does(local_stack: Any, change: dict[str, Any], error: str) -> None:
    auth = local_stack.google_auth
    status, body = _grant(auth, _jwt(auth.key, _claims(auth.key, **change)))
    assert (status, body["error"]) == (400, error), body


def test_a_key_the_endpoint_does_not_know_fails_on_one_line(local_stack: Any) -> None:
    from flows.failures import one_line
    from tpu_ops.cloud.clients import tpu_client

    unknown = local_stack.google_auth.authority.new_key("gone@tpu-ops-local.iam.gserviceaccount.com", PROJECT,
                                                        trusted=False)  # fmt: skip
    settings = local_stack.settings(gcp_credentials_file=None, gcp_credentials_info=json.dumps(unknown))
    with pytest.raises(Exception) as caught:
        list(tpu_client(settings).list_nodes(parent=f"projects/{PROJECT}/locations/{ZONE}"))
    line = one_line(caught.value)
    assert "\n" not in line and "Google Cloud credentials were refused" in line, line


def test_a_dry_run_without_a_key_says_which_credentials_are_missing(local_stack: Any) -> None:
    from tpu_ops.cloud.clients import compute_options, storage_client, tpu_client
    from tpu_ops.cloud.transfer import transfer_client
    from tpu_ops.errors import ConfigError, CredentialsError

    bare = local_stack.settings(gcp_credentials_file=None)
    for make in (tpu_client, compute_options, transfer_client):
        with pytest.raises(CredentialsError, match="Google Cloud credentials not found: no service-account key"):
            make(bare)
    storage_client(bare)  # the GCS emulator is not ours: it takes anonymous requests, as it always did
    google = dict(local_stack.google_auth.key, token_uri="https://oauth2.googleapis.com/token")
    with pytest.raises(ConfigError, match=r"token_uri .* is not on loopback"):
        tpu_client(local_stack.settings(gcp_credentials_info=json.dumps(google)))


def test_a_vms_metadata_token_is_one_the_endpoint_issued(local_stack: Any) -> None:
    auth = local_stack.google_auth
    doc = json.loads(auth.vm_token())
    assert doc["token_type"] == "Bearer" and 0 < doc["expires_in"] <= 3599
    assert doc["access_token"] in auth.authority.tokens_of(subject=auth.vm_email)
    method, url, body = _paths(local_stack)["logging"]
    assert _call(method, url, body, doc["access_token"])[0] == 200


def test_the_gcloud_token_file_is_renewed_before_it_expires(local_stack: Any) -> None:
    auth = local_stack.google_auth
    before = auth.token_file.read_text()
    auth._renew_file()  # live for an hour: left alone
    assert auth.token_file.read_text() == before
    auth._file_until = time.time() + 60  # a minute left: the ticker's next call renews it
    auth._renew_file()
    after = auth.token_file.read_text()
    assert after != before and after in auth.authority.tokens_of(key_id=auth.key_id)
    assert local_stack.env()["CLOUDSDK_AUTH_ACCESS_TOKEN_FILE"] == str(auth.token_file)
