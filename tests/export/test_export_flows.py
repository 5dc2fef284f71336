"""The Prefect flows: export_model → approve_model → deploy_model, each sealed by a digest, the
run's trail published as an artifact in the UI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from export_helpers import make_run


def test_export_approve_deploy_flows_seal_the_chain_and_publish_the_trail(
    local_stack: Any, env_on_stack: Any, tmp_path: Path, prefect_api: None
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.audit import trail_for
    from flows.export import approve_model, deploy_model, export_model
    from tpu_ops.audit.records import DIGEST_CHAIN
    from tpu_ops.audit.verify import items_from_objects, verify
    from tpu_ops.export.release import chain_records
    from tpu_ops.specs import ExportSpec

    run = make_run(local_stack, tmp_path)
    spec = ExportSpec(destination=run.destination, model_package_group=run.group)
    out = export_model(spec, run.run_id, checkpoint_dir=run.checkpoint_dir)
    arn = out["package_arn"]
    assert approve_model(arn, "carol")["status"] == "Approved"
    assert deploy_model(arn, "fraud-flow")["created"] is True

    trail = trail_for(run.settings)
    events = [r["event"] for r in chain_records(trail, run.run_id)]
    assert events == ["model.artifact_uploaded", "model.exported", "model.approved", "model.deployed"]
    actors = {r["actor"].get("flow") for r in chain_records(trail, run.run_id)}
    assert actors == {"export_model", "approve_model", "deploy_model"}
    digests = [r for r in chain_records(trail, DIGEST_CHAIN) if r["params"]["chain"] == run.run_id]
    assert [d["params"]["head_seq"] for d in digests] == [2, 3, 4]  # one digest per flow run
    assert verify(items_from_objects(trail.store.read_all()), trail.kms).ok
    with get_client(sync_client=True) as client:
        key = ArtifactFilterKey(any_=[f"audit-{run.run_id}"])
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=key))
    assert len(arts) == 3  # one version per flow run; the deploy flow's shows the whole chain
    assert any("model.deployed" in str(a.data) and "endpoint      fraud-flow" in str(a.data) for a in arts)
