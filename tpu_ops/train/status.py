"""A run's status as ``tpu-ops status`` shows it: state, step, slices and hosts alive, cost and goodput so far.

Read from what the run leaves anyway, never from the supervisor's memory: the run state in GCS
(``RUN/_tpu_ops/state.json``, the live incarnation's heartbeats, the cancel marker), the cost ledger
(``<state_dir>/ledger/<run_id>.jsonl``, merged with the copy its supervisor publishes: :mod:`tpu_ops.train.costs`)
and the launch record (:mod:`tpu_ops.train.launches`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from tpu_ops.errors import NotFoundError, TpuOpsError
from tpu_ops.provision.ledger import RunCost
from tpu_ops.provision.naming import slice_of
from tpu_ops.provision.prices import load as load_prices
from tpu_ops.settings import Settings
from tpu_ops.train import cancel, costs
from tpu_ops.train.checkpoints import latest_complete_step
from tpu_ops.train.efficiency import efficiency
from tpu_ops.train.goodput import GoodputReport
from tpu_ops.train.incarnations import absorb_heartbeats, mine
from tpu_ops.train.launches import PIPELINE, PREFECT, PROVISION, LaunchRecord
from tpu_ops.train.layout import list_json
from tpu_ops.train.runstate import RunState, StateStore

# The states a run shows. ENDED: nothing of it runs any more.
STARTING: Final = "starting"  # launched; no run state yet (a pipeline mirrors first)
PROVISIONING: Final = "provisioning"  # asking the ladder for a slice
RUNNING: Final = "running"
RECOVERING: Final = "recovering"  # a slice was lost: a new one is being asked for, or is restoring
MOVING: Final = "moving"  # a move at a checkpoint: the new slice asked for or taking over (docs/moves.md)
CANCELLING: Final = "cancelling"
FINISHING: Final = "finishing"  # a pipeline whose training ended: export and the audit digest go on
LOST: Final = "lost"  # the run state says running, but its supervisor is gone (launch it again to resume)
UP: Final = "up"  # a provisioned slice handed to the user (a provision spec)
ENDED: Final = frozenset({"done", "failed", cancel.CANCELLED, "gone"})
ALIVE_BEATS: Final = 3  # a host is alive while its last heartbeat is at most 3 intervals old


@dataclass
class SliceStatus:
    """One slice the run holds now."""

    slice_id: str
    zone: str
    tier: str
    hosts: int
    hosts_alive: int
    index: int = 0  # its place in the allocation
    kept: bool = False  # held over from the incarnation before (only the lost slice was replaced)
    repaired: bool = False  # Google repaired it: the multislice request kept, the node new


@dataclass
class RunStatus:
    """What ``tpu-ops status RUN --json`` prints."""

    run_id: str
    kind: str
    mode: str
    state: str
    launched_at: float
    step: int | None = None
    steps: int | None = None
    slices: list[SliceStatus] = field(default_factory=list)
    # every incarnation's allocation: number, end, its slices (index, resource_id, zone, tier, hosts, kept, repaired)
    incarnations: list[dict[str, Any]] = field(default_factory=list)
    hosts_alive: int = 0
    # voluntary moves at checkpoints (docs/moves.md): number, from, to, phase, checkpoint, why, overlap_s
    moves: list[dict[str, Any]] = field(default_factory=list)
    preemptions: int = 0
    recoveries: int = 0
    cost_usd: float = 0.0
    open_slices: int = 0
    # False: the run held slices but this state directory has no ledger of them (its supervisor runs on a
    # Prefect worker elsewhere), so cost_usd and open_slices say nothing; never a $0 that looks real.
    cost_known: bool = True
    # Set while the run goes on and its cost comes from the copy its supervisor publishes (train.costs): the
    # moment that copy was last known complete; the figure may miss what happened since.
    cost_as_of: float | None = None
    goodput: float | None = None
    wall_s: float | None = None
    error: str = ""
    supervisor_pid: int | None = None
    supervisor_alive: bool | None = None  # the detached process, on this machine (None: not knowable here)
    cancelled_by: str = ""
    flow_run_id: str = ""
    ui_url: str = ""
    origin: str = ""  # launch | ui | schedule (``launches.LAUNCH``...): where the run was started
    # Filled when the trainer reports tokens and model FLOPs in its heartbeats (the job contract's
    # optional fields); None until then.
    tokens: int | None = None
    mfu: float | None = None
    usd_per_million_tokens: float | None = None

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _alive(beats: list[dict[str, Any]], now: float, interval_s: float) -> int:
    window = ALIVE_BEATS * max(interval_s, 1.0)
    return sum(1 for b in beats if b.get("state") != "exited" and now - float(b.get("time") or 0) <= window)


def run_status(settings: Settings, record: LaunchRecord, gcs: Any, now: float | None = None,
               flow_run: tuple[str, str] | None = None) -> RunStatus:  # fmt: skip
    """The status of the launched run ``record`` (``gcs``: a storage client for its run state).

    ``flow_run``: how its Prefect flow run ended (``done`` | ``failed`` | ``cancelled``, and why) when
    it did; it stands for the run's own outcome when the run state has none (a flow run that crashed
    before its supervisor wrote any).
    """
    now = time.time() if now is None else now
    out = RunStatus(record.run_id, record.kind, record.mode, STARTING, record.launched_at,
                    supervisor_pid=record.pid, flow_run_id=record.flow_run_id, ui_url=record.ui_url,
                    cancelled_by=record.cancelled_by, origin=record.origin)  # fmt: skip
    layout = record.layout
    known = costs.known(settings, record.run_id, load_prices(settings), gcs, layout, now)  # one GET
    cost = known.cost
    out.cost_usd, out.open_slices = round(cost.usd_total, 4), cost.open_slices
    alive = out.supervisor_alive = record.supervisor_alive()
    if record.kind == PROVISION:  # no training: the slice is the run
        return _provision(out, record, cost, alive)
    if layout is None:  # a flow run whose spec did not validate: no run state, its flow run's end says it all
        out.state, out.error = (record.outcome, record.error) if record.outcome else (flow_run or (STARTING, ""))
        return out
    try:
        state = StateStore(gcs, layout.run_state).load()
    except NotFoundError:  # the checkpoint bucket itself is not there (yet)
        state = None
    if state is not None:
        _from_state(out, state, gcs, record, now, cost.to_json())
        if not cost.slices and any(inc["slices"] for inc in out.incarnations):
            out.cost_known, out.usd_per_million_tokens = False, None
        elif known.published and state.outcome == "running":
            out.cost_as_of = max(known.as_of or 0.0, state.ledger_as_of or 0.0) or None
    ended = out.state in ENDED
    if not ended and flow_run is not None:
        out.state, out.error = flow_run[0], out.error or flow_run[1]
        ended = True
    if ended and record.kind == PIPELINE and alive is True:
        out.state = FINISHING  # its process goes on after training: teardown, export, the audit digest
    elif out.state == "failed" and (record.cancelled_at is not None or (flow_run or ("",))[0] == cancel.CANCELLED):
        # Stopped on the way out of a cancel (Prefect's cancellation signals the flow run's process; a run
        # started in the UI has no launch record to say it was cancelled, its flow run does).
        out.state, out.error = cancel.CANCELLED, ""
        for inc in out.incarnations[-1:]:  # the incarnation the cancel ended says so too
            inc["end"] = cancel.CANCELLED if inc["end"] == "failed" else inc["end"]
    elif not ended and record.cancelled_at is not None:
        done = alive is False or record.outcome == cancel.CANCELLED  # `cancel` saw it stop
        out.state = cancel.CANCELLED if done else CANCELLING
    elif not ended and alive is False:
        out.state = record.outcome if record.outcome in ENDED else LOST
        out.error = out.error or record.error
    return out


def _provision(out: RunStatus, record: LaunchRecord, cost: RunCost, alive: bool | None) -> RunStatus:
    """A provision run's status: its slices are what its ledger says is open."""
    out.state = UP if cost.open_slices else ("gone" if cost.slices else (record.outcome or STARTING))
    for s in cost.slices:
        if s.open:
            index = slice_of(record.run_id, s.resource_id) or 0
            out.slices.append(SliceStatus(s.resource_id, s.zone, s.tier, record.hosts, record.hosts, index))
    if record.cancelled_at is not None and not cost.open_slices:
        out.state = cancel.CANCELLED
    elif out.state == STARTING and alive is False:
        out.state, out.error = "failed", record.error or "the provisioning process ended without a slice"
    if record.mode == PREFECT and not cost.slices:
        # provisioned by a Prefect worker: its ledger (no run state, no published copy) may be on that
        # machine, so nothing billed here says nothing; never a $0 that looks real
        out.cost_known = False
    return out


def _from_state(out: RunStatus, state: RunState, gcs: Any, record: LaunchRecord, now: float,
                cost: dict[str, Any]) -> None:  # fmt: skip
    out.steps, out.error = state.steps, state.error
    out.preemptions = len(state.preemptions)
    out.incarnations = [
        {"number": i.number, "end": i.end, "slices": [asdict(s) for s in i.allocation()]} for i in state.incarnations
    ]
    out.recoveries = sum(1 for p in state.preemptions if p.resume_step is not None)
    out.moves = [{"number": m.number, "from": f"{m.from_tier} in {m.from_zone}", "to": f"{m.to_tier} in {m.to_zone}",
                  "phase": m.phase, "checkpoint": m.checkpoint, "why": m.detail or m.why,
                  "overlap_s": round(m.overlap_s, 1)} for m in state.moves]  # fmt: skip
    live = state.live if state.outcome == "running" else None
    beats: list[dict[str, Any]] = []
    if live is not None and live.queued_resource and record.layout is not None:
        # The supervisor saves the run state every few seconds; its workers' heartbeats are newer.
        beats = [b for b in list_json(gcs, record.layout.heartbeats) if isinstance(b, dict)]
        absorb_heartbeats(live, mine(live, beats))
        # So far, a live incarnation keeps the steps its newest committed checkpoint holds.
        live.kept_until = latest_complete_step(gcs, record.layout.steps_uri)
    steps = [i.last_step for i in state.incarnations if i.last_step is not None]
    out.step = state.final_step if state.outcome == "done" else max(steps, default=None)
    try:
        report = GoodputReport.derive(state, now, cost)
        out.goodput, out.wall_s = round(report.goodput, 4), round(report.wall_s, 1)
    except TpuOpsError:  # a state written half-way through an event: no figure rather than a wrong one
        pass
    if record.accelerator:
        eff = efficiency(state, cost, record.accelerator, now, slices=record.slices)
        out.tokens = None if eff.tokens is None else int(eff.tokens)
        out.mfu, out.usd_per_million_tokens = eff.mfu, eff.usd_per_million_tokens
    if state.outcome != "running":
        out.state = state.outcome
        if state.outcome == cancel.CANCELLED:
            out.error = ""  # asked for, not an error: ``cancelled_by`` says who
        return
    if live is None or not live.queued_resource:  # between a lost slice and the next one
        out.state = RECOVERING if state.preemptions else PROVISIONING
        return
    current = mine(live, beats)
    for sl in live.allocation():
        alive = _alive([b for b in current if int(b.get("slice") or 0) == sl.index], now, record.heartbeat_s)
        hosts = sl.hosts or record.hosts
        out.slices.append(SliceStatus(sl.resource_id, sl.zone, sl.tier, hosts, alive, sl.index, sl.kept, sl.repaired))
    out.hosts_alive = sum(sl.hosts_alive for sl in out.slices)
    restoring = bool(state.preemptions) and live.first_step_at is None  # no new step since the restore
    out.state = RECOVERING if restoring else RUNNING
    if state.moves and state.moves[-1].phase in ("asked", "stopping"):
        out.state = MOVING
