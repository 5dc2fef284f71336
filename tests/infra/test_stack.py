"""The local stack starts, serves S3/STS/SageMaker and GCS on loopback, and stops cleanly."""

from __future__ import annotations

import os

import boto3
import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from infra.local.stack import LocalStack
from tpu_ops.settings import is_loopback


@pytest.fixture
def stack(local_stack):
    return local_stack


def _boto(stack: LocalStack, service: str):
    st = stack.settings()
    return boto3.client(
        service,
        endpoint_url=st.aws_endpoint_url,
        region_name=st.aws_region,
        aws_access_key_id=st.aws_access_key_id.get_secret_value(),
        aws_secret_access_key=st.aws_secret_access_key.get_secret_value(),
    )


def test_settings_are_dry_run_and_loopback(stack):
    st = stack.settings()
    assert st.dry_run is True
    for name in ("aws_endpoint_url", "gcs_endpoint"):
        assert is_loopback(st.endpoints()[name]), name
    for key, value in stack.env().items():
        if key.endswith(("ENDPOINT_URL", "_ENDPOINT", "EMULATOR_HOST")):
            assert is_loopback(value), (key, value)


def test_s3_sts_sagemaker_roundtrip(stack):
    s3 = _boto(stack, "s3")
    s3.create_bucket(Bucket="curated")
    s3.put_object(Bucket="curated", Key="a/b.txt", Body=b"hello")
    assert s3.get_object(Bucket="curated", Key="a/b.txt")["Body"].read() == b"hello"
    assert _boto(stack, "sts").get_caller_identity()["Account"]
    sm = _boto(stack, "sagemaker")
    sm.create_model_package_group(ModelPackageGroupName="g")
    groups = sm.list_model_package_groups()["ModelPackageGroupSummaryList"]
    assert "g" in [g["ModelPackageGroupName"] for g in groups]


def test_gcs_roundtrip(stack):
    client = storage.Client(
        project=stack.project,
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": stack.gcs_endpoint},
    )
    bucket = client.create_bucket("snapshots")
    bucket.blob("m/manifest.json").upload_from_string(b"{}")
    assert [b.name for b in client.list_blobs("snapshots")] == ["m/manifest.json"]
    assert bucket.blob("m/manifest.json").download_as_bytes() == b"{}"


def test_stop_kills_gcs_process(local_stack):
    # a second stack while the session one runs: it must not wipe the shared moto state
    s3 = _boto(local_stack, "s3")
    s3.create_bucket(Bucket="survivor")
    s = LocalStack(tpu=False).start()
    pid = s.gcs.pid
    assert pid is not None
    os.kill(pid, 0)  # alive
    s.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(RuntimeError):
        _ = s.aws_endpoint
    assert "survivor" in [b["Name"] for b in s3.list_buckets()["Buckets"]]


def test_tpu_endpoint_and_control_helpers(local_stack):
    from google.cloud import tpu_v2

    client = local_stack.tpu_client()
    parent = f"projects/{local_stack.project}/locations/us-east5-a"
    node = tpu_v2.Node(accelerator_type="v5litepod-16", runtime_version="v2-alpha-tpuv5-lite")
    created = client.create_node(parent=parent, node_id="stack-node", node=node).result(timeout=30)
    assert created.state == tpu_v2.Node.State.READY and len(created.network_endpoints) == 2
    local_stack.preempt("us-east5-a", "stack-node")
    assert local_stack.state()["node_states"][f"{parent}/nodes/stack-node"] == "PREEMPTED"
    client.delete_node(name=f"{parent}/nodes/stack-node").result(timeout=30)
    assert f"{parent}/nodes/stack-node" not in local_stack.state()["node_states"]
    assert local_stack.env()["CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU"] == local_stack.tpu_endpoint + "/"
    assert local_stack.env()["CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE"] == local_stack.compute_endpoint + "/compute/v1/"
    assert local_stack.settings().tpu_endpoint == local_stack.tpu_endpoint


def test_reset_forgets_everything(local_stack):
    s3 = _boto(local_stack, "s3")
    s3.create_bucket(Bucket="to-forget")
    gcs = storage.Client(
        project=local_stack.project, credentials=AnonymousCredentials(),
        client_options={"api_endpoint": local_stack.gcs_endpoint},
    )  # fmt: skip
    gcs.create_bucket("to-forget-gcs").blob("x").upload_from_string(b"1")
    local_stack.reset()
    # Only the standing audit bucket (re-seeded by every reset, as an account keeps it) survives.
    audit_bucket = local_stack.settings().audit_uri.removeprefix("s3://").split("/")[0]
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == [audit_bucket]
    assert list(gcs.list_buckets()) == []
    state = local_stack.state()
    assert (state["nodes"], state["queued_resources"], state["worker_pids"]) == (0, 0, [])
