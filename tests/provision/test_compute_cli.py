"""``tpu-ops provision`` with backend compute makes a group of 4 labelled hosts for v5p-32, as
google-cloud-compute lists them; ``tpu-ops teardown`` leaves no instance, group, template or policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ZONE = "us-east5-a"


def test_provision_and_teardown_a_v5p_32_group_from_the_cli(
    local_stack: Any, prefect_api: None, tmp_path: Path
) -> None:
    import prefect.settings

    local_stack.reset()
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({
        "slice": {"accelerator_type": "v5p-32", "region": "us-east5", "zones": [ZONE], "backend": "compute"},
        "ladder": [{"kind": "spot"}], "budget_usd": 10_000, "hours": 1, "queue_timeout": "60s",
    }))  # fmt: skip
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_OPS_", "PREFECT_"))}
    env = {**base, **local_stack.env(), "TPU_OPS_STATE_DIR": str(tmp_path / "state"), "TPU_OPS_POLL_INTERVAL_S": "0.05",
           "PREFECT_API_URL": str(prefect.settings.PREFECT_API_URL.value()), "NO_GCE_CHECK": "true",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PYTHONPATH": str(ROOT)}  # fmt: skip

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "flows.cli", *args], env=env, capture_output=True, text=True,
                              timeout=180, cwd=ROOT)  # fmt: skip

    out = cli("provision", "--spec", str(spec), "--run-id", "run-cli-ce", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert (result["backend"], result["hosts"], result["queued_resource"]) == ("compute", 4, "run-cli-ce-a1")

    groups = local_stack.compute_client("InstanceGroupManagersClient")
    project = local_stack.settings().gcp_project
    managed = list(groups.list_managed_instances(project=project, zone=ZONE, instance_group_manager="run-cli-ce-a1"))
    assert len(managed) == 4
    instances = local_stack.compute_client("InstancesClient")
    listed = [i for i in instances.list(project=project, zone=ZONE) if i.name.startswith("run-cli-ce-a1-")]
    assert len(listed) == 4
    assert {i.labels["tpu-ops-run"] for i in listed} == {"run-cli-ce"}
    assert {i.machine_type.rsplit("/", 1)[-1] for i in listed} == {"ct5p-hightpu-4t"}
    assert {i.scheduling.provisioning_model for i in listed} == {"SPOT"}

    out = cli("teardown", "run-cli-ce", "--zone", ZONE, "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    kinds = {r["kind"] for r in json.loads(out.stdout)["deleted"]}
    assert kinds == {"instance", "instance-group", "instance-template", "workload-policy"}
    st = local_stack.compute_backend.state()
    assert (st["instances"], st["instance_group_managers"], st["instance_templates"], st["resource_policies"]) == (
        0,
        0,
        0,
        0,
    ), st
