"""Operations of zones, regions and the global scope: get, wait, list, and their settling (an
insert ends when its VM is RUNNING or gone, a delete when the resource is gone)."""

from __future__ import annotations

import threading
import time
from typing import Any, Unpack

from infra.local.compute import exceptions as cexc
from infra.local.compute.base import API, ComputeBase, Paging
from infra.local.compute.hosts import PREEMPTED
from infra.local.compute.records import OPERATIONS, Status


class OperationsMixin(ComputeBase):
    """``zoneOperations.*``, ``regionOperations.*``, ``globalOperations.*`` (``scope``: ``zones/<z>``,
    ``regions/<r>`` or ``global``)."""

    def get_operation(self, project: str, scope: str, name: str) -> dict[str, Any]:
        path = API + OPERATIONS.path(project, scope, name)
        return self._call("GET", path, lambda: self._read_op(project, scope, name))

    def _read_op(self, project: str, scope: str, name: str) -> dict[str, Any]:
        """An operation's JSON; a read of a RUNNING one counts toward its end (``op_polls``)."""
        op = self._get(OPERATIONS, project, scope, name)
        out = op.to_json(self.link_base)
        if not op.done:
            op.polls_left -= 1
        return out

    def wait_operation(self, project: str, scope: str, name: str, timeout_s: float | None = None) -> dict[str, Any]:
        """Like Google's ``wait``: returns when DONE or after a while (theirs: ~2 min; here ``wait_s``
        of wall time, so a test on a manual clock is never stuck); the caller polls again if not DONE."""
        path = API + OPERATIONS.path(project, scope, name)
        deadline = time.monotonic() + (self.wait_s if timeout_s is None else timeout_s)
        while True:
            op = self._call("POST", path + "/wait", lambda: self._read_op(project, scope, name))
            if op["status"] == "DONE" or time.monotonic() >= deadline:
                return op
            threading.Event().wait(0.02)

    def list_operations(self, project: str, scope: str, **page: Unpack[Paging]) -> dict[str, Any]:
        return self._list_call(OPERATIONS, project, scope, page, order=lambda o: (o.insert_time, o.uid))

    def _settle_ops(self, now: float) -> None:
        """End every operation whose work is done (and that was read ``op_polls`` times): with its
        asynchronous failure if it has one, else when its instance runs or its resource is gone. One
        nobody reads ends ``op_s`` of fake time after it began."""
        for op in self._ops.values():
            if op.done or op.op_type == PREEMPTED or (op.polls_left > 0 and now - op.insert_time < self.op_s):
                continue
            if op.fail_with is not None:
                op.finish(now, *op.fail_with)
                continue
            parts = op.target.split("/")
            collection, zone, name = parts[-2], parts[3], parts[-1]
            if collection == "instances":
                inst = self._instances.get((op.project, zone, name))
                if op.op_type == "insert":
                    if inst is None or inst.uid != op.target_id:
                        gone = {"code": "RESOURCE_NOT_FOUND", "message": f"The instance '{op.target}' was deleted"}
                        err = self._failures.get(op.target) or {"errors": [gone]}
                        op.finish(now, err, cexc.http_of(err))
                    elif inst.status == Status.RUNNING:
                        op.finish(now)
                elif op.op_type == "delete" and inst is None:
                    op.finish(now)
            elif collection == "instanceGroupManagers" and op.op_type == "delete":
                if (op.project, zone, name) not in self._groups:
                    op.finish(now)
            else:  # the change was made when it was asked for (templates, policies, a group's insert)
                op.finish(now)
