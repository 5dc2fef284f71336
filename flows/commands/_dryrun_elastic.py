"""The elastic dry run (``tpu-ops dry-run --spec examples/elastic.yaml``): a stock-out of the target shape.

``ElasticScenario`` plays the capacity the way a bad night would (docs/elastic.md): once the run has a
committed checkpoint on its target shape, that shape is stocked out in every zone (the fake Compute
Engine's spot chips cut to what the next smaller shape needs) and the slice is preempted, so the run
resumes on the smaller shape with accumulation; once that has committed a checkpoint of its own, the
capacity comes back and the slice is preempted again, so the recovery goes back to the target.
The dry run then compares the run's last checkpoint with an uninterrupted run of the reference trainer
on the target shape (``flows.commands._baseline``, given ``target_shape_env``).
"""

from __future__ import annotations

import threading
from typing import Any

TARGET_STOCKED_OUT = "target stocked out"
TARGET_BACK = "target back in stock"


class ElasticScenario(threading.Thread):
    """Stock the target shape out and preempt; then bring it back and preempt again (module docstring)."""

    def __init__(self, stack: Any, settings: Any, spec: Any, run_id: str) -> None:
        super().__init__(name="elastic-scenario", daemon=True)
        from tpu_ops.layout import RunLayout
        from tpu_ops.provision.providers import for_spec

        self.provider = for_spec(spec.provision, settings)
        self.stack, self.settings, self.spec, self.run_id = stack, settings, spec, run_id
        self.layout = RunLayout.of(spec.train.checkpoint_dir, run_id, spec.train.checkpoint_subdir)
        shapes = spec.provision.slice.shape_list
        self.target, self.smaller = shapes[0], shapes[1]
        self.zones = list(spec.provision.slice.zones)
        self.preempted: str | None = None
        self.events: list[dict[str, Any]] = []
        self._done = threading.Event()

    def _capacity(self, spot_chips: int) -> dict[str, Any]:
        # every zone: no on-demand, and spot for ``spot_chips`` (the target's chips, or the smaller shape's)
        return {zone: {"SPOT": spot_chips, "STANDARD": 0} for zone in self.zones}

    def run(self) -> None:
        from tpu_ops.cloud.clients import Clients
        from tpu_ops.errors import TpuOpsError
        from tpu_ops.train.checkpoints import latest_complete_step

        gcs = Clients(self.settings).gcs()
        phase, mark = 0, None
        while phase < 2 and not self._done.wait(0.2):
            try:
                step = latest_complete_step(gcs, self.layout.steps_uri)
                live = self._running()
                on = live[0].accelerator_type if live else ""
                if phase == 0 and step is not None and on == self.target.accelerator.name:
                    self.stack.set_compute_capacity(self._capacity(self.smaller.chips))
                    self._preempt(live[0], TARGET_STOCKED_OUT, step)
                    phase = 1
                elif phase == 1 and on == self.smaller.accelerator.name:
                    if mark is None:
                        mark = step  # the smaller shape's own checkpoint comes after this one
                    elif step is not None and step > mark:
                        self.stack.set_compute_capacity(self._capacity(4 * self.target.chips))
                        self._preempt(live[0], TARGET_BACK, step)
                        phase = 2
            except TpuOpsError:
                continue

    def _running(self) -> list[Any]:
        from tpu_ops.provision.providers import SliceState

        found = self.provider.slices(self.zones, self.run_id)
        return sorted((r for r in found if r.state in SliceState.RUNNING and r.hosts), key=lambda r: r.slice_id)

    def _preempt(self, rec: Any, why: str, step: int) -> None:
        host = sorted(rec.hosts, key=lambda h: h.index)[-1].name.split(".")[0]
        self.stack.preempt_instance(rec.zone, host)
        what = f"host {host} of {rec.slice_id} ({rec.accelerator_type}) in {rec.zone}"
        self.preempted = self.preempted or what
        self.events.append({"event": why, "preempted": what, "committed_step": step})
        print(f"==> {why}: injected a spot preemption of {what}", flush=True)

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=10)


def target_shape_env(spec: Any) -> dict[str, str]:
    """The elastic-shape variables an uninterrupted run on the target shape gets (``{}`` without shapes)."""
    sl = spec.provision.slice
    if not sl.shapes:
        return {}
    t = sl.shape_list[0]
    return {
        "TPU_OPS_CHIPS": str(t.chips),
        "TPU_OPS_TARGET_CHIPS": str(t.chips),
        "TPU_OPS_ACCUM_STEPS": "1",
        "TPU_OPS_SHAPE": t.name,
        "TPU_OPS_TARGET_SHAPE": t.name,
    }


def shape_records(run_id: str) -> list[dict[str, Any]]:
    """The run's ``shape`` / ``shape-unavailable`` ledger records (the ledger under ``TPU_OPS_STATE_DIR``):
    which shape each allocation got, and why a larger one was not had."""
    from tpu_ops.provision.ledger import Ledger
    from tpu_ops.provision.shapes import SHAPE, SHAPE_UNAVAILABLE
    from tpu_ops.settings import Settings

    keep = ("kind", "shape", "accum_steps", "why", "next", "reason")
    events = Ledger(Settings(), run_id).events()
    return [{k: e[k] for k in keep if k in e} for e in events if e["kind"] in (SHAPE, SHAPE_UNAVAILABLE)]
