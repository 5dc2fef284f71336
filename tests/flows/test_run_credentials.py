"""One pipeline run, one set of AWS credentials: its AwsCredentials block's, for every audit record.

moto checks every request's signature here (IAM auth on), and the environment's keys are unknown to
it: a record written with them would be refused and spooled locally instead (audit never fails a
run; a later record sends the spool on, so the chain alone would not show it). So a complete chain
in S3, with no record ever put in the spool, shows that every record of the run went out with the
block's keys.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from infra.local._proc import http_call
from tpu_ops.cloud.clients import boto3_client
from tpu_ops.settings import Settings

RUN_ID = "creds-run"


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_every_audit_record_of_a_pipeline_run_is_written_with_the_blocks_credentials(
    stack: Any, monkeypatch: pytest.MonkeyPatch, pipeline_on_stack: Any
) -> None:
    from botocore.exceptions import ClientError
    from prefect_aws import AwsCredentials
    from prefect_aws.client_parameters import AwsClientParameters

    from flows.pipeline import retraining_pipeline
    from tpu_ops.audit.events import AuditEvent
    from tpu_ops.audit.records import DIGEST_CHAIN
    from tpu_ops.audit.spool import Spool
    from tpu_ops.audit.trail import AuditTrail
    from tpu_ops.export.release import chain_records

    def tweak(doc: dict[str, Any]) -> None:
        doc["provision"]["slice"]["backend"] = "tpu-api"
        doc["train"]["steps"], doc["train"]["checkpoint_every"] = 10, 5

    admin, spec = pipeline_on_stack.seed("dryrun.yaml", RUN_ID, "creds", tweak)

    # The block's keys: an IAM user's, allowed everything (created while moto does not check yet).
    iam = boto3_client(admin, "iam")
    iam.create_user(UserName="pipeline")
    everything = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    iam.put_user_policy(UserName="pipeline", PolicyName="all", PolicyDocument=json.dumps(everything))
    key = iam.create_access_key(UserName="pipeline")["AccessKey"]
    AwsCredentials(
        aws_access_key_id=key["AccessKeyId"],
        aws_secret_access_key=key["SecretAccessKey"],
        region_name=admin.aws_region,
        aws_client_parameters=AwsClientParameters(endpoint_url=admin.aws_endpoint_url),
    ).save("pipeline-aws", overwrite=True)

    pipeline_on_stack.enter(admin)
    # The environment's keys differ from the block's, and moto does not know them.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAENVIRONMENTKEYS0")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-blocks-secret")
    spooled: list[dict[str, Any]] = []  # every record S3 refused (the spool is where they go)
    append = Spool.append
    monkeypatch.setattr(Spool, "append", lambda spool, entry: (spooled.append(entry), append(spool, entry))[1])
    http_call(f"{stack.aws_endpoint}/moto-api/reset-auth", "POST", b"0")
    try:
        with pytest.raises(ClientError) as env_keys:  # what any record written with the environment's keys meets
            boto3_client(Settings(), "s3").list_objects_v2(Bucket=admin.audit_uri.split("/")[2])
        assert env_keys.value.response["Error"]["Code"] == "InvalidAccessKeyId"
        summary = retraining_pipeline(spec, aws_credentials_block="pipeline-aws")
    finally:
        http_call(f"{stack.aws_endpoint}/moto-api/reset-auth", "POST", b"inf")

    assert [e["event"]["event"] for e in spooled] == []  # none refused: none written with other keys
    assert isinstance(summary, dict), summary
    assert summary["training"]["outcome"] == "done" and summary["export"]["package_arn"]
    trail = AuditTrail.from_settings(admin)
    assert trail.spool.pending() == 0, "a record was refused and waits in the spool"
    records = chain_records(trail, RUN_ID)
    events = [r["event"] for r in records]
    every_step = {
        AuditEvent.DATASET_MIRRORED, AuditEvent.SLICE_PROVISION_ATTEMPT, AuditEvent.SLICE_PROVISIONED,
        AuditEvent.TRAIN_FINISHED, AuditEvent.SLICE_DELETED, AuditEvent.MODEL_ARTIFACT_UPLOADED,
        AuditEvent.MODEL_EXPORTED,
    }  # fmt: skip
    assert every_step <= set(events), events
    # every record a success, but a ladder attempt the cloud refused (a stock-out: the stack's capacity)
    refused = [r for r in records if r["outcome"] == "refused"]
    assert all(r["event"] == AuditEvent.SLICE_PROVISION_ATTEMPT and r["params"]["outcome"] in ("stockout", "quota")
               for r in refused), refused  # fmt: skip
    assert [r["outcome"] for r in records if r not in refused] == ["success"] * (len(records) - len(refused))
    digests = [r for r in chain_records(trail, DIGEST_CHAIN) if r["params"]["chain"] == RUN_ID]
    assert digests and digests[-1]["params"]["head_seq"] == records[-1]["seq"]  # sealed, head included
    assert summary["audit"]["ok"]  # verified with the block's keys too
