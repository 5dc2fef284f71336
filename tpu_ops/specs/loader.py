"""Load specs from YAML or JSON and turn validation errors into field-named messages.

Every document tpu-ops reads from a file or a bucket (specs, dataset schema files, manifests, price
tables) goes through ``parse_document``, which refuses hostile input before it costs anything:

- bounded: bytes, nesting depth and node count; a file is never read past its limit;
- strict: UTF-8 only; one document; no duplicate keys; keys are strings; no NaN or infinity;
- YAML without anchors and aliases (no "billion laughs"), without tags (``!!python/...``,
  ``!!binary``, custom ones) and without YAML 1.1's surprises: only ``true``/``false`` are booleans
  (``no`` stays a string) and dates stay strings;
- no control characters in keys, no invisible format characters (bidi overrides, zero-width) or
  line separators anywhere (``tpu_ops.text``).

Each refusal is a ``SpecError`` naming the file, the field (dotted path) and, for YAML, the line.
"""

from __future__ import annotations

import json
import math
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from tpu_ops.errors import SpecError
from tpu_ops.specs.messages import describe, format_errors
from tpu_ops.text import unsafe_char

M = TypeVar("M", bound=BaseModel)
Format = Literal["yaml", "json"]


@dataclass(frozen=True)
class Limits:
    """What one document may cost: bytes, nesting depth, nodes (scalars and collections)."""

    max_bytes: int = 64 * 1024
    max_depth: int = 32
    max_nodes: int = 2_000
    # Check every key and string for refused characters, and depth and node count, in one more pass.
    # Large machine-written JSON (manifests) skips it: the pass would triple the cost of reading it,
    # and its depth is bounded by the parser's recursion limit instead.
    walk: bool = True


# A spec or a schema file is ~1 KB; pure-Python YAML scans 64 KiB in a fraction of a second.
SPEC_LIMITS = Limits()
MANIFEST_LIMITS = Limits(max_bytes=512 * 1024 * 1024, max_depth=16, max_nodes=0, walk=False)  # JSON only


def parse_spec(model: type[M], data: Any, what: str | None = None) -> M:
    """Validate ``data`` as ``model``; raise ``SpecError`` naming each bad field and its value."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = format_errors(exc, model)
        raise SpecError(describe(errors, what or model.__name__), errors) from None


def _refuse(source: str, field: str, problem: str, line: int | None = None) -> SpecError:
    field = field or "(document)"
    at = f" (line {line})" if line is not None else ""
    return SpecError(f"{source}: {field}: {problem}{at}", [{"field": field, "message": problem, "value": None}])


def _child(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if unsafe_char(key) or not key:
        key = repr(key)  # escaped: a key must not hide characters in the message that names it
    return f"{path}.{key}" if path else key


# -- YAML -----------------------------------------------------------------------------------------

_CORE = "tag:yaml.org,2002:"
_DROPPED = {_CORE + t for t in ("timestamp", "merge", "value", "bool", "int", "float")}


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader's parser with YAML 1.2 core scalars: ``true``/``false`` only are booleans, decimal
    integers and plain floats only are numbers (no sexagesimal ``1:30``, no octal, no ``.inf``), no
    timestamps and no merge keys."""

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in _DROPPED]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }


_StrictLoader.add_implicit_resolver(_CORE + "bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_StrictLoader.add_implicit_resolver(_CORE + "int", re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), list("-+0123456789"))
_StrictLoader.add_implicit_resolver(
    _CORE + "float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+\.[0-9]*|[0-9]+(?:\.[0-9]*)?[eE][-+]?[0-9]+|\.[0-9]+[eE][-+]?[0-9]+)$"),
    list("-+0123456789."),
)


class _Frame:
    """An open mapping or sequence while events stream in."""

    __slots__ = ("key", "key_line", "path", "value")

    def __init__(self, value: dict[str, Any] | list[Any], path: str) -> None:
        self.value = value
        self.path = path
        self.key: str | None = None  # a mapping's key waiting for its value
        self.key_line = 0


_QUOTED_OR_COMMENT = re.compile(r""""(?:[^"\\\n]|\\.)*"|'(?:[^'\n]|'')*'|#[^\n]*""")


def _flow_depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` outside quotes and comments (an over-estimate is harmless)."""
    depth = deepest = 0
    for c in re.sub(r"[^\[\]{}]", "", _QUOTED_OR_COMMENT.sub("", text)):
        depth = depth + 1 if c in "[{" else max(0, depth - 1)
        deepest = max(deepest, depth)
    return deepest


def _yaml(text: str, source: str, limits: Limits) -> Any:
    """Build the document from parser events: no composer recursion, every limit checked as it streams."""
    if _flow_depth(text) > limits.max_depth:
        # PyYAML's scanner looks ahead across a whole flow collection (quadratically in its depth)
        # before the first event can be checked, so deep [[[... is refused before it starts.
        raise _refuse(source, "(document)", f"nested more than {limits.max_depth} levels deep")
    stack: list[_Frame] = []
    root: list[Any] = []
    documents = nodes = 0
    loader: Any = None  # PyYAML's stubs type little of the event API
    try:
        loader = _StrictLoader(text)  # its reader refuses NUL and other unprintable characters here
        while loader.check_event():
            event = loader.get_event()
            line = event.start_mark.line + 1
            if isinstance(event, yaml.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    raise _refuse(source, "(document)", "more than one YAML document ('---')", line)
                continue
            if isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
                done = stack.pop().value
                _place(stack, root, done, source, line)
                continue
            if not isinstance(event, yaml.NodeEvent):
                continue  # stream and document boundaries
            where = _pending_path(stack)
            if isinstance(event, yaml.AliasEvent) or event.anchor is not None:
                raise _refuse(source, where, "YAML anchors and aliases (&, *) are not allowed", line)
            tag = getattr(event, "tag", None)
            if tag not in (None, "!"):
                shown = str(tag).replace(_CORE, "!!")
                raise _refuse(source, where, f"YAML tags ({shown}) are not allowed; write plain values", line)
            nodes += 1
            if nodes > limits.max_nodes:
                raise _refuse(source, where, f"more than the limit of {limits.max_nodes} values", line)
            if isinstance(event, yaml.ScalarEvent):
                _place(stack, root, _scalar(loader, event, source, where, line), source, line)
                continue
            if stack and isinstance(stack[-1].value, dict) and stack[-1].key is None:
                raise _refuse(source, where, "a key must be a plain string, not a list or mapping", line)
            if len(stack) >= limits.max_depth:
                raise _refuse(source, where, f"nested more than {limits.max_depth} levels deep", line)
            stack.append(_Frame({} if isinstance(event, yaml.MappingStartEvent) else [], where))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise _refuse(source, "(document)", f"not valid YAML: {problem}", mark.line + 1 if mark else None) from None
    finally:
        if loader is not None:
            loader.dispose()
    return root[0] if root else None


def _pending_path(stack: list[_Frame]) -> str:
    """The path of the node that comes next ("" for the document itself)."""
    if not stack:
        return ""
    top = stack[-1]
    if isinstance(top.value, list):
        return _child(top.path, len(top.value))
    return _child(top.path, top.key) if top.key is not None else top.path


def _scalar(loader: Any, event: Any, source: str, where: str, line: int) -> Any:
    node = yaml.ScalarNode(
        loader.resolve(yaml.ScalarNode, event.value, event.implicit),
        event.value,
        event.start_mark,
        event.end_mark,
        style=event.style,
    )
    try:
        value = loader.construct_object(node)
    except (yaml.YAMLError, ValueError) as exc:  # e.g. an integer of 5000 digits
        raise _refuse(source, where, f"cannot read value: {str(exc)[:120]}", line) from None
    if isinstance(value, float) and not math.isfinite(value):
        raise _refuse(source, where, f"{event.value!r} is not a finite number", line)
    return value


def _place(stack: list[_Frame], root: list[Any], value: Any, source: str, line: int) -> None:
    """Put a finished value into its parent: as a key, a mapping's value, an item, or the root."""
    if not stack:
        root.append(value)
        return
    top = stack[-1]
    if isinstance(top.value, list):
        top.value.append(value)
    elif top.key is None:
        if not isinstance(value, str):
            raise _refuse(source, top.path, f"key {value!r} is not a string; quote it", line)
        if value in top.value:
            raise _refuse(source, _child(top.path, value), "this key appears twice", line)
        top.key, top.key_line = value, line
    else:
        top.value[top.key] = value
        top.key = None


# -- JSON -----------------------------------------------------------------------------------------


class _JsonDuplicates:
    """``object_pairs_hook`` that keeps the first of a duplicate key and remembers where it was."""

    def __init__(self, source: str, at_once: bool) -> None:
        self.found: dict[int, str] = {}
        self.source = source
        self.at_once = at_once  # refuse here, without the field's path (no walk will find it)

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)
        if len(out) < len(pairs):
            seen: set[str] = set()
            key = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
            if self.at_once:
                raise _refuse(self.source, _child("", key), "this key appears twice")
            self.found[id(out)] = key
        return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")


class _NonFinite:
    """Where JSON had ``NaN``/``Infinity``: kept until the walk can name the field it is in."""

    def __init__(self, name: str) -> None:
        self.name = name


def _json(text: str, source: str, limits: Limits) -> Any:
    dups = _JsonDuplicates(source, at_once=not limits.walk)
    try:
        doc = json.loads(text, object_pairs_hook=dups, parse_constant=_NonFinite if limits.walk else _no_constant)
    except SpecError:
        raise
    except json.JSONDecodeError as exc:
        raise _refuse(source, "(document)", f"not valid JSON: {exc.msg}", exc.lineno) from None
    except RecursionError:
        raise _refuse(source, "(document)", f"nested more than {limits.max_depth} levels deep") from None
    except ValueError as exc:  # NaN/Infinity, an integer too long to convert
        raise _refuse(source, "(document)", f"not valid JSON: {exc}") from None
    if limits.walk:
        _walk(doc, source, limits, dups.found)
    return doc


# -- both -----------------------------------------------------------------------------------------


def _walk(doc: Any, source: str, limits: Limits, duplicates: dict[int, str] | None = None) -> None:
    """Check keys and strings everywhere, and (for JSON) depth, size and duplicate keys."""
    todo: list[tuple[Any, str, int]] = [(doc, "", 0)]
    nodes = 0
    while todo:
        value, path, depth = todo.pop()
        nodes += 1
        where = path or "(document)"
        if nodes > limits.max_nodes:
            raise _refuse(source, where, f"more than the limit of {limits.max_nodes} values")
        if isinstance(value, _NonFinite):
            raise _refuse(source, where, f"{value.name} is not a finite number (JSON has no NaN or infinity)")
        if isinstance(value, str):
            bad = unsafe_char(value, allow="\t\n\r")
            if bad:
                raise _refuse(source, where, f"the value contains {bad}")
            continue
        if not isinstance(value, dict | list):
            continue
        if depth >= limits.max_depth:
            raise _refuse(source, where, f"nested more than {limits.max_depth} levels deep")
        if isinstance(value, list):
            todo.extend((item, _child(path, i), depth + 1) for i, item in enumerate(value))
            continue
        if duplicates and id(value) in duplicates:
            raise _refuse(source, _child(path, duplicates[id(value)]), "this key appears twice")
        for key, item in value.items():
            bad = unsafe_char(key)
            if bad:
                raise _refuse(source, _child(path, key), f"the key contains {bad}")
            todo.append((item, _child(path, key), depth + 1))


def parse_document(raw: bytes, source: str, fmt: Format = "yaml", limits: Limits = SPEC_LIMITS) -> Any:
    """Decode and parse one YAML or JSON document strictly (see the module docstring).

    ``source`` names it in errors (a path or a URI). YAML's parser reads JSON too.
    """
    if len(raw) > limits.max_bytes:
        raise _refuse(source, "(document)", f"larger than the limit of {limits.max_bytes} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _refuse(
            source, "(document)", f"not UTF-8 (byte {exc.start}: {raw[exc.start : exc.start + 1]!r})"
        ) from None
    if fmt == "json":
        return _json(text, source, limits)
    doc = _yaml(text, source, limits)
    _walk(doc, source, limits)  # YAML is for people: always checked
    return doc


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of ``path``, refusing (``SpecError``) a file larger than ``limit`` without reading it all."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # a FIFO or a device would block or never end
            raise _refuse(str(path), "(document)", "not a regular file")
        with path.open("rb") as f:
            raw = f.read(limit + 1)
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > limit:
        raise _refuse(str(path), "(document)", f"larger than the limit of {limit} bytes")
    return raw


def read_document(path: Path, limits: Limits = SPEC_LIMITS) -> Any:
    """Read a YAML or JSON file (by suffix; YAML otherwise, which also reads JSON)."""
    raw = read_bounded(path, limits.max_bytes)
    return parse_document(raw, str(path), "json" if path.suffix == ".json" else "yaml", limits)


def load_spec(path: str | Path, model: type[M]) -> M:
    """Load and validate a spec file as ``model``."""
    path = Path(path)
    return parse_spec(model, read_document(path), what=str(path))
