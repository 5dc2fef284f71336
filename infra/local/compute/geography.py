"""Which regions and zones exist: Compute Engine answers 404 for a zone or region it does not have
(``projects/<p>/zones/us-east5-z``), on every method under it, as it does for any missing resource.

The table is the public regions that offer TPUs or that tests name (Nov 2026); a zone named in the
fake's configured capacity (``/_fake/capacity``) exists too, so a test may invent one on purpose.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from infra.local.compute import exceptions as cexc

REGIONS: dict[str, str] = {  # region -> its zones' suffixes
    "asia-east1": "abc", "asia-northeast1": "abc", "asia-southeast1": "abc", "europe-west1": "bcd",
    "europe-west4": "abc", "us-central1": "abcf", "us-central2": "abcd", "us-east1": "bcd", "us-east4": "abc",
    "us-east5": "abc", "us-south1": "abc", "us-west1": "abc", "us-west4": "abc",
}  # fmt: skip
ZONES = tuple(f"{r}-{s}" for r, suffixes in sorted(REGIONS.items()) for s in suffixes)
# The REST path's location part: /compute/v1/projects/<p>/(zones|regions)/<name>[/...]
_SCOPE_RE = re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)/(?P<kind>zones|regions)/(?P<name>[^/]+)")


def zones(extra: Iterable[str] = ()) -> list[str]:
    """Every zone that exists: the table's and ``extra`` (configured ones)."""
    return sorted({*ZONES, *extra})


def zones_of(region: str, extra: Iterable[str] = ()) -> list[str]:
    return [z for z in zones(extra) if z.rsplit("-", 1)[0] == region]


def regions(extra: Iterable[str] = ()) -> list[str]:
    return sorted({z.rsplit("-", 1)[0] for z in zones(extra)})


def check_path(path: str, extra: Iterable[str] = ()) -> None:
    """404 (``projects/<p>/zones/<z>`` was not found) if ``path`` is under a zone or region that does not exist."""
    m = _SCOPE_RE.match(path)
    if m is None:
        return
    name, known = m.group("name"), extra
    exists = name in zones(known) if m.group("kind") == "zones" else name in regions(known)
    if not exists:
        raise cexc.not_found(f"projects/{m.group('project')}/{m.group('kind')}/{name}")
