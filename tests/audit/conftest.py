"""Audit tests share the session stack; each test writes its own trail prefix (no reset needed)."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def audit_settings(local_stack: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Settings on the stack with a fresh trail prefix and spool; the environment says the same (for the CLI)."""
    local_stack.seed_audit()  # another module's test may have reset the stack
    uri = f"s3://tpu-ops-audit/t-{uuid.uuid4().hex[:12]}"
    spool = tmp_path / "spool.jsonl"
    for k, v in local_stack.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("TPU_OPS_AUDIT_URI", uri)
    monkeypatch.setenv("TPU_OPS_AUDIT_SPOOL", str(spool))
    monkeypatch.setenv("TPU_OPS_STATE_DIR", str(tmp_path / "state"))
    return local_stack.settings(audit_uri=uri, audit_spool=spool, state_dir=tmp_path / "state")


@pytest.fixture
def trail(audit_settings: Any) -> Any:
    from tpu_ops.audit.trail import AuditTrail

    return AuditTrail.from_settings(audit_settings)


def _write_run(trail: Any) -> list[dict[str, Any]]:
    """run-a: 6 records, a digest (head 6), 2 more records, a digest (head 8); every record in key order."""
    for i in range(6):
        trail.record("run-a", "train.step", params={"step": i})
    trail.digest("run-a")
    for i in range(2):
        trail.record("run-a", "train.step", params={"step": 6 + i})
    trail.digest("run-a")
    return [json.loads(body) for _, body in trail.store.read_all()]


@pytest.fixture
def write_run() -> Callable[[Any], list[dict[str, Any]]]:
    """:func:`_write_run`, for a test that writes run-a into its own trail."""
    return _write_run


@pytest.fixture(scope="module")
def run_a(local_stack: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list[dict[str, Any]]]:
    """One trail written once per module: (trail, its records)."""
    from tpu_ops.audit.trail import AuditTrail

    local_stack.seed_audit()
    settings = local_stack.settings(audit_uri=f"s3://tpu-ops-audit/m-{uuid.uuid4().hex[:12]}",
                                    audit_spool=tmp_path_factory.mktemp("spool") / "spool.jsonl")  # fmt: skip
    trail = AuditTrail.from_settings(settings)
    return trail, _write_run(trail)


@pytest.fixture
def written(run_a: tuple[Any, list[dict[str, Any]]], audit_settings: Any) -> list[dict[str, Any]]:
    """run-a's records, a copy each test may damage."""
    return copy.deepcopy(run_a[1])
