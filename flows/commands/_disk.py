"""What a dry run leaves on disk: its workers' files removed (unless kept), the rest measured.

Each simulated host's worker directory holds the run's setup output (a venv with numpy, the
wheelhouse it came from, the agent): ~77 MB a host, 600 MB a dry run. Nothing reads them once the
run is over, unless the user asks to keep them (``--keep``) to look at the trainer's logs.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path


def disk_bytes(path: Path) -> int:
    """Bytes of every file under ``path`` (what ``du -sb`` counts: apparent sizes, links not followed)."""
    total = 0
    if not path.exists():
        return 0
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:  # gone meanwhile
                continue
    return total + os.lstat(path).st_size


def remove_workers(workers: Path) -> int:
    """Delete the simulated hosts' files under ``workers``; returns the bytes freed."""
    freed = disk_bytes(workers)
    shutil.rmtree(workers, ignore_errors=True)
    return freed - disk_bytes(workers)


def tpu_ops_exe() -> str:
    """The ``tpu-ops`` of this environment as a shell can run it without the venv activated: its path,
    relative to the working directory when below it (``.venv/bin/tpu-ops``), else absolute."""
    exe = Path(sys.executable).with_name("tpu-ops")
    if not exe.exists():
        return f"{shlex.quote(sys.executable)} -m flows.cli"
    rel = os.path.relpath(exe)
    shown = rel if not rel.startswith("..") else str(exe.absolute())
    return shlex.quote(shown if os.sep in shown else f".{os.sep}{shown}")
