"""Start a Python-entry-point trainer early, so its imports overlap the agent's own start-up.

Standard library only (imported before anything else). The startup script's bootstrap leaves the
job spec in the agent's working directory; for a ``module:function`` trainer, a child interpreter
imports the module at once and then waits on its stdin for the job contract's variables, which
the agent sends once it has resolved the resume step (or an empty line: do not train). On a
preempted slice this takes the trainer's import time off every restore. Not when the job has a
setup step still to run on this disk: the trainer's packages may not be there yet.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# Imports the trainer, waits for its environment on stdin, then calls it. Names stay in argv.
WARM_ENTRY = (
    "import importlib, json, os, sys\n"
    "mod, _, fn = sys.argv[1].partition(':')\n"
    "target = getattr(importlib.import_module(mod), fn)\n"
    "line = sys.stdin.readline()\n"
    "if not line.strip():\n"
    "    sys.exit(0)\n"
    "os.environ.pop('TPU_OPS_RESUME_STEP', None)\n"
    "os.environ.update(json.loads(line))\n"
    "sys.argv = [mod]\n"
    "sys.exit(target())\n"
)


def warm_trainer(job_file: Path, log: Path) -> subprocess.Popen[bytes] | None:
    """The early trainer process for a ``module:function`` trainer in ``job_file``, else None."""
    try:
        job = json.loads(job_file.read_text())
    except (OSError, ValueError):
        return None
    trainer = job.get("trainer") or ""
    if job.get("command") or ":" not in trainer:
        return None
    if job.get("setup") and not any(log.parent.glob(".setup-*.done")):
        return None
    python = job.get("python") or sys.executable
    if "/" in python and not Path(python).is_absolute():
        python = str(log.parent / python)
    if "/" in python and not Path(python).exists():
        return None
    with log.open("ab") as out:
        return subprocess.Popen(
            [python, "-c", WARM_ENTRY, trainer], stdin=subprocess.PIPE, stdout=out,
            stderr=subprocess.STDOUT, cwd=log.parent,
        )  # fmt: skip


def release(proc: subprocess.Popen[bytes], env: dict[str, str] | None) -> None:
    """Hand the early trainer its environment (``None``: tell it not to train)."""
    assert proc.stdin is not None
    try:
        proc.stdin.write((json.dumps(env) if env is not None else "").encode() + b"\n")
        proc.stdin.close()
    except BrokenPipeError:
        pass  # it died while importing; its exit status and log say why
