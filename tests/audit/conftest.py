"""Audit tests share the session stack; each test writes its own trail prefix (no reset needed)."""

from __future__ import annotations

import uuid
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
