"""The ``tpu-ops`` command.

Each subcommand lives in a module of ``flows/commands/`` that exposes ``register(sub)``; heavy
imports (Prefect, cloud SDKs) stay inside the handlers so ``--help`` and ``validate`` start fast.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

import flows.commands as _commands
from tpu_ops.errors import SpecError, TpuOpsError


def build_parser() -> argparse.ArgumentParser:
    """The full parser, with every subcommand module registered."""
    parser = argparse.ArgumentParser(
        prog="tpu-ops",
        description="Mirror datasets S3→GCS, provision TPU slices, train with resume, export to "
        "SageMaker, all audited. Run `tpu-ops COMMAND --help` for each command.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(_commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"flows.commands.{info.name}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
