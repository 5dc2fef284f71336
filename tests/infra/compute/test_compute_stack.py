"""The local stack serves the fake Compute Engine on loopback and plays its TPU VMs' hosts."""

from __future__ import annotations

import json
import urllib.request

from compute.helpers import loopback_only
from google.cloud import compute_v1

from infra.local._proc import wait_until
from tpu_ops.settings import is_loopback

ZONE = "us-east5-a"
SCRIPT = r"""
trap 'echo got-term; exit 0' TERM
curl -sf -H 'Metadata-Flavor: Google' \
  "http://$GCE_METADATA_HOST/computeMetadata/v1/instance/attributes/worker-id" > worker-id
echo "{\"dry_run\": \"$TPU_OPS_DRY_RUN\", \"compute\": \"$TPU_OPS_COMPUTE_ENDPOINT\"}" > env.tmp
mv env.tmp env.json  # whole or absent: the test reads it as soon as it exists
while true; do sleep 0.05 || :; done
"""


def test_stack_exports_the_endpoint_and_runs_an_instances_startup_script(stack):
    env = stack.env()
    assert is_loopback(env["TPU_OPS_COMPUTE_ENDPOINT"]) and env["TPU_OPS_COMPUTE_ENDPOINT"] == stack.compute_endpoint
    with loopback_only() as blocked:
        instances, ops = stack.compute_client(), stack.compute_client("ZoneOperationsClient")
        inst = compute_v1.Instance(
            name="stack-vm",
            machine_type=f"zones/{ZONE}/machineTypes/ct6e-standard-1t",
            scheduling=compute_v1.Scheduling(provisioning_model="SPOT"),
            metadata=compute_v1.Metadata(items=[compute_v1.Items(key="startup-script", value=SCRIPT)]),
        )
        op = instances.insert_unary(project=stack.project, zone=ZONE, instance_resource=inst)
        op = ops.wait(project=stack.project, zone=ZONE, operation=op.name)
        assert op.status == compute_v1.Operation.Status.DONE and not op.error.errors
        (worker,) = stack.compute_hosts.wait_workers(ZONE, "stack-vm", 1)
        wait_until(lambda: (worker.workdir / "env.json").exists(), 15, what="the startup script ran")
        assert (worker.workdir / "worker-id").read_text() == "0"
        seen = json.loads((worker.workdir / "env.json").read_text())
        # a VM knows it is a dry run, but not the control plane's endpoint (like Google's image)
        assert seen == {"dry_run": "true", "compute": ""}
        assert stack.state()["compute"]["instances"] == 1 and worker.pid in stack.state()["worker_pids"]

        op = instances.delete_unary(project=stack.project, zone=ZONE, instance="stack-vm")
        assert ops.wait(project=stack.project, zone=ZONE, operation=op.name).status == compute_v1.Operation.Status.DONE
        stack.compute_hosts.wait_exited(ZONE, "stack-vm", timeout=15)
        with urllib.request.urlopen(f"{stack.compute_endpoint}/_fake/logs/{ZONE}/stack-vm", timeout=10) as resp:
            logs = json.loads(resp.read())  # the host's output, served by the fake
        assert "got-term" in logs["workers"][0]["stdout"] and logs["workers"][0]["returncode"] == 0
    assert blocked == []
    assert stack.state()["compute"]["instances"] == 0
