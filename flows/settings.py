"""Settings for flows: the environment, plus credentials from Prefect blocks when named.

Blocks are how Prefect users keep credentials (prefect-aws ``AwsCredentials``, prefect-gcp
``GcpCredentials``); a flow takes block *names* as parameters, never secrets, so nothing secret
lands in flow-run parameters or logs.

A named block is taken whole: its key pair *with* its session token, or its profile, or the role
it assumes, replaces the environment's AWS credentials entirely, so temporary credentials never
lose their token and a block never silently falls back to whatever keys the worker has.
"""

from __future__ import annotations

import json
from typing import Any, cast

from tpu_ops.layout import check_run_id
from tpu_ops.run import Run
from tpu_ops.settings import Settings

_AWS_CREDENTIALS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token", "aws_profile")


def _aws_overrides(block_name: str) -> dict[str, Any]:
    """Settings fields from an ``AwsCredentials`` block: credentials, region, endpoint."""
    from prefect_aws import AwsCredentials

    aws = cast(AwsCredentials, AwsCredentials.load(block_name))
    out: dict[str, Any] = dict.fromkeys(_AWS_CREDENTIALS)
    out["aws_access_key_id"] = aws.aws_access_key_id
    out["aws_secret_access_key"] = aws.aws_secret_access_key.get_secret_value() if aws.aws_secret_access_key else None
    out["aws_session_token"] = aws.aws_session_token
    out["aws_profile"] = aws.profile_name
    if aws.region_name:
        out["aws_region"] = aws.region_name
    if aws.aws_client_parameters.endpoint_url:
        out["aws_endpoint_url"] = aws.aws_client_parameters.endpoint_url
    if aws.assume_role_arn:
        out.update(_assumed_role(Settings(**out), aws.assume_role_arn, aws.assume_role_kwargs.get_params_override()))
    return out


def _assumed_role(base: Settings, role_arn: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Temporary credentials for the block's role, asked of STS with the block's own credentials.

    What ``AwsCredentials.get_boto3_session()`` does, but through our client factory, so a dry run
    never sends the request to the real STS.
    """
    from tpu_ops.cloud.clients import boto3_client
    from tpu_ops.cloud.translate import aws_errors

    params = {"RoleSessionName": "tpu-ops", **kwargs, "RoleArn": role_arn}
    with aws_errors("sts"):
        creds = boto3_client(base, "sts").assume_role(**params)["Credentials"]
    return {
        "aws_access_key_id": creds["AccessKeyId"],
        "aws_secret_access_key": creds["SecretAccessKey"],
        "aws_session_token": creds["SessionToken"],
        "aws_profile": None,
    }


def resolve_settings(aws_credentials_block: str | None = None, gcp_credentials_block: str | None = None) -> Settings:
    """``Settings()`` from the environment, overridden by the named credential blocks."""
    overrides: dict[str, Any] = {}
    if aws_credentials_block:
        overrides.update(_aws_overrides(aws_credentials_block))
    if gcp_credentials_block:
        from prefect_gcp import GcpCredentials

        gcp = cast(GcpCredentials, GcpCredentials.load(gcp_credentials_block))
        # Whole here too: a block without a key means application default credentials, never
        # a key file the environment happens to name.
        info = gcp.service_account_info
        overrides["gcp_credentials_info"] = json.dumps(info.get_secret_value()) if info else None
        overrides["gcp_credentials_file"] = None if info else gcp.service_account_file
        if gcp.project:
            overrides["gcp_project"] = gcp.project
    # No endpoint check here: each client factory checks the endpoint it is about to use, so a
    # flow that only needs the TPU API does not need S3 configured.
    return Settings(**overrides)


def open_run(
    run_id: str,
    aws_credentials_block: str | None = None,
    gcp_credentials_block: str | None = None,
    *,
    checkpoint_dir: str | None = None,
    checkpoint_subdir: str = "",
) -> Run:
    """The run, built once at a flow's edge: the settings with the named blocks' credentials (resolved
    here, once), its checkpoint location when known, and the flow run as the actor of its records."""
    from flows.audit import current_actor

    check_run_id(run_id)  # before any block is loaded
    settings = resolve_settings(aws_credentials_block, gcp_credentials_block)
    return Run.open(run_id, settings, checkpoint_dir=checkpoint_dir, checkpoint_subdir=checkpoint_subdir,
                    actor=current_actor)  # fmt: skip
