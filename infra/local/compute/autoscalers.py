"""Autoscalers (zonal and regional): the fake's groups never have one, so a list is empty and a get is
404, as Compute Engine answers for a group without autoscaling. gcloud reads them before it
describes or deletes a managed instance group."""

from __future__ import annotations

from typing import Any, Unpack

from infra.local.compute import exceptions as cexc
from infra.local.compute.base import API, ComputeBase, Paging


class AutoscalersMixin(ComputeBase):
    """``autoscalers.get/list`` and ``regionAutoscalers.get/list`` (``scope``: ``zones/<z>`` or ``regions/<r>``)."""

    def list_autoscalers(self, project: str, scope: str, **page: Unpack[Paging]) -> dict[str, Any]:
        path = f"projects/{project}/{scope}/autoscalers"
        return self._call("GET", API + path, lambda: self._list("compute#autoscalerList", [], **page, path=path))

    def get_autoscaler(self, project: str, scope: str, name: str) -> dict[str, Any]:
        path = f"projects/{project}/{scope}/autoscalers/{name}"

        def run() -> dict[str, Any]:
            raise cexc.not_found(path)

        return self._call("GET", API + path, run)
