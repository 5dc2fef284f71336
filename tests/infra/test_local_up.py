"""`tpu-ops local up` starts fast, serves every endpoint, and leaves no process behind on SIGTERM."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from infra.local._proc import wait_until
from tpu_ops.settings import is_loopback

ROOT = Path(__file__).resolve().parents[2]
CONSOLE = Path(sys.executable).parent / "tpu-ops"


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def _parse(env_file: Path) -> dict[str, str]:
    out = {}
    for line in env_file.read_text().splitlines():
        key, _, value = line.partition("=")
        out[key] = shlex.split(value)[0] if value else ""
    return out


def _local_up(
    env_file: Path, *args: str, output: int = subprocess.PIPE, cwd: Path = ROOT
) -> subprocess.Popen[bytes]:
    cmd = [str(CONSOLE)] if CONSOLE.exists() else [sys.executable, "-m", "flows.cli"]
    return subprocess.Popen(
        [*cmd, "local", "up", "--env-file", str(env_file), *args],
        cwd=cwd, stdout=output, stderr=output, start_new_session=True,
        env={**os.environ, "NO_GCE_CHECK": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"},
    )  # fmt: skip


def _create_node(tpu_endpoint: str, script: str, token: str) -> None:
    """A v4-16 (2 workers) through the fake TPU API, running ``script`` on each worker."""
    node = {"acceleratorType": "v4-16", "runtimeVersion": "v2", "metadata": {"startup-script": script}}
    req = urllib.request.Request(
        f"{tpu_endpoint}/v2/projects/p/locations/us-central2-b/nodes?nodeId=n1",
        data=json.dumps(node).encode(), method="POST", headers={"Authorization": f"Bearer {token}"},
    )  # fmt: skip
    urllib.request.urlopen(req, timeout=10).read()


def test_local_up_serves_and_cleans_up(tmp_path):
    env_file = tmp_path / "local.env"
    t0 = time.monotonic()
    proc = _local_up(env_file, "--grace", "1")
    try:
        wait_until(lambda: env_file.exists() or proc.poll() is not None, 15, what="env file")
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        assert time.monotonic() - t0 < 15
        env = _parse(env_file)
        for key in ("AWS_ENDPOINT_URL", "STORAGE_EMULATOR_HOST", "TPU_OPS_TPU_ENDPOINT", "TPU_OPS_GCS_ENDPOINT",
                    "TPU_OPS_STS_ENDPOINT", "TPU_OPS_COMPUTE_ENDPOINT"):  # fmt: skip
            assert is_loopback(env[key]), key
        assert env["CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU"].endswith("/") and env["TPU_OPS_DRY_RUN"] == "true"
        # what TensorStore (Orbax) needs to reach the GCS emulator instead of Google's host
        assert env["TENSORSTORE_GCS_HTTP_URL"] == env["STORAGE_EMULATOR_HOST"] and env["GOOGLE_AUTH_TOKEN_FOR_TESTING"]
        # start worker processes through the fake TPU API, so there is something to clean up
        # the fakes want a token the stack's key obtained: the one the env hands gcloud
        assert Path(env["TPU_OPS_GCP_CREDENTIALS_FILE"]).is_file()
        token = Path(env["CLOUDSDK_AUTH_ACCESS_TOKEN_FILE"]).read_text()
        forever = "trap '' TERM; while true; do sleep 0.05; done"  # needs SIGKILL
        _create_node(env["TPU_OPS_TPU_ENDPOINT"], forever, token)
        wait_until(lambda: len(_descendants(proc.pid)) >= 3, 10, what="fake-gcs + 2 workers")
        before = _descendants(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()
    assert out.decode() == env_file.read_text()
    leftovers = [p for p in before if _alive(p)]
    assert leftovers == []
    assert not Path(env["TPU_OPS_GCP_CREDENTIALS_FILE"]).exists()  # the key goes with the stack


def test_a_killed_stack_leaves_no_process_behind(tmp_path):
    """SIGKILL runs no cleanup at all: fake-gcs-server and the simulated TPU workers still go,
    because the pipes they hang off close with the stack's process."""
    env_file = tmp_path / "local.env"
    proc = _local_up(env_file, output=subprocess.DEVNULL)
    try:
        wait_until(lambda: env_file.exists() or proc.poll() is not None, 15, what="env file")
        env = _parse(env_file)
        with urllib.request.urlopen(f"{env['STORAGE_EMULATOR_HOST']}/storage/v1/b", timeout=5) as resp:
            assert resp.status == 200
        token = Path(env["CLOUDSDK_AUTH_ACCESS_TOKEN_FILE"]).read_text()
        _create_node(env["TPU_OPS_TPU_ENDPOINT"], "trap '' TERM; sleep 300 & wait", token)  # a child, deaf to SIGTERM
        # fake-gcs + its lifeline shell, and per worker (2) bash and its sleep (and a watcher, forked first)
        wait_until(lambda: len(_descendants(proc.pid)) >= 6, 10, what="the emulator and 2 workers")
        everything = _descendants(proc.pid)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    wait_until(lambda: not any(_alive(p) for p in everything), 10, what="every child of the stack to exit")


def test_local_up_creates_the_env_files_folder_in_a_fresh_checkout(tmp_path):
    """The README's `local up --env-file .tpu-ops/local.env`, run where no `.tpu-ops/` exists yet."""
    proc = _local_up(Path(".tpu-ops/local.env"), "--grace", "1", cwd=tmp_path)
    env_file = tmp_path / ".tpu-ops" / "local.env"
    try:
        wait_until(lambda: env_file.exists() or proc.poll() is not None, 30, what="env file")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and b"Traceback" not in err, err.decode()[-2000:]
    assert out.decode() == env_file.read_text() and "TPU_OPS_TPU_ENDPOINT=" in out.decode()
    assert sorted(p.name for p in env_file.parent.iterdir()) == ["local.env"]  # no .tmp left
