"""Operations of zones, regions and the global scope: get, wait, list, and their settling (an
insert ends when its VM is RUNNING or gone, a delete when the resource is gone)."""

from __future__ import annotations

import threading
import time
from typing import Any, Unpack

from infra.local.compute.base import API, ComputeBase, Paging
from infra.local.compute.hosts import PREEMPTED
from infra.local.compute.records import OPERATIONS, Status


class OperationsMixin(ComputeBase):
    """``zoneOperations.*``, ``regionOperations.*``, ``globalOperations.*`` (``scope``: ``zones/<z>``,
    ``regions/<r>`` or ``global``)."""

    def get_operation(self, project: str, scope: str, name: str) -> dict[str, Any]:
        return self._get_call(OPERATIONS, project, scope, name)

    def wait_operation(self, project: str, scope: str, name: str, timeout_s: float | None = None) -> dict[str, Any]:
        """Like Google's ``wait``: returns when DONE or after a while (theirs: ~2 min; here ``wait_s``
        of wall time, so a test on a manual clock is never stuck); the caller polls again if not DONE."""
        path = API + OPERATIONS.path(project, scope, name)
        deadline = time.monotonic() + (self.wait_s if timeout_s is None else timeout_s)
        while True:
            op = self._call("POST", path + "/wait", lambda: self._render(self._get(OPERATIONS, project, scope, name)))
            if op["status"] == "DONE" or time.monotonic() >= deadline:
                return op
            threading.Event().wait(0.02)

    def list_operations(self, project: str, scope: str, **page: Unpack[Paging]) -> dict[str, Any]:
        return self._list_call(OPERATIONS, project, scope, page, order=lambda o: (o.insert_time, o.uid))

    def _settle_ops(self, now: float) -> None:
        for op in self._ops.values():
            if op.done or op.op_type == PREEMPTED:
                continue
            parts = op.target.split("/")
            collection, zone, name = parts[-2], parts[3], parts[-1]
            if collection == "instances":
                inst = self._instances.get((op.project, zone, name))
                if op.op_type == "insert":
                    if inst is None or inst.uid != op.target_id:
                        gone = {"code": "RESOURCE_NOT_FOUND", "message": f"The instance '{op.target}' was deleted"}
                        op.finish(now, self._failures.get(op.target) or {"errors": [gone]})
                    elif inst.status == Status.RUNNING:
                        op.finish(now)
                elif op.op_type == "delete" and inst is None:
                    op.finish(now)
            elif (
                collection == "instanceGroupManagers"
                and op.op_type == "delete"
                and ((op.project, zone, name) not in self._groups)
            ):
                op.finish(now)
