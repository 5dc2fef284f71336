"""Temporary directories a local stack owns, and the sweep of those a killed stack left.

A stack killed with ``kill -9`` (a crashed test run, a killed ``tpu-ops local up``) never runs its
``stop()``: each owned directory names its process in ``owner.json``, and the next stack to start
removes the directories of that prefix whose process is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

OWNER = "owner.json"


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (someone else's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owned(prefix: str) -> Path:
    """A new directory under the temp dir, owned by this process."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    (d / OWNER).write_text(json.dumps({"pid": os.getpid()}))
    return d


def sweep(prefix: str, unowned_stale_s: float | None = None, root: Path | None = None) -> list[Path]:
    """Remove the ``prefix*`` directories whose owner is gone; the removed ones.

    One without an owner file (from before them) goes only when ``unowned_stale_s`` is given and it was
    untouched that long."""
    removed = []
    for d in Path(root or tempfile.gettempdir()).glob(f"{prefix}*"):
        try:
            owner = json.loads((d / OWNER).read_text()) if (d / OWNER).exists() else None
            if owner:
                stale = not alive(int(owner["pid"]))
            else:
                stale = unowned_stale_s is not None and time.time() - d.stat().st_mtime > unowned_stale_s
        except (OSError, ValueError, KeyError, TypeError):
            continue  # another stack's, half written or going: not ours to judge
        if stale:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed
