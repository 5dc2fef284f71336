"""``tpu-ops local up [--env-file PATH]``: run the emulated clouds until SIGINT/SIGTERM.

Prints (and writes to ``--env-file``) ``KEY=VALUE`` lines, shell-quoted, that point every client
at the stack: ``set -a; . ./local.env; set +a``. Imports stay inside the handler so the CLI
starts fast; no Prefect here.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from flows.commands._common import index_arg


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    what = "The local stack of emulated clouds (moto, fake GCS, fake Compute Engine and Cloud TPU)."
    p = sub.add_parser("local", help=what, description=what)
    local_sub = p.add_subparsers(dest="local_command", metavar="ACTION", required=True)
    up = local_sub.add_parser("up", help="Start the stack, print its environment, run until interrupted.")
    up.add_argument("--env-file", type=Path, help="also write the KEY=VALUE lines to this file")
    up.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL for workers")
    up.add_argument("--provision-latency", type=float, default=0.0, help="fake TPU CREATING->READY seconds")
    up.add_argument("--workdir", type=Path, help="keep simulated TPU workers' directories here")
    up.add_argument(
        "--access-log",
        action="store_true",
        help="print the emulators' per-request lines (hidden: KEY=VALUE stays in view)",
    )
    up.set_defaults(handler=run_up)
    seed = local_sub.add_parser(
        "seed",
        help="Publish what a pipeline spec expects (curated dataset, buckets) on a running local stack.",
        description="Run in a shell that sourced the file `local up --env-file` wrote.",
    )
    seed.add_argument("--spec", type=Path, help="pipeline spec (default: the dry run's, flows/dryrun.yaml)")
    seed.add_argument(
        "--ladder-demo", action="store_true", help="also set the fake TPU capacity the dry run uses (spot in zone c)"
    )
    seed.set_defaults(handler=run_seed)
    preempt = local_sub.add_parser(
        "preempt",
        help="Preempt a launched run's slice on the local stack, as spot capacity would (to watch the recovery).",
        description="Run in a shell that sourced the file `local up --env-file` wrote. The run's supervisor sees "
        "the SIGTERM notices or the lost slice, asks for a new one and resumes from the newest complete "
        "checkpoint: watch it with `tpu-ops status RUN` and `tpu-ops logs RUN --follow`.",
    )
    preempt.add_argument("run_id", metavar="RUN", help="a run id (`tpu-ops status` lists them)")
    preempt.add_argument(
        "--slice", type=index_arg("slice"), default=0, metavar="N", help="which of the run's slices (0)"
    )
    preempt.set_defaults(handler=run_preempt)


def run_preempt(args: argparse.Namespace) -> int:
    from flows.commands._disk import tpu_ops_exe
    from flows.commands._runs import find, spec_doc
    from infra.local.chaos import preempt, require_local, running_slices
    from tpu_ops.errors import SpecError
    from tpu_ops.settings import Settings
    from tpu_ops.specs import ProvisionSpec

    settings = Settings()
    require_local(settings)  # before anything is read or called
    record = find(settings, args.run_id)
    doc = spec_doc(settings, record)
    spec = ProvisionSpec.model_validate(doc if record.kind == "provision" else doc["provision"])
    slices = running_slices(settings, spec, record.run_id, record.zones)
    if args.slice >= len(slices):
        held = f"slices 0-{len(slices) - 1}" if slices else "no running slice now"
        raise SpecError(f"--slice {args.slice} is not allowed: run {record.run_id} has {held}")
    what = preempt(settings, slices[args.slice])
    print(f"preempted {what} (run {record.run_id}); watch the recovery: {tpu_ops_exe()} status {record.run_id}")
    return 0


def env_lines(env: dict[str, str]) -> str:
    """``KEY=VALUE`` lines a POSIX shell can source, sorted, values quoted with shlex."""
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))


def run_seed(args: argparse.Namespace) -> int:
    from flows.commands._specs import expect_kind
    from flows.commands.dryrun import DEFAULT_SPEC
    from infra.local.seed import DRY_RUN_CAPACITY, ensure_model_bucket, seed_pipeline, set_tpu_capacity
    from tpu_ops.settings import Settings
    from tpu_ops.specs import PipelineSpec, load_spec

    if args.spec:  # a train job spec: one line naming its kind, not "Field required" per missing section
        expect_kind(args.spec, "pipeline", "tpu-ops local seed --spec")
    spec = load_spec(args.spec or DEFAULT_SPEC, PipelineSpec)
    settings = Settings()
    settings.check_safe()  # seeding is for local stacks only, whatever TPU_OPS_DRY_RUN says
    if not settings.dry_run:
        from tpu_ops.errors import ConfigError

        refused = ConfigError("seed only runs against the local stack (TPU_OPS_DRY_RUN=true)")
        refused.fix = "load the file `tpu-ops local up --env-file FILE` wrote: set -a; . FILE; set +a"
        raise refused
    seeded = seed_pipeline(settings, spec)
    # A run started from the UI exports too, as the dry run does: its model bucket must exist.
    ensure_model_bucket(settings, spec.export.destination)
    print(f"seeded {seeded.shards} shards ({seeded.bytes / 2**20:.1f} MiB) in {seeded.source}; "
          f"model bucket {spec.export.destination}")  # fmt: skip
    if args.ladder_demo:
        set_tpu_capacity(settings, DRY_RUN_CAPACITY)
        print("fake TPU capacity set: reservation too small, spot stocked out in us-central2-b")
    return 0


def run_up(args: argparse.Namespace) -> int:
    import logging

    from infra.local.stack import LocalStack

    if not args.access_log:  # moto's server logs every request; the KEY=VALUE lines would scroll away
        logging.getLogger("werkzeug").setLevel(logging.WARNING)

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    t0 = time.monotonic()
    stack = LocalStack(grace_s=args.grace, provision_s=args.provision_latency, workdir=args.workdir)
    try:
        stack.start()
        text = env_lines(stack.env())
        if args.env_file:
            args.env_file.parent.mkdir(parents=True, exist_ok=True)  # `.tpu-ops/` on a fresh clone
            tmp = args.env_file.with_name(args.env_file.name + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, args.env_file)  # readers never see a half-written file
        sys.stdout.write(text)
        sys.stdout.flush()
        print(f"# local stack up in {time.monotonic() - t0:.1f}s; Ctrl-C or SIGTERM stops it", file=sys.stderr)
        while not stop.wait(0.5):
            pass
    finally:
        stack.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
    print("# local stack stopped", file=sys.stderr)
    return 0
