"""``tpu-ops logs RUN [--worker N] [--slice S] [--follow]``: the trainers' output from every worker,
labelled ``[wN]`` (``[sS wN]`` when the run has several slices).

Read from what the agents ship to ``RUN/_tpu_ops/logs/`` (:mod:`tpu_ops.train.logs`), so it works
wherever the run goes on. ``--follow`` polls until the run ends (bounded by its ``max_duration``).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, TextIO

from flows.commands._common import index_arg

POLL_S = 1.0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("logs", help="Print a run's trainer output from every worker, interleaved and labelled.")
    p.add_argument("run_id", metavar="RUN", help="a run id (`tpu-ops status` lists them)")
    p.add_argument("--worker", type=_worker, metavar="N", help="only worker N (0 is a slice's first host)")
    only = "only slice S of a multislice run (0 is the first)"
    p.add_argument("--slice", type=_slice, metavar="S", dest="slice_index", help=only)
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until the run ends")
    p.set_defaults(handler=run)


_worker, _slice = index_arg("worker"), index_arg("slice")


def run(args: argparse.Namespace) -> int:
    from flows.commands._common import shell_settings
    from flows.commands._runs import find

    settings = shell_settings()
    record = find(settings, args.run_id)
    if record.layout is None:
        from tpu_ops.errors import SpecError

        raise SpecError(f"run {args.run_id} is a slice (provision spec): no trainer runs on it, so no logs")
    _check_filters(args, record)
    if args.follow:
        return follow(settings, record, args.worker, slice_index=args.slice_index)
    from flows.commands._runs import gcs
    from tpu_ops.train.logs import LogReader

    reader = LogReader(gcs(settings), record.layout, args.worker, args.slice_index, record.slices)
    for line in reader.read(final=True):
        print(line)
    return 0


def _check_filters(args: argparse.Namespace, record: Any) -> None:
    """``--worker`` within a slice's hosts, ``--slice`` within the run's slices: a clear error otherwise."""
    from tpu_ops.errors import SpecError

    each = " on each slice" if record.slices > 1 else ""
    if args.worker is not None and record.hosts and args.worker >= record.hosts:
        raise SpecError(
            f"--worker {args.worker} is not allowed: run {args.run_id} has workers 0-{record.hosts - 1}{each}"
        )
    if args.slice_index is not None and args.slice_index >= record.slices:
        allowed = f"slices 0-{record.slices - 1}" if record.slices > 1 else "one slice, slice 0"
        raise SpecError(f"--slice {args.slice_index} is not allowed: run {args.run_id} has {allowed}")


def follow(settings: Any, record: Any, worker: int | None, stream: TextIO | None = None,
           announce: bool = False, slice_index: int | None = None) -> int:  # fmt: skip
    """Print the run's new lines every second until it ends; 0 if it ended done, 1 otherwise.

    Ctrl-C stops following (exit 130), never the run.
    """
    from flows.commands._runs import flow_run_end, gcs
    from tpu_ops.train.logs import LogReader
    from tpu_ops.train.status import ENDED, LOST, PROVISIONING, STARTING, run_status

    out = stream or sys.stdout
    client = gcs(settings)
    layout = record.layout
    reader = LogReader(client, layout, worker, slice_index, record.slices) if layout is not None else None
    deadline = time.monotonic() + max(record.max_duration_s, 60.0) + 60.0
    try:
        while True:
            fresh = _fresh(settings, record)
            status = run_status(settings, fresh, client, flow_run=flow_run_end(fresh))
            # An ended run's workers shipped their last pieces before it ended (the supervisor
            # releases the slice, and so stops them, before it writes the outcome): one last read.
            waiting = status.state in (STARTING, PROVISIONING)
            ended = status.state in ENDED or status.state == LOST or (reader is None and not waiting)
            for line in reader.read(final=ended) if reader is not None else []:
                print(line, file=out, flush=True)
            if ended:
                break
            if time.monotonic() > deadline:
                print(f"stopped following run {record.run_id}: past its max_duration", file=sys.stderr)
                return 1
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        print(f"\nstopped following; run {record.run_id} goes on: tpu-ops status {record.run_id}", file=sys.stderr)
        return 130
    if announce or status.state in ENDED:
        print(summary(status), file=out)
    return 0 if status.state in ("done", "up") else 1


def _fresh(settings: Any, record: Any) -> Any:
    from tpu_ops.train import launches

    return launches.load(settings, record.run_id) or record


def summary(status: Any) -> str:
    """One line: how the run ended (or where it is), its cost and goodput."""
    at = f" at step {status.step}/{status.steps}" if status.steps else ""
    good = f", goodput {status.goodput:.1%}" if status.goodput is not None else ""
    why = f" ({status.error})" if status.error else ""
    from flows.commands.status import cost_phrase

    return f"run {status.run_id}: {status.state}{at}; {cost_phrase(status)}{good}{why}"
