"""How a spec's validation errors read: one line per bad field, its dotted path and what is allowed.

A misspelt field gets the closest field name the model has at that place ("did you mean"); the
value is shown only when it is a scalar the message does not already name (a model's own checks
receive the whole enclosing mapping as their input, which would only repeat the spec back).
"""

from __future__ import annotations

import difflib
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from tpu_ops.tiers import Tier

_TAGS = (*Tier, "function-after[_check(), SliceSpec]")  # union tags pydantic puts in a location


def _where(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in _TAGS:
            continue  # discriminator tags add nothing for a reader
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(spec)"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (through Optional, unions, lists, dicts, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def field_names_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The field names of the model(s) found at ``loc`` inside ``model`` (empty if none is a model)."""
    models = [model]
    for item in loc:
        if isinstance(item, int) or item in _TAGS:
            continue
        owners = [m for m in models if item in m.model_fields]
        models = [inner for m in owners for inner in _models_in(m.model_fields[item].annotation)]
        if not models:
            return []  # a mapping's key (labels, hyperparameters) or a field that holds no model
    return sorted({name for m in models for name in m.model_fields})


def _did_you_mean(model: type[BaseModel] | None, loc: tuple[int | str, ...]) -> str:
    if model is None or not loc or not isinstance(loc[-1], str):
        return ""
    close = difflib.get_close_matches(loc[-1], field_names_at(model, loc[:-1]), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def format_errors(exc: ValidationError, model: type[BaseModel] | None = None) -> list[dict[str, Any]]:
    """One dict per error: ``field`` (dotted path), ``message``, ``value``."""
    out = []
    for err in exc.errors(include_url=False):
        msg = str(err["msg"]).removeprefix("Value error, ")
        loc = tuple(err["loc"])
        if err["type"] == "extra_forbidden":
            msg += _did_you_mean(model, loc)
        out.append({"field": _where(loc), "message": msg, "value": err.get("input")})
    return out


def describe(errors: list[dict[str, Any]], what: str) -> str:
    """The message of a ``SpecError``: a heading and one line per error."""
    lines = [f"{what}: {len(errors)} error(s)"]
    for e in errors:
        lines.append(f"  {e['field']}: {e['message']}{_shown(e['value'], e['message'])}")
    return "\n".join(lines)


def _shown(value: Any, message: str) -> str:
    """`` (got VALUE)`` for a short scalar the message does not already name; else nothing."""
    if isinstance(value, dict | list | tuple | set):
        return ""
    text = repr(value)
    if text in message:
        return ""
    return f" (got {text})" if len(text) <= 80 else f" (got {text[:77]}...)"
