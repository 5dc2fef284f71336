"""What the command modules share: settings from the environment, and printing text or JSON."""

from __future__ import annotations

import json
from typing import Any


def shell_settings() -> Any:
    """``Settings`` for a command run from a shell (the environment; no credential blocks)."""
    from flows.settings import resolve_settings

    return resolve_settings()


def show(obj: dict[str, Any], as_json: bool, text: str) -> None:
    """Print ``obj`` as JSON when asked, else the human-readable ``text``."""
    print(json.dumps(obj, indent=2, default=str) if as_json else text)
