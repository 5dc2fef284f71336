"""The local stack's Google credentials: one OAuth endpoint, one service-account key, in one place.

``StackAuth`` serves the fake token endpoint (``infra.local.core.oauth``) on loopback, makes the
stack's service-account key (``tpu-ops@PROJECT.iam.gserviceaccount.com``, its ``token_uri`` that
endpoint) and writes it to ``key_file``. Everything that talks to our fakes gets its token from it:

- tpu-ops: ``settings_overrides()`` / ``env()`` name the key file (``gcp_credentials_file``), so the
  library builds ``google.oauth2.service_account.Credentials`` from it as it does from a Prefect
  ``GcpCredentials`` block, and each client signs its own token request;
- tests and tools: ``credentials()`` (the same kind of credentials), ``mint_token()`` (a token that
  key obtained through the real JWT grant), ``token_file`` (that token, for gcloud's
  ``auth/access_token_file``, i.e. ``CLOUDSDK_AUTH_ACCESS_TOKEN_FILE``);
- simulated VMs: ``vm_token()`` is what their metadata server answers for the VM's service account.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from infra.local.core import tempdirs
from infra.local.core.oauth import LIFETIME_S, TOKEN_PATH, TokenAuthority
from infra.local.core.server import LoopbackServer

SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]  # what prefect-gcp's GcpCredentials asks for
PREFIX = "tpu-ops-auth-"  # each stack's directory under the temp dir (its owner in tempdirs.OWNER)
OWNER = tempdirs.OWNER
# A directory from before owner files: a live stack rewrites its token file at least hourly, so one untouched for
# twice the token's lifetime has no stack behind it.
UNOWNED_STALE_S = 2 * LIFETIME_S


def sweep_stale(root: Path | None = None) -> list[Path]:
    """Remove the ``tpu-ops-auth-*`` directories a killed stack left (its owner process gone); the removed."""
    return tempdirs.sweep(PREFIX, UNOWNED_STALE_S, root)


class _TokenServer(LoopbackServer):
    name = "fake-oauth"


class StackAuth:
    """The token endpoint, the stack's key and the VM service account's tokens."""

    def __init__(self, project: str) -> None:
        self.project = project
        self.authority = TokenAuthority()
        self.email = f"tpu-ops@{project}.iam.gserviceaccount.com"
        self.vm_email = f"tpu-vm@{project}.iam.gserviceaccount.com"
        self._server: _TokenServer | None = None
        self._dir: Path | None = None
        self.key: dict[str, Any] = {}
        self._vm: tuple[str, float] | None = None
        self._file_until = 0.0  # when the token in token_file expires
        self._lock = threading.Lock()

    def start(self) -> StackAuth:
        # the ticker keeps token_file live for a long-running stack (`tpu-ops local up`): gcloud reads it per call
        self._server = _TokenServer(self.authority.app, tick=self._renew_file, tick_s=30.0).start()
        self.authority.token_uri = self._server.url + TOKEN_PATH
        self.key = self.authority.new_key(self.email, self.project)
        sweep_stale()  # a killed stack (kill -9, a crashed test run) never ran stop()
        self._dir = tempdirs.owned(PREFIX)
        self.key_file.write_text(json.dumps(self.key, indent=2))
        self.key_file.chmod(0o600)
        self.mint_token()  # writes token_file
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    @property
    def token_uri(self) -> str:
        """The fake OAuth endpoint (``http://127.0.0.1:PORT/token``): the key's ``token_uri``."""
        return self.authority.token_uri

    @property
    def key_file(self) -> Path:
        """The stack's service-account key (JSON, Google's format)."""
        assert self._dir is not None, "StackAuth is not started"
        return self._dir / "service-account.json"

    @property
    def token_file(self) -> Path:
        """A file holding a token the stack's key obtained (renewed 10 min before it expires, and by
        ``mint_token``): gcloud reads it through ``auth/access_token_file``."""
        assert self._dir is not None, "StackAuth is not started"
        return self._dir / "access-token"

    @property
    def key_id(self) -> str:
        return str(self.key["private_key_id"])

    def settings_overrides(self) -> dict[str, Any]:
        """The ``Settings`` fields that give tpu-ops the stack's key."""
        return {"gcp_credentials_file": self.key_file}

    def env(self) -> dict[str, str]:
        """The same for subprocesses (tpu-ops, gcloud)."""
        return {
            "TPU_OPS_GCP_CREDENTIALS_FILE": str(self.key_file),
            "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": str(self.token_file),
        }

    def credentials(self, key: dict[str, Any] | None = None) -> Any:
        """``google.oauth2.service_account.Credentials`` of the stack's key (or ``key``), as prefect-gcp builds them."""
        from tpu_ops.cloud.clients import service_account_credentials

        return service_account_credentials(key or self.key, loopback=True)

    def mint_token(self) -> str:
        """A fresh access token, obtained by the stack's key through the JWT-bearer grant (valid 1 h);
        also written to ``token_file``."""
        from google.auth.transport.requests import Request

        creds = self.credentials()
        creds.refresh(Request())
        tmp = self.token_file.with_suffix(".tmp")
        tmp.write_text(str(creds.token))
        tmp.replace(self.token_file)  # gcloud never reads half a token
        self._file_until = time.time() + LIFETIME_S
        return str(creds.token)

    def _renew_file(self) -> None:
        if self._dir is not None and self._file_until - time.time() < 600:
            with contextlib.suppress(Exception):  # stopping, or a busy machine: the next tick tries again
                self.mint_token()

    def vm_token(self) -> str:
        """The metadata server's answer for the VM's service account: a current token the endpoint issued."""
        with self._lock:
            if self._vm is None or self._vm[1] - time.time() < 300:
                token = self.authority.issue(self.vm_email)
                self._vm = (token, time.time() + LIFETIME_S)
            token, until = self._vm
        return json.dumps({"access_token": token, "expires_in": int(until - time.time()), "token_type": "Bearer"})
