"""The one retry policy: transient errors only, exponential backoff with jitter."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from tpu_ops.errors import TransientError
from tpu_ops.settings import Settings

T = TypeVar("T")


def policy(settings: Settings) -> Retrying:
    """A tenacity ``Retrying`` that retries ``TransientError`` with jittered exponential backoff."""
    return Retrying(
        retry=retry_if_exception_type(TransientError),
        wait=wait_random_exponential(multiplier=settings.retry_initial_delay_s, max=settings.retry_max_delay_s),
        stop=stop_after_attempt(settings.retry_attempts),
        reraise=True,
    )


def call(settings: Settings, fn: Callable[[], T]) -> T:
    """Call ``fn`` under the retry policy. ``fn`` must raise translated errors.

    Creates are not safe to retry blindly: callers check whether the resource exists first.
    """
    return policy(settings)(fn)
