"""Instance templates, global or regional (``region`` "" = global): insert, get, list, delete."""

from __future__ import annotations

from typing import Any, Unpack

from infra.local.compute.base import Paging
from infra.local.compute.placement import PlacementMixin
from infra.local.compute.records import TEMPLATES, Template


class TemplatesMixin(PlacementMixin):
    """``instanceTemplates.*`` and ``regionInstanceTemplates.*``."""

    def insert_template(
        self, project: str, region: str, body: dict[str, Any], request_id: str | None = None
    ) -> dict[str, Any]:
        """``region`` "" = a global template."""

        def build(name: str) -> Template:
            props = body.get("properties") or {}
            self._machine(props.get("machineType"), "resource.properties.machineType")
            return Template(project, region, name, next(self._uids), dict(body), self.clock.now())

        return self._insert_now(TEMPLATES, project, region, body, request_id, build)

    def get_template(self, project: str, region: str, name: str) -> dict[str, Any]:
        return self._get_call(TEMPLATES, project, region, name)

    def list_templates(self, project: str, region: str, **page: Unpack[Paging]) -> dict[str, Any]:
        return self._list_call(TEMPLATES, project, region, page)

    def delete_template(self, project: str, region: str, name: str, request_id: str | None = None) -> dict[str, Any]:
        return self._delete_unused(
            TEMPLATES, (project, region, name), request_id, "instance_template", lambda g, tpl: g.template is tpl
        )
