"""Clocks the fake runs on: the wall clock when served, a manual one tests can drive."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that only moves when told to (``advance``); starts at a fixed instant."""

    def __init__(self, start: float = 1_790_000_000.0) -> None:
        self._t = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._t

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._t += seconds


def rfc3339(t: float) -> str:
    """``2026-11-21T23:05:00.123456Z`` as Google timestamps look."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def parse_proto_duration(s: str | int | float) -> float:
    """A protobuf Duration as JSON (``"3600s"``, ``"1.5s"``) in seconds."""
    if isinstance(s, int | float):
        return float(s)
    return float(s.strip().removesuffix("s"))
