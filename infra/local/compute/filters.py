"""The ``filter`` of Compute Engine list calls, as much of it as a provider uses.

Terms joined by ``AND`` (or juxtaposed in parentheses): ``field = value``, ``field != value``
(exact; ``*`` in the value is a wildcard), ``field:*`` (the field is set), ``field:value``
(contains), ``field eq regex``, ``field ne regex`` (whole-string RE2-like match). ``field`` may be
dotted (``labels.run-id``, ``scheduling.provisioningModel``). Values may be quoted. Anything else
(``OR``, ``<``, ...) is INVALID_ARGUMENT, never silently ignored.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from typing import Any

from infra.local.core import exceptions as exc

_TERM = re.compile(r"""^\(?\s*([A-Za-z][\w.\-]*)\s*(=|!=|:|\beq\b|\bne\b)\s*("[^"]*"|'[^']*'|[^\s()]+)\s*\)?$""")


def _value(obj: Any, dotted: str) -> Any:
    cur = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _split(expr: str) -> list[str]:
    expr = expr.strip()
    if not expr:
        return []
    parts = re.split(r"\s+AND\s+", expr)
    if len(parts) == 1 and expr.startswith("(") and ")" in expr[:-1]:
        parts = [p if p.startswith("(") else "(" + p for p in re.split(r"\)\s*\(", expr)]
        parts = [p if p.endswith(")") else p + ")" for p in parts]
    return parts


def compile_filter(expr: str | None) -> Callable[[dict[str, Any]], bool]:
    """A predicate over a resource's JSON for ``expr`` (None or "" = everything)."""
    tests: list[Callable[[dict[str, Any]], bool]] = []
    for term in _split(expr or ""):
        m = _TERM.match(term.strip())
        if not m:
            raise exc.InvalidArgument(f"Invalid value for field 'filter': {expr!r}", reason="invalid")
        field, op, raw = m.group(1), m.group(2), m.group(3)
        value = raw[1:-1] if raw[:1] in "\"'" else raw

        def test(res: dict[str, Any], field: str = field, op: str = op, value: str = value) -> bool:
            got = _value(res, field)
            text = "" if got is None else str(got).lower() if isinstance(got, bool) else str(got)
            if op == ":":
                return got is not None and (value == "*" or value in text)
            if op in ("=", "!="):
                hit = fnmatch.fnmatchcase(text, value) if "*" in value else text == value
                return hit if op == "=" else not hit
            hit = re.fullmatch(value, text) is not None
            return hit if op == "eq" else not hit

        tests.append(test)
    return lambda res: all(t(res) for t in tests)
