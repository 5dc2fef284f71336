"""Export tests run with the environment pointing at the shared stack and a fresh audit trail prefix."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def env_on_stack(local_stack: Any, tmp_path: Path) -> Iterator[pytest.MonkeyPatch]:
    local_stack.seed_audit()  # another module's test may have reset the stack
    uri = f"s3://tpu-ops-audit/t-{uuid.uuid4().hex[:12]}"
    with pytest.MonkeyPatch.context() as mp:
        for k, v in local_stack.env().items():
            mp.setenv(k, v)
        mp.setenv("TPU_OPS_AUDIT_URI", uri)
        mp.setenv("TPU_OPS_AUDIT_SPOOL", str(tmp_path / "spool.jsonl"))
        mp.setenv("TPU_OPS_STATE_DIR", str(tmp_path / "state"))
        mp.setenv("TPU_OPS_AUDIT_ACTOR", "user:test-operator")
        yield mp
