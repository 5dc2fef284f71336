"""Build the real SDK clients from ``Settings``, pointed at local servers in a dry run.

Every factory checks the settings first, so a dry run with a missing or non-loopback endpoint
fails before any request leaves the process.
"""

from __future__ import annotations

import json
from typing import Any

from tpu_ops.settings import Settings


def _google_credentials(settings: Settings, emulated: bool) -> Any:
    from google.auth.credentials import AnonymousCredentials

    if emulated:
        return AnonymousCredentials()  # type: ignore[no-untyped-call]
    if not (settings.gcp_credentials_info or settings.gcp_credentials_file):
        return None  # application default credentials
    from google.oauth2 import service_account

    if settings.gcp_credentials_info:
        info = json.loads(settings.gcp_credentials_info.get_secret_value())
        return service_account.Credentials.from_service_account_info(info)  # type: ignore[no-untyped-call]
    if settings.gcp_credentials_file:
        return service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
            str(settings.gcp_credentials_file)
        )
    return None  # application default credentials


def tpu_client(settings: Settings) -> Any:
    """A ``google.cloud.tpu_v2.TpuClient`` over REST."""
    settings.check_safe("tpu_endpoint")
    from google.cloud import tpu_v2

    endpoint = settings.tpu_endpoint
    opts = {"api_endpoint": endpoint.rstrip("/")} if endpoint else None
    return tpu_v2.TpuClient(
        transport="rest", credentials=_google_credentials(settings, bool(endpoint)), client_options=opts
    )


def compute_options(settings: Settings) -> dict[str, Any]:
    """``credentials`` and ``client_options`` for every ``google.cloud.compute_v1`` client of a run.

    The operations clients that poll must be built with exactly these too: an operation's own
    ``.result()`` polls through a client built without them, i.e. Google's real host.
    """
    settings.check_safe("compute_endpoint")
    from google.api_core.client_options import ClientOptions

    endpoint = settings.compute_endpoint
    opts = ClientOptions(api_endpoint=endpoint.rstrip("/")) if endpoint else None
    return {"credentials": _google_credentials(settings, bool(endpoint)), "client_options": opts}


def storage_client(settings: Settings) -> Any:
    """A ``google.cloud.storage.Client``."""
    settings.check_safe("gcs_endpoint")
    from google.cloud import storage  # type: ignore[attr-defined]

    endpoint = settings.gcs_endpoint
    if endpoint and "://" not in endpoint:
        endpoint = "http://" + endpoint
    opts = {"api_endpoint": endpoint.rstrip("/")} if endpoint else None
    return storage.Client(
        project=settings.gcp_project,
        credentials=_google_credentials(settings, bool(endpoint)),
        client_options=opts,
    )


def boto3_client(
    settings: Settings,
    service: str,
    *,
    text_timestamps: bool = False,
    session: Any = None,
    max_attempts: int | None = None,
    **config: Any,
) -> Any:
    """An AWS SDK client for ``service`` (``s3``, ``sagemaker``, ``sts``) with credentials from ``settings``.

    A key pair goes with its session token (temporary credentials); otherwise a named profile, or
    botocore's own chain. Built from botocore's session, which is what ``boto3.client`` does
    underneath: the client is the same object with the same API, without ~0.1 s of boto3's
    imports (s3transfer, asyncio) that we would not use. ``text_timestamps`` leaves timestamps
    (``LastModified``...) as the strings AWS sent, as the AWS CLI does: parsing each with dateutil
    costs more than the rest of a listed object. ``session`` reuses a botocore session (its loaded
    service models) instead of a new one; ``max_attempts`` overrides the settings' retry attempts.
    """
    settings.check_safe("aws_endpoint_url")
    from botocore.config import Config
    from botocore.session import get_session

    kw: dict[str, Any] = {"region_name": settings.aws_region}
    if settings.aws_endpoint_url:
        kw["endpoint_url"] = settings.aws_endpoint_url
    if settings.aws_access_key_id and settings.aws_secret_access_key:
        kw["aws_access_key_id"] = settings.aws_access_key_id.get_secret_value()
        kw["aws_secret_access_key"] = settings.aws_secret_access_key.get_secret_value()
        if settings.aws_session_token:  # temporary credentials are worthless without it
            kw["aws_session_token"] = settings.aws_session_token.get_secret_value()
    session = session or get_session()
    if settings.aws_profile:
        session.set_config_variable("profile", settings.aws_profile)
    if text_timestamps:
        session.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=str)
    cfg = Config(retries={"mode": "standard", "max_attempts": max_attempts or settings.retry_attempts}, **config)
    return session.create_client(service, config=cfg, **kw)
