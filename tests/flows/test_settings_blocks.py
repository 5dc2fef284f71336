"""Credentials reach Settings from Prefect blocks by name, and a dry run still guards endpoints."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from flows.settings import resolve_settings
from tpu_ops.errors import ConfigError


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
    from tpu_ops.cloud.clients import boto3_client

    remote = resolve_settings("remote-aws")
    with pytest.raises(ConfigError, match="not on loopback"):
        boto3_client(remote, "s3")
