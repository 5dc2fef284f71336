"""Fixtures of the flow tests: the default dry run, run once for every test that reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from dryruns import dry_run


@pytest.fixture(scope="session")
def default_dry_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`tpu-ops dry-run --keep` (Compute Engine, one injected preemption), its workers' files kept."""
    tmp: Path = tmp_path_factory.mktemp("default-dry-run")
    summary, out, env = dry_run(tmp, "--keep")
    return {"tmp": tmp, "summary": summary, "out": out, "env": env}
