"""Routing of the fake TPU API: (HTTP method, path regex) -> handler name on ``TpuResponses``."""

from __future__ import annotations

from infra.local.core.routing import CONTROL_PATHS, Routes, compile_routes, known_in, match_in

__all__ = ["ROUTES", "URL_PATHS", "Routes", "known_in", "match", "match_in", "path_known"]

_LOC = r"projects/[^/]+/locations/[^/]+"
_ID = r"[^/:]+"

URL_PATHS: list[tuple[str, str, str]] = [
    # Cloud TPU v2
    ("GET", rf"^/v2/(?P<parent>{_LOC})/nodes$", "list_nodes"),
    ("POST", rf"^/v2/(?P<parent>{_LOC})/nodes$", "create_node"),
    ("GET", rf"^/v2/(?P<name>{_LOC}/nodes/{_ID})$", "get_node"),
    ("DELETE", rf"^/v2/(?P<name>{_LOC}/nodes/{_ID})$", "delete_node"),
    ("POST", rf"^/v2/(?P<name>{_LOC}/nodes/{_ID}):getGuestAttributes$", "get_guest_attributes"),
    ("GET", rf"^/v2/(?P<parent>{_LOC})/queuedResources$", "list_queued_resources"),
    ("POST", rf"^/v2/(?P<parent>{_LOC})/queuedResources$", "create_queued_resource"),
    ("GET", rf"^/v2/(?P<name>{_LOC}/queuedResources/{_ID})$", "get_queued_resource"),
    ("DELETE", rf"^/v2/(?P<name>{_LOC}/queuedResources/{_ID})$", "delete_queued_resource"),
    ("POST", rf"^/v2/(?P<name>{_LOC}/queuedResources/{_ID}):reset$", "reset_queued_resource"),
    ("GET", rf"^/v2/(?P<parent>{_LOC})/operations$", "list_operations"),
    ("GET", rf"^/v2/(?P<name>{_LOC}/operations/{_ID})$", "get_operation"),
    ("GET", rf"^/v2/(?P<parent>{_LOC})/(?P<collection>acceleratorTypes|runtimeVersions)$", "list_catalog"),
    ("GET", rf"^/v2/(?P<name>{_LOC}/(?P<collection>acceleratorTypes|runtimeVersions)/{_ID})$", "get_catalog"),
    ("GET", r"^/v2/(?P<project>projects/[^/]+)/locations$", "list_locations"),
    ("GET", rf"^/v2alpha1/(?P<parent>{_LOC})/reservations$", "list_reservations"),
    # control endpoints for tests and dry runs
    *CONTROL_PATHS,  # /_fake/reset, /_fake/faults, /_fake/state
    ("POST", rf"^/_fake/nodes/(?P<zone>{_ID})/(?P<node>{_ID}):preempt$", "fake_preempt"),
    ("GET", r"^/_fake/capacity$", "fake_get_capacity"),
    ("POST", r"^/_fake/capacity$", "fake_capacity"),
    ("POST", r"^/_fake/latency$", "fake_latency"),
    ("GET", rf"^/_fake/logs/(?P<zone>{_ID})/(?P<node>{_ID})$", "fake_logs"),
]

ROUTES: Routes = compile_routes(URL_PATHS)


def match(method: str, path: str) -> tuple[str, dict[str, str]] | None:
    return match_in(ROUTES, method, path)


def path_known(path: str) -> bool:
    return known_in(ROUTES, path)
