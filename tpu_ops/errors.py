"""The one exception hierarchy of tpu-ops.

Every error the library raises is a ``TpuOpsError``; SDK errors (google.api_core, botocore) are
translated into it in one place, :mod:`tpu_ops.cloud.translate`. The tree::

    TpuOpsError
    ├── SpecError                 bad user input (field, value, what is allowed); before any cloud call
    ├── ConfigError               settings: missing endpoint, non-loopback endpoint in a dry run
    ├── BudgetError               an estimate over the spec's budget (both numbers)
    ├── PolicyError               refused by policy: data residency, unsafe object key
    ├── CloudError                a cloud API call failed (service, request id)
    │   ├── TransientError        429/500/502/503/504 and timeouts: the one retry policy retries these
    │   │   └── UnreachableError  an endpoint did not answer (refused, unknown host, timed out)
    │   ├── NotFoundError         404
    │   ├── AlreadyExistsError    409 on create
    │   ├── AccessDeniedError     401/403
    │   │   └── CredentialsError  no credentials found (nothing was sent)
    │   └── CapacityError         no capacity for a (zone, tier): stockout, quota, reservation full
    │       └── QuotaError        quota exhausted (carries zone and tier too)
    ├── ProvisioningError         every rung of the capacity ladder failed (carries the attempts)
    ├── CheckpointError           no complete checkpoint, corrupt checkpoint
    ├── TrainingError             the trainer failed on its own (exit status, log tail), or recovery gave up
    ├── DeadlineError             waited past a deadline for a condition (also a builtin ``TimeoutError``)
    └── IntegrityError            checksum mismatch, source changed mid-run, broken audit chain
        ├── SourceChangedError    the source object is no longer the listed version
        └── ChecksumMismatchError what was stored (or sent) does not match the bytes read
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class TpuOpsError(Exception):
    """Root of every error tpu-ops raises.

    ``fix`` says what a person does about it, when that is known (the CLI prints it on the same line).
    """

    fix: str = ""


class SpecError(TpuOpsError, ValueError):
    """User input failed validation. ``errors`` holds one entry per bad field."""

    def __init__(self, message: str, errors: Sequence[dict[str, Any]] = ()) -> None:
        super().__init__(message)
        self.errors: list[dict[str, Any]] = list(errors)


class ConfigError(TpuOpsError):
    """Settings are missing or unsafe (e.g. a non-loopback endpoint in a dry run)."""


class BudgetError(TpuOpsError):
    """An estimate exceeds the budget; both numbers are carried."""

    def __init__(self, message: str, estimate_usd: float, budget_usd: float) -> None:
        super().__init__(message)
        self.estimate_usd = estimate_usd
        self.budget_usd = budget_usd


class PolicyError(TpuOpsError):
    """Refused by policy: data residency, unsafe object keys."""


class CloudError(TpuOpsError):
    """A cloud API call failed."""

    def __init__(
        self, message: str, *, service: str = "", status: int | None = None, request_id: str | None = None
    ) -> None:
        super().__init__(message)
        self.service = service
        self.status = status
        self.request_id = request_id


class TransientError(CloudError):
    """Worth retrying: throttling, server errors, timeouts."""


class NotFoundError(CloudError):
    """The resource does not exist."""


class AlreadyExistsError(CloudError):
    """A create found the resource already there."""


class AccessDeniedError(CloudError):
    """Credentials are missing or lack a permission."""


class CredentialsError(AccessDeniedError):
    """No credentials were found for a cloud: nothing was sent."""


class UnreachableError(TransientError):
    """An endpoint did not answer: connection refused, unknown host, timed out. ``endpoint`` names it."""

    def __init__(self, message: str, *, endpoint: str = "", **kw: Any) -> None:
        super().__init__(message, **kw)
        self.endpoint = endpoint


class CapacityError(CloudError):
    """No capacity for this zone and tier; failover moves to the next zone or rung."""

    def __init__(self, message: str, *, zone: str, tier: str, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.zone = zone
        self.tier = tier


class QuotaError(CapacityError):
    """Quota for this zone and tier is used up."""


class ProvisioningError(TpuOpsError):
    """No rung of the capacity ladder produced a slice; ``attempts`` says what was tried."""

    def __init__(self, message: str, attempts: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.attempts = list(attempts)


class CheckpointError(TpuOpsError):
    """No usable (complete) checkpoint, or a checkpoint failed verification."""


class TrainingError(TpuOpsError):
    """Training failed in a way recovery must not retry: the trainer's own failure, or limits reached.

    ``worker``/``exit_code``/``log_tail`` name the worker whose trainer failed, when one did.
    """

    def __init__(self, message: str, *, worker: int | None = None, exit_code: int | None = None,
                 log_tail: str = "") -> None:  # fmt: skip
        super().__init__(message)
        self.worker = worker
        self.exit_code = exit_code
        self.log_tail = log_tail


class DeadlineError(TpuOpsError, TimeoutError):
    """A condition did not come true before its deadline (workers never reported, a slice never went).

    Also a ``TimeoutError``, so code that waits on the one polling helper catches both alike.
    """


class IntegrityError(TpuOpsError):
    """Data did not verify: checksum mismatch, source changed during a run, broken audit chain."""


class SourceChangedError(IntegrityError):
    """The source object no longer matches the listed version/ETag: it changed during the run."""


class ChecksumMismatchError(IntegrityError):
    """What the destination stored (or the source declared) does not match the bytes we read."""
