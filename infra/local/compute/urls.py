"""Routing of the fake Compute Engine: (HTTP method, path regex) -> handler name on ``ComputeResponses``.

Paths are what google-cloud-compute's REST transport sends (``/compute/v1/projects/...``).
"""

from __future__ import annotations

from infra.local.core.routing import CONTROL_PATHS, Routes, compile_routes

_P = r"/compute/v1/projects/(?P<project>[^/]+)"
_Z = _P + r"/zones/(?P<zone>[^/]+)"
_R = _P + r"/regions/(?P<region>[^/]+)"
_G = _P + r"/global"
_N = r"(?P<name>[^/]+)"
_RR = r"(?P<rr>[^/]+)"  # a resize request of group <name>
_SCOPE = _P + r"/(?P<scope>zones/[^/]+|regions/[^/]+|global)"
_ZR = _P + r"/(?P<scope>zones/[^/]+|regions/[^/]+)"

URL_PATHS: list[tuple[str, str, str]] = [
    ("GET", rf"^{_Z}/instances$", "list_instances"),
    ("POST", rf"^{_Z}/instances$", "insert_instance"),
    ("GET", rf"^{_Z}/instances/{_N}$", "get_instance"),
    ("DELETE", rf"^{_Z}/instances/{_N}$", "delete_instance"),
    ("GET", rf"^{_Z}/machineTypes$", "list_machine_types"),
    ("GET", rf"^{_Z}/machineTypes/{_N}$", "get_machine_type"),
    ("GET", rf"^{_Z}/reservations$", "list_reservations"),
    ("GET", rf"^{_Z}/reservations/{_N}$", "get_reservation"),
    ("GET", rf"^{_Z}/instanceGroupManagers$", "list_groups"),
    ("POST", rf"^{_Z}/instanceGroupManagers$", "insert_group"),
    ("GET", rf"^{_Z}/instanceGroupManagers/{_N}$", "get_group"),
    ("DELETE", rf"^{_Z}/instanceGroupManagers/{_N}$", "delete_group"),
    ("POST", rf"^{_Z}/instanceGroupManagers/{_N}/listManagedInstances$", "list_managed_instances"),
    ("GET", rf"^{_R}/instanceGroupManagers$", "list_region_groups"),
    ("POST", rf"^{_R}/instanceGroupManagers$", "insert_region_group"),
    ("GET", rf"^{_R}/instanceGroupManagers/{_N}$", "get_region_group"),
    ("DELETE", rf"^{_R}/instanceGroupManagers/{_N}$", "delete_region_group"),
    ("POST", rf"^{_R}/instanceGroupManagers/{_N}/listManagedInstances$", "list_region_managed_instances"),
    ("GET", rf"^{_ZR}/autoscalers$", "list_autoscalers"),
    ("GET", rf"^{_ZR}/autoscalers/{_N}$", "get_autoscaler"),
    ("GET", rf"^{_ZR}/instanceGroups$", "list_instance_groups"),
    ("GET", rf"^{_ZR}/instanceGroups/{_N}$", "get_instance_group"),
    ("GET", rf"^{_G}/images/family/{_N}$", "get_image_from_family"),
    ("GET", rf"^{_G}/images/{_N}$", "get_image"),
    ("GET", rf"^{_Z}/instanceGroupManagers/{_N}/resizeRequests$", "list_resize_requests"),
    ("POST", rf"^{_Z}/instanceGroupManagers/{_N}/resizeRequests$", "insert_resize_request"),
    ("GET", rf"^{_Z}/instanceGroupManagers/{_N}/resizeRequests/{_RR}$", "get_resize_request"),
    ("DELETE", rf"^{_Z}/instanceGroupManagers/{_N}/resizeRequests/{_RR}$", "delete_resize_request"),
    ("POST", rf"^{_Z}/instanceGroupManagers/{_N}/resizeRequests/{_RR}/cancel$", "cancel_resize_request"),
    ("GET", rf"^{_Z}/futureReservations$", "list_future_reservations"),
    ("POST", rf"^{_Z}/futureReservations$", "insert_future_reservation"),
    ("GET", rf"^{_Z}/futureReservations/{_N}$", "get_future_reservation"),
    ("DELETE", rf"^{_Z}/futureReservations/{_N}$", "delete_future_reservation"),
    ("POST", rf"^{_Z}/futureReservations/{_N}/cancel$", "cancel_future_reservation"),
    ("GET", rf"^{_P}/aggregated/futureReservations$", "aggregated_future_reservations"),
    ("GET", rf"^{_G}/instanceTemplates$", "list_templates"),
    ("POST", rf"^{_G}/instanceTemplates$", "insert_template"),
    ("GET", rf"^{_G}/instanceTemplates/{_N}$", "get_template"),
    ("DELETE", rf"^{_G}/instanceTemplates/{_N}$", "delete_template"),
    ("GET", rf"^{_R}/instanceTemplates$", "list_templates"),
    ("POST", rf"^{_R}/instanceTemplates$", "insert_template"),
    ("GET", rf"^{_R}/instanceTemplates/{_N}$", "get_template"),
    ("DELETE", rf"^{_R}/instanceTemplates/{_N}$", "delete_template"),
    ("GET", rf"^{_R}/resourcePolicies$", "list_policies"),
    ("POST", rf"^{_R}/resourcePolicies$", "insert_policy"),
    ("GET", rf"^{_R}/resourcePolicies/{_N}$", "get_policy"),
    ("DELETE", rf"^{_R}/resourcePolicies/{_N}$", "delete_policy"),
    ("GET", rf"^{_R}$", "get_region"),
    ("GET", rf"^{_Z}$", "get_zone"),
    ("GET", rf"^{_P}$", "get_project"),
    (
        "GET",
        rf"^{_P}/aggregated/(?P<collection>[A-Za-z]+)$",
        "aggregated_list",
    ),
    ("GET", rf"^{_SCOPE}/operations$", "list_operations"),
    ("GET", rf"^{_SCOPE}/operations/{_N}$", "get_operation"),
    ("POST", rf"^{_SCOPE}/operations/{_N}/wait$", "wait_operation"),
    # control endpoints for tests and dry runs
    *CONTROL_PATHS,  # /_fake/reset, /_fake/faults, /_fake/state
    ("POST", r"^/_fake/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/:]+):preempt$", "fake_preempt"),
    ("GET", r"^/_fake/capacity$", "fake_get_capacity"),
    ("POST", r"^/_fake/capacity$", "fake_capacity"),
    ("POST", r"^/_fake/quotas$", "fake_quotas"),
    ("POST", r"^/_fake/latency$", "fake_latency"),
    ("POST", r"^/_fake/tick$", "fake_tick"),
    ("POST", r"^/_fake/operations:fail$", "fake_fail_operations"),
    ("GET", r"^/_fake/logs/(?P<zone>[^/]+)/(?P<name>[^/]+)$", "fake_logs"),
]

ROUTES: Routes = compile_routes(URL_PATHS)
