"""The agent and the bootstrap import nothing outside the standard library (and nothing of tpu_ops
outside the agent), run on Python 3.10 (vermin), and ship in a wheel without dependencies."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tpu_ops.settings import Settings
from tpu_ops.startup import BOOTSTRAP
from tpu_ops.train.wheel import agent_wheel

ROOT = Path(__file__).resolve().parents[2]
AGENT = sorted((ROOT / "tpu_ops" / "agent").glob("*.py"))
VERMIN = Path(sys.executable).with_name("vermin")


def imports(source: str) -> set[str]:
    """Every module an AST imports (absolute names; relative imports are refused by the caller)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import"
            found.add(node.module or "")
    return found


def outside(names: set[str]) -> set[str]:
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    return {n for n in names if n.split(".")[0] not in allowed and not n.startswith("tpu_ops.agent")}


def test_the_agent_and_the_bootstrap_import_only_the_standard_library() -> None:
    assert len(AGENT) >= 8
    for path in AGENT:
        assert outside(imports(path.read_text())) == set(), path.name
    assert outside(imports(BOOTSTRAP)) == set()
    assert "tpu_ops" not in {n.split(".")[0] for n in imports(BOOTSTRAP)}
    # the check itself bites
    assert outside(imports("import numpy\nfrom tpu_ops.settings import Settings\nimport json")) == {
        "numpy", "tpu_ops.settings"}  # fmt: skip


@pytest.mark.parametrize("target", ["3.10"])
def test_vermin_proves_python_3_10(tmp_path: Path, target: str) -> None:
    boot = tmp_path / "bootstrap.py"
    boot.write_text(BOOTSTRAP)
    argv = [str(VERMIN), "--no-tips", "--violations", "--eval-annotations", f"-t={target}-"]
    out = subprocess.run([*argv, *map(str, AGENT), str(boot)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    newer = tmp_path / "newer.py"
    newer.write_text("import tomllib\n")  # 3.11: the same check fails on it
    out = subprocess.run([*argv, str(newer)], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0


def test_the_vm_wheel_has_no_dependencies_and_only_what_a_vm_runs(tmp_path: Path) -> None:
    wheel = agent_wheel(Settings(state_dir=tmp_path / "state"))
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "Requires-Dist" not in meta and "Requires-Python: >=3.10" in meta
    code = {n for n in names if n.endswith(".py")}
    assert "tpu_ops/agent/run.py" in code and "tpu_ops/train/reference.py" in code
    assert not {n for n in code if not n.startswith(("tpu_ops/agent/", "tpu_ops/train/"))} - {"tpu_ops/__init__.py"}
    assert "tpu_ops/settings.py" not in code and "tpu_ops/train/supervisor.py" not in code
