"""The finder names the newest complete step and nothing else, from one listing."""

from __future__ import annotations

from typing import Any

import pytest

from tpu_ops.train.checkpoints import complete_steps, latest_complete_step, step_uri


def lay_out(gcs: Any, bucket: str, names: list[str]) -> None:
    b = gcs.bucket(bucket)
    for name in names:
        b.blob(name).upload_from_string(b"x")


def test_empty_run_has_no_step(gcs: Any, bucket: str) -> None:
    assert latest_complete_step(gcs, f"gs://{bucket}/ckpt/run-1") is None


def test_newest_complete_step_ignores_every_trap(gcs: Any, bucket: str, local_stack: Any) -> None:
    run = "ckpt/run-1"
    lay_out(gcs, bucket, [
        f"{run}/100/commit_success.txt", f"{run}/100/state/data", f"{run}/100/_CHECKPOINT_METADATA",
        f"{run}/200/commit_success.txt", f"{run}/200/params/commit_success.txt",
        # an interrupted save: item markers and metadata, but no step marker
        f"{run}/300/params/commit_success.txt", f"{run}/300/_CHECKPOINT_METADATA", f"{run}/300/state/data",
        # Orbax temporary names, some already holding a marker
        f"{run}/400.orbax-checkpoint-tmp/commit_success.txt",
        f"{run}/500.orbax-checkpoint-tmp-1700000000/commit_success.txt",
        # non-numeric entries beside the steps
        f"{run}/metadata/commit_success.txt", f"{run}/_tpu_ops/DONE", f"{run}/export/commit_success.txt",
        f"{run}/-7/commit_success.txt", f"{run}/+9/commit_success.txt", f"{run}/1e3/commit_success.txt",
        # a marker nested too deep, and another run sharing the prefix
        f"{run}/600/x/y/commit_success.txt", "ckpt/run-10/900/commit_success.txt",
    ])  # fmt: skip
    uri = f"gs://{bucket}/{run}"
    assert complete_steps(gcs, uri) == [100, 200]
    assert latest_complete_step(gcs, uri) == 200
    assert latest_complete_step(gcs, uri + "/") == 200
    # the agent's standard-library finder (what a worker resumes from) agrees on every trap
    from tpu_ops.agent import checkpoints as agent_finder
    from tpu_ops.agent.gcs import Gcs

    worker = Gcs(local_stack.gcs_endpoint)
    assert agent_finder.complete_steps(worker, uri) == [100, 200]
    assert agent_finder.latest_complete_step(worker, uri + "/") == 200


def test_numeric_order_not_lexical(gcs: Any, bucket: str) -> None:
    lay_out(gcs, bucket, [f"r/{s}/commit_success.txt" for s in (9, 10, 99, 1000)] + ["r/0/commit_success.txt"])
    assert latest_complete_step(gcs, f"gs://{bucket}/r") == 1000


def test_maxtext_layout_is_one_level_deeper(gcs: Any, bucket: str) -> None:
    lay_out(gcs, bucket, ["base/run-1/checkpoints/20/commit_success.txt", "base/run-1/checkpoints/40/items/x"])
    assert latest_complete_step(gcs, f"gs://{bucket}/base/run-1") is None
    assert latest_complete_step(gcs, f"gs://{bucket}/base/run-1/checkpoints") == 20


def test_bucket_root_run(gcs: Any, bucket: str) -> None:
    lay_out(gcs, bucket, ["7/commit_success.txt", "8/partial"])
    assert latest_complete_step(gcs, f"gs://{bucket}") == 7


def test_one_listing_however_many_steps(gcs: Any, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    lay_out(gcs, bucket, [f"r/{s}/{f}" for s in range(30) for f in ("commit_success.txt", "a/b", "c/d")])
    calls: list[dict[str, Any]] = []
    real = gcs.list_blobs

    def counting(*args: Any, **kw: Any) -> Any:
        calls.append(kw)
        return real(*args, **kw)

    monkeypatch.setattr(gcs, "list_blobs", counting)
    assert latest_complete_step(gcs, f"gs://{bucket}/r") == 29
    assert len(calls) == 1
    assert calls[0]["match_glob"] == "r/*/commit_success.txt"


def test_step_uri() -> None:
    assert step_uri("gs://bkt/ckpt/run-1", 300) == "gs://bkt/ckpt/run-1/300"
    assert step_uri("gs://bkt/ckpt/run-1/", 0) == "gs://bkt/ckpt/run-1/0"
    with pytest.raises(ValueError):
        step_uri("gs://bkt/r", -1)
