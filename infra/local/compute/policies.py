"""Resource policies (a workload policy: type and TPU topology of a slice): insert, get, list, delete."""

from __future__ import annotations

import re
from typing import Any, Unpack

from infra.local.compute import exceptions as cexc
from infra.local.compute.base import ComputeBase, Paging
from infra.local.compute.records import POLICIES, Policy

TOPOLOGY_RE = re.compile(r"^\d+(x\d+){1,2}$")


class PoliciesMixin(ComputeBase):
    """``resourcePolicies.*`` of regions."""

    def insert_policy(
        self, project: str, region: str, body: dict[str, Any], request_id: str | None = None
    ) -> dict[str, Any]:
        def build(name: str) -> Policy:
            wp = body.get("workloadPolicy")
            if wp is not None:
                if wp.get("type") not in ("HIGH_THROUGHPUT", "HIGH_AVAILABILITY"):
                    raise cexc.Invalid(
                        f"Invalid value for field 'resource.workloadPolicy.type': {wp.get('type')!r}; "
                        "allowed: HIGH_THROUGHPUT, HIGH_AVAILABILITY"
                    )
                topo = wp.get("acceleratorTopology")
                if topo is not None and not TOPOLOGY_RE.match(str(topo)):
                    raise cexc.Invalid(
                        f"Invalid value for field 'resource.workloadPolicy.acceleratorTopology': {topo!r} "
                        "(expected e.g. 2x2x4 or 8x8)"
                    )
            return Policy(project, region, name, next(self._uids), dict(body), self.clock.now())

        return self._insert_now(POLICIES, project, region, body, request_id, build)

    def get_policy(self, project: str, region: str, name: str) -> dict[str, Any]:
        return self._get_call(POLICIES, project, region, name)

    def list_policies(self, project: str, region: str, **page: Unpack[Paging]) -> dict[str, Any]:
        return self._list_call(POLICIES, project, region, page)

    def delete_policy(self, project: str, region: str, name: str, request_id: str | None = None) -> dict[str, Any]:
        return self._delete_unused(
            POLICIES, (project, region, name), request_id, "resource_policy", lambda g, pol: g.policy is pol
        )
