"""The fake Storage Transfer Service, driven by google-cloud-storage-transfer over REST on the local stack.

Every request the client sends and every response the fake returns is checked against Google's
``storagetransfer.v1`` discovery document.
"""

from __future__ import annotations

import json
import urllib.request
import uuid

import pytest
from google.cloud import storage_transfer_v1 as st
from google.rpc import code_pb2
from tpu.discovery import Discovery

from infra.local._proc import wait_until
from infra.local.sts.responses import ENUMS
from tpu_ops.cloud.transfer import transfer_client
from tpu_ops.mirror.engine import make_clients

STS = Discovery("storagetransfer.v1.json", {"TransferOperation", "Empty"}, ENUMS)
# (method, path suffix) -> (request schema, response schema)
SCHEMAS = {
    ("POST", "/v1/transferJobs"): ("TransferJob", "TransferJob"),
    ("GET", "/v1/transferJobs"): (None, "ListTransferJobsResponse"),
    ("GET", "job"): (None, "TransferJob"),
    ("PATCH", "job"): ("UpdateTransferJobRequest", "TransferJob"),
    ("POST", ":run"): ("RunTransferJobRequest", "Operation"),
    ("GET", "op"): (None, "Operation"),
    ("GET", "/v1/transferOperations"): (None, "ListOperationsResponse"),
}


def _kind(method: str, path: str) -> tuple[str, str]:
    if path.endswith(":run"):
        return method, ":run"
    if path in ("/v1/transferJobs", "/v1/transferOperations"):
        return method, path
    return method, "job" if path.startswith("/v1/transferJobs/") else "op"


@pytest.fixture
def recorded(stack):
    """Every (method, path, request JSON, status, response JSON) the fake serves during a test."""
    app = stack.sts.app
    calls: list[tuple[str, str, dict, int, dict]] = []
    handle = app.handle

    def recording(req):
        resp = handle(req)
        body = json.loads(req.get_data() or b"{}")
        calls.append((req.method, req.path, body, resp.status_code, json.loads(resp.get_data())))
        return resp

    app.handle = recording
    yield calls
    del app.handle


@pytest.fixture
def buckets(stack):
    s3, gcs = make_clients(stack.settings(), 4)
    tag = uuid.uuid4().hex[:8]
    src, dst = f"sts-src-{tag}", f"sts-dst-{tag}"
    s3.create_bucket(Bucket=src)
    gcs.create_bucket(dst)
    for i in range(4):
        s3.put_object(Bucket=src, Key=f"data/k{i},x.bin", Body=bytes([i]) * (100 + i))
    gcs.bucket(dst).blob("lists/m.csv").upload_from_string('"k0,x.bin"\n"k2,x.bin"\n"k3,x.bin"\n')
    return src, dst, gcs


def _job(stack, src: str, dst: str, **spec) -> dict:
    return {
        "project_id": stack.project,
        "status": st.TransferJob.Status.ENABLED,
        "transfer_spec": {
            "aws_s3_data_source": {"bucket_name": src, "path": "data/",
                                   "aws_access_key": {"access_key_id": "testing", "secret_access_key": "s3cr3t-k3y"}},
            "gcs_data_sink": {"bucket_name": dst, "path": "out/"},
            "transfer_manifest": {"location": f"gs://{dst}/lists/m.csv"},
            "transfer_options": {"overwrite_when": st.TransferOptions.OverwriteWhen.ALWAYS},
            **spec,
        },
    }  # fmt: skip


def test_client_runs_a_manifest_transfer_and_every_json_fits_discovery(stack, buckets, recorded):
    src, dst, gcs = buckets
    client = transfer_client(stack.settings())
    job = client.create_transfer_job({"transfer_job": _job(stack, src, dst)})
    assert job.name.startswith("transferJobs/") and job.status == st.TransferJob.Status.ENABLED
    got = client.get_transfer_job({"job_name": job.name, "project_id": stack.project})
    assert got.transfer_spec.aws_s3_data_source.aws_access_key.secret_access_key == ""  # never returned
    listed = client.list_transfer_jobs({"filter": json.dumps({"projectId": stack.project, "jobNames": [job.name]})})
    assert [j.name for j in listed] == [job.name]

    op = client.run_transfer_job({"job_name": job.name, "project_id": stack.project})
    op.result(timeout=60)
    meta = op.metadata
    assert meta.status == st.TransferOperation.Status.SUCCESS and meta.transfer_job_name == job.name
    assert (meta.counters.objects_copied_to_sink, meta.counters.bytes_copied_to_sink) == (3, 100 + 102 + 103)
    names = sorted(b.name for b in gcs.list_blobs(dst, prefix="out/"))
    assert names == ["out/k0,x.bin", "out/k2,x.bin", "out/k3,x.bin"]  # the manifest's rows only
    assert gcs.bucket(dst).blob("out/k2,x.bin").download_as_bytes() == bytes([2]) * 102

    flt = json.dumps({"projectId": stack.project, "jobNames": [job.name]})
    ops = client.list_operations({"name": "transferOperations", "filter": flt}).operations
    assert [o.name for o in ops] == [op.operation.name] and ops[0].done
    deleted = client.update_transfer_job(
        {"job_name": job.name, "project_id": stack.project,
         "transfer_job": {"status": st.TransferJob.Status.DELETED}, "update_transfer_job_field_mask": "status"}
    )  # fmt: skip
    assert deleted.status == st.TransferJob.Status.DELETED

    seen = set()
    for method, path, body, status, resp in recorded:
        assert status == 200, (method, path, resp)
        assert "s3cr3t-k3y" not in json.dumps(resp)
        req_schema, resp_schema = SCHEMAS[_kind(method, path)]
        seen.add(_kind(method, path))
        if req_schema:
            assert STS.validate(req_schema, body) == [], (method, path)
        assert STS.validate(resp_schema, resp) == [], (method, path, resp)
    assert seen == set(SCHEMAS)


def _control(stack, what: str, body: dict) -> None:
    req = urllib.request.Request(f"{stack.sts_endpoint}/_fake/{what}", json.dumps(body).encode(), method="POST")
    urllib.request.urlopen(req, timeout=10).read()


def test_controls_fail_an_object_deny_a_bucket_and_stall(stack, buckets, recorded):
    src, dst, _ = buckets
    client = transfer_client(stack.settings())
    _control(stack, "fail", {"object": f"s3://{src}/data/k2,x.bin", "code": "DATA_LOSS", "message": "bad disk"})
    job = client.create_transfer_job({"transfer_job": _job(stack, src, dst)})
    op = client.run_transfer_job({"job_name": job.name, "project_id": stack.project})
    with pytest.raises(Exception, match="FAILED"):
        op.result(timeout=60)
    meta = op.metadata
    assert meta.status == st.TransferOperation.Status.FAILED and meta.counters.objects_from_source_failed == 1
    [err] = meta.error_breakdowns
    assert err.error_code == code_pb2.DATA_LOSS and err.error_log_entries[0].url == f"s3://{src}/data/k2,x.bin"
    assert "bad disk" in err.error_log_entries[0].error_details[0]

    _control(stack, "deny", {"bucket": src})
    op = client.run_transfer_job({"job_name": job.name, "project_id": stack.project})
    with pytest.raises(Exception):
        op.result(timeout=60)
    assert op.metadata.error_breakdowns[0].error_code == code_pb2.PERMISSION_DENIED

    stack.sts_backend.reset()
    job = client.create_transfer_job({"transfer_job": _job(stack, src, dst)})
    _control(stack, "stall", {"on": True})
    op = client.run_transfer_job({"job_name": job.name, "project_id": stack.project})
    name = op.operation.name
    wait_until(lambda: stack.sts_backend.get_operation(name)["metadata"]["status"] == "IN_PROGRESS", 30, what="start")
    assert stack.sts_backend.get_operation(name)["metadata"]["counters"].get("objectsCopiedToSink") is None
    _control(stack, "stall", {"on": False})
    op.result(timeout=60)
    assert op.metadata.counters.objects_copied_to_sink == 3
    for method, path, _body, status, resp in recorded:
        if status == 200 and not path.startswith("/_fake"):
            assert STS.validate(SCHEMAS[_kind(method, path)][1], resp) == [], (method, path, resp)
