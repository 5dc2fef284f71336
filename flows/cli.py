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
import sys
from collections.abc import Sequence

from tpu_ops.errors import SpecError, TpuOpsError

COMMANDS: dict[str, str] = {
    "approve": "flows.commands.approve",
    "audit": "flows.commands.audit",
    "capacity": "flows.commands.capacity",
    "cost": "flows.commands.cost",
    "deploy": "flows.commands.deploy",
    "doctor": "flows.commands.doctor",
    "dry-run": "flows.commands.dryrun",
    "export": "flows.commands.export",
    "local": "flows.commands.local",
    "mirror": "flows.commands.mirror",
    "provision": "flows.commands.provision",
    "reap": "flows.commands.reap",
    "serve": "flows.commands.serve",
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
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in [only] if only in COMMANDS else sorted(COMMANDS):
        importlib.import_module(COMMANDS[name]).register(sub)
    return parser


def _call(args: argparse.Namespace) -> int:
    """Run the parsed command's handler; the exit code."""
    try:
        code = args.handler(args)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except TpuOpsError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return int(code or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``tpu-ops`` command line; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    return _call(build_parser(args[0] if args else None).parse_args(args))


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
    argv = sys.argv[1:]
    args = build_parser(argv[0] if argv else None).parse_args(argv)
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
