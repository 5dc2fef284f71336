"""The agent in an interpreter with no site-packages at all (``python -S -I``, the unpacked wheel on
``sys.path``) against the local stack: it trains, reports and commits DONE; on SIGTERM it writes its
notice at once and forwards the signal with the remaining grace. Metadata in both forms."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from infra.local.metadata import MetadataServer, tpu_vm_values
from tpu_ops.agent.job import Job, contract_env
from tpu_ops.agent.metadata import Metadata, parse_endpoints
from tpu_ops.settings import Settings
from tpu_ops.train.wheel import agent_wheel

NODE = {"name": "projects/p/locations/us-central2-b/nodes/bare", "id": "424242",
        "networkEndpoints": [{"ipAddress": "127.0.0.1"}]}  # fmt: skip
# The trainer: a bare interpreter too. It writes its step, then waits; on SIGTERM it records the grace
# it was given and exits 143, as a trainer saving its work would.
TRAINER = (
    "import os, signal, sys, time\n"
    "def term(*_):\n"
    "    open('term.txt', 'w').write(os.environ['TPU_OPS_TERM_GRACE_S'])\n"
    "    sys.exit(143)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "open(os.environ['TPU_OPS_PROGRESS_FILE'], 'w').write('1')\n"
    "open('env.json', 'w').write(__import__('json').dumps(dict(os.environ)))\n"
    "time.sleep(float(sys.argv[1]))\n"
)


@pytest.fixture
def bare(local_stack: Any, tmp_path: Path) -> Any:
    """(start(job) -> Popen of the agent under ``python -S -I``, gcs, workdir)."""
    from tpu_ops.cloud.clients import storage_client

    gcs = storage_client(local_stack.settings())
    bucket = f"bare-{int(time.time() * 1000)}"
    gcs.create_bucket(bucket)
    lib = tmp_path / "lib"
    with zipfile.ZipFile(agent_wheel(Settings(state_dir=tmp_path / "state"))) as zf:
        zf.extractall(lib)
    md = MetadataServer(tpu_vm_values(NODE, "p", "us-central2-b", 0)).start()
    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": "/usr/bin:/bin", "STORAGE_EMULATOR_HOST": local_stack.gcs_endpoint, "GCE_METADATA_HOST": md.host,
           "TPU_OPS_WORKER_DIR": str(work)}  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []

    def start(job: Job) -> subprocess.Popen[bytes]:
        from dataclasses import asdict

        gcs.bucket(bucket).blob("runs/bare/_tpu_ops/job.json").upload_from_string(json.dumps(asdict(job)))
        code = f"import sys; sys.path.insert(0, {str(lib)!r}); from tpu_ops.agent.__main__ import main; " \
            "sys.exit(main())"
        argv = [sys.executable, "-S", "-I", "-c", code, "run", "--job", f"gs://{bucket}/runs/bare/_tpu_ops/job.json",
                "--incarnation", "0-test"]  # fmt: skip
        p = subprocess.Popen(argv, env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        procs.append(p)
        return p

    yield start, gcs.bucket(bucket), work
    for p in procs:
        if p.poll() is None:
            p.kill()
    md.stop()
    for blob in gcs.list_blobs(bucket):
        blob.delete()
    gcs.bucket(bucket).delete()


def _job(bucket: str, sleep_s: float, **kw: Any) -> Job:
    cmd = [sys.executable, "-S", "-I", "-c", TRAINER, str(sleep_s)]
    return Job(run_id="bare", run_uri=f"gs://{bucket}/runs/bare", steps=1, checkpoint_every=1, command=cmd,
               heartbeat_s=0.2, **kw)  # fmt: skip


def _read(bucket: Any, key: str) -> Any:
    return json.loads(bucket.blob(key).download_as_bytes())


def test_the_agent_runs_with_no_site_packages(bare: Any) -> None:
    start, bucket, work = bare
    agent = start(_job(bucket.name, 0.0))
    out = agent.communicate(timeout=60)[0].decode()
    assert agent.returncode == 0, out
    assert "site-packages" not in out and "run bare done" in out
    report = _read(bucket, "runs/bare/_tpu_ops/workers/worker-0.json")
    assert report["exit_code"] == 0 and report["last_step"] == 1 and report["phase"] == "train"
    assert _read(bucket, "runs/bare/_tpu_ops/DONE")["incarnation"] == "0-test"
    seen = json.loads((work / "env.json").read_text())
    assert seen["TPU_WORKER_ID"] == "0" and seen["TPU_WORKER_HOSTNAMES"] == "127.0.0.1"
    assert seen["JAX_COORDINATOR_ADDRESS"] == "127.0.0.1:8476" and seen["TPU_OPS_INCARNATION"] == "0-test"


def test_sigterm_writes_the_notice_at_once_and_forwards_the_remaining_grace(bare: Any) -> None:
    start, bucket, work = bare
    agent = start(_job(bucket.name, 60.0, term_grace_s=7.0))
    deadline = time.monotonic() + 30
    while not (work / "env.json").exists():
        assert time.monotonic() < deadline and agent.poll() is None, agent.stdout.read() if agent.stdout else ""
        time.sleep(0.05)
    sent = time.time()
    agent.send_signal(signal.SIGTERM)
    notice_key = "runs/bare/_tpu_ops/notices/worker-0.json"
    while not bucket.blob(notice_key).exists():
        assert time.time() - sent < 5, "no notice"
        time.sleep(0.02)
    notice = _read(bucket, notice_key)
    assert notice["worker"] == 0 and notice["incarnation"] == "0-test" and notice["grace_s"] == 7.0
    assert 0 <= notice["time"] - sent < 1.0
    agent.communicate(timeout=30)
    assert agent.returncode == 143
    assert (work / "term.txt").read_text() == "7"
    report = _read(bucket, "runs/bare/_tpu_ops/workers/worker-0.json")
    assert report["terminated"] is True and report["exit_code"] == 143
    assert not bucket.blob("runs/bare/_tpu_ops/DONE").exists()


def test_metadata_forms_worker_id_and_host_name_lists() -> None:
    assert parse_endpoints("unknown:unknown:10.0.0.1,unknown:unknown:10.0.0.2") == ("10.0.0.1", "10.0.0.2")
    assert parse_endpoints("t1v-w-0, t1v-w-1\nt1v-w-2") == ("t1v-w-0", "t1v-w-1", "t1v-w-2")
    # a host name with its IP (the fake Compute Engine's form): the IP, which needs no DNS
    assert parse_endpoints("s-0.z.c.p.internal:0:127.20.0.2,s-1.z.c.p.internal:1:127.20.0.3") == (
        "127.20.0.2", "127.20.0.3")  # fmt: skip
    values = {"instance/attributes/worker-id": "1", "instance/attributes/worker-network-endpoints": "h-0,h-1",
              "instance/zone": "projects/1/zones/us-east5-a", "instance/name": "slice-1"}  # fmt: skip
    md = MetadataServer(values).start()
    try:
        who = Metadata(md.host).identity()
    finally:
        md.stop()
    assert (who.worker_number, who.worker_count, who.endpoints) == (1, 2, ("h-0", "h-1"))
    assert (who.zone, who.node_id) == ("us-east5-a", "slice-1")
    env = contract_env(Job("r", "gs://b/r", 10, 5, coordinator_port=9000), who, None, Path("p"))
    assert env["TPU_WORKER_ID"] == "1" and env["TPU_WORKER_HOSTNAMES"] == "h-0,h-1"
    assert env["JAX_COORDINATOR_ADDRESS"] == "h-0:9000" and env["JAX_PROCESS_ID"] == "1"


def test_the_dry_run_guard_covers_the_trainer_s_environment() -> None:
    from tpu_ops.agent.loopback import LoopbackError, check_trainer_env

    local = {"TPU_OPS_DRY_RUN": "true", "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9",
             "GCE_METADATA_HOST": "127.0.0.1:8", "TENSORSTORE_GCS_HTTP_URL": "http://127.0.0.1:9"}  # fmt: skip
    check_trainer_env(local)
    with pytest.raises(LoopbackError, match="TENSORSTORE_GCS_HTTP_URL"):
        check_trainer_env({k: v for k, v in local.items() if k != "TENSORSTORE_GCS_HTTP_URL"})
    with pytest.raises(LoopbackError, match="AWS_ENDPOINT_URL"):
        check_trainer_env({**local, "AWS_ENDPOINT_URL": "https://s3.amazonaws.com"})
    check_trainer_env({**local, "TPU_OPS_DRY_RUN": "false", "AWS_ENDPOINT_URL": "https://s3.amazonaws.com"})
