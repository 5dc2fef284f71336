"""Storage Transfer Service: the client (built from ``Settings`` like the factories in ``clients``) and
the job calls the STS mirror engine makes, with typed answers and translated errors."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from tpu_ops.cloud.clients import _google_credentials
from tpu_ops.cloud.translate import google_errors
from tpu_ops.settings import Settings

SERVICE: Final = "storagetransfer"


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


@dataclass(frozen=True)
class TransferProgress:
    """One look at a running transfer: its state, counters and failures by canonical code."""

    DONE: ClassVar[frozenset[str]] = frozenset({"SUCCESS", "FAILED", "ABORTED"})

    name: str  # the transfer operation's own name
    status: str  # IN_PROGRESS, SUCCESS, FAILED, ABORTED, ...
    objects_copied: int
    bytes_copied: int
    objects_failed: int
    # canonical code name (PERMISSION_DENIED, NOT_FOUND...) -> "url (details)" entries, or "N object(s)"
    errors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.status in self.DONE


def create_job(client: Any, job: dict[str, Any]) -> str:
    """Create the transfer job ``job`` (the API's JSON field names); its name."""
    with google_errors(SERVICE):
        return str(client.create_transfer_job({"transfer_job": job}).name)


def run_job(client: Any, job_name: str, project: str) -> str:
    """Start one run of ``job_name``; the name of its long-running operation."""
    with google_errors(SERVICE):
        return str(client.run_transfer_job({"job_name": job_name, "project_id": project}).operation.name)


def progress(client: Any, operation: str) -> TransferProgress:
    """The state of the transfer the long-running ``operation`` runs."""
    from google.cloud import storage_transfer_v1
    from google.rpc import code_pb2

    with google_errors(SERVICE):
        op = client.get_operation({"name": operation})
        top = storage_transfer_v1.TransferOperation.deserialize(op.metadata.value)
    errors: dict[str, list[str]] = {}
    for summary in top.error_breakdowns:
        code = code_pb2.Code.Name(int(summary.error_code))
        entries = [f"{e.url} ({'; '.join(e.error_details)})" for e in summary.error_log_entries]
        errors.setdefault(code, []).extend(entries or [f"{summary.error_count} object(s)"])
    return TransferProgress(
        name=str(top.name),
        status=str(top.status.name),
        objects_copied=int(top.counters.objects_copied_to_sink),
        bytes_copied=int(top.counters.bytes_copied_to_sink),
        objects_failed=int(top.counters.objects_from_source_failed),
        errors={code: tuple(v) for code, v in errors.items()},
    )


def cancel(client: Any, operation: str) -> None:
    """Ask STS to stop the transfer ``operation`` runs."""
    with google_errors(SERVICE):
        client.cancel_operation({"name": operation})


def delete_job(client: Any, job_name: str, project: str) -> None:
    """Mark the job deleted (STS keeps deleted jobs for a while, then drops them)."""
    request = {"job_name": job_name, "project_id": project, "transfer_job": {"status": "DELETED"}}
    with google_errors(SERVICE):
        client.update_transfer_job({**request, "update_transfer_job_field_mask": "status"})
