"""Pure parts of the mirror: CRC32C combination, the plan, the schema file and header checks."""

from __future__ import annotations

import itertools
import os
import time
import tracemalloc

import google_crc32c
import pytest
from mirror_helpers import safetensors_bytes

from tpu_ops.errors import SpecError
from tpu_ops.mirror import crc
from tpu_ops.mirror.plan import plan
from tpu_ops.mirror.records import DestObject, SourceObject
from tpu_ops.mirror.schema import check_header, header_length, parse_schema
from tpu_ops.mirror.strategies import MAX_PARTS, part_ranges, provenance


def test_crc32c_combine_matches_whole():
    a, b, c = os.urandom(1000), os.urandom(777), os.urandom(1)
    whole = google_crc32c.value(a + b + c)
    combined = crc.combine(
        crc.combine(google_crc32c.value(a), google_crc32c.value(b), len(b)), google_crc32c.value(c), 1
    )
    assert combined == whole
    assert crc.from_b64(crc.to_b64(whole)) == whole


def test_part_ranges_cover_and_respect_compose_limit():
    mib = 1024 * 1024
    assert part_ranges(64 * mib, 16 * mib) == [(i * 16 * mib, (i + 1) * 16 * mib) for i in range(4)]
    huge = part_ranges(10_000 * mib + 3, 16 * mib)
    assert len(huge) <= MAX_PARTS and huge[0][0] == 0 and huge[-1][1] == 10_000 * mib + 3
    assert all(x[1] == y[0] for x, y in itertools.pairwise(huge))


def _dest_for(src: SourceObject, crc32c: str = "AAAAAA==") -> DestObject:
    meta = provenance(src, crc32c)
    return DestObject(
        src.rel, src.size, crc32c, meta["tpu-ops-src-etag"], meta["tpu-ops-src-version"], src.size, crc32c
    )


def test_plan_skips_only_verified_copies_of_the_same_version():
    same = SourceObject("a", 10, "e1", None)
    overwritten = SourceObject("b", 10, "f00-2", None)  # same size, new multipart ETag
    new = SourceObject("c", 5, "e3", "v1")
    tampered = SourceObject("d", 10, "e4", None)
    dest = {
        "a": _dest_for(same),
        "b": _dest_for(SourceObject("b", 10, "abc-2", None)),
        "d": DestObject("d", 10, "BBBBBB==", "e4", "", 10, "AAAAAA=="),  # stored CRC differs from verified
    }
    p = plan([same, overwritten, new, tampered], dest)
    assert [s.rel for s, _ in p.skip] == ["a"]
    assert [s.rel for s in p.copy] == ["b", "c", "d"]


def test_plan_100k_objects_is_fast_and_small():
    """The README's figures: a 100,000-object plan in 0.4-0.6 s, the whole process in 61 MB. The limits
    leave 5x headroom on time for a loaded 2-core CI; memory does not depend on load."""
    n = 100_000
    src = [SourceObject(f"shard/{i:06d}.safetensors", 1 << 20, f"{i:032x}", None) for i in range(n)]
    dest = {s.rel: _dest_for(s) for s in src[: n // 2]}
    t = time.perf_counter()
    p = plan(src, dest)
    elapsed = time.perf_counter() - t
    assert len(p.copy) == n // 2 and len(p.skip) == n // 2
    assert elapsed < 3.0
    tracemalloc.start()
    try:
        plan(src, dest)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 1024 * 1024, f"plan() allocated {peak / 2**20:.1f} MiB at its peak"


SCHEMA = b"""
version: 1
shards:
  - pattern: "train/*.safetensors"
    tensors:
      - {name: tokens, dtype: int32, shape: [null, 4]}
      - {name: emb, dtype: bfloat16, shape: [2, 3]}
"""


def test_schema_and_headers():
    rule = parse_schema(SCHEMA, "s").rule_for("train/x/0.safetensors")
    assert rule is not None and rule.tensors[1].dtype == "BF16"
    good = safetensors_bytes({"tokens": ("I32", [5, 4]), "emb": ("BF16", [2, 3])})
    n = header_length(good[:8], len(good))
    assert isinstance(n, int)
    assert check_header(good[8 : 8 + n], len(good), rule) == []
    bad = safetensors_bytes({"tokens": ("I32", [5, 4]), "emb": ("F32", [2, 3]), "x": ("U8", [1])})
    n = header_length(bad[:8], len(bad))
    problems = check_header(bad[8 : 8 + n], len(bad), rule)
    assert any("dtype F32, schema says BF16" in p for p in problems)
    assert any("undeclared" in p for p in problems)
    assert "truncated header" in str(header_length(good[:8], 40))
    with pytest.raises(SpecError, match="unknown dtype"):
        parse_schema(b"shards: [{pattern: '*', tensors: [{name: a, dtype: float7, shape: []}]}]", "s")
