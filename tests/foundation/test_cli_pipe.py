"""``tpu-ops ... | head``: a reader that goes away is not an unreachable endpoint.

Python raises BrokenPipeError (a ConnectionError) on a write to a pipe nobody reads; before this,
``tpu-ops status | head -3`` ended with ``error: cannot reach an endpoint: nothing answers there``.
The pipe's read end is closed before the command starts, so every write fails: no race with a reader.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = str(ROOT / "examples" / "train.yaml")


def _run_into_a_closed_pipe(*argv: str) -> subprocess.CompletedProcess[str]:
    read, write = os.pipe()
    os.close(read)  # nobody will read: the command's first write to stdout fails with EPIPE
    try:
        return subprocess.run([sys.executable, "-m", "flows.cli", *argv], stdout=write, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT, timeout=120, check=False)  # fmt: skip
    finally:
        os.close(write)


def test_output_larger_than_the_buffers_into_a_closed_pipe_ends_quietly() -> None:
    done = _run_into_a_closed_pipe("validate", *[SPEC] * 1500)  # ~150 KB: written while the command runs
    assert done.stderr == "" and done.returncode == 141, (done.returncode, done.stderr)


def test_one_line_into_a_closed_pipe_ends_quietly() -> None:
    done = _run_into_a_closed_pipe("validate", SPEC)
    assert done.stderr == "" and done.returncode == 141, (done.returncode, done.stderr)


def test_a_pipe_still_read_is_not_taken_for_a_gone_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    # A BrokenPipeError from a socket (an endpoint hung up) while stdout is fine stays an error line.
    from flows.cli import _reader_gone

    read, write = os.pipe()
    with os.fdopen(write, "w") as out:
        monkeypatch.setattr(sys, "stdout", out)
        assert not _reader_gone()
        os.close(read)
        assert _reader_gone()
