"""List the S3 source in a child process, started before the caller has even loaded its settings.

A no-change run of ``tpu-ops mirror`` is mostly start-up: importing pydantic, botocore and
google-cloud-storage and building clients, each a few tenths of a second of CPU. The CLI starts
this child first thing: it imports botocore and loads the S3 models on another core while the
parent loads its settings, then takes the client parameters from the parent through its stdin
(credentials never travel in argv or the environment), lists, prints the listing and leaves. A
run that finds nothing to copy never imports botocore in the parent at all. The child runs the
same ``list_source`` as the in-process path; if it fails for any reason, or is never handed its
parameters, the caller lists in-process, which raises the proper error.

    python -m tpu_ops.mirror.prefetch s3://bucket/prefix < params.json   # see clients.aws_params
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from typing import IO, TYPE_CHECKING

from tpu_ops.mirror.records import SourceObject

if TYPE_CHECKING:
    from tpu_ops.mirror.listing import SourceListing
    from tpu_ops.settings import Settings


class SourcePrefetch:
    """A child listing one S3 prefix; ``configure(settings)`` hands it its client, ``result()`` the listing."""

    def __init__(self, source_uri: str) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tpu_ops.mirror.prefetch", source_uri],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self._stdin: IO[bytes] | None = self._proc.stdin

    def configure(self, settings: Settings) -> None:
        """Send the child its S3 client parameters (once; later calls do nothing)."""
        from tpu_ops.cloud.clients import aws_params

        if self._stdin is None:
            return
        # A child already gone makes result() report None, and the caller lists itself.
        with contextlib.suppress(OSError):
            self._stdin.write(json.dumps(aws_params(settings)).encode())
        self._close_stdin()

    def _close_stdin(self) -> None:
        if self._stdin is not None:
            with contextlib.suppress(OSError):
                self._stdin.close()
            self._stdin = self._proc.stdin = None

    def result(self, timeout_s: float = 300.0) -> SourceListing | None:
        """The child's listing, or ``None`` if it failed (the caller then lists in-process)."""
        from tpu_ops.mirror.listing import SourceListing

        self._close_stdin()  # never configured: the child reads EOF and gives up
        assert self._proc.stdout is not None
        try:
            out = self._proc.stdout.read()
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.cancel()
            return None
        if self._proc.returncode != 0 or not out:
            return None
        doc = json.loads(out)
        return SourceListing(doc["versioned"], [SourceObject(*row) for row in doc["objects"]])

    def cancel(self) -> None:
        """Stop the child if it is still running."""
        self._close_stdin()
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.communicate()  # reaps it and closes its stdout


def main(argv: list[str]) -> int:
    """Print the listing of ``argv[0]`` as JSON, with client parameters read from stdin; 1 on any error."""
    try:
        from botocore.session import get_session

        from tpu_ops.cloud.clients import aws_client
        from tpu_ops.mirror.listing import list_source
        from tpu_ops.uris import parse_s3

        # Load S3's models while the parent is still loading its settings.
        session = get_session()
        loader = session.get_component("data_loader")
        loader.load_service_model("s3", "service-2")
        loader.load_service_model("s3", "endpoint-rule-set-1")
        params = json.loads(sys.stdin.read() or "null")
        if not params:
            return 1
        client = aws_client(params, "s3", session=session, text_timestamps=True)
        listing = list_source(client, parse_s3(argv[0]))
    except Exception:  # the parent lists again in-process and reports the error properly
        return 1
    rows = [[o.rel, o.size, o.etag, o.version_id] for o in listing.objects]
    json.dump({"versioned": listing.versioned, "objects": rows}, sys.stdout, separators=(",", ":"))
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)  # no interpreter teardown: the parent is waiting for our exit
