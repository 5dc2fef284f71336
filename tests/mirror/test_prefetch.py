"""The CLI's source listing in a child process: the same listing as in-process, or a clean fallback."""

from __future__ import annotations

from typing import Any

import pytest

from tpu_ops.errors import PolicyError
from tpu_ops.mirror.engine import mirror
from tpu_ops.mirror.listing import list_source
from tpu_ops.mirror.prefetch import SourcePrefetch
from tpu_ops.uris import parse_s3


def test_child_lists_exactly_what_the_parent_would(env: Any) -> None:
    for i in range(5):
        env.put(f"shard-{i}.bin", bytes([i]) * (100 + i))
    prefetch = SourcePrefetch(env.src)
    prefetch.configure(env.settings)  # the stack's endpoint is not in its environment: only in the pipe
    child = prefetch.result(timeout_s=60)
    assert child is not None
    here = list_source(env.s3, parse_s3(env.src))
    assert child == here
    assert len(child.objects) == 5

    result = mirror(env.spec(), env.settings, source_prefetch=SourcePrefetch(env.src))
    assert result.objects_copied == 5
    again = mirror(env.spec(), env.settings, source_prefetch=SourcePrefetch(env.src))
    assert again.objects_copied == 0 and again.snapshot_id == result.snapshot_id


def test_a_child_never_configured_gives_up_and_the_parent_lists(env: Any) -> None:
    env.put("ok.bin", b"x")
    prefetch = SourcePrefetch(env.src)
    assert prefetch.result(timeout_s=60) is None
    assert prefetch._proc.returncode == 1


def test_a_failing_child_falls_back_to_the_real_error(env: Any) -> None:
    env.put("ok.bin", b"x")
    env.put("a/../escape.bin", b"y")
    prefetch = SourcePrefetch(env.src)
    with pytest.raises(PolicyError, match="unsafe source key"):
        mirror(env.spec(), env.settings, source_prefetch=prefetch)
    assert env.dest_names() == []
