"""``inject_preemption``: the ``train`` and ``retraining-pipeline`` forms' way to show a recovery on the
local stack.

With the parameter on, a background thread waits for the run's first committed checkpoint, then
preempts its slice through the fakes' control endpoints (``infra.local.chaos``, as ``tpu-ops local
preempt`` does); the run page then shows the preemption, the new slice and the resume. Outside a
dry run the flow refuses the parameter before anything starts: a real cloud's preemptions are its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tpu_ops.layout import RunLayout
from tpu_ops.settings import Settings
from tpu_ops.specs import ProvisionSpec


class PreemptAfterCheckpoint(threading.Thread):
    """Preempt the run's slice once, after its first committed checkpoint."""

    def __init__(self, settings: Settings, spec: ProvisionSpec, layout: RunLayout, run_id: str,
                 say: Callable[[str], Any]) -> None:  # fmt: skip
        super().__init__(name="inject-preemption", daemon=True)
        self.settings, self.spec, self.layout, self.run_id, self.say = settings, spec, layout, run_id, say
        self.preempted: str | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        from infra.local.chaos import preempt, running_slices
        from tpu_ops.cloud.clients import Clients
        from tpu_ops.errors import TpuOpsError
        from tpu_ops.train.checkpoints import latest_complete_step

        gcs = Clients(self.settings).gcs()
        while not self._halt.wait(0.5):
            try:
                if latest_complete_step(gcs, self.layout.steps_uri) is None:
                    continue
                slices = running_slices(self.settings, self.spec, self.run_id)
                if slices:
                    self.preempted = preempt(self.settings, slices[0])
                    self.say(f"inject_preemption: preempted {self.preempted}, as spot capacity would")
                    return
            except TpuOpsError:
                continue  # the slice moved under us (deleting, recreated): look again

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)


@contextmanager
def injected_preemption(enabled: bool, settings: Settings, spec: ProvisionSpec, layout: RunLayout, run_id: str,
                        say: Callable[[str], Any]) -> Iterator[PreemptAfterCheckpoint | None]:  # fmt: skip
    """One preemption of the run's slice while the block runs (when ``enabled``; local stack only)."""
    if not enabled:
        yield None
        return
    from infra.local.chaos import require_local

    require_local(settings)
    thread = PreemptAfterCheckpoint(settings, spec, layout, run_id, say)
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()
