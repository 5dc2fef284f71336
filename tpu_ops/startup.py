"""Render the ``startup-script`` every worker of a slice runs at boot.

The script runs as root on N hosts at once, and again after a recreate, so it is idempotent: it
checks a DONE marker first. Every value is passed through ``shlex.quote``; the script carries no
credentials (the VM's service account, or the local stack's environment, provides them).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from tpu_ops.errors import SpecError

_PIP_SPEC = re.compile(r"^[A-Za-z0-9_.\-\[\],=<>~!]+$")

TEMPLATE = """#!/bin/bash
# tpu-ops startup script for run {run_id} (rendered; do not edit by hand)
set -euo pipefail
RUN_ID={run_id}
# A host may give each worker its own state directory (the local simulator does).
BASE="${{TPU_OPS_WORKER_DIR:-}}"
[ -n "$BASE" ] || BASE={state_dir}
STATE_DIR="$BASE/$RUN_ID"
mkdir -p "$STATE_DIR"
if [ -e "$STATE_DIR/DONE" ]; then
  echo "tpu-ops: run $RUN_ID already done on this worker"
  exit 0
fi
{install}exec {python} -m tpu_ops.agent {args} --done-file "$STATE_DIR/DONE"
"""


def render_startup_script(
    run_id: str,
    agent_args: Sequence[str],
    *,
    python: str = "python3",
    pip_spec: str | None = None,
    state_dir: str = "/var/lib/tpu-ops",
) -> str:
    """A bash script that runs ``python -m tpu_ops.agent AGENT_ARGS --done-file F`` once per worker.

    The agent creates the done file when it finishes, so a re-run of the script is a no-op.

    ``pip_spec`` (e.g. ``tpu-ops==0.1.0``) is installed first when the VM lacks tpu-ops.
    """
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", run_id):
        raise SpecError(f"run id {run_id!r} is not a valid run id")
    install = ""
    if pip_spec is not None:
        if not _PIP_SPEC.match(pip_spec):
            raise SpecError(f"pip spec {pip_spec!r} has characters a requirement cannot have")
        install = (
            f"{shlex.quote(python)} -c 'import tpu_ops' 2>/dev/null || "
            f"{shlex.quote(python)} -m pip install --quiet {shlex.quote(pip_spec)}\n"
        )
    return TEMPLATE.format(
        run_id=shlex.quote(run_id),
        state_dir=shlex.quote(state_dir),
        install=install,
        python=shlex.quote(python),
        args=" ".join(shlex.quote(a) for a in agent_args),
    )
