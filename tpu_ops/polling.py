"""The one polling helper: call ``check`` until it returns a value, backing off, within a deadline."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from tenacity import RetryCallState, RetryError, Retrying, retry_if_result, stop_after_delay, wait_exponential

T = TypeVar("T")


def poll(
    check: Callable[[], T | None],
    *,
    timeout_s: float,
    interval_s: float,
    max_interval_s: float | None = None,
    what: str = "condition",
) -> T:
    """Call ``check`` until it returns something other than ``None``; return that.

    Waits ``interval_s`` after the first miss, growing 1.5x per miss up to ``max_interval_s``
    (default 8x ``interval_s``), never past the deadline. Raises ``TimeoutError`` naming ``what``
    after ``timeout_s``; exceptions from ``check`` propagate at once.
    """
    cap = max_interval_s if max_interval_s is not None else max(interval_s, interval_s * 8)
    backoff = wait_exponential(multiplier=interval_s, exp_base=1.5, min=interval_s, max=cap)

    def wait(state: RetryCallState) -> float:  # the last wait ends at the deadline, for one last check
        return max(0.0, min(backoff(state), timeout_s - (state.seconds_since_start or 0.0)))

    retrying: Retrying = Retrying(
        retry=retry_if_result(lambda value: value is None),
        wait=wait,
        stop=stop_after_delay(timeout_s),
        reraise=False,
    )
    try:
        value = retrying(check)
    except RetryError:
        raise TimeoutError(f"timed out after {timeout_s:.1f}s waiting for {what}") from None
    assert value is not None
    return value
