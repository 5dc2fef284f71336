"""The ``tpu-ops`` command.

Each subcommand is one module of ``flows/commands/``, named in ``COMMANDS``, that exposes
``register(sub)``; heavy imports (Prefect, cloud SDKs) stay inside the handlers so ``--help`` and
``validate`` start fast. A command line that names a subcommand loads only that subcommand's module.

In the console script (not in ``main``, which tests call in-process) a subcommand may ask for
process-wide shortcuts with ``set_defaults``; each stays only while ``make bench`` shows it pays
(``mirror`` asks for both):

- ``fast_exit=True``: run the ``atexit`` handlers, flush the output and leave with ``os._exit``,
  skipping the rest of interpreter teardown (freeing every module of the cloud SDKs): 0.2 CPU s
  of a no-change mirror run's 0.9. Nothing registered with ``atexit`` is skipped; such a handler
  must leave nothing to finalizers (``__del__``) either.
- ``keep_freed_memory=True``: glibc's malloc keeps freed blocks (up to 64 MiB each, 256 MiB in
  all) for reuse instead of handing them back to the kernel and faulting fresh pages in for the
  next object's buffers (~6% of a full copy's CPU time).
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import importlib
import os
import select
import sys
import traceback
from collections.abc import Sequence

from flows.privacy import telemetry_off
from tpu_ops.errors import SpecError

DEBUG_ENV = "TPU_OPS_DEBUG"

COMMANDS: dict[str, str] = {
    "approve": "flows.commands.approve",
    "audit": "flows.commands.audit",
    "cancel": "flows.commands.cancel",
    "capacity": "flows.commands.capacity",
    "cost": "flows.commands.cost",
    "deploy": "flows.commands.deploy",
    "doctor": "flows.commands.doctor",
    "launch": "flows.commands.launch",
    "dry-run": "flows.commands.dryrun",
    "export": "flows.commands.export",
    "local": "flows.commands.local",
    "logs": "flows.commands.logs",
    "mirror": "flows.commands.mirror",
    "provision": "flows.commands.provision",
    "reap": "flows.commands.reap",
    "serve": "flows.commands.serve",
    "status": "flows.commands.status",
    "teardown": "flows.commands.teardown",
    "train": "flows.commands.train",
    "validate": "flows.commands.validate",
}
"""Command name → the module that registers it (and only it)."""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser, with every subcommand module registered (or just ``only``, if it names one)."""
    parser = argparse.ArgumentParser(
        prog="tpu-ops",
        description="Mirror datasets S3→GCS, provision TPU slices, train with resume, export to "
        "SageMaker, all audited. Run `tpu-ops COMMAND --help` for each command.",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help=f"on a failure, show the traceback as well as the one-line reason (or set {DEBUG_ENV}=1); "
        "accepted anywhere on the command line",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in [only] if only in COMMANDS else sorted(COMMANDS):
        importlib.import_module(COMMANDS[name]).register(sub)
    return parser


def _debug(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get(DEBUG_ENV, "").lower() in ("1", "true", "yes")


def _call(args: argparse.Namespace) -> int:
    """Run the parsed command's handler; the exit code.

    The one place where a failure meets a person: bad input is listed field by field (exit 2); a
    missing credential, an endpoint that does not answer or a refused permission is one line
    naming what is missing and the fix (exit 1, or the command's ``failure_exit``), whatever SDK
    raised it; anything else is one line too. ``--debug`` (or ``TPU_OPS_DEBUG=1``) prints the traceback first.
    """
    from flows.failures import check_endpoints, quiet_library_tracebacks, reads_files_only

    debug = _debug(args)
    try:
        with quiet_library_tracebacks(not debug):
            _check_run_ids(args)  # bad input is named before any endpoint is probed
            if not reads_files_only(args):
                check_endpoints()
            code = args.handler(args)
    except SpecError as exc:
        if debug:
            traceback.print_exc()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # every failure becomes one line; the traceback only on request
        from flows.failures import one_line

        if isinstance(exc, BrokenPipeError) and _reader_gone():  # `tpu-ops status | head`: not a failure
            return SIGPIPE_EXIT
        if debug:
            traceback.print_exc()
        print(one_line(exc, debug), file=sys.stderr)
        # a command whose exit 1 means something else (audit verify: damage) names its own failure code
        return int(getattr(args, "failure_exit", 1))
    return int(code or 0)


SIGPIPE_EXIT = 141  # what a shell reports for a command whose reader went away (128 + SIGPIPE)


def _reader_gone() -> bool:
    """Whether standard output is a pipe nobody reads any more (``| head`` has exited).

    If so, the rest of the output goes to /dev/null, so the interpreter's last flush raises
    nothing either. A BrokenPipeError from a socket (an endpoint that hung up) is not this.
    """
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        if not any(events & select.POLLERR for _, events in poller.poll(0)):
            return False
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real file behind stdout (a test captures it)
        return False
    return True


def _check_run_ids(args: argparse.Namespace) -> None:
    """Refuse a bad ``--run-id`` / ``RUN_ID`` (``cost --run``) with the run-id rule (``SpecError``)."""
    from tpu_ops.layout import check_run_id

    for name in ("run_id", "run"):
        value = getattr(args, name, None)
        if isinstance(value, str):
            check_run_id(value)


def _split_debug(argv: Sequence[str]) -> tuple[list[str], bool]:
    """``argv`` without ``--debug`` (accepted after the command name too), and whether it was there."""
    rest = [a for a in argv if a != "--debug"]
    return rest, len(rest) != len(argv)


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    rest, debug = _split_debug(argv)
    args = build_parser(rest[0] if rest else None).parse_args(rest)
    args.debug = debug
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``tpu-ops`` command line; returns the exit code."""
    telemetry_off()
    return _call(_parse(list(sys.argv[1:] if argv is None else argv)))


def _keep_freed_memory() -> None:
    """Raise glibc malloc's mmap and trim thresholds (nothing happens on other C libraries)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    mallopt(m_trim_threshold, 256 << 20)
    mallopt(m_mmap_threshold, 64 << 20)


def console() -> None:
    """The console script: ``main``, with the process-wide shortcuts a command asks for."""
    telemetry_off()  # before any command module can import Prefect (docs/privacy.md)
    args = _parse(sys.argv[1:])
    if getattr(args, "keep_freed_memory", False):
        _keep_freed_memory()
    code = _call(args)
    if getattr(args, "fast_exit", False):
        atexit._run_exitfuncs()  # logging's shutdown and anything a spool registered run first
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    console()
