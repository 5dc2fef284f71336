"""Routing of the fake STS: (HTTP method, path regex) -> handler name on ``StsResponses``."""

from __future__ import annotations

from infra.local.core.routing import Routes, compile_routes, known_in, match_in

_JOB = r"transferJobs/[^:]+"
_OP = r"transferOperations/[^:]+"

URL_PATHS: list[tuple[str, str, str]] = [
    # storagetransfer.v1 (the REST transport of google-cloud-storage-transfer)
    ("POST", r"^/v1/transferJobs$", "create_transfer_job"),
    ("GET", r"^/v1/transferJobs$", "list_transfer_jobs"),
    ("GET", rf"^/v1/(?P<name>{_JOB})$", "get_transfer_job"),
    ("PATCH", rf"^/v1/(?P<name>{_JOB})$", "update_transfer_job"),
    ("DELETE", rf"^/v1/(?P<name>{_JOB})$", "delete_transfer_job"),
    ("POST", rf"^/v1/(?P<name>{_JOB}):run$", "run_transfer_job"),
    ("GET", r"^/v1/transferOperations$", "list_operations"),
    ("GET", rf"^/v1/(?P<name>{_OP})$", "get_operation"),
    ("POST", rf"^/v1/(?P<name>{_OP}):(?P<verb>pause|resume|cancel)$", "operation_verb"),
    ("GET", r"^/v1/googleServiceAccounts/(?P<project>[^/]+)$", "get_google_service_account"),
    # control endpoints for tests and dry runs
    ("POST", r"^/_fake/reset$", "fake_reset"),
    ("POST", r"^/_fake/fail$", "fake_fail"),
    ("POST", r"^/_fake/deny$", "fake_deny"),
    ("POST", r"^/_fake/stall$", "fake_stall"),
    ("GET", r"^/_fake/state$", "fake_state"),
]

ROUTES: Routes = compile_routes(URL_PATHS)


def match(method: str, path: str) -> tuple[str, dict[str, str]] | None:
    """The handler name and path arguments for a request, or ``None`` if no route matches."""
    return match_in(ROUTES, method, path)


def path_known(path: str) -> bool:
    return known_in(ROUTES, path)
