"""Check JSON against the official ``tpu.v2`` discovery document (shipped in google-api-python-client)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import googleapiclient

from infra.local.tpu.responses import ENUMS

DOC = Path(googleapiclient.__file__).parent / "discovery_cache/documents/tpu.v2.json"
ANY_TYPES = {"OperationMetadata", "Node", "QueuedResource", "Empty"}


@cache
def schemas() -> dict[str, Any]:
    return dict(json.loads(DOC.read_text())["schemas"])


def _enum_name(allowed: list[str], value: Any) -> Any:
    """Integer enums (``enum-encoding=int``) back to names, using the table with the same names."""
    if not isinstance(value, int):
        return value
    for table in ENUMS.values():
        if set(table) <= set(allowed):
            back = {v: k for k, v in table.items()}
            if value in back:
                return back[value]
    return value


def validate(schema: str, value: Any, path: str = "$") -> list[str]:
    """Every problem found, as ``path: message``; an empty list means the value fits the schema."""
    spec = schemas()[schema]
    if not isinstance(value, dict):
        return [f"{path}: expected object for {schema}"]
    errors = []
    props = spec.get("properties", {})
    for key, item in value.items():
        if key not in props:
            errors.append(f"{path}.{key}: not a field of {schema}")
        else:
            errors += _check(props[key], item, f"{path}.{key}")
    return errors


def _check(prop: dict[str, Any], value: Any, path: str) -> list[str]:
    if "$ref" in prop:
        return validate(prop["$ref"], value, path)
    kind = prop.get("type")
    if kind == "string":
        if not isinstance(value, str) and not (prop.get("enum") and isinstance(value, int)):
            return [f"{path}: expected string, got {value!r}"]
        if prop.get("enum") and _enum_name(prop["enum"], value) not in prop["enum"]:
            return [f"{path}: {value!r} not in enum {prop['enum']}"]
        return []
    if kind == "integer":
        ok = (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, str) and value.isdigit())
        return [] if ok else [f"{path}: expected integer, got {value!r}"]
    if kind == "boolean":
        return [] if isinstance(value, bool) else [f"{path}: expected boolean, got {value!r}"]
    if kind == "array":
        if not isinstance(value, list):
            return [f"{path}: expected array"]
        return [e for i, v in enumerate(value) for e in _check(prop["items"], v, f"{path}[{i}]")]
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{path}: expected object"]
        if "@type" in value:  # an Any: metadata / response of an Operation
            name = str(value["@type"]).rsplit(".", 1)[-1]
            if name not in ANY_TYPES:
                return [f"{path}: unexpected @type {value['@type']}"]
            return validate(name, {k: v for k, v in value.items() if k != "@type"}, path)
        extra = prop.get("additionalProperties")
        if isinstance(extra, dict) and extra.get("type") in ("string",):
            return [f"{path}.{k}: expected string" for k, v in value.items() if not isinstance(v, str)]
        return []
    return [f"{path}: schema type {kind!r} not handled"]
