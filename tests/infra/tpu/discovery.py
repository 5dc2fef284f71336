"""Check JSON against an official discovery document (shipped in google-api-python-client).

``validate`` checks against ``tpu.v2``; ``Discovery("storagetransfer.v1.json", ...)`` against others.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

import googleapiclient

from infra.local.tpu.responses import ENUMS

DOCS = Path(googleapiclient.__file__).parent / "discovery_cache/documents"


class Discovery:
    """One discovery document; ``any_types`` may appear as ``@type`` of an Any, ``enums`` are the
    name -> integer tables used to read integer-encoded enums back."""

    def __init__(self, doc: str, any_types: set[str], enums: dict[str, dict[str, int]]) -> None:
        self.doc = DOCS / doc
        self.any_types = any_types
        self.enums = enums

    @cached_property
    def schemas(self) -> dict[str, Any]:
        return dict(json.loads(self.doc.read_text())["schemas"])

    def _enum_name(self, allowed: list[str], value: Any) -> Any:
        """Integer enums (``enum-encoding=int``) back to names, using the table with the same names."""
        if not isinstance(value, int):
            return value
        for table in self.enums.values():
            if set(table) <= set(allowed):
                back = {v: k for k, v in table.items()}
                if value in back:
                    return back[value]
        return value

    def validate(self, schema: str, value: Any, path: str = "$") -> list[str]:
        """Every problem found, as ``path: message``; an empty list means the value fits the schema."""
        spec = self.schemas[schema]
        if not isinstance(value, dict):
            return [f"{path}: expected object for {schema}"]
        errors = []
        props = spec.get("properties", {})
        for key, item in value.items():
            if key not in props:
                errors.append(f"{path}.{key}: not a field of {schema}")
            else:
                errors += self._check(props[key], item, f"{path}.{key}")
        return errors

    def _inline(self, spec: dict[str, Any], value: dict[str, Any], path: str) -> list[str]:
        props = spec["properties"]
        errors = [f"{path}.{k}: not a field" for k in value if k not in props]
        return errors + [e for k, v in value.items() if k in props for e in self._check(props[k], v, f"{path}.{k}")]

    def _check(self, prop: dict[str, Any], value: Any, path: str) -> list[str]:
        if "$ref" in prop:
            return self.validate(prop["$ref"], value, path)
        kind = prop.get("type")
        if kind == "string":
            if not isinstance(value, str) and not (prop.get("enum") and isinstance(value, int)):
                return [f"{path}: expected string, got {value!r}"]
            if prop.get("enum") and self._enum_name(prop["enum"], value) not in prop["enum"]:
                return [f"{path}: {value!r} not in enum {prop['enum']}"]
            return []
        if kind == "integer":
            ok = isinstance(value, int) and not isinstance(value, bool)
            ok = ok or (isinstance(value, str) and value.isdigit())
            return [] if ok else [f"{path}: expected integer, got {value!r}"]
        if kind == "number":
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            return [] if ok else [f"{path}: expected number, got {value!r}"]
        if kind == "boolean":
            return [] if isinstance(value, bool) else [f"{path}: expected boolean, got {value!r}"]
        if kind == "array":
            if not isinstance(value, list):
                return [f"{path}: expected array"]
            return [e for i, v in enumerate(value) for e in self._check(prop["items"], v, f"{path}[{i}]")]
        if kind == "object":
            if not isinstance(value, dict):
                return [f"{path}: expected object"]
            if "@type" in value:  # an Any: metadata / response of an Operation
                name = str(value["@type"]).rsplit(".", 1)[-1]
                if name not in self.any_types:
                    return [f"{path}: unexpected @type {value['@type']}"]
                return self.validate(name, {k: v for k, v in value.items() if k != "@type"}, path)
            extra = prop.get("additionalProperties")
            if isinstance(extra, dict) and extra.get("type") in ("string",):
                return [f"{path}.{k}: expected string" for k, v in value.items() if not isinstance(v, str)]
            if isinstance(extra, dict):  # a map of messages (e.g. Compute Engine's scoped lists)
                return [e for k, v in value.items() for e in self._check(extra, v, f"{path}.{k}")]
            if "properties" in prop:  # an inline message (e.g. compute's Operation.error)
                return self._inline(prop, value, path)
            return []
        return [f"{path}: schema type {kind!r} not handled"]


TPU = Discovery("tpu.v2.json", {"OperationMetadata", "Node", "QueuedResource", "Empty"}, ENUMS)
validate = TPU.validate


def schemas() -> dict[str, Any]:
    return TPU.schemas
