"""Drive a fake Compute Engine with the real ``gcloud`` (imported as ``compute.gcloud_harness``).

``Gcloud(endpoint, config_dir)`` runs ``gcloud`` with Google's documented endpoint override
(``CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE=<endpoint>/compute/v1/``: with the prefix, or the links gcloud
writes into request bodies lose it), a throwaway ``CLOUDSDK_CONFIG``, project / zone / region as
properties, and no prompts, update checks or usage reports. Credentials: none by default
(``auth/disable_credentials``); ``access_token_file=`` sends the token in that file instead (the
``auth/access_token_file`` property), for fakes that require one. Any request that is not for
loopback goes to a dead proxy, so nothing leaves the machine even if gcloud tried.

``GCLOUD_SKIP`` marks a test module to skip, with the reason, where gcloud is not installed.
gcloud takes ~1-2 s to start: share one fake and one ``Gcloud`` per module, keep calls few.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

GCLOUD_SKIP = pytest.mark.skipif(
    shutil.which("gcloud") is None, reason="gcloud (Google Cloud CLI) is not installed: nothing to drive the fake with"
)


class GcloudError(AssertionError):
    """A gcloud command that should have succeeded exited non-zero (its stderr is the message)."""


@dataclass
class Gcloud:
    endpoint: str  # the fake's base URL, e.g. http://127.0.0.1:PORT (no trailing slash)
    config_dir: Path
    project: str = "proj"
    zone: str = "us-east5-a"
    region: str = "us-east5"
    access_token_file: Path | None = None
    timeout_s: float = 120.0
    calls: list[list[str]] = field(default_factory=list)  # every command run, for a test's figures

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDSDK_")}
        env.update({
            "CLOUDSDK_CONFIG": str(self.config_dir),
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": f"{self.endpoint}/compute/v1/",
            "CLOUDSDK_CORE_PROJECT": self.project,
            "CLOUDSDK_COMPUTE_ZONE": self.zone,
            "CLOUDSDK_COMPUTE_REGION": self.region,
            "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
            "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true",
            "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true",
            "CLOUDSDK_CORE_CHECK_GCE_METADATA": "false",
            "NO_GCE_CHECK": "true",
            # Anything not for loopback meets a closed port instead of the Internet.
            "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
            "https_proxy": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9",
            "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
        })  # fmt: skip
        if self.access_token_file is not None:
            env["CLOUDSDK_AUTH_ACCESS_TOKEN_FILE"] = str(self.access_token_file)
            env["CLOUDSDK_AUTH_DISABLE_CREDENTIALS"] = "false"
        else:
            env["CLOUDSDK_AUTH_DISABLE_CREDENTIALS"] = "true"
        return env

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``gcloud <args> --quiet``; with ``check``, a non-zero exit fails the test with gcloud's stderr."""
        cmd = ["gcloud", *args, "--quiet"]
        self.calls.append(cmd)
        r = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=self.timeout_s, check=False)
        if check and r.returncode != 0:
            raise GcloudError(f"{' '.join(args)} exited {r.returncode}:\n{r.stderr}")
        return r

    def json(self, *args: str) -> Any:
        """The command's ``--format=json`` output, parsed."""
        return json.loads(self.run(*args, "--format=json").stdout or "null")

    def fails(self, *args: str) -> str:
        """Run a command that must fail; its stderr."""
        r = self.run(*args, check=False)
        assert r.returncode != 0, f"{' '.join(args)} succeeded:\n{r.stdout}"
        return r.stderr
