"""The startup script quotes every value, is idempotent, and refuses what it cannot quote."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tpu_ops.errors import SpecError
from tpu_ops.startup import render_startup_script

NASTY = ["preflight", "--manifest", "gs://b/p/$(touch pwned)", "--note", "a'b\"c;`id`&&|"]


def fake_python(tmp_path: Path) -> Path:
    """A stand-in interpreter that records the argv it was given."""
    exe = tmp_path / "py"
    exe.write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$(dirname "$0")/argv.txt"\n')
    exe.chmod(0o755)
    return exe


def test_values_arrive_verbatim_and_nothing_is_executed(tmp_path: Path) -> None:
    exe = fake_python(tmp_path)
    script = tmp_path / "startup.sh"
    script.write_text(render_startup_script("run-1", NASTY, python=str(exe), state_dir=str(tmp_path / "state")))
    subprocess.run(["bash", str(script)], check=True, cwd=tmp_path)
    argv = (tmp_path / "argv.txt").read_text().splitlines()
    assert argv == ["-m", "tpu_ops.agent", *NASTY, "--done-file", f"{tmp_path}/state/run-1/DONE"]
    assert not (tmp_path / "pwned").exists()


def test_done_marker_makes_a_rerun_a_no_op(tmp_path: Path) -> None:
    exe = fake_python(tmp_path)
    state = tmp_path / "state"
    script = tmp_path / "startup.sh"
    script.write_text(render_startup_script("run-1", ["x"], python=str(exe), state_dir=str(state)))
    (state / "run-1").mkdir(parents=True)
    (state / "run-1" / "DONE").touch()
    out = subprocess.run(["bash", str(script)], check=True, capture_output=True, text=True, cwd=tmp_path)
    assert "already done" in out.stdout
    assert not (tmp_path / "argv.txt").exists()


@pytest.mark.parametrize(
    ("run_id", "pip_spec"), [("Run;reboot", None), ("$(id)", None), ("ok", "tpu-ops; curl evil"), ("ok", "$(id)")]
)
def test_unquotable_inputs_are_refused(run_id: str, pip_spec: str | None) -> None:
    with pytest.raises(SpecError):
        render_startup_script(run_id, ["x"], pip_spec=pip_spec)


def test_script_has_no_credentials_and_is_valid_bash(tmp_path: Path) -> None:
    text = render_startup_script("run-1", ["preflight"], pip_spec="tpu-ops==0.1.0")
    (tmp_path / "s.sh").write_text(text)
    subprocess.run(["bash", "-n", str(tmp_path / "s.sh")], check=True)
    lowered = text.lower()
    for word in ("secret", "password", "aws_access_key", "private_key", "token"):
        assert word not in lowered
    assert json.dumps("tpu-ops==0.1.0")[1:-1] in text
