"""HTTP handlers of resize requests and future reservations (mixed into ``ComputeResponses``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from werkzeug.wrappers import Request

from infra.local.compute.models import ComputeBackend


class ResizeResponses:
    """``instanceGroupManagerResizeRequests.*`` and ``futureReservations.*`` over HTTP."""

    backend: ComputeBackend

    if TYPE_CHECKING:  # given by ``ComputeResponses`` (this mixin comes last among its bases)

        def _body(self, req: Request) -> dict[str, Any]: ...
        def _page(self, req: Request) -> dict[str, Any]: ...

    def insert_resize_request(self, req: Request, project: str, zone: str, name: str) -> dict[str, Any]:
        return self.backend.insert_resize_request(project, zone, name, self._body(req), req.args.get("requestId"))

    def list_resize_requests(self, req: Request, project: str, zone: str, name: str) -> dict[str, Any]:
        return self.backend.list_resize_requests(project, zone, name, **self._page(req))

    def get_resize_request(self, req: Request, project: str, zone: str, name: str, rr: str) -> dict[str, Any]:
        return self.backend.get_resize_request(project, zone, name, rr)

    def cancel_resize_request(self, req: Request, project: str, zone: str, name: str, rr: str) -> dict[str, Any]:
        return self.backend.cancel_resize_request(project, zone, name, rr, req.args.get("requestId"))

    def delete_resize_request(self, req: Request, project: str, zone: str, name: str, rr: str) -> dict[str, Any]:
        return self.backend.delete_resize_request(project, zone, name, rr, req.args.get("requestId"))

    def insert_future_reservation(self, req: Request, project: str, zone: str) -> dict[str, Any]:
        return self.backend.insert_future_reservation(project, zone, self._body(req), req.args.get("requestId"))

    def list_future_reservations(self, req: Request, project: str, zone: str) -> dict[str, Any]:
        return self.backend.list_future_reservations(project, zone, **self._page(req))

    def get_future_reservation(self, req: Request, project: str, zone: str, name: str) -> dict[str, Any]:
        return self.backend.get_future_reservation(project, zone, name)

    def cancel_future_reservation(self, req: Request, project: str, zone: str, name: str) -> dict[str, Any]:
        return self.backend.cancel_future_reservation(project, zone, name, req.args.get("requestId"))

    def delete_future_reservation(self, req: Request, project: str, zone: str, name: str) -> dict[str, Any]:
        return self.backend.delete_future_reservation(project, zone, name, req.args.get("requestId"))

    def aggregated_future_reservations(self, req: Request, project: str) -> dict[str, Any]:
        return self.backend.aggregated_future_reservations(project, req.args.get("filter"))
