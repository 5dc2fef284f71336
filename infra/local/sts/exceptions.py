"""Errors of the fake Storage Transfer Service: Google's error model, shared with the fake TPU API.

Over HTTP each becomes ``{"error": {"code": <http>, "message": ..., "status": <CANONICAL>}}``.
"""

from __future__ import annotations

from infra.local.tpu.exceptions import CODES as _TPU_CODES
from infra.local.tpu.exceptions import (
    AlreadyExists,
    FailedPrecondition,
    Injected,
    InvalidArgument,
    NotFound,
    TpuApiError,
)

__all__ = [
    "CODES",
    "AlreadyExists",
    "FailedPrecondition",
    "Injected",
    "InvalidArgument",
    "NotFound",
    "StsApiError",
]

# google.rpc.Code: canonical status name -> (gRPC code, HTTP status); STS error summaries use them all.
CODES = {**_TPU_CODES, "OUT_OF_RANGE": (11, 400), "DATA_LOSS": (15, 500)}

StsApiError = TpuApiError  # the same Google error model; the name says which fake raised it
