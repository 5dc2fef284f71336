"""The job's setup command, once per VM disk, and the worker's small file readers (log tails, step file).

Standard library only, like the rest of the agent.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path
from typing import Protocol

from tpu_ops.agent.job import Job

LOG_TAIL_BYTES = 4000


class Worker(Protocol):
    """What the setup needs of the agent: its heartbeat, its SIGTERM time, and where it keeps the child."""

    term_at: float | None
    proc: subprocess.Popen[bytes] | None

    def _heartbeat(self, step: int | None, resume: int | None, state: str) -> None: ...


def run_setup(
    job: Job, argv: list[str], env: dict[str, str], workdir: Path, log: Path, worker: Worker
) -> tuple[int, float | None]:
    """Run ``argv`` (the job's setup) unless a marker in ``workdir`` says this disk ran it; (exit status, seconds).

    Heartbeats ("setup") every ``heartbeat_s`` while it runs; killed ``term_grace_s`` after a SIGTERM.
    """
    digest = hashlib.sha256(json.dumps(argv).encode()).hexdigest()[:16]
    marker = workdir / f".setup-{digest}.done"
    if marker.exists():
        return 0, None
    print(f"tpu-ops agent: setup: {argv[0]} ...", flush=True)
    t0 = time.monotonic()
    with log.open("ab") as out:
        try:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, cwd=workdir, env=env, stdin=subprocess.DEVNULL
            )
        except OSError as exc:
            out.write(f"setup could not start: {exc}\n".encode())
            return 127, round(time.monotonic() - t0, 3)
        worker.proc = proc  # a SIGTERM forwards to it
        last = 0.0
        while True:
            try:
                rc = proc.wait(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() - last >= job.heartbeat_s:
                worker._heartbeat(None, None, "setup")
                last = time.monotonic()
            if worker.term_at is not None and time.monotonic() - worker.term_at > job.term_grace_s:
                proc.kill()
    worker.proc = None
    took = round(time.monotonic() - t0, 3)
    if rc == 0:
        marker.touch()
        print(f"tpu-ops agent: setup done in {took:.1f}s", flush=True)
    return rc, took


def tail(*paths: Path) -> str:
    """The last ``LOG_TAIL_BYTES`` of the files, in order (unreadable ones skipped)."""
    out = b""
    for path in paths:
        try:
            with path.open("rb") as f:
                f.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
                out += f.read()
        except OSError:
            continue
    return out[-LOG_TAIL_BYTES:].decode(errors="replace")


def read_step(path: Path) -> int | None:
    """The step number the trainer last wrote to its progress file, or None."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def size(path: Path) -> int:
    """The file's size, 0 when it is not there."""
    try:
        return path.stat().st_size
    except OSError:
        return 0
