"""The ``tpu-ops`` command.

Each subcommand lives in a module of ``flows/commands/`` that exposes ``register(sub)``; heavy
imports (Prefect, cloud SDKs) stay inside the handlers so ``--help`` and ``validate`` start fast.
A command line that names a subcommand loads only that subcommand's module.

In the console script (not in ``main``, which tests call in-process) a subcommand may ask for
process-wide shortcuts with ``set_defaults`` (``mirror`` asks for both):

- ``fast_exit=True``: flush the output and leave with ``os._exit``, skipping interpreter teardown,
  which for a process holding the cloud SDKs takes ~0.25 s, a quarter of a no-change mirror run.
  Such a handler must leave nothing to ``atexit`` or finalizers.
- ``http_only=True``: the command uses no gRPC, so ``grpc`` is never imported.
- ``keep_freed_memory=True``: glibc's malloc keeps freed blocks (up to 64 MiB each, 256 MiB in
  all) for reuse instead of handing them back to the kernel and faulting fresh pages in for the
  next object's buffers; on a VM a page fault costs 3-14 us.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import logging
import os
import pkgutil
import sys
from collections.abc import Sequence

import flows.commands as _commands
from tpu_ops.errors import SpecError, TpuOpsError


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser, with every subcommand module registered (or just ``only``, if it names one)."""
    parser = argparse.ArgumentParser(
        prog="tpu-ops",
        description="Mirror datasets S3→GCS, provision TPU slices, train with resume, export to "
        "SageMaker, all audited. Run `tpu-ops COMMAND --help` for each command.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    names = sorted(m.name for m in pkgutil.iter_modules(_commands.__path__) if not m.name.startswith("_"))
    if only in names:
        names = [only]
    for name in names:
        module = importlib.import_module(f"flows.commands.{name}")
        module.register(sub)
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
    if getattr(args, "http_only", False):
        # google.api_core imports grpc when it can: ~0.1 s at every start of a command that
        # only talks HTTP. None in sys.modules makes that import fail, which api_core handles.
        sys.modules.setdefault("grpc", None)  # type: ignore[arg-type]
    code = _call(args)
    if getattr(args, "fast_exit", False):
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    console()
