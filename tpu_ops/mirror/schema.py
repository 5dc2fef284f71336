"""The dataset schema file, and validating safetensors shards from their headers with ranged GETs.

A curated dataset declares its shards in ``_schema.yaml`` (``MirrorSpec.schema_file``) at the
top of the source prefix. YAML or JSON::

    version: 1
    shards:
      - pattern: "train/*.safetensors"   # shell-style (fnmatch) on the key below the prefix;
        format: safetensors              # '*' also matches '/'. Only safetensors for now.
        allow_extra_tensors: false       # default false: undeclared tensors fail the shard
        tensors:
          - {name: tokens, dtype: int32, shape: [null, 2048]}   # null (or -1) = any length
          - {name: embeddings, dtype: bfloat16, shape: [4096, 768]}

dtypes: safetensors names (``BOOL U8 I8 U16 I16 F16 BF16 U32 I32 F32 U64 I64 F64 F8_E4M3
F8_E5M2``) or numpy-style aliases (``bool uint8 int8 ... float16 bfloat16 float32 float64``).
Keys matching no pattern are copied without validation. A key matching several patterns is
validated against the first.

A shard is checked from its header only: the 8-byte little-endian header length, then the JSON
header (one ranged GET, two if the header is large). It fails when the file is shorter than its
header claims, the header is not safetensors JSON, a tensor's byte range disagrees with its dtype
and shape or lies past the end of the file, or the tensors differ from the schema. Every failing
shard is reported, and nothing is copied if any fails.
"""

from __future__ import annotations

import fnmatch
import json
import math
from dataclasses import dataclass
from typing import Any

from tpu_ops.errors import SpecError
from tpu_ops.specs.loader import SPEC_LIMITS, parse_document

HEAD_BYTES = 64 * 1024  # first ranged GET: the length prefix and, usually, the whole header
MAX_HEADER = 100_000_000  # safetensors' own limit
MAX_SCHEMA_BYTES = SPEC_LIMITS.max_bytes  # read as strictly as a spec (tpu_ops/specs/loader.py)

ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
}  # fmt: skip
ALIASES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "uint16": "U16", "int16": "I16", "float16": "F16", "half": "F16", "bfloat16": "BF16",
    "uint32": "U32", "int32": "I32", "float32": "F32", "float": "F32",
    "uint64": "U64", "int64": "I64", "float64": "F64", "double": "F64",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    dtype: str  # safetensors name
    shape: tuple[int | None, ...]  # None = any


@dataclass(frozen=True, slots=True)
class ShardRule:
    pattern: str
    tensors: tuple[TensorSpec, ...]
    allow_extra: bool


@dataclass(frozen=True, slots=True)
class Schema:
    rules: tuple[ShardRule, ...]

    def rule_for(self, rel: str) -> ShardRule | None:
        """The first rule whose pattern matches ``rel``."""
        return next((r for r in self.rules if fnmatch.fnmatchcase(rel, r.pattern)), None)


def _dtype(value: Any, where: str) -> str:
    text = str(value)
    name = ALIASES.get(text.lower(), text.upper())
    if name not in ITEMSIZE:
        raise SpecError(f"{where}: unknown dtype {value!r}; use one of {', '.join(ITEMSIZE)} or an alias")
    return name


def parse_schema(raw: bytes, origin: str) -> Schema:
    """Parse a schema file; raise ``SpecError`` naming the offending field."""
    doc = parse_document(raw, f"schema file {origin}")  # bounded and strict: it comes from a bucket
    if not isinstance(doc, dict) or doc.get("version", 1) != 1 or not isinstance(doc.get("shards"), list):
        raise SpecError(f"schema file {origin}: expected a mapping with 'version: 1' and a 'shards' list")
    rules = []
    for i, item in enumerate(doc["shards"]):
        where = f"schema file {origin}: shards[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("pattern"), str):
            raise SpecError(f"{where}: needs a 'pattern' string")
        if item.get("format", "safetensors") != "safetensors":
            raise SpecError(f"{where}: format {item.get('format')!r} is not supported (only safetensors)")
        tensors = []
        for j, t in enumerate(item.get("tensors") or []):
            tw = f"{where}.tensors[{j}]"
            if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not isinstance(t.get("shape"), list):
                raise SpecError(f"{tw}: needs 'name', 'dtype' and 'shape' (a list)")
            shape: list[int | None] = []
            for d in t["shape"]:
                if d is None or d == -1:
                    shape.append(None)
                elif isinstance(d, int) and not isinstance(d, bool) and d >= 0:
                    shape.append(d)
                else:
                    raise SpecError(f"{tw}: shape entries must be non-negative integers, null or -1, got {d!r}")
            tensors.append(TensorSpec(t["name"], _dtype(t.get("dtype"), tw), tuple(shape)))
        rules.append(ShardRule(item["pattern"], tuple(tensors), bool(item.get("allow_extra_tensors", False))))
    return Schema(tuple(rules))


def header_length(prefix: bytes, size: int) -> int | str:
    """The declared header length, or a problem description."""
    if size < 8 or len(prefix) < 8:
        return f"truncated: {size} bytes, too short for the 8-byte header length"
    n = int.from_bytes(prefix[:8], "little")
    if n > MAX_HEADER:
        return f"header length {n} exceeds the safetensors limit ({MAX_HEADER}); not a safetensors file?"
    if 8 + n > size:
        return f"truncated header: it declares {n} bytes but the file has only {size - 8} after the length"
    return n


def check_header(header: bytes, size: int, rule: ShardRule) -> list[str]:
    """Problems with a shard's JSON header against ``rule`` (empty when it passes)."""
    try:
        doc = json.loads(header)
    except (UnicodeDecodeError, ValueError) as exc:
        return [f"header is not valid JSON ({exc.__class__.__name__}): truncated or not safetensors"]
    if not isinstance(doc, dict):
        return ["header is not a JSON object"]
    problems: list[str] = []
    data_len = size - 8 - len(header)
    found: dict[str, tuple[str, list[int]]] = {}
    for name, info in doc.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
            problems.append(f"tensor {name!r}: entry lacks dtype/shape/data_offsets")
            continue
        dtype, shape, offsets = str(info["dtype"]), info["shape"], info["data_offsets"]
        found[name] = (dtype, shape)
        if dtype not in ITEMSIZE or not isinstance(shape, list) or not isinstance(offsets, list) or len(offsets) != 2:
            problems.append(f"tensor {name!r}: malformed entry (dtype {dtype!r})")
            continue
        begin, end = offsets
        if end - begin != math.prod(shape) * ITEMSIZE[dtype]:
            problems.append(f"tensor {name!r}: {end - begin} bytes do not hold {dtype}{shape}")
        if end > data_len:
            problems.append(f"tensor {name!r}: data ends at byte {end}, past the end of the file (truncated)")
    for want in rule.tensors:
        if want.name not in found:
            problems.append(f"tensor {want.name!r}: missing")
            continue
        dtype, shape = found[want.name]
        if dtype != want.dtype:
            problems.append(f"tensor {want.name!r}: dtype {dtype}, schema says {want.dtype}")
        same_rank = len(shape) == len(want.shape)
        if not same_rank or any(w is not None and w != s for w, s in zip(want.shape, shape, strict=True)):
            shown = [("*" if w is None else w) for w in want.shape]
            problems.append(f"tensor {want.name!r}: shape {shape}, schema says {shown}")
    if not rule.allow_extra:
        declared = {t.name for t in rule.tensors}
        extra = sorted(set(found) - declared)
        if extra:
            problems.append(f"undeclared tensor(s) {', '.join(map(repr, extra[:10]))}")
    return problems
