"""Credentials reach Settings from Prefect blocks by name, and a dry run still guards endpoints."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from flows.settings import resolve_settings
from infra.local._proc import http_call
from tpu_ops.cloud.clients import boto3_client
from tpu_ops.errors import ConfigError
from tpu_ops.settings import Settings


def fake_service_account_key() -> dict[str, str]:
    """A well-formed service-account key for an account that does not exist."""
    pem = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        .private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        .decode()
    )
    return {
        "type": "service_account",
        "project_id": "acme-ml",
        "private_key_id": "0" * 40,
        "private_key": pem,
        "client_email": "tpu-ops@acme-ml.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": "http://127.0.0.1:9/token",
    }


@pytest.mark.usefixtures("prefect_api")
def test_blocks_fill_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect_aws import AwsCredentials
    from prefect_aws.client_parameters import AwsClientParameters
    from prefect_gcp import GcpCredentials

    local = "http://127.0.0.1:9"
    for var in ("TPU_OPS_GCS_ENDPOINT", "TPU_OPS_TPU_ENDPOINT"):
        monkeypatch.setenv(var, local)
    AwsCredentials(
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="s3cr3t-example",
        region_name="eu-west-1",
        aws_client_parameters=AwsClientParameters(endpoint_url=local),
    ).save("test-aws", overwrite=True)
    key = fake_service_account_key()
    GcpCredentials(service_account_info=key, project="acme-ml").save("test-gcp", overwrite=True)

    settings = resolve_settings("test-aws", "test-gcp")
    assert settings.aws_region == "eu-west-1"
    assert settings.aws_endpoint_url == local
    assert settings.aws_secret_access_key is not None
    assert settings.aws_secret_access_key.get_secret_value() == "s3cr3t-example"
    assert "s3cr3t" not in repr(settings), "secrets never show in reprs or logs"
    assert settings.gcp_project == "acme-ml"
    assert settings.gcp_credentials_info is not None
    assert json.loads(settings.gcp_credentials_info.get_secret_value())["client_email"] == key["client_email"]

    AwsCredentials(
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="x",
        aws_client_parameters=AwsClientParameters(endpoint_url="https://s3.amazonaws.com"),
    ).save("remote-aws", overwrite=True)
    remote = resolve_settings("remote-aws")
    with pytest.raises(ConfigError, match="not on loopback"):
        boto3_client(remote, "s3")


@pytest.fixture
def moto_checks_auth(stack: Any) -> Iterator[tuple[Settings, dict[str, str]]]:
    """moto enforcing IAM auth, and temporary credentials (key, secret, session token) of a role
    allowed to use S3: created with auth off, then every request must be signed by them."""
    url = stack.aws_endpoint
    admin = stack.settings()
    iam = boto3_client(admin, "iam")
    trust = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}],
    }
    role = iam.create_role(RoleName="mirror", AssumeRolePolicyDocument=json.dumps(trust))["Role"]
    s3_all = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
    iam.put_role_policy(RoleName="mirror", PolicyName="s3", PolicyDocument=json.dumps(s3_all))
    creds = boto3_client(admin, "sts").assume_role(RoleArn=role["Arn"], RoleSessionName="test")["Credentials"]
    boto3_client(admin, "s3").create_bucket(Bucket="temp-creds")
    iam.create_user(UserName="worker")
    assume = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole", "Resource": "*"}]}
    iam.put_user_policy(UserName="worker", PolicyName="assume", PolicyDocument=json.dumps(assume))
    user_key = iam.create_access_key(UserName="worker")["AccessKey"]
    http_call(f"{url}/moto-api/reset-auth", "POST", b"0")
    try:
        yield (
            admin,
            {
                **{k: creds[k] for k in ("AccessKeyId", "SecretAccessKey", "SessionToken")},
                "RoleArn": role["Arn"],
                "UserKeyId": user_key["AccessKeyId"],
                "UserSecret": user_key["SecretAccessKey"],
            },
        )
    finally:
        http_call(f"{url}/moto-api/reset-auth", "POST", b"inf")


@pytest.mark.usefixtures("prefect_api")
def test_session_token_credentials_from_a_block_reach_the_client(
    moto_checks_auth: tuple[Settings, dict[str, str]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Temporary credentials work only with their token; moto (checking auth) refuses them without."""
    from prefect_aws import AwsCredentials
    from prefect_aws.client_parameters import AwsClientParameters

    admin, creds = moto_checks_auth
    for name, value in admin.endpoints().items():
        if value:
            monkeypatch.setenv(f"TPU_OPS_{name.upper()}", value)
    # the environment's keys are moto's open test keys: a block must not fall back to them
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    endpoint = AwsClientParameters(endpoint_url=admin.aws_endpoint_url)
    AwsCredentials(
        aws_access_key_id=creds["AccessKeyId"],
        aws_secret_access_key=creds["SecretAccessKey"],
        aws_session_token=creds["SessionToken"],
        aws_client_parameters=endpoint,
    ).save("temp-aws", overwrite=True)
    settings = resolve_settings("temp-aws")
    assert creds["SessionToken"] not in repr(settings)
    listed = boto3_client(settings, "s3").list_objects_v2(Bucket="temp-creds")
    assert listed["ResponseMetadata"]["HTTPStatusCode"] == 200

    # A profile named by the block is used, and only it.
    (tmp_path / "credentials").write_text(
        "[temp]\n"
        f"aws_access_key_id = {creds['AccessKeyId']}\n"
        f"aws_secret_access_key = {creds['SecretAccessKey']}\n"
        f"aws_session_token = {creds['SessionToken']}\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    AwsCredentials(profile_name="temp", aws_client_parameters=endpoint).save("profile-aws", overwrite=True)
    by_profile = boto3_client(resolve_settings("profile-aws"), "s3")
    assert by_profile.list_objects_v2(Bucket="temp-creds")["ResponseMetadata"]["HTTPStatusCode"] == 200

    # A block that assumes a role: its user's keys ask STS (ours, in a dry run) for the role's.
    AwsCredentials(
        aws_access_key_id=creds["UserKeyId"],
        aws_secret_access_key=creds["UserSecret"],
        assume_role_arn=creds["RoleArn"],
        aws_client_parameters=endpoint,
    ).save("role-aws", overwrite=True)
    as_role = resolve_settings("role-aws")
    assert as_role.aws_session_token is not None
    assert boto3_client(as_role, "s3").list_objects_v2(Bucket="temp-creds")["KeyCount"] == 0

    # and without its token the same key pair is refused: moto really checks
    from botocore.exceptions import ClientError

    tokenless = settings.model_copy(update={"aws_session_token": None})
    with pytest.raises(ClientError):
        boto3_client(tokenless, "s3").list_objects_v2(Bucket="temp-creds")
