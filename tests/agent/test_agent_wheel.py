"""The agent reaches a VM as a wheel of the library alone, installable without an index."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tpu_ops.settings import Settings
from tpu_ops.train.wheel import agent_wheel


def test_the_wheel_installs_without_an_index_or_dependencies(tmp_path: Path) -> None:
    wheel = agent_wheel(Settings(state_dir=tmp_path / "state"))
    assert agent_wheel(Settings(state_dir=tmp_path / "state")) == wheel  # cached per source state
    names = zipfile.ZipFile(wheel).namelist()
    assert "tpu_ops/agent/run.py" in names and "tpu_ops/train/reference.py" in names
    assert not any(n.startswith(("flows/", "infra/", "tests/")) for n in names)
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--target",
                    str(target), str(wheel)], check=True, timeout=120)  # fmt: skip
    assert (target / "tpu_ops" / "agent" / "run.py").is_file()
    assert "from tpu_ops.agent.__main__ import console" in (target / "bin" / "tpu-ops-agent").read_text()


def test_the_agent_console_script_and_module_agree() -> None:
    exe = Path(sys.executable).with_name("tpu-ops-agent")
    for argv in ([str(exe), "run", "--help"], [sys.executable, "-m", "tpu_ops.agent", "run", "--help"]):
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "--job" in out.stdout and "--incarnation" in out.stdout
