"""Fetch the schema file and validate shard headers with pinned ranged GETs, in parallel."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tpu_ops.errors import SpecError
from tpu_ops.mirror import schema as sch
from tpu_ops.mirror.records import SourceObject
from tpu_ops.mirror.source import PinnedRead
from tpu_ops.mirror.strategies import CopyContext


def _range(ctx: CopyContext, src: SourceObject, start: int, end: int) -> bytes:
    return PinnedRead(ctx.s3, ctx.source, src, (start, end), block=end - start).read_all()


def load_schema(ctx: CopyContext, src: SourceObject) -> sch.Schema:
    """Read the listed version of the schema file and parse it."""
    if src.size > sch.MAX_SCHEMA_BYTES:
        raise SpecError(f"schema file {src.rel!r} is {src.size} bytes; at most {sch.MAX_SCHEMA_BYTES}")
    raw = _range(ctx, src, 0, src.size) if src.size else b""
    return sch.parse_schema(raw, f"{ctx.source}/{src.rel}")


def check_shard(ctx: CopyContext, src: SourceObject, rule: sch.ShardRule) -> list[str]:
    """Problems with one shard (empty when it passes); at most two ranged GETs."""
    if src.size < 8:
        return [f"truncated: {src.size} bytes, too short for the 8-byte header length"]
    head = _range(ctx, src, 0, min(src.size, sch.HEAD_BYTES))
    n = sch.header_length(head, src.size)
    if isinstance(n, str):
        return [n]
    header = head[8 : 8 + n]
    if len(header) < n:
        header += _range(ctx, src, len(head), 8 + n)
    return sch.check_header(header, src.size, rule)


def validate(ctx: CopyContext, schema: sch.Schema, objects: list[SourceObject]) -> int:
    """Validate every object a schema rule matches; raise ``SpecError`` listing every failing shard.

    Returns how many shards were validated.
    """
    work = [(o, r) for o in objects if (r := schema.rule_for(o.rel)) is not None]
    if not work:
        return 0

    def one(item: tuple[SourceObject, sch.ShardRule]) -> tuple[str, list[str]]:
        return item[0].rel, check_shard(ctx, *item)

    with ThreadPoolExecutor(ctx.concurrency, thread_name_prefix="validate") as pool:
        results = list(pool.map(one, work))
    failures: list[dict[str, Any]] = [{"shard": rel, "problems": p} for rel, p in results if p]
    if failures:
        lines = [f"  {f['shard']}: " + "; ".join(f["problems"]) for f in failures]
        raise SpecError(
            f"{len(failures)} of {len(work)} shard(s) fail schema validation; nothing was copied:\n" + "\n".join(lines),
            errors=failures,
        )
    return len(work)
