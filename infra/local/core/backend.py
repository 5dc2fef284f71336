"""What every fake's state machine shares: one lock, injected faults, ordered events, paging.

A backend's API methods run through ``_call(method, rest_path, fn)``: injected faults first (so a
scenario behaves the same in-process and over HTTP), then ``_advance()`` (time-driven
transitions, to the clock's now), the state change, ``_advance()`` again; events queued with
``_emit_event`` are delivered to listeners after the lock is released, in order.
"""

from __future__ import annotations

import base64
import re
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from infra.local.core import exceptions as exc
from infra.local.core.clock import Clock, SystemClock

T = TypeVar("T")
E = TypeVar("E")


@dataclass(frozen=True)
class NodeEvent:
    """A simulated host's life for the host simulator: a node/instance became ready
    (``kind="ready"``), its guest is told to stop (``"terminating"``: SIGTERM only) or it stopped
    (``"stopped"``); ``reason`` says why, ``node`` is its JSON at the time of the event."""

    kind: str
    reason: str
    project: str
    zone: str
    node_id: str
    node: dict[str, Any]


@dataclass
class Fault:
    pattern: re.Pattern[str]
    method: str | None
    status: int
    remaining: int
    message: str | None
    served: int = 0


def page(items: list[T], page_size: int | None, page_token: str | None) -> tuple[list[T], str]:
    """One page of ``items`` and the next page's token ("" on the last page); tokens are offsets."""
    start = 0
    if page_token:
        try:
            start = int(base64.urlsafe_b64decode(page_token.encode()).decode())
        except ValueError:
            raise exc.InvalidArgument(f"invalid page token {page_token!r}") from None
    size = page_size if page_size and page_size > 0 else 1000
    chunk = items[start : start + size]
    nxt = start + size
    token = base64.urlsafe_b64encode(str(nxt).encode()).decode() if nxt < len(items) else ""
    return chunk, token


def operation_id(now: float) -> str:
    """``operation-<ms>-<hex>``, the form Google's operation names take."""
    return f"operation-{int(now * 1000)}-{secrets.token_hex(8)}"


class FakeBackend(Generic[E]):
    """Base of a fake's state machine; subclasses implement ``_advance`` (and their API)."""

    def __init__(self, *, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or SystemClock()
        self._lock = threading.RLock()
        self._dispatch = threading.RLock()
        self._pending: list[E] = []
        self._listeners: list[Callable[[E], None]] = []
        self._faults: list[Fault] = []

    # -- events --------------------------------------------------------------------------------
    def subscribe(self, listener: Callable[[E], None]) -> None:
        self._listeners.append(listener)

    def _emit_event(self, event: E) -> None:
        self._pending.append(event)

    def _flush(self) -> None:
        # One dispatcher at a time pops the shared queue, so listeners see events in order.
        with self._dispatch:
            while True:
                with self._lock:
                    if not self._pending:
                        return
                    event = self._pending.pop(0)
                for listener in list(self._listeners):
                    listener(event)

    # -- calls and time ------------------------------------------------------------------------
    def _call(self, method: str, path: str, fn: Callable[[], T]) -> T:
        """Run one API method: faults first, then the state change, then deliver events."""
        try:
            with self._lock:
                self._fault(method, path)
                self._advance()
                result = fn()
                self._advance()
                return result
        finally:
            self._flush()

    def _locked(self, fn: Callable[[], T]) -> T:
        """Like ``_call`` without faults: for control methods (preempt, capacity, ...)."""
        try:
            with self._lock:
                self._advance()
                result = fn()
                self._advance()
                return result
        finally:
            self._flush()

    def _advance(self) -> None:
        """Move every time-driven state machine to the clock's now."""

    def tick(self) -> None:
        """Advance to the clock's now (the server calls this on a timer)."""
        try:
            with self._lock:
                self._advance()
        finally:
            self._flush()

    # -- faults --------------------------------------------------------------------------------
    def _fault(self, method: str, path: str) -> None:
        for f in self._faults:
            if f.remaining > 0 and (f.method is None or f.method == method) and f.pattern.search(path):
                f.remaining -= 1
                f.served += 1
                raise exc.Injected(f.status, f.message)

    def add_fault(
        self, path_regex: str, status: int, count: int = 1, method: str | None = None, message: str | None = None
    ) -> None:
        """Answer the next ``count`` calls whose REST path matches ``path_regex`` with ``status``."""
        with self._lock:
            self._faults.append(
                Fault(re.compile(path_regex), method.upper() if method else None, status, count, message)
            )

    def faults_served(self) -> int:
        with self._lock:
            return sum(f.served for f in self._faults)

    def faults_pending(self) -> int:
        with self._lock:
            return sum(f.remaining for f in self._faults)
