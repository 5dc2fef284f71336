"""Routing of a fake: a table of (HTTP method, path regex, handler name)."""

from __future__ import annotations

import re

Routes = list[tuple[str, re.Pattern[str], str]]


def compile_routes(paths: list[tuple[str, str, str]]) -> Routes:
    return [(m, re.compile(p), h) for m, p, h in paths]


def match_in(routes: Routes, method: str, path: str) -> tuple[str, dict[str, str]] | None:
    """The handler name and path arguments for a request, or ``None`` if no route matches."""
    for m, pattern, handler in routes:
        found = pattern.match(path)
        if found and m == method:
            return handler, found.groupdict()
    return None


def known_in(routes: Routes, path: str) -> bool:
    return any(p.match(path) for _, p, _ in routes)


# The control endpoints every state-machine fake serves (handlers in ``responses.ControlMixin``).
CONTROL_PATHS: list[tuple[str, str, str]] = [
    ("POST", r"^/_fake/reset$", "fake_reset"),
    ("POST", r"^/_fake/faults$", "fake_faults"),
    ("GET", r"^/_fake/state$", "fake_state"),
]
