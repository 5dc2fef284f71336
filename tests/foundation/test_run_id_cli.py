"""``tpu-ops provision|teardown`` refuse a run id the rule refuses, on one line, before any cloud call.

A run id with a final newline once passed ``^...$`` (``$`` matches before a final ``\\n``):
provision died in an assertion deep in naming and left a ledger file named ``run\\n.jsonl``, and
teardown of it exited 0 saying "nothing to delete". Every endpoint here refuses connections, so a
line naming the run id (not an endpoint) shows the refusal came first.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BAD = ["run\n", "run\r\n", "run\u0663", "run\uff13"]  # argv cannot carry NUL: the unit test covers it


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    tmp = tmp_path_factory.mktemp("runid")
    socks = []
    for _ in range(5):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))  # bound, never listening: any call would be refused
        socks.append(s)
    aws, gcs, tpu, compute, proxy = (f"http://127.0.0.1:{s.getsockname()[1]}" for s in socks)
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR")
    yield {
        **{k: v for k, v in os.environ.items() if k in keep},
        "HOME": str(tmp / "home"),
        "TPU_OPS_STATE_DIR": str(tmp / "state"),
        "TPU_OPS_DRY_RUN": "true",
        "TPU_OPS_RETRY_ATTEMPTS": "1",
        "AWS_ENDPOINT_URL": aws,
        "STORAGE_EMULATOR_HOST": gcs,
        "TPU_OPS_TPU_ENDPOINT": tpu,
        "TPU_OPS_COMPUTE_ENDPOINT": compute,
        "NO_GCE_CHECK": "true",
        "HTTPS_PROXY": proxy,
        "HTTP_PROXY": proxy,
        "NO_PROXY": "127.0.0.1,localhost",
    }
    for s in socks:
        s.close()


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    exe = str(Path(sys.executable).with_name("tpu-ops"))
    return subprocess.run([exe, *argv], env=env, capture_output=True, text=True, timeout=180, cwd=ROOT)


@pytest.mark.parametrize("bad", BAD, ids=repr)
@pytest.mark.parametrize("command", ["provision", "teardown"])
def test_a_bad_run_id_is_refused_on_one_line(command: str, bad: str, env: dict[str, str]) -> None:
    spec = str(ROOT / "examples" / "provision.yaml")
    argv = ["provision", "--spec", spec, "--run-id", bad, "--no-flow"] if command == "provision" else ["teardown", bad]
    res = _run(argv, env)
    assert res.returncode != 0, res.stdout
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert f"run id {bad!r} is not allowed" in lines[0]
    state = Path(env["TPU_OPS_STATE_DIR"])
    assert not any(state.rglob("*.jsonl")), sorted(state.rglob("*"))  # no ledger (nor `run\n.jsonl`)
