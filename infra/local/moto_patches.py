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
"""

from __future__ import annotations

import copy as _copy
import threading
import types
from typing import Any

_lock = threading.Lock()
_applied = False


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
        models.copy = shim  # type: ignore[attr-defined]
        _applied = True


def applied() -> bool:
    """Whether moto's ``list_object_versions`` uses the views (for tests)."""
    from moto.s3 import models

    return _applied and hasattr(getattr(models, "copy", None), "ListedVersion")
