"""Issue 31, point 6: telemetry is off in every ``tpu-ops`` command unless the user turns it on.

Each case runs the real console script's code path (``flows.cli.console``) in a fresh interpreter
whose environment says nothing about telemetry and is not a CI machine (Prefect turns its client
telemetry off by itself on CI), then reads, in that process after the command ran, what Prefect
itself decides: the server heartbeat's setting and the client's ``is_telemetry_enabled``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from prefect._internal.analytics.ci_detection import CI_ENV_VARS

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import json, os, sys
def report():
    from prefect.settings import get_current_settings
    from prefect._internal.analytics.enabled import is_telemetry_enabled
    print(json.dumps({"server": get_current_settings().server.analytics_enabled, "client": is_telemetry_enabled(),
                      "env": os.environ.get("PREFECT_SERVER_ANALYTICS_ENABLED")}))
sys.argv = ["tpu-ops", *sys.argv[1:]]
from flows.cli import console
try:
    console()
except SystemExit:
    report()
"""


def _telemetry(tmp_path: Path, **extra: str) -> dict[str, object]:
    quiet = {"PREFECT_SERVER_ANALYTICS_ENABLED", "DO_NOT_TRACK", *CI_ENV_VARS}
    env = {k: v for k, v in os.environ.items() if k not in quiet}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), **extra)
    out = subprocess.run([sys.executable, "-c", PROBE, "validate", str(ROOT / "examples" / "provision.yaml")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_a_command_leaves_telemetry_off(tmp_path: Path) -> None:
    assert _telemetry(tmp_path) == {"server": False, "client": False, "env": "false"}


def test_the_user_can_turn_it_on(tmp_path: Path) -> None:
    assert _telemetry(tmp_path, PREFECT_SERVER_ANALYTICS_ENABLED="true") == {
        "server": True, "client": True, "env": "true",
    }  # fmt: skip
