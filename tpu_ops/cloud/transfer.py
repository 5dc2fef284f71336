"""The Storage Transfer Service client, built from ``Settings`` like the factories in ``clients``."""

from __future__ import annotations

from typing import Any

from tpu_ops.cloud.clients import _google_credentials
from tpu_ops.settings import Settings


def transfer_client(settings: Settings) -> Any:
    """A ``google.cloud.storage_transfer_v1.StorageTransferServiceClient`` over REST.

    In a dry run the endpoint must be set and on loopback (the local fake), or this refuses.
    """
    settings.check_safe("sts_endpoint")
    from google.cloud import storage_transfer_v1

    endpoint = settings.sts_endpoint
    opts = {"api_endpoint": endpoint.rstrip("/")} if endpoint else None
    return storage_transfer_v1.StorageTransferServiceClient(
        transport="rest", credentials=_google_credentials(settings, bool(endpoint)), client_options=opts
    )
