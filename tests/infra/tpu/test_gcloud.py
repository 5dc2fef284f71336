"""gcloud reads and drives the fake through its standard endpoint override (throwaway config)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from infra.local.tpu.models import TpuBackend
from infra.local.tpu.server import TpuServer

pytestmark = pytest.mark.skipif(shutil.which("gcloud") is None, reason="gcloud is not installed")
PROJECT, ZONE = "tpu-ops-local", "us-central2-b"
P = f"projects/{PROJECT}/locations/{ZONE}"


@pytest.fixture(scope="module")
def gcloud(tmp_path_factory):
    backend = TpuBackend()
    with TpuServer(backend) as server:
        env = {
            **os.environ,
            "CLOUDSDK_CONFIG": str(tmp_path_factory.mktemp("gcloud-config")),
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": server.url + "/",
            "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
            "CLOUDSDK_CORE_PROJECT": PROJECT,
            "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
            "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true",
            "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true",
        }

        def run(*args: str) -> str:
            r = subprocess.run(
                ["gcloud", *args, f"--zone={ZONE}"], env=env, capture_output=True, text=True, timeout=120
            )
            assert r.returncode == 0, r.stderr
            return r.stdout

        yield backend, run


def test_list_nodes_and_queued_resources(gcloud):
    backend, run = gcloud
    backend.create_node(P, "n1", {"acceleratorType": "v4-32", "runtimeVersion": "tpu-ubuntu2204-base"})
    spec = {"parent": P, "nodeId": "n2", "node": {"acceleratorType": "v4-8", "runtimeVersion": "v2"}}
    backend.create_queued_resource(P, "q1", {"tpu": {"nodeSpec": [spec]}, "spot": {}})
    nodes = json.loads(run("compute", "tpus", "tpu-vm", "list", "--format=json"))
    assert {n["name"].rsplit("/", 1)[1]: n["state"] for n in nodes} == {"n1": "READY", "n2": "READY"}
    assert len(next(n for n in nodes if n["name"].endswith("/n1"))["networkEndpoints"]) == 4
    qrs = json.loads(run("compute", "tpus", "queued-resources", "list", "--format=json"))
    assert [(q["name"].rsplit("/", 1)[1], q["state"]["state"]) for q in qrs] == [("q1", "ACTIVE")]


def test_create_and_delete_queued_resource_through_gcloud(gcloud):
    backend, run = gcloud
    run("compute", "tpus", "queued-resources", "create", "q2", "--node-id=n3", "--accelerator-type=v4-8",
        "--runtime-version=tpu-ubuntu2204-base", "--spot")  # fmt: skip
    assert backend.get_queued_resource(f"{P}/queuedResources/q2")["spot"] == {}
    assert backend.get_node(f"{P}/nodes/n3")["state"] == "READY"
    run("compute", "tpus", "queued-resources", "delete", "q2", "--force", "--quiet")
    assert backend.state()["queued_resource_states"].get(f"{P}/queuedResources/q2") is None
