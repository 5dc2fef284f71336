"""The mirror's parts on their own: checksumming streams, the GCS writer and reader, the one
module allowed to reach into the GCS SDK's private transport."""

from __future__ import annotations

import hashlib
import io
import os
import re
from pathlib import Path

import google_crc32c
import pytest

from tpu_ops.errors import TransientError
from tpu_ops.mirror import crc
from tpu_ops.mirror.gcs_transport import GcsWriter, open_object
from tpu_ops.mirror.stream import BytesBody, ChecksumStream

ROOT = Path(__file__).resolve().parents[2]


def test_only_gcs_transport_touches_the_sdks_private_transport() -> None:
    private = re.compile(r"\._(http|connection)\b")
    users = sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "tpu_ops").rglob("*.py") if private.search(p.read_text())
    )
    assert users == ["tpu_ops/mirror/gcs_transport.py"]


class _Short(io.BytesIO):
    """A body whose connection closed: read(n) hands back what arrived, then nothing, no error."""

    def __init__(self, data: bytes, cut: int) -> None:
        super().__init__(data[:cut])


def test_checksum_stream_sums_while_reading_and_treats_a_short_body_as_transient() -> None:
    data = os.urandom(3 * 1024 + 7)
    stream = ChecksumStream(io.BytesIO(data), "k", len(data), block=1024, sha256=True)
    assert [len(c) for c in stream] == [1024, 1024, 1024, 7]
    assert stream.crc == google_crc32c.value(data)
    assert stream.sha256 == hashlib.sha256(data).hexdigest()
    with pytest.raises(TransientError, match="ended after 2000 of 3079 bytes"):
        ChecksumStream(_Short(data, 2000), "k", len(data), block=1024).read_all()


def test_gcs_writer_and_reader_stream_a_verified_object(env) -> None:
    data = os.urandom(1024 * 1024 + 3)
    ours = crc.to_b64(google_crc32c.value(data))
    stored = GcsWriter(env.gcs, env.dst_bucket).write("x/obj", BytesBody(data), {"k": "v"}, crc32c=ours)
    assert (stored.size, stored.crc32c) == (len(data), ours) and stored.generation
    raw, size = open_object(env.gcs, env.dst_bucket, "x/obj", stored.generation)
    stream = ChecksumStream(raw, "x/obj", size, block=64 * 1024, sha256=True, service="gcs")
    assert stream.read_all() == data
    assert stream.sha256 == hashlib.sha256(data).hexdigest() and crc.to_b64(stream.crc) == ours
