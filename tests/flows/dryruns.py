"""Running `tpu-ops dry-run` as its user does, for the tests that read one (a dry run is ~45 s: share it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

EXE = Path(sys.executable).with_name("tpu-ops")


def dry_run(tmp_path: Path, *args: str) -> tuple[dict[str, Any], subprocess.CompletedProcess[str], dict[str, str]]:
    """`tpu-ops dry-run --json --workdir TMP/work ARGS` in a clean environment: (summary, process, env)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_OPS_", "AWS_", "PREFECT_API"))}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "120"  # a loaded 2-core machine starts it slowly
    out = subprocess.run(
        [str(EXE), "dry-run", "--json", "--workdir", str(tmp_path / "work"), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary: dict[str, Any] = json.loads(out.stdout[out.stdout.index("{\n") :])
    return summary, out, env
