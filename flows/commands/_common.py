"""What the command modules share: settings from the environment, printing text or JSON, index arguments."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any


def shell_settings() -> Any:
    """``Settings`` for a command run from a shell (the environment; no credential blocks)."""
    from flows.settings import resolve_settings

    return resolve_settings()


def show(obj: dict[str, Any], as_json: bool, text: str) -> None:
    """Print ``obj`` as JSON when asked, else the human-readable ``text``."""
    print(json.dumps(obj, indent=2, default=str) if as_json else text)


def index_arg(what: str) -> Callable[[str], int]:
    """An argparse ``type`` for a ``what`` number (a worker, a slice): 0 or more, else one line saying so."""

    def parse(text: str) -> int:
        if not text.isdigit():
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed: a {what} number, 0 or more")
        return int(text)

    return parse
