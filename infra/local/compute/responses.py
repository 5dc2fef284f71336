"""HTTP layer of the fake Compute Engine: parse requests, call ``ComputeBackend``, return its JSON.

No state lives here. Compute Engine's JSON is camelCase with enums as strings; errors are
Google's error JSON with Compute Engine's ``errors: [{reason, domain, message}]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from werkzeug.wrappers import Request

from infra.local.compute import urls
from infra.local.compute.models import ComputeBackend
from infra.local.compute.resize_responses import ResizeResponses
from infra.local.core import exceptions as exc
from infra.local.core.responses import ControlMixin, JsonApp

LogsProvider = Callable[[str, str], dict[str, Any]]  # (zone, instance) -> its simulated host's output


def _int(req: Request, key: str) -> int | None:
    raw = req.args.get(key)
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise exc.InvalidArgument(f"Invalid value for field '{key}': {raw!r}", reason="invalid") from None


class ComputeResponses(ControlMixin, JsonApp, ResizeResponses):
    """A WSGI application serving ``backend`` with Compute Engine's URL scheme and JSON."""

    routes = urls.ROUTES
    backend: ComputeBackend

    def __init__(self, backend: ComputeBackend, logs: LogsProvider | None = None) -> None:
        self.backend = backend
        self.logs = logs

    @staticmethod
    def _page(req: Request) -> dict[str, Any]:
        return {"flt": req.args.get("filter"), "max_results": _int(req, "maxResults"),
                "token": req.args.get("pageToken")}  # fmt: skip

    # -- instances -------------------------------------------------------------------------------
    def list_instances(self, req: Request, project: str, zone: str) -> dict[str, Any]:
        return self.backend.list_instances(project, zone, **self._page(req))

    def insert_instance(self, req: Request, project: str, zone: str) -> dict[str, Any]:
        return self.backend.insert_instance(project, zone, self._body(req), req.args.get("requestId"))

    def get_instance(self, req: Request, project: str, zone: str, name: str) -> dict[str, Any]:
        return self.backend.get_instance(project, zone, name)

    def delete_instance(self, req: Request, project: str, zone: str, name: str) -> dict[str, Any]:
        return self.backend.delete_instance(project, zone, name, req.args.get("requestId"))

    def get_machine_type(self, req: Request, project: str, zone: str, name: str) -> dict[str, Any]:
        return self.backend.get_machine_type(project, zone, name)

    def list_machine_types(self, req: Request, project: str, zone: str) -> dict[str, Any]:
        return self.backend.list_machine_types(project, zone, **self._page(req))

    def list_reservations(self, req: Request, project: str, zone: str) -> dict[str, Any]:
        return self.backend.list_reservations(project, zone, **self._page(req))

    def get_reservation(self, req: Request, project: str, zone: str, name: str) -> dict[str, Any]:
        return self.backend.get_reservation(project, zone, name)

    # -- groups, templates, policies ----------------------------------------------------------------
    def list_groups(self, req: Request, project: str, zone: str) -> dict[str, Any]:
        return self.backend.list_groups(project, zone, **self._page(req))

    def insert_group(self, req: Request, project: str, zone: str) -> dict[str, Any]:
        return self.backend.insert_group(project, zone, self._body(req), req.args.get("requestId"))

    def get_group(self, req: Request, project: str, zone: str, name: str) -> dict[str, Any]:
        return self.backend.get_group(project, zone, name)

    def delete_group(self, req: Request, project: str, zone: str, name: str) -> dict[str, Any]:
        return self.backend.delete_group(project, zone, name, req.args.get("requestId"))

    def list_managed_instances(self, req: Request, project: str, zone: str, name: str) -> dict[str, Any]:
        return self.backend.list_managed_instances(project, zone, name, _int(req, "maxResults"),
                                                   req.args.get("pageToken"))  # fmt: skip

    def list_region_groups(self, req: Request, project: str, region: str) -> dict[str, Any]:
        return self.backend.list_region_groups(project, region, **self._page(req))

    def insert_region_group(self, req: Request, project: str, region: str) -> dict[str, Any]:
        return self.backend.insert_region_group(project, region, self._body(req), req.args.get("requestId"))

    def get_region_group(self, req: Request, project: str, region: str, name: str) -> dict[str, Any]:
        return self.backend.get_region_group(project, region, name)

    def delete_region_group(self, req: Request, project: str, region: str, name: str) -> dict[str, Any]:
        return self.backend.delete_region_group(project, region, name, req.args.get("requestId"))

    def list_region_managed_instances(self, req: Request, project: str, region: str, name: str) -> dict[str, Any]:
        return self.backend.list_region_managed_instances(project, region, name, _int(req, "maxResults"),
                                                          req.args.get("pageToken"))  # fmt: skip

    def list_autoscalers(self, req: Request, project: str, scope: str) -> dict[str, Any]:
        return self.backend.list_autoscalers(project, scope, **self._page(req))

    def get_autoscaler(self, req: Request, project: str, scope: str, name: str) -> dict[str, Any]:
        return self.backend.get_autoscaler(project, scope, name)

    def list_instance_groups(self, req: Request, project: str, scope: str) -> dict[str, Any]:
        return self.backend.list_instance_groups(project, scope, **self._page(req))

    def get_instance_group(self, req: Request, project: str, scope: str, name: str) -> dict[str, Any]:
        return self.backend.get_instance_group(project, scope, name)

    def get_image_from_family(self, req: Request, project: str, name: str) -> dict[str, Any]:
        return self.backend.get_image_from_family(project, name)

    def get_image(self, req: Request, project: str, name: str) -> dict[str, Any]:
        return self.backend.get_image(project, name)

    def list_templates(self, req: Request, project: str, region: str = "") -> dict[str, Any]:
        return self.backend.list_templates(project, region, **self._page(req))

    def insert_template(self, req: Request, project: str, region: str = "") -> dict[str, Any]:
        return self.backend.insert_template(project, region, self._body(req), req.args.get("requestId"))

    def get_template(self, req: Request, project: str, name: str, region: str = "") -> dict[str, Any]:
        return self.backend.get_template(project, region, name)

    def delete_template(self, req: Request, project: str, name: str, region: str = "") -> dict[str, Any]:
        return self.backend.delete_template(project, region, name, req.args.get("requestId"))

    def list_policies(self, req: Request, project: str, region: str) -> dict[str, Any]:
        return self.backend.list_policies(project, region, **self._page(req))

    def insert_policy(self, req: Request, project: str, region: str) -> dict[str, Any]:
        return self.backend.insert_policy(project, region, self._body(req), req.args.get("requestId"))

    def get_policy(self, req: Request, project: str, region: str, name: str) -> dict[str, Any]:
        return self.backend.get_policy(project, region, name)

    def delete_policy(self, req: Request, project: str, region: str, name: str) -> dict[str, Any]:
        return self.backend.delete_policy(project, region, name, req.args.get("requestId"))

    def get_region(self, req: Request, project: str, region: str) -> dict[str, Any]:
        return self.backend.get_region(project, region)

    def get_zone(self, req: Request, project: str, zone: str) -> dict[str, Any]:
        return self.backend.get_zone(project, zone)

    def get_project(self, req: Request, project: str) -> dict[str, Any]:
        return self.backend.get_project(project)

    def aggregated_list(self, req: Request, project: str, collection: str) -> dict[str, Any]:
        return self.backend.aggregated_list(project, collection, req.args.get("filter"))

    # -- operations -------------------------------------------------------------------------------
    def list_operations(self, req: Request, project: str, scope: str) -> dict[str, Any]:
        return self.backend.list_operations(project, scope, **self._page(req))

    def get_operation(self, req: Request, project: str, scope: str, name: str) -> dict[str, Any]:
        return self.backend.get_operation(project, scope, name)

    def wait_operation(self, req: Request, project: str, scope: str, name: str) -> dict[str, Any]:
        return self.backend.wait_operation(project, scope, name)

    # -- control ----------------------------------------------------------------------------------
    def fake_preempt(self, req: Request, zone: str, name: str) -> dict[str, Any]:
        return self.backend.preempt(zone, name, req.args.get("project") or None)

    def fake_get_capacity(self, req: Request) -> dict[str, Any]:
        return self.backend.capacity.to_json()

    def fake_capacity(self, req: Request) -> dict[str, Any]:
        return self.backend.configure_capacity(self._body(req))

    def fake_quotas(self, req: Request) -> dict[str, Any]:
        return self.backend.set_quotas(self._body(req))

    def fake_latency(self, req: Request) -> dict[str, Any]:
        body = self._body(req)
        return self.backend.set_latency(body.get("provision_s"), body.get("delete_s"), body.get("preempt_notice_s"),
                                        body.get("op_polls"), body.get("op_s"))  # fmt: skip

    def fake_fail_operations(self, req: Request) -> dict[str, Any]:
        """``{collection, operationType, error?, count?}``: see ``ComputeBase.fail_operations``."""
        b = self._body(req)
        return self.backend.fail_operations(str(b.get("collection")), str(b.get("operationType")),
                                            str(b.get("error") or "ZONE_RESOURCE_POOL_EXHAUSTED"),
                                            int(b.get("count") or 1))  # fmt: skip

    def fake_tick(self, req: Request) -> dict[str, Any]:
        self.backend.tick()
        return {}

    def fake_logs(self, req: Request, zone: str, name: str) -> dict[str, Any]:
        if self.logs is None:
            raise exc.FailedPrecondition("no host simulator attached to this server")
        return self.logs(zone, name)
