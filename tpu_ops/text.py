"""Characters no name, key, URI or spec string may contain; amounts formatted for people.

Control characters smuggle terminal escapes into logs; Unicode format characters (bidirectional
overrides such as U+202E, zero-width spaces and joiners, the BOM: category Cf) make a name or a key
read differently from what it is; line and paragraph separators break a log line; a lone surrogate
(which a JSON ``\\ud800`` escape can produce) cannot even be encoded. All are refused alike.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from typing import Any

_REFUSED = {
    "Cc": "control character",
    "Cf": "invisible format character",
    "Zl": "line separator",
    "Zp": "paragraph separator",
    "Cs": "surrogate",
}
_ASCII_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def unsafe_char(text: str, allow: str = "") -> str | None:
    """Describe the first refused character of ``text`` (those in ``allow`` excepted), else ``None``.

    >>> unsafe_char("abc\\u202edef")
    'U+202E RIGHT-TO-LEFT OVERRIDE (an invisible format character) at position 3'
    """
    if text.isascii():  # the common case, without a per-character lookup
        m = _ASCII_CONTROL.search(text)
        while m is not None and m.group() in allow:
            m = _ASCII_CONTROL.search(text, m.end())
        if m is None:
            return None
        return f"U+{ord(m.group()):04X} (a control character) at position {m.start()}"
    for i, c in enumerate(text):
        kind = _REFUSED.get(unicodedata.category(c))
        if kind is not None and c not in allow:
            name = unicodedata.name(c, "")
            article = "an" if kind[0] in "aeiou" else "a"
            return f"U+{ord(c):04X}{' ' + name if name else ''} ({article} {kind}) at position {i}"
    return None


def usd_by(amounts: Mapping[str, Any], digits: int = 4) -> str:
    """``spot $0.1074, on-demand $0.0100`` (``-`` when empty): dollars by key, for people."""
    return ", ".join(f"{k} ${float(v):,.{digits}f}" for k, v in sorted(amounts.items())) or "-"


def amounts_by(amounts: Mapping[str, Any], unit: str, digits: int = 4) -> str:
    """``running 0.0168 chip-h, deleting 0.0020 chip-h`` (``-`` when empty)."""
    return ", ".join(f"{k} {float(v):,.{digits}f} {unit}" for k, v in amounts.items()) or "-"


def human_duration(seconds: float) -> str:
    """``45s``, ``1m30s``, ``2h``, ``7d``, ``1d2h``: a duration as a person writes it (no ``0:00:01``)."""
    if seconds < 60:
        return f"{seconds:g}s"
    out, rest = "", round(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        n, rest = divmod(rest, size)
        if n:
            out += f"{n}{unit}"
    return out
