"""AWS clients from one botocore session per process.

Loading the service models and the endpoint resolver is most of the cost of a new client (0.3-1 s
each on a busy 2-core machine); a flow step or a CLI command that builds S3, KMS and SageMaker
clients pays it once this way. Clients are created under a lock (a session is not thread-safe
while it builds a client); the clients themselves are.
"""

from __future__ import annotations

import threading
from typing import Any

from tpu_ops.cloud.clients import aws_client, aws_params
from tpu_ops.settings import Settings

_session: list[Any] = []
_lock = threading.Lock()


def shared_client(settings: Settings, service: str, *, max_attempts: int | None = None, **config: Any) -> Any:
    """An AWS client for ``service`` built from ``settings`` on the process's shared session."""
    from botocore.session import get_session

    params = aws_params(settings)
    if max_attempts is not None:
        params["max_attempts"] = max_attempts
    with _lock:
        if not _session:
            _session.append(get_session())
        return aws_client(params, service, session=_session[0], **config)
