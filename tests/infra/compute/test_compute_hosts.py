"""Each RUNNING Compute Engine TPU VM runs its startup-script on a simulated host with Compute
Engine's metadata; a spot preemption of one host SIGTERMs every guest of the slice and kills them
30 s of fake time later."""

from __future__ import annotations

import json

import pytest
from compute.helpers import PROJECT, REGION, ZONE

from infra.local._proc import wait_until
from infra.local.compute.models import ComputeBackend
from infra.local.core.clock import ManualClock
from infra.local.hostsim import HostSimulator

# Reads its metadata, writes it as JSON; on SIGTERM notes it and keeps running (so only a kill ends it).
SCRIPT = r"""
set -eu
trap 'echo got-term >> term.log' TERM
md() { curl -sf -H 'Metadata-Flavor: Google' "http://$GCE_METADATA_HOST/computeMetadata/v1/$1"; }
python3 - "$(md instance/attributes/worker-id)" "$(md instance/attributes/worker-network-endpoints)" \
  "$(md instance/hostname)" "$(md instance/attributes/tpu-env)" <<'PY'
import json, sys
worker, endpoints, hostname, tpu_env = sys.argv[1:]
json.dump({"worker": worker, "endpoints": endpoints, "hostname": hostname, "tpu_env": tpu_env},
          open("seen.json", "w"))
PY
touch looping  # from here on a SIGTERM only runs the trap
while true; do sleep 0.05 || :; done
"""


@pytest.fixture
def sim(tmp_path):
    clock = ManualClock()
    backend = ComputeBackend(clock=clock)
    hosts = HostSimulator(backend, {"TPU_OPS_DRY_RUN": "true"}, grace_s=1.0, workdir=tmp_path, variant="compute")
    yield backend, hosts, clock
    hosts.stop()
    assert hosts.running_pids() == []


def _slice(backend: ComputeBackend) -> list[str]:
    policy = {"name": "wp", "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x4"}}
    backend.insert_policy(PROJECT, REGION, policy)
    backend.insert_template(PROJECT, "", {"name": "tpl", "properties": {
        "machineType": "ct5p-hightpu-4t", "scheduling": {"provisioningModel": "SPOT"},
        "metadata": {"items": [{"key": "startup-script", "value": SCRIPT}]}}})  # fmt: skip
    backend.insert_group(PROJECT, ZONE, {
        "name": "s32", "targetSize": 4,
        "instanceTemplate": f"projects/{PROJECT}/global/instanceTemplates/tpl",
        "instanceLifecyclePolicy": {"defaultActionOnFailure": "DO_NOTHING"},
        "resourcePolicies": {"workloadPolicy": f"projects/{PROJECT}/regions/{REGION}/resourcePolicies/wp"},
    })  # fmt: skip
    managed = backend.list_managed_instances(PROJECT, ZONE, "s32")["managedInstances"]
    return sorted(m["name"] for m in managed)


def test_four_hosts_see_compute_engine_metadata_and_preemption_kills_after_30_fake_seconds(sim):
    backend, hosts, clock = sim
    names = _slice(backend)
    workers = {n: hosts.wait_workers(ZONE, n, 1)[0] for n in names}
    seen_files = {n: w.workdir / "seen.json" for n, w in workers.items()}
    wait_until(lambda: all((w.workdir / "looping").exists() for w in workers.values()), 15, what="4 scripts looping")
    seen = {n: json.loads(f.read_text()) for n, f in seen_files.items()}
    assert [seen[n]["worker"] for n in names] == ["0", "1", "2", "3"]  # rank = order of the names
    hostnames = [f"{n}.{ZONE}.c.{PROJECT}.internal" for n in names]
    (endpoints,) = {s["endpoints"] for s in seen.values()}
    entries = [e.split(":") for e in endpoints.split(",")]
    assert [h for h, _, _ in entries] == hostnames and [r for _, r, _ in entries] == ["0", "1", "2", "3"]
    assert all(ip.startswith("127.") for _, _, ip in entries)  # the coordinator address JAX gets is usable
    assert [seen[n]["hostname"] for n in names] == hostnames
    assert all("ACCELERATOR_TYPE: 'v5p-32'" in s["tpu_env"] and "TOPOLOGY: '2x2x4'" in s["tpu_env"]
               for s in seen.values())  # fmt: skip

    backend.preempt(ZONE, names[1])  # one host of the slice: every host gets the notice
    for w in workers.values():
        wait_until(lambda w=w: (w.workdir / "term.log").exists(), 10, what="SIGTERM reached every guest")
    assert all(w.running for w in workers.values())  # they trapped SIGTERM: only the kill, 30 s later, ends them
    clock.advance(29)
    backend.tick()
    assert all(w.running for w in workers.values())
    clock.advance(1)
    backend.tick()
    for n in names:
        hosts.wait_exited(ZONE, n, timeout=10)
    assert {w.proc.returncode for w in workers.values()} == {-9}

    backend.delete_group(PROJECT, ZONE, "s32")
    assert backend.state()["instance_group_managers"] == 0
