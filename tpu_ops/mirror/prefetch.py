"""List the S3 source in a child process, started before the caller has even loaded its settings.

A no-change run of ``tpu-ops mirror`` is mostly start-up: importing pydantic, boto3 and
google-cloud-storage and building clients, each a few tenths of a second of CPU. The CLI starts
this child first thing, so the boto3 half (import, client, listing) runs on another core while
the parent validates its arguments and sets up GCS; a run that finds nothing to copy never imports
boto3 in the parent at all. The child runs the same ``list_source`` as the in-process path; if it
fails for any reason the caller lists in-process, which raises the proper error.

    python -m tpu_ops.mirror.prefetch s3://bucket/prefix   # Settings from the environment
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING

from tpu_ops.mirror.records import SourceObject

if TYPE_CHECKING:
    from tpu_ops.mirror.listing import SourceListing


class SourcePrefetch:
    """A child listing one S3 prefix with the caller's environment; ``result()`` gives the listing."""

    def __init__(self, source_uri: str) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tpu_ops.mirror.prefetch", source_uri],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )

    def result(self, timeout_s: float = 300.0) -> SourceListing | None:
        """The child's listing, or ``None`` if it failed (the caller then lists in-process)."""
        from tpu_ops.mirror.listing import SourceListing

        try:
            out, _ = self._proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.cancel()
            return None
        if self._proc.returncode != 0 or not out:
            return None
        doc = json.loads(out)
        return SourceListing(doc["versioned"], [SourceObject(*row) for row in doc["objects"]])

    def cancel(self) -> None:
        """Stop the child if it is still running."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.communicate()


def main(argv: list[str]) -> int:
    """Print the listing of ``argv[0]`` as JSON; exit 1 on any error."""
    from tpu_ops.cloud.clients import boto3_client
    from tpu_ops.mirror.listing import list_source
    from tpu_ops.settings import Settings
    from tpu_ops.uris import parse_s3

    try:
        listing = list_source(boto3_client(Settings(), "s3", text_timestamps=True), parse_s3(argv[0]))
    except Exception:  # the parent lists again in-process and reports the error properly
        return 1
    rows = [[o.rel, o.size, o.etag, o.version_id] for o in listing.objects]
    json.dump({"versioned": listing.versioned, "objects": rows}, sys.stdout, separators=(",", ":"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
