"""The local stack: every emulated cloud tpu-ops talks to, on loopback, started and stopped together.

    with LocalStack() as stack:
        settings = stack.settings()      # tpu_ops Settings(dry_run=True, endpoints -> the stack)
        env = stack.env()                # the same, as environment variables for subprocesses

Parts: moto in server mode (S3, SageMaker, STS) in a thread, fake-gcs-server as a subprocess in
its own process group, the fake Cloud TPU API in a thread, and the TPU-VM host simulator. Every
part binds 127.0.0.1 on a free port; ``stop()`` (or leaving the ``with``) stops all of them and
kills every process the stack started.
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Any

from infra.local.aws import MotoServer
from infra.local.gcs import FakeGcs
from tpu_ops.settings import Settings

PROJECT = "tpu-ops-local"
AWS_REGION = "us-east-1"
# moto accepts any keys; these are the ones its docs use, never real credentials.
FAKE_AWS_KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


class LocalStack:
    """Context manager owning the emulators. One live stack per process (moto state is global)."""

    def __init__(self, *, project: str = PROJECT) -> None:
        self.project = project
        self.aws: MotoServer | None = None
        self.gcs: FakeGcs | None = None
        self._started = False

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> LocalStack:
        if self._started:
            return self
        try:
            self.gcs = FakeGcs()
            self.gcs.start()
            self.aws = MotoServer()
            self.aws.start()
        except BaseException:
            self.stop()
            raise
        self._started = True
        return self

    def stop(self) -> None:
        """Stop every part; safe to call twice and after a failed start."""
        for part in (self.aws, self.gcs):
            if part is not None:
                with contextlib.suppress(Exception):
                    part.stop()
        self._started = False

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- endpoints ---------------------------------------------------------------------------
    def _need(self, part: Any, name: str) -> Any:
        if part is None or not self._started:
            raise RuntimeError(f"LocalStack is not running ({name} unavailable); use `with LocalStack()`")
        return part

    @property
    def aws_endpoint(self) -> str:
        """moto: ``http://127.0.0.1:PORT`` (S3 path-style, SageMaker, STS, ...)."""
        return str(self._need(self.aws, "aws").url)

    @property
    def gcs_endpoint(self) -> str:
        """fake-gcs-server: ``http://127.0.0.1:PORT`` (what ``STORAGE_EMULATOR_HOST`` takes)."""
        return str(self._need(self.gcs, "gcs").url)

    def env(self) -> dict[str, str]:
        """Environment variables pointing every client (ours, SDKs, CLIs) at the stack."""
        env = {
            "AWS_ENDPOINT_URL": self.aws_endpoint,
            "AWS_DEFAULT_REGION": AWS_REGION,
            **FAKE_AWS_KEYS,
            "STORAGE_EMULATOR_HOST": self.gcs_endpoint,
            "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
            "CLOUDSDK_CORE_PROJECT": self.project,
            "GOOGLE_CLOUD_PROJECT": self.project,
            "NO_GCE_CHECK": "true",
            "TPU_OPS_DRY_RUN": "true",
            "TPU_OPS_GCP_PROJECT": self.project,
            "TPU_OPS_AWS_REGION": AWS_REGION,
            "TPU_OPS_AWS_ENDPOINT_URL": self.aws_endpoint,
            "TPU_OPS_GCS_ENDPOINT": self.gcs_endpoint,
            "TPU_OPS_AWS_ACCESS_KEY_ID": FAKE_AWS_KEYS["AWS_ACCESS_KEY_ID"],
            "TPU_OPS_AWS_SECRET_ACCESS_KEY": FAKE_AWS_KEYS["AWS_SECRET_ACCESS_KEY"],
        }
        return env

    def settings(self, **overrides: Any) -> Settings:
        """``Settings(dry_run=True, ...)`` with every endpoint on this stack; ``overrides`` win."""
        values: dict[str, Any] = {
            "dry_run": True,
            "gcp_project": self.project,
            "aws_region": AWS_REGION,
            "aws_endpoint_url": self.aws_endpoint,
            "gcs_endpoint": self.gcs_endpoint,
            "aws_access_key_id": FAKE_AWS_KEYS["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": FAKE_AWS_KEYS["AWS_SECRET_ACCESS_KEY"],
        }
        values.update(overrides)
        return Settings(**values)

    def reset(self) -> None:
        """Forget all AWS state (GCS buckets are reset by deleting them; see ``reset_gcs``)."""
        self._need(self.aws, "aws").reset()
