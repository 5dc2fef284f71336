"""The fake TPU API's errors are the fakes' shared ones (:mod:`infra.local.core.exceptions`).

Kept so code written against ``infra.local.tpu.exceptions`` keeps importing; new code imports the core.
"""

from infra.local.core.exceptions import (
    CODES,
    AlreadyExists,
    ApiError,
    FailedPrecondition,
    Injected,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unimplemented,
    status_for_http,
)

TpuApiError = ApiError

__all__ = [
    "CODES",
    "AlreadyExists",
    "ApiError",
    "FailedPrecondition",
    "Injected",
    "InvalidArgument",
    "NotFound",
    "ResourceExhausted",
    "TpuApiError",
    "Unimplemented",
    "status_for_http",
]
