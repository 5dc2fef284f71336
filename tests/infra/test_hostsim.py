"""A v4-32 node's startup script runs on 4 simulated hosts, each with its own metadata server."""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

from infra.local._proc import wait_until
from infra.local.hostsim import HostSimulator
from infra.local.tpu.models import TpuBackend

ZONE = "us-central2-b"
PARENT = f"projects/proj/locations/{ZONE}"

# Reads its metadata with curl (header required), writes it as JSON, then waits to be signalled.
SCRIPT = r"""
set -eu
trap 'echo got-term; exit 0' TERM
md() { curl -sf -H 'Metadata-Flavor: Google' "http://$GCE_METADATA_HOST/computeMetadata/v1/$1"; }
python3 - "$(md instance/attributes/agent-worker-number)" "$(md instance/attributes/worker-network-endpoints)" \
  "$(md instance/attributes/tpu-env)" "$(md project/project-id)" <<'PY'
import json, os, sys
worker, endpoints, tpu_env, project = sys.argv[1:]
json.dump({"worker": worker, "endpoints": endpoints, "tpu_env": tpu_env, "project": project,
           "dry_run": os.environ.get("TPU_OPS_DRY_RUN"), "cwd": os.getcwd()}, open("seen.json", "w"))
PY
curl -sf -X PUT -H 'Metadata-Flavor: Google' --data done \
  "http://$GCE_METADATA_HOST/computeMetadata/v1/instance/guest-attributes/tpu-ops/status"
while true; do sleep 0.05 || :; done  # the group gets SIGTERM too: sleep may die first
"""


@pytest.fixture
def sim(tmp_path):
    backend = TpuBackend()
    hosts = HostSimulator(backend, {"TPU_OPS_DRY_RUN": "true"}, grace_s=1.0, workdir=tmp_path)
    yield backend, hosts
    hosts.stop()
    assert hosts.running_pids() == []


def _create(backend: TpuBackend, node_id: str, script: str, accel: str = "v4-32") -> None:
    body = {"acceleratorType": accel, "runtimeVersion": "tpu-ubuntu2204-base", "metadata": {"startup-script": script}}
    op = backend.create_node(PARENT, node_id, body)
    assert backend.get_operation(op["name"])["done"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_v4_32_workers_see_their_metadata_and_preemption_stops_them(sim):
    backend, hosts = sim
    _create(backend, "slice", SCRIPT)
    workers = hosts.wait_workers(ZONE, "slice", 4)
    seen_files = [w.workdir / "seen.json" for w in workers]
    wait_until(lambda: all(f.exists() and f.stat().st_size for f in seen_files), 15, what="4 workers wrote seen.json")
    seen = [json.loads(f.read_text()) for f in seen_files]
    assert sorted(s["worker"] for s in seen) == ["0", "1", "2", "3"]
    assert len({s["endpoints"] for s in seen}) == 1
    assert len(seen[0]["endpoints"].split(",")) == 4
    assert {s["project"] for s in seen} == {"proj"}
    assert all("NODE_ID: 'slice'" in s["tpu_env"] and f"WORKER_ID: '{s['worker']}'" in s["tpu_env"] for s in seen)
    assert len({s["cwd"] for s in seen}) == 4 and all(s["dry_run"] == "true" for s in seen)
    # guest attributes written through the metadata server show up in the API
    wait_until(
        lambda: all(
            ga["queryValue"]["items"]
            for ga in backend.get_guest_attributes(f"{PARENT}/nodes/slice", "tpu-ops/")["guestAttributes"]
        ),
        10,
        what="guest attributes",
    )
    pids = [w.pid for w in workers]
    assert all(_alive(p) for p in pids)
    backend.preempt(ZONE, "slice")
    hosts.wait_exited(ZONE, "slice", timeout=10)
    assert [w.proc.returncode for w in workers] == [0] * 4  # the TERM trap ran: SIGTERM, not SIGKILL
    assert all("got-term" in w["stdout"] for w in hosts.logs(ZONE, "slice")["workers"])


def test_worker_ignoring_sigterm_is_killed_after_grace(sim):
    backend, hosts = sim
    _create(backend, "stubborn", "trap '' TERM; echo started; while true; do sleep 0.05; done", accel="v4-8")
    (worker,) = hosts.wait_workers(ZONE, "stubborn", 1)
    wait_until(lambda: "started" in hosts.logs(ZONE, "stubborn")["workers"][0]["stdout"], 10, what="started")
    backend.delete_node(f"{PARENT}/nodes/stubborn")
    hosts.wait_exited(ZONE, "stubborn", timeout=10)
    assert worker.proc.returncode == -9


def test_metadata_server_requires_flavor_header(sim):
    backend, hosts = sim
    _create(backend, "one", "sleep 30", accel="v4-8")
    (worker,) = hosts.wait_workers(ZONE, "one", 1)
    url = f"http://{worker.metadata.host}/computeMetadata/v1/instance/attributes/agent-worker-number"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url, timeout=5)
    assert e.value.code == 403
    req = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.read() == b"0" and resp.headers["Metadata-Flavor"] == "Google"
    token = urllib.request.Request(
        f"http://{worker.metadata.host}/computeMetadata/v1/instance/service-accounts/default/token",
        headers={"Metadata-Flavor": "Google"},
    )
    with urllib.request.urlopen(token, timeout=5) as resp:
        assert json.loads(resp.read())["token_type"] == "Bearer"
