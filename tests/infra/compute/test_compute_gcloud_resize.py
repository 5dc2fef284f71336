"""gcloud's resize-request commands against the fake Compute Engine (Google's "Create a resize request
in a MIG" page): create, describe, list, cancel, delete; skipped where gcloud is not installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from infra.local.compute.models import ComputeBackend
from infra.local.compute.server import ComputeServer

pytestmark = pytest.mark.skipif(shutil.which("gcloud") is None, reason="gcloud is not installed")
PROJECT, ZONE = "tpu-ops-local", "us-east5-a"


@pytest.fixture(scope="module")
def gcloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    backend = ComputeBackend()
    with ComputeServer(backend) as server:
        env = {
            **os.environ,
            "CLOUDSDK_CONFIG": str(tmp_path_factory.mktemp("gcloud-config")),
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": server.url + "/compute/v1/",
            "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
            "CLOUDSDK_CORE_PROJECT": PROJECT,
            "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
            "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true",
            "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true",
        }

        def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
            r = subprocess.run(["gcloud", "compute", "instance-groups", "managed", "resize-requests", *args,
                                f"--zone={ZONE}"], env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
            assert (r.returncode == 0) == ok, r.stderr
            return r

        yield backend, server.url, run


def _flex_group(url: str, name: str) -> None:
    """A group of 0 hosts over a FLEX_START template (made with google-cloud-compute)."""
    kw: dict[str, Any] = {"credentials": AnonymousCredentials(), "client_options": ClientOptions(api_endpoint=url)}
    sched = compute_v1.Scheduling(provisioning_model="FLEX_START", on_host_maintenance="TERMINATE",
                                  instance_termination_action="DELETE",
                                  max_run_duration=compute_v1.Duration(seconds=3600))  # fmt: skip
    tpl = compute_v1.InstanceTemplate(name=f"{name}-tpl", properties=compute_v1.InstanceProperties(
        machine_type="ct5p-hightpu-4t", scheduling=sched))  # fmt: skip
    compute_v1.InstanceTemplatesClient(**kw).insert_unary(project=PROJECT, instance_template_resource=tpl)
    igm = compute_v1.InstanceGroupManager(
        name=name,
        base_instance_name=name,
        target_size=0,
        instance_template=f"projects/{PROJECT}/global/instanceTemplates/{name}-tpl",
    )
    compute_v1.InstanceGroupManagersClient(**kw).insert_unary(project=PROJECT, zone=ZONE,
                                                              instance_group_manager_resource=igm)  # fmt: skip


def test_create_describe_list_cancel_delete(gcloud: Any) -> None:
    backend, url, run = gcloud
    backend.reset()
    backend.configure_capacity({ZONE: {"FLEX_START": 0}})  # it waits ACCEPTED: cancellable
    _flex_group(url, "mig")
    run("create", "mig", "--resize-request=rr1", "--resize-by=2", "--requested-run-duration=1h")
    got = json.loads(run("describe", "mig", "--resize-request=rr1", "--format=json").stdout)
    assert (got["state"], got["resizeBy"], got["requestedRunDuration"]["seconds"]) == ("ACCEPTED", 2, "3600")
    listed = json.loads(run("list", "mig", "--format=json").stdout)
    assert [r["name"] for r in listed] == ["rr1"]
    bad = run("delete", "mig", "--resize-requests=rr1", "--quiet", ok=False)
    assert "cancel it first" in bad.stderr
    run("cancel", "mig", "--resize-requests=rr1")
    assert json.loads(run("describe", "mig", "--resize-request=rr1", "--format=json").stdout)["state"] == "CANCELLED"
    run("delete", "mig", "--resize-requests=rr1", "--quiet")
    assert json.loads(run("list", "mig", "--format=json").stdout) == []


def test_created_all_at_once_when_capacity_allows_and_bad_duration_refused(gcloud: Any) -> None:
    backend, url, run = gcloud
    backend.reset()
    _flex_group(url, "mig2")
    bad = run("create", "mig2", "--resize-request=short", "--resize-by=2", "--requested-run-duration=5m", ok=False)
    assert "10m" in bad.stderr or "10 minutes" in bad.stderr
    run("create", "mig2", "--resize-request=rr2", "--resize-by=2", "--requested-run-duration=2h")
    got = json.loads(run("describe", "mig2", "--resize-request=rr2", "--format=json").stdout)
    assert got["state"] == "SUCCEEDED"
    assert backend.state()["instances"] == 2
