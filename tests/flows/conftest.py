"""Fixtures for flow tests: a pipeline seeded on the session stack, run in this process with its environment;
the default dry run, run once for every test that reads it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from dryruns import dry_run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pipeline_on_stack(stack: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> SimpleNamespace:
    """What a test of one whole pipeline run needs, in two steps around its credential blocks:

    - ``seed(spec_file, run_id, name, tweak)``: the pipeline spec ``flows/<spec_file>`` (``tweak`` edits its
      document) with its dataset seeded, its model bucket made and the stack's capacity set; returns the
      admin settings (state in ``tmp_path``) and the spec.
    - ``enter(admin)``: this process's environment on the stack (a 0.2 s poll), as a shell that sourced
      ``local up --env-file`` would be.
    """
    from flows.commands.dryrun import COMPUTE_CAPACITY
    from infra.local.seed import DRY_RUN_CAPACITY, ensure_model_bucket, seed_pipeline
    from tpu_ops.specs import PipelineSpec, load_spec, parse_spec

    def seed(spec_file: str, run_id: str, name: str, tweak: Callable[[dict[str, Any]], None]) -> tuple[Any, Any]:
        admin = stack.settings(state_dir=tmp_path / "state")
        doc = load_spec(ROOT / "flows" / spec_file, PipelineSpec).model_dump(mode="json")
        doc.update(run_id=run_id, name=name)
        tweak(doc)
        spec = parse_spec(PipelineSpec, doc, what="spec")
        seed_pipeline(admin, spec)
        ensure_model_bucket(admin, spec.export.destination)
        if spec.provision.slice.backend == "compute":
            stack.set_compute_capacity(COMPUTE_CAPACITY)
        stack.set_capacity(DRY_RUN_CAPACITY)
        return admin, spec

    def enter(admin: Any) -> None:
        for name, value in stack.env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("TPU_OPS_STATE_DIR", str(admin.state_dir))
        monkeypatch.setenv("TPU_OPS_POLL_INTERVAL_S", "0.2")

    return SimpleNamespace(seed=seed, enter=enter)


@pytest.fixture(scope="session")
def default_dry_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`tpu-ops dry-run --keep` (Compute Engine, one injected preemption), its workers' files kept."""
    tmp: Path = tmp_path_factory.mktemp("default-dry-run")
    summary, out, env = dry_run(tmp, "--keep")
    return {"tmp": tmp, "summary": summary, "out": out, "env": env}
