"""Cancelling a run: ``tpu-ops cancel`` writes ``RUN/_tpu_ops/CANCEL``; the supervisor stops at its next poll.

The marker is in GCS beside the run's state, so it reaches a supervisor wherever it runs (a detached
process, a Prefect worker); the supervisor then ends the run as it ends a failed one: slice released,
report written, outcome ``cancelled``.
"""

from __future__ import annotations

import getpass
import socket
import time
from typing import Any, Final

from tpu_ops.cloud.translate import google_errors
from tpu_ops.errors import NotFoundError, TrainingError
from tpu_ops.layout import RunLayout
from tpu_ops.train.layout import get_json, put_json

CANCELLED: Final = "cancelled"


class RunCancelled(TrainingError):
    """Someone asked the run to stop (``tpu-ops cancel``): not a failure to recover from."""


def request(gcs: Any, layout: RunLayout, reason: str = "tpu-ops cancel") -> dict[str, Any]:
    """Write the run's cancel marker (who, when, why); returns it."""
    doc = {"time": time.time(), "by": f"{getpass.getuser()}@{socket.gethostname()}", "reason": reason}
    put_json(gcs, layout.cancel, doc)
    return doc


def requested(gcs: Any, layout: RunLayout) -> dict[str, Any] | None:
    """The cancel marker, if the run was asked to stop."""
    try:
        doc = get_json(gcs, layout.cancel)
    except NotFoundError:
        return None
    return doc if isinstance(doc, dict) else {}


def clear(gcs: Any, layout: RunLayout) -> None:
    """Remove the marker: a run launched again under the same id goes on."""
    try:
        with google_errors("gcs"):
            gcs.bucket(layout.cancel.bucket).blob(layout.cancel.prefix).delete()
    except NotFoundError:
        pass


def check(gcs: Any, layout: RunLayout, run_id: str) -> None:
    """Raise ``RunCancelled`` if the run was asked to stop."""
    doc = requested(gcs, layout)
    if doc is not None:
        raise RunCancelled(f"run {run_id}: cancelled by {doc.get('by', '?')}")


def outcome(exc: BaseException) -> str:
    """The run's outcome when ``exc`` ended it."""
    return CANCELLED if isinstance(exc, RunCancelled) else "failed"
