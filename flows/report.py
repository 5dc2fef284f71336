"""What a pipeline run says about itself: on its Prefect page and at the end of ``tpu-ops dry-run``.

The pipeline builds one summary dict; this module turns it into

- table artifacts on the ``retraining-pipeline`` run's own page: cost by tier, the capacity ladder
  (one row per attempt), goodput (one row per preemption), and a lineage markdown artifact
  (dataset manifest → run → checkpoint → model artifact → model package → audit);
- a run-level progress artifact, moved through the long steps (mirror, provisioning, training);
- the at-a-glance table ``tpu-ops dry-run`` prints.

Pure functions build the rows (tested without Prefect); ``publish`` and ``RunProgress`` talk to it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from tpu_ops.text import usd_by
from tpu_ops.train.goodput import efficiency_line

ACTIVE = ("active", "adopted")  # attempt outcomes that gave the run its slice


def _f(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{float(value):.{digits}f}"


def cost_rows(cost: dict[str, Any]) -> list[dict[str, str]]:
    """One row per tier (chip-hours, USD), then the total: the cost table."""
    hours: dict[str, float] = cost.get("chip_hours_by_tier") or {}
    usd: dict[str, float] = cost.get("usd_by_tier") or {}
    rows = [
        {"tier": tier, "chip-hours": _f(hours.get(tier), 4), "USD": _f(usd.get(tier), 4)}
        for tier in sorted(set(hours) | set(usd))
    ]
    rows.append({"tier": "total", "chip-hours": _f(sum(hours.values()), 4), "USD": _f(cost.get("usd_total", 0.0), 4)})
    return rows


def rung_of(attempt: dict[str, Any]) -> str:
    """``reservation NAME``, ``spot`` or ``on-demand``: the ladder rung an attempt tried."""
    return f"reservation {attempt['reservation']}" if attempt.get("reservation") else str(attempt.get("tier", "?"))


def incarnations(attempts: Iterable[dict[str, Any]]) -> list[int]:
    """The incarnation each attempt provisioned for: each walk of the ladder numbers its attempts from
    1 again (``<run>-a1``...), so a number that does not grow starts the next incarnation."""
    out: list[int] = []
    last = 0
    for a in attempts:
        number = int(a.get("number") or 0)
        out.append((out[-1] + (number <= last)) if out else 0)
        last = number
    return out


def _incarnation(n: int) -> str:
    return "0 (first)" if n == 0 else f"{n} (after preemption {n})"


def ladder_rows(attempts: Iterable[dict[str, Any]]) -> list[dict[str, str]]:
    """One row per slice request (an instance or group on Compute Engine, a queued resource on the TPU API),
    in order, with the incarnation it was for: the ladder table."""
    attempts = list(attempts)
    return [
        {
            "incarnation": _incarnation(inc),
            "#": str(a.get("number", "")),
            "rung": rung_of(a),
            "zone": str(a.get("zone", "")),
            "slice request": str(a.get("resource_id", "")),
            "outcome": str(a.get("outcome", "")),
            "waited (s)": _f(a.get("seconds_waited"), 1),
            "detail": str(a.get("detail", ""))[:160],
        }
        for inc, a in zip(incarnations(attempts), attempts, strict=True)
    ]


def winning_rung(attempts: list[dict[str, Any]]) -> str:
    """The rung and zone of the last attempt that got a slice (``-`` if none did)."""
    won = [a for a in attempts if a.get("outcome") in ACTIVE]
    if not won:
        return "-"
    a = won[-1]
    return f"{rung_of(a)} in {a.get('zone')} ({a.get('resource_id')})"


# The badput categories of goodput.json (tpu_ops.train.goodput, Google's ml-goodput-measurement names), in words.
BADPUT_WORDS = {
    "program_startup": "start-up",
    "tpu_initialization": "TPU init",
    "training_prep": "training prep",
    "data_loading": "data loading",
    "checkpoint_save": "checkpoint save",
    "checkpoint_restore": "checkpoint restore",
    "infrastructure_recovery_from_disruption": "recovery",
    "wasted_progress_from_disruption": "lost progress",
    "other": "other",
}


def _badput(training: dict[str, Any]) -> list[tuple[str, float]]:
    """The badput categories with time in them (≥ 0.05 s), largest first, as ``(words, seconds)``."""
    categories = (training.get("badput_s") or {}).items()
    spent = [(BADPUT_WORDS.get(k, k.replace("_", " ")), float(v or 0)) for k, v in categories]
    return sorted(((w, v) for w, v in spent if v >= 0.05), key=lambda wv: -wv[1])


def goodput_line(training: dict[str, Any]) -> str:
    """Goodput and where the rest of the wall time went, on one line:
    ``16.5% = productive 2.3 s of 13.9 s; start-up 7.3 s, TPU init 1.9 s, ...``."""
    pct = f"{float(training.get('goodput') or 0):.1%}"
    if not training.get("badput_s"):
        return pct
    productive, wall = float(training.get("productive_s") or 0), float(training.get("wall_s") or 0)
    line = f"{pct} = productive {productive:.1f} s of {wall:.1f} s"
    rest = ", ".join(f"{w} {v:.1f} s" for w, v in _badput(training))
    return f"{line}; {rest}" if rest else line


def goodput_rows(training: dict[str, Any], preemptions: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The run's totals, where the rest of the wall time went (one row per badput category), then one
    row per preemption: the goodput table."""
    rows = [
        {
            "what": "run",
            "steps": f"{training.get('final_step')}/{training.get('steps')}",
            "goodput": f"{float(training.get('goodput') or 0):.1%}",
            "wall (s)": _f(training.get("wall_s"), 1),
            "productive (s)": _f(training.get("productive_s"), 1),
            "steps lost": str(sum(int(p.get("steps_lost") or 0) for p in preemptions)),
            "overhead (s)": "-",
        }
    ]
    wall = float(training.get("wall_s") or 0)
    for words, seconds in _badput(training):
        rows.append(
            {
                "what": f"badput: {words}",
                "steps": "-",
                "goodput": f"{seconds / wall:.1%} of wall" if wall else "-",
                "wall (s)": _f(seconds, 1),
                "productive (s)": "-",
                "steps lost": "-",
                "overhead (s)": "-",
            }
        )
    for p in preemptions:
        rows.append(
            {
                "what": f"preemption {p.get('number')}: {p.get('reason')}",
                "steps": f"resumed from {p.get('resume_step')}",
                "goodput": "-",
                "wall (s)": "-",
                "productive (s)": "-",
                "steps lost": str(p.get("steps_lost", "-")),
                "overhead (s)": _f(p.get("overhead_s"), 1),
            }
        )
    return rows


class RecoveryLog:
    """One log line per preemption and per recovery step: preempted → deleting → re-provisioning →
    re-provisioned → training again. Fed the supervisor's events and ladder attempts; ``log`` is a
    logger's ``info``."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self._log = log
        self._pending: int | None = None  # a preemption whose slice is being deleted

    def event(self, name: str, payload: dict[str, Any]) -> None:
        n = payload.get("preemption")
        if name.endswith(".preempted"):
            self._pending = n
            self._log(
                f"preemption {n}: {payload.get('reason')} ({payload.get('tier')} {payload.get('queued_resource')} "
                f"in {payload.get('zone')}, last step {_step(payload.get('last_step'))}) → deleting the slice"
            )
        elif name.endswith(".provisioned") and payload.get("incarnation"):
            self._log(
                f"recovery: incarnation {payload['incarnation']} on {payload.get('tier')} in {payload.get('zone')} "
                f"({payload.get('queued_resource')}{', ' + payload['shape'] if payload.get('shape') else ''}) → "
                f"resuming from step {_step(payload.get('resume_step'))}"
            )
        elif name.endswith(".recovered"):
            self._log(f"preemption {n}: recovered, training again at step {_step(payload.get('step'))}")
        elif name.endswith(".moved"):  # a move at a checkpoint (docs/moves.md): moved, refused or abandoned
            why = payload.get("detail") or payload.get("why")
            self._log(f"move {payload.get('number')} {payload.get('from_tier')} -> {payload.get('to_tier')} in "
                      f"{payload.get('to_zone')}: {payload.get('phase')}: {why}")  # fmt: skip

    def attempt(self, described: str) -> None:
        if self._pending is not None:
            self._log(f"preemption {self._pending}: slice deleted → re-provisioning through the ladder")
            self._pending = None
        self._log(f"attempt {described}")


def _step(value: Any) -> str:
    return "none yet" if value is None else str(value)


def _source(source: Any) -> str:
    """The exported checkpoint: ``uri`` (kind, step)."""
    if not isinstance(source, dict):
        return "-" if source is None else f"`{source}`"
    step = "" if source.get("step") is None else f", step {source['step']}"
    return f"`{source.get('uri')}` ({source.get('kind', '?')}{step})"


def lineage_markdown(summary: dict[str, Any]) -> str:
    """Dataset → run → checkpoint → artifact → model package → audit, as a markdown list."""
    export = summary.get("export") or {}
    artifact = export.get("artifact") or {}
    audit = summary.get("audit") or {}
    lines = [
        f"# Lineage of run `{summary.get('run_id')}`",
        "",
        f"1. dataset snapshot `{summary.get('snapshot_id')}`: manifest `{summary.get('manifest')}`",
        f"2. run `{summary.get('run_id')}`: checkpoints under `{summary.get('checkpoints', '-')}`",
        f"3. checkpoint exported: {_source(export.get('source'))}",
        f"4. model artifact `{artifact.get('uri', '-')}` (sha256 `{artifact.get('sha256', '-')}`)",
        f"5. model package `{export.get('package_arn', '-')}`",
        f"6. audit trail: {_audit_line(audit, export)}",
    ]
    return "\n".join(lines)


def verify_trail(clients: Any, run_id: str = "") -> dict[str, Any]:
    """The audit trail checked end to end (chains, digests, signatures when a key is set): the summary's
    ``audit``. A trail that cannot be read says so instead of failing the run that wrote it.

    ``records`` counts what ``audit lineage`` counts: the records of ``run_id``'s chain; ``trail``
    says what ``audit verify`` counted (every chain, and the digests)."""
    from tpu_ops.audit.check import check_trail
    from tpu_ops.errors import TpuOpsError

    try:
        report = check_trail(clients, key=clients.settings.audit_kms_key_id)
    except (TpuOpsError, OSError) as exc:
        return {"verify": f"not checked ({type(exc).__name__}: {exc})", "records": 0, "digests": 0, "ok": False}
    if not report.records:
        verdict = "no records"
    elif report.ok:
        verdict = "OK" + (", signatures checked" if report.signatures_checked else "")
    else:
        verdict = f"DAMAGED: {report.damage[0].describe()}"
    return {"verify": verdict, "records": report.chain_records.get(run_id, 0), "digests": report.digests,
            "ok": report.ok, "trail": report.counts()}  # fmt: skip


def _audit_line(audit: dict[str, Any], export: dict[str, Any]) -> str:
    if audit.get("verify") and audit.get("trail"):
        return f"{audit['verify']}: {audit.get('records', 0)} records in this run's chain (the trail: {audit['trail']})"
    if audit.get("verify"):
        return f"{audit['verify']} ({audit.get('records', 0)} records, {audit.get('digests', 0)} digests)"
    return _audit_cell(audit, export)


def _audit_cell(audit: dict[str, Any], export: dict[str, Any]) -> str:
    """The dry run's verification verdict; in a pipeline run, the audit record the package names."""
    if audit.get("verify"):
        return str(audit["verify"])
    head = export.get("audit_head") or {}
    if head.get("seq") is not None:
        return f"package names audit record {head['seq']} (check: tpu-ops audit verify)"
    return "-"


def glance_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The rows a person reads at a glance at the end of a dry run."""
    training = summary.get("training") or {}
    preemptions = summary.get("preemptions") or []
    cost = summary.get("cost") or {}
    left = summary.get("left_behind")
    by_tier = usd_by(cost.get("usd_by_tier") or {})
    recovered = sum(1 for p in preemptions if p.get("overhead_s") is not None)
    export = summary.get("export") or {}
    audit = summary.get("audit") or {}
    rows = [
        ("run", str(summary.get("run_id"))),
        ("snapshot", f"{summary.get('snapshot_id')} ({summary.get('objects_copied', 0)} objects copied)"),
        ("winning rung", winning_rung(summary.get("ladder") or [])),
        ("preemptions / recoveries", f"{len(preemptions)} / {recovered}"),
        ("steps lost", str(sum(int(p.get("steps_lost") or 0) for p in preemptions))),
        ("training", f"step {training.get('final_step')}/{training.get('steps')}, {training.get('outcome', '-')}"),
        ("goodput", goodput_line(training) if training else "-"),
        ("$/M tokens, MFU", efficiency_line(training.get("efficiency") or {}) or "-"),
        ("cost by tier", f"{by_tier} (total ${float(cost.get('usd_total') or 0):.4f})"),
        ("model package", str(export.get("package_arn", "-"))),
        ("audit verify", _audit_cell(audit, export)),
    ]
    if summary.get("shapes"):  # elastic shapes: each one used, and the steps kept on it
        shapes = ", ".join(f"{s['shape']} {s['steps']} steps" for s in summary["shapes"])
        held = sum(float(s["held_chip_s"]) for s in summary["shapes"])
        rows.insert(6, ("shapes", f"{shapes}; chip-seconds held {held:.0f}"))
    if "final_params" in summary:  # the dry run's check against the same trainer uninterrupted
        rows.insert(6, ("final parameters", params_line(summary["final_params"])))
    if left is not None:
        rows.append(("left behind", left_behind(left, summary.get("disk"))))
    return rows


def params_line(check: dict[str, Any] | None) -> str:
    """How the final parameters compare with the same trainer run uninterrupted (a dry run's check)."""
    if not check:
        return "- (not the reference trainer)"
    if check.get("bit_identical"):
        return "bit-identical to an uninterrupted run"
    diff = check.get("max_rel_diff")
    return "DIFFER from an uninterrupted run" + (f" (max relative difference {diff:.2e})" if diff is not None else "")


def left_behind(left: dict[str, Any], disk: dict[str, Any] | None = None) -> str:
    """``nothing``, or what is still there in words (``2 TPU resources, 1 worker process``); with
    ``disk`` (a dry run's ``{"path", "bytes", "workers_kept"}``), the bytes it leaves on disk too."""
    if left.get("unconfirmed"):
        return "not confirmed gone: run `tpu-ops teardown RUN_ID`"
    parts = []
    for key, one in (("tpu_resources", "TPU resource"), ("worker_processes", "worker process")):
        n = int(left.get(key) or 0)
        if n:
            parts.append(f"{n} {one}{'' if n == 1 else ('es' if one.endswith('s') else 's')}")
    clouds = ", ".join(parts) or "nothing"
    if not disk:
        return clouds
    kept = "workers' files kept (--keep)" if disk.get("workers_kept") else "workers' files removed"
    return f"{clouds} in the clouds; {mib(int(disk.get('bytes') or 0))} on disk in {disk.get('path')} ({kept})"


def mib(n: int) -> str:
    """Bytes as MiB with one decimal (``23.4 MiB``)."""
    return f"{n / 2**20:.1f} MiB"


def glance_text(rows: list[tuple[str, str]]) -> str:
    """``rows`` as a boxed two-column text table."""
    width = max(len(k) for k, _ in rows)
    vwidth = max(len(v) for _, v in rows)
    rule = f"+-{'-' * width}-+-{'-' * vwidth}-+"
    body = [f"| {k:<{width}} | {v:<{vwidth}} |" for k, v in rows]
    return "\n".join([rule, *body, rule])


def glance_markdown(rows: list[tuple[str, str]], title: str) -> str:
    """``rows`` as a markdown table under ``title`` (the pipeline-summary artifact)."""
    cells = [f"| {k} | {v.replace('|', '/')} |" for k, v in rows]
    return "\n".join([f"# {title}", "", "| field | value |", "|---|---|", *cells])


def publish(summary: dict[str, Any]) -> None:
    """The run page's artifacts: summary, cost, ladder, goodput (if trained) and lineage."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    run_id = summary.get("run_id")
    create_markdown_artifact(key="pipeline-summary", markdown=glance_markdown(glance_rows(summary), f"Run `{run_id}`"))
    cost = summary.get("cost") or {}
    create_table_artifact(cost_rows(cost), key="run-cost", description=f"Cost of run {run_id} by tier (USD)")
    if summary.get("ladder"):
        won = winning_rung(summary["ladder"])
        create_table_artifact(ladder_rows(summary["ladder"]), key="run-ladder",
                              description=f"Capacity ladder of run {run_id}: won {won}")  # fmt: skip
    if summary.get("training"):
        create_table_artifact(goodput_rows(summary["training"], summary.get("preemptions") or []),
                              key="run-goodput",
                              description=f"Goodput of run {run_id}: {goodput_line(summary['training'])}")  # fmt: skip
    create_markdown_artifact(key="run-lineage", markdown=lineage_markdown(summary))


class RunProgress:
    """One progress artifact on the pipeline run's page, moved through its stages.

    ``stage(name, start, end)`` enters a stage spanning ``start..end`` percent; ``fraction(f)``
    moves within it. ``watch(poll, every_s)`` polls a ``() -> fraction | None`` in a background
    thread while a long step runs (e.g. the newest committed training step over the total).
    Updates are best effort: a failed update never fails the run.
    """

    def __init__(self, run_id: str) -> None:
        from prefect.artifacts import create_progress_artifact

        self._span = (0.0, 0.0)
        self._name = "starting"
        self._run_id = run_id
        self._id: Any = create_progress_artifact(0.0, key="pipeline-progress", description=f"run {run_id}: starting")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _update(self, percent: float, note: str) -> None:
        from prefect.artifacts import update_progress_artifact

        try:
            update_progress_artifact(self._id, min(100.0, max(0.0, percent)), description=f"run {self._run_id}: {note}")
        except Exception:  # progress is a courtesy; the run's outcome never depends on it
            return

    def stage(self, name: str, start: float, end: float) -> None:
        self.unwatch()
        self._span, self._name = (start, end), name
        self._update(start, name)

    def fraction(self, f: float, note: str = "") -> None:
        lo, hi = self._span
        self._update(lo + (hi - lo) * min(1.0, max(0.0, f)), f"{self._name} {note}".strip())

    def watch(self, poll: Callable[[], tuple[float, str] | None], every_s: float = 1.0) -> None:
        """Poll ``poll`` every ``every_s`` seconds until the next ``stage``/``done``/``unwatch``."""
        self.unwatch()
        self._stop = threading.Event()

        def loop() -> None:
            while not self._stop.wait(every_s):
                try:
                    got = poll()
                except Exception:  # a failed poll (e.g. a transient GCS error) waits for the next one
                    got = None
                if got is not None:
                    self.fraction(*got)

        self._thread = threading.Thread(target=loop, name="pipeline-progress", daemon=True)
        self._thread.start()

    def unwatch(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None

    def done(self, note: str = "done") -> None:
        self.unwatch()
        self._update(100.0, note)
