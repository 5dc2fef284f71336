"""Load specs from YAML or JSON and turn validation errors into field-named messages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from tpu_ops.errors import SpecError
from tpu_ops.tiers import Tier

M = TypeVar("M", bound=BaseModel)


def _where(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in (*Tier, "function-after[_check(), SliceSpec]"):
            continue  # discriminator tags add nothing for a reader
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(spec)"


def format_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """One dict per error: ``field`` (dotted path), ``message``, ``value``."""
    out = []
    for err in exc.errors(include_url=False):
        msg = str(err["msg"]).removeprefix("Value error, ")
        out.append({"field": _where(tuple(err["loc"])), "message": msg, "value": err.get("input")})
    return out


def _describe(errors: list[dict[str, Any]], what: str) -> str:
    lines = [f"{what}: {len(errors)} error(s)"]
    for e in errors:
        value = repr(e["value"])
        if len(value) > 80:
            value = value[:77] + "..."
        lines.append(f"  {e['field']}: {e['message']} (got {value})")
    return "\n".join(lines)


def parse_spec(model: type[M], data: Any, what: str | None = None) -> M:
    """Validate ``data`` as ``model``; raise ``SpecError`` naming each bad field and its value."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = format_errors(exc)
        raise SpecError(_describe(errors, what or model.__name__), errors) from None


def read_document(path: Path) -> Any:
    """Read a YAML or JSON file (by suffix; YAML otherwise, which also reads JSON)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SpecError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None


def load_spec(path: str | Path, model: type[M]) -> M:
    """Load and validate a spec file as ``model``."""
    path = Path(path)
    return parse_spec(model, read_document(path), what=str(path))
