"""Settings for flows: the environment, plus credentials from Prefect blocks when named.

Blocks are how Prefect users keep credentials (prefect-aws ``AwsCredentials``, prefect-gcp
``GcpCredentials``); a flow takes block *names* as parameters, never secrets, so nothing secret
lands in flow-run parameters or logs.
"""

from __future__ import annotations

import json
from typing import Any, cast

from tpu_ops.settings import Settings


def resolve_settings(aws_credentials_block: str | None = None, gcp_credentials_block: str | None = None) -> Settings:
    """``Settings()`` from the environment, overridden by the named credential blocks."""
    overrides: dict[str, Any] = {}
    if aws_credentials_block:
        from prefect_aws import AwsCredentials

        aws = cast(AwsCredentials, AwsCredentials.load(aws_credentials_block))
        if aws.aws_access_key_id and aws.aws_secret_access_key:
            overrides["aws_access_key_id"] = aws.aws_access_key_id
            overrides["aws_secret_access_key"] = aws.aws_secret_access_key.get_secret_value()
        if aws.region_name:
            overrides["aws_region"] = aws.region_name
        if aws.aws_client_parameters.endpoint_url:
            overrides["aws_endpoint_url"] = aws.aws_client_parameters.endpoint_url
    if gcp_credentials_block:
        from prefect_gcp import GcpCredentials

        gcp = cast(GcpCredentials, GcpCredentials.load(gcp_credentials_block))
        if gcp.service_account_info:
            overrides["gcp_credentials_info"] = json.dumps(gcp.service_account_info.get_secret_value())
        elif gcp.service_account_file:
            overrides["gcp_credentials_file"] = gcp.service_account_file
        if gcp.project:
            overrides["gcp_project"] = gcp.project
    # No endpoint check here: each client factory checks the endpoint it is about to use, so a
    # flow that only needs the TPU API does not need S3 configured.
    return Settings(**overrides)
