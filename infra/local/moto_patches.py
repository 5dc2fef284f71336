"""Fixes to moto's S3 costs that grow with data size, applied when our moto server starts.

Each is reported upstream-style in ``infra/local/README.md``. They change how moto computes a
response, never what it returns.

- ``ListObjectVersions`` deep-copied every version of every key of the bucket, bodies included,
  on every page (``S3Backend.list_object_versions``: ``copy.deepcopy(version_key)`` for all
  keys, only to set ``is_latest`` on the copies). ``FakeKey.__getstate__`` reads the whole body
  and ``__setstate__`` writes it into a new spooled file, so a page cost ~0.3 s per 64 MiB stored.
  The fix hands that function views: objects of a ``FakeKey`` subclass sharing the stored key's
  attributes (no body copy) with their own ``is_latest``, whose finaliser leaves the shared
  buffer alone.
- ``ListObjectsV2`` built, filtered and sorted the whole bucket on every page
  (``S3Backend.list_objects_v2`` -> ``list_objects(..., max_keys=None)``, then a linear scan for
  the continuation token), so listing N keys cost O(N^2 / 1000): 29 s for 20,000 keys. The fix
  keeps each bucket's key names sorted (rebuilt only when the set of names changed, checked in
  C), finds the page's start by bisection and builds only that page's entries.
- Every timestamp moto serialises (``LastModified`` of each listed key) went through
  ``TimestampSerializer._convert_timestamp_to_str`` -> ``parse_to_aware_datetime`` -> dateutil's
  generic parser, ~0.4 ms per key: 0.4 s of every 1,000-key page. An ISO 8601 string (what moto
  stores) is now read with ``datetime.fromisoformat``; anything else takes moto's path.
"""

from __future__ import annotations

import bisect
import copy as _copy
import threading
import types
from typing import Any

_lock = threading.Lock()
_applied = False
STOCK: dict[str, Any] = {}  # moto's own functions, replaced here (tests compare against them)


def _views() -> tuple[type, Any]:
    from moto.s3.models import FakeDeleteMarker, FakeKey

    class ListedVersion(FakeKey):
        """A listing's view of a stored version: its attributes, not a copy of its body."""

        def __init__(self, key: Any) -> None:  # no FakeKey.__init__: nothing is allocated
            self.__dict__.update(key.__dict__)

        def __del__(self) -> None:  # the body buffer belongs to the stored key
            pass

    def view(item: Any) -> Any:
        if isinstance(item, FakeKey):
            return ListedVersion(item)
        if isinstance(item, FakeDeleteMarker):
            marker = object.__new__(FakeDeleteMarker)
            marker.__dict__.update(item.__dict__)
            return marker
        return _copy.deepcopy(item)

    def deepcopy(value: Any, memo: Any = None) -> Any:
        # list_object_versions calls deepcopy(list of versions of one key); anything else is real.
        if isinstance(value, list) and value and all(isinstance(v, FakeKey | FakeDeleteMarker) for v in value):
            return [view(v) for v in value]
        return _copy.deepcopy(value, memo)

    return ListedVersion, deepcopy


def _sorted_names(bucket: Any) -> list[str]:
    """The bucket's key names, sorted; cached on the bucket until the set of names changes."""
    store = bucket.keys
    cached = getattr(bucket, "_tpu_ops_sorted", None)
    if cached is not None and len(cached[1]) == len(store) and dict.keys(store) == cached[0]:
        return list(cached[1])
    names = set(dict.keys(store))
    ordered = sorted(names)
    bucket._tpu_ops_sorted = (names, ordered)
    return ordered


def list_objects_v2(
    self: Any,
    bucket: Any,
    prefix: str | None,
    delimiter: str | None,
    continuation_token: str | None,
    start_after: str | None,
    max_keys: int,
) -> Any:
    """``S3Backend.list_objects_v2`` with the same results, built from the page's keys only."""
    from moto.s3.exceptions import MethodNotAllowed
    from moto.s3.models import FakeDeleteMarker, FakeTableStorageBucket

    if isinstance(bucket, FakeTableStorageBucket):
        raise MethodNotAllowed()
    prefix = prefix or ""
    token = self._pagination_tokens.get(continuation_token) if continuation_token else start_after
    names = _sorted_names(bucket)
    i = bisect.bisect_left(names, prefix)
    if token:
        i = max(i, bisect.bisect_right(names, token))
    items: list[Any] = []
    folders: set[str] = set()
    while i < len(names) and len(items) <= max_keys:
        name = names[i]
        i += 1
        if not name.startswith(prefix):
            break
        rest = name[len(prefix) :]
        if delimiter and delimiter in rest:
            folder = prefix + rest.split(delimiter)[0] + delimiter
            if folder not in folders and (not token or folder > token):
                folders.add(folder)
                items.append(folder)
            continue
        key = dict.get(bucket.keys, name)
        if key and not isinstance(key[-1], FakeDeleteMarker):
            items.append(key[-1])
    return self._truncate_result(items, max_keys)


def _fast_timestamps(stock: Any) -> Any:
    from datetime import UTC, datetime

    def convert(self: Any, value: Any, timestamp_format: str) -> Any:
        if isinstance(value, str) and "T" in value:
            try:
                parsed = datetime.fromisoformat(value)
            except ValueError:
                return stock(self, value, timestamp_format)
            parsed = parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
            return getattr(self, f"_timestamp_{timestamp_format.lower()}")(parsed)
        return stock(self, value, timestamp_format)

    return convert


def apply() -> None:
    """Install the fixes in this process's moto (idempotent)."""
    global _applied
    with _lock:
        if _applied:
            return
        from moto.s3 import models

        listed, deepcopy = _views()
        shim = types.ModuleType("copy", "moto.s3.models' view of copy: shallow views for version listings")
        shim.copy = _copy.copy  # type: ignore[attr-defined]
        shim.deepcopy = deepcopy  # type: ignore[attr-defined]
        shim.ListedVersion = listed  # type: ignore[attr-defined]
        from moto.core.serialize import TimestampSerializer

        STOCK["list_objects_v2"] = models.S3Backend.list_objects_v2
        STOCK["timestamp"] = TimestampSerializer._convert_timestamp_to_str
        TimestampSerializer._convert_timestamp_to_str = _fast_timestamps(STOCK["timestamp"])  # type: ignore[method-assign]
        models.copy = shim  # type: ignore[attr-defined]
        models.S3Backend.list_objects_v2 = list_objects_v2  # type: ignore[method-assign]
        _applied = True


def applied() -> bool:
    """Whether moto's ``list_object_versions`` uses the views (for tests)."""
    from moto.s3 import models

    return (
        _applied
        and hasattr(getattr(models, "copy", None), "ListedVersion")
        and models.S3Backend.list_objects_v2 is list_objects_v2
    )
