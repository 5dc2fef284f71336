"""Reading stored audit records: bytes to a record or a reason it is not one, never an exception.

Everything a trail holds may be hostile (NaN, duplicate keys, huge or deeply nested, not UTF-8):
:func:`parse_record` accepts only canonical, finite, unique-keyed JSON objects of bounded size and
depth with a seq, chain, prev_hash and hash; :class:`Item` carries either the record or why not.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MAX_RECORD_BYTES = 1 << 20  # a record is a few KiB; anything near this is an attack, not a record
MAX_DEPTH = 32
_KEY = re.compile(r"chains/([^/]+)/([^/]+)$")
_SEQ_NAME = re.compile(r"^(\d{12})\.json$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HINT_CHAIN = re.compile(rb'"chain"\s*:\s*"([-_a-z0-9]{1,63})"')
_HINT_SEQ = re.compile(rb'"seq"\s*:\s*(\d{1,12})\b')


@dataclass
class Item:
    """One stored record: where it is (key or line), the seq its key says, its parsed body.

    ``record`` is None when the bytes are not a well-formed record; ``problem`` then says why, and
    ``key_chain``/``key_seq`` (from the key, or hinted from the bytes) say which record it claims to be.
    """

    where: str
    record: dict[str, Any] | None
    key_chain: str | None = None
    key_seq: int | None = None
    problem: str | None = None
    foreign: bool = False


class _Bad(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _Bad(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Bad(f"{text[:20]} is not a finite number")
    return value


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Bad(f"duplicate key {k[:40]!r}")
        out[k] = v
    return out


def _depth(obj: Any) -> int:
    """Nesting depth of ``obj``, without recursion (a planted record may be deep)."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if d > MAX_DEPTH:
            return d
        if isinstance(node, dict):
            stack.extend((v, d + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, d + 1) for v in node)
    return deepest


def parse_record(body: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """``(record, None)`` if ``body`` is a well-formed record, else ``(None, why)``. Never raises."""
    if len(body) > MAX_RECORD_BYTES:
        return None, f"{len(body)} bytes, over the {MAX_RECORD_BYTES} a record may have"
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 (byte {exc.start})"
    try:
        obj = json.loads(text, parse_constant=_no_constant, parse_float=_finite, object_pairs_hook=_unique)
    except RecursionError:
        return None, "nested too deeply to parse"
    except _Bad as exc:
        return None, f"not canonical JSON: {exc}"
    except ValueError as exc:  # JSONDecodeError, and ints too long to convert
        return None, f"not JSON: {str(exc)[:120]}"
    if not isinstance(obj, dict):
        return None, f"a JSON {type(obj).__name__}, not an object"
    if _depth(obj) > MAX_DEPTH:
        return None, f"nested deeper than {MAX_DEPTH} levels"
    seq = obj.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        return None, "no positive integer seq"
    if not isinstance(obj.get("chain"), str) or not isinstance(obj.get("prev_hash"), str):
        return None, "no chain or prev_hash"
    if not isinstance(obj.get("hash"), str) or not _HEX64.fullmatch(obj["hash"]):
        return None, "no SHA-256 hash"
    return obj, None


def _hints(body: bytes) -> tuple[str | None, int | None]:
    """Which chain and seq unreadable bytes claim to be (to name them), best effort."""
    c, s = _HINT_CHAIN.search(body[: MAX_RECORD_BYTES * 4]), _HINT_SEQ.findall(body[: MAX_RECORD_BYTES * 4])
    return (c.group(1).decode() if c else None), (int(s[-1]) if s else None)


def _item(where: str, body: bytes, key_chain: str | None = None, key_seq: int | None = None) -> Item:
    record, problem = parse_record(body)
    if record is None:
        chain, seq = _hints(body)
        return Item(where, None, key_chain or chain, key_seq if key_seq is not None else seq, problem)
    return Item(where, record, key_chain, key_seq)


def items_from_jsonl(path: Path) -> list[Item]:
    """Records of a JSONL file, one per line, in file order (read as bytes: any line may be hostile)."""
    out = []
    with open(path, "rb") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                out.append(_item(f"line {n}", line.rstrip(b"\r\n")))
    return out


def item_from_object(key: str, body: bytes) -> Item:
    """The record of one S3 object; its key's chain and seq are checked too."""
    m = _KEY.search(key)
    if m is None:
        return Item(key, None, None, None, "not under chains/<chain>/", foreign=True)
    chain, name = m.group(1), m.group(2)
    seq = _SEQ_NAME.fullmatch(name)
    if seq is None:
        return Item(key, None, chain, None, f"{name!r} is not a record key (<seq:012d>.json)", foreign=True)
    return _item(key, body, chain, int(seq.group(1)))


def items_from_objects(objects: Iterable[tuple[str, bytes]]) -> list[Item]:
    """Records of ``(key, body)`` pairs from S3."""
    return [item_from_object(key, body) for key, body in objects]


def parse_time(text: str) -> datetime:
    """A record's ``time`` as an aware datetime."""
    t = datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def time_of(record: dict[str, Any]) -> datetime | None:
    """A record's ``time``, or None if it is not an ISO 8601 time."""
    try:
        return parse_time(str(record.get("time")))
    except ValueError:
        return None
