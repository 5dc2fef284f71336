"""The agent reaches a VM as a wheel of the library alone, installable without an index."""

from __future__ import annotations

import subprocess
import sys
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tpu_ops.settings import Settings
from tpu_ops.train.wheel import agent_wheel, build_wheel


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


def test_a_build_never_touches_another_builder_s_file_in_progress(tmp_path: Path) -> None:
    out = tmp_path / "wheels"
    out.mkdir()
    name = build_wheel(tmp_path / "first").name
    theirs = out / Path(name).with_suffix(".tmp").name  # the name every build once shared
    theirs.write_bytes(b"another supervisor's half-written wheel")
    wheel = build_wheel(out)
    assert zipfile.ZipFile(wheel).testzip() is None
    assert sorted(p.name for p in out.iterdir()) == sorted([wheel.name, theirs.name])
    assert theirs.read_bytes() == b"another supervisor's half-written wheel"


def test_supervisors_starting_at_once_all_get_a_whole_wheel(tmp_path: Path) -> None:
    start = threading.Barrier(8)

    def build(_: int) -> Path:
        start.wait(timeout=30)
        return build_wheel(tmp_path / "wheels")

    with ThreadPoolExecutor(8) as pool:
        wheels = set(pool.map(build, range(8)))
    (wheel,) = wheels
    assert zipfile.ZipFile(wheel).testzip() is None
    assert [p.name for p in (tmp_path / "wheels").iterdir()] == [wheel.name]  # no temporary file left
