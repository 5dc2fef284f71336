"""AWS clients from one botocore session per process.

Loading the service models and the endpoint resolver is most of the cost of a new client (0.3-1 s
each on a busy 2-core machine); a flow step or a CLI command that builds S3, KMS and SageMaker
clients pays it once this way. Clients are created under a lock (a session is not thread-safe
while it builds a client); the clients themselves are.
"""

from __future__ import annotations

import threading
from typing import Any

from tpu_ops.cloud.clients import boto3_client
from tpu_ops.settings import Settings

# One botocore session per AWS profile: a session carries its profile as config.
_sessions: dict[str | None, Any] = {}
_lock = threading.Lock()


def shared_client(settings: Settings, service: str, *, max_attempts: int | None = None, **config: Any) -> Any:
    """An AWS client for ``service`` built from ``settings`` on the process's shared session."""
    from botocore.session import get_session

    with _lock:
        session = _sessions.get(settings.aws_profile) or _sessions.setdefault(settings.aws_profile, get_session())
        return boto3_client(settings, service, session=session, max_attempts=max_attempts, **config)
