"""A killed local stack (``kill -9``, a crashed test run) leaves its ``tpu-ops-auth-*`` directory (the stack's
service-account key and token) and its ``tpu-ops-hosts-*`` directory (the simulated hosts' logs, a venv of the
image's python) in the temp dir: the next stack to start removes those whose owner is gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from infra.local import hostsim
from infra.local.auth import OWNER, PREFIX, UNOWNED_STALE_S, StackAuth
from infra.local.tpu.models import TpuBackend


def _left(root: Path, name: str, pid: int | None, age_s: float = 0.0, prefix: str = PREFIX) -> Path:
    d = root / f"{prefix}{name}"
    d.mkdir()
    (d / "service-account.json").write_text("{}")
    if pid is not None:
        (d / OWNER).write_text(json.dumps({"pid": pid}))
    when = time.time() - age_s
    os.utime(d, (when, when))
    return d


def test_the_next_stack_removes_the_directories_of_stacks_whose_process_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = _left(tmp_path, "dead", int(gone.stdout))  # its process has exited
    live = _left(tmp_path, "live", os.getpid(), age_s=3 * UNOWNED_STALE_S)  # a running stack's, however old
    old = _left(tmp_path, "old", None, age_s=UNOWNED_STALE_S + 60)  # before owner files: untouched for 2 h
    recent = _left(tmp_path, "recent", None, age_s=60)  # before owner files, its token still renewed
    auth = StackAuth("p").start()
    try:
        assert not dead.exists() and not old.exists()
        assert live.exists() and recent.exists()
        mine = auth.key_file.parent
        assert mine.parent == tmp_path and json.loads((mine / OWNER).read_text()) == {"pid": os.getpid()}
    finally:
        auth.stop()
    assert not mine.exists()


def test_the_next_stack_removes_the_simulated_hosts_of_stacks_whose_process_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = _left(tmp_path, "dead", int(gone.stdout), prefix=hostsim.PREFIX)
    live = _left(tmp_path, "live", os.getpid(), prefix=hostsim.PREFIX)
    unowned = _left(tmp_path, "unowned", None, age_s=3 * UNOWNED_STALE_S, prefix=hostsim.PREFIX)  # not judged
    hosts = hostsim.HostSimulator(TpuBackend(), {}, grace_s=1.0)
    try:
        assert not dead.exists() and live.exists() and unowned.exists()
        assert hosts.workdir.parent == tmp_path and hosts.workdir.name.startswith(hostsim.PREFIX)
        assert json.loads((hosts.workdir / OWNER).read_text()) == {"pid": os.getpid()}
    finally:
        hosts.stop()
    assert not hosts.workdir.exists()
