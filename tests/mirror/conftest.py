"""Fixtures for mirror tests: real clients on the local stack, fresh buckets, request counters."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from tpu_ops.mirror.engine import make_clients
from tpu_ops.settings import Settings
from tpu_ops.specs.jobs import MirrorSpec


@dataclass
class Env:
    """Fresh source and destination buckets on the stack, with counting clients."""

    settings: Settings
    s3: Any
    gcs: Any
    src_bucket: str
    dst_bucket: str
    s3_calls: Counter[str] = field(default_factory=Counter)
    gcs_calls: list[str] = field(default_factory=list)

    @property
    def src(self) -> str:
        return f"s3://{self.src_bucket}/data"

    @property
    def dst(self) -> str:
        return f"gs://{self.dst_bucket}/mirror"

    def spec(self, **kw: Any) -> MirrorSpec:
        return MirrorSpec(source=self.src, destination=self.dst, **kw)

    def put(self, rel: str, body: bytes) -> dict[str, Any]:
        return self.s3.put_object(Bucket=self.src_bucket, Key=f"data/{rel}", Body=body)

    def put_multipart(self, rel: str, parts: list[bytes]) -> str:
        key = f"data/{rel}"
        up = self.s3.create_multipart_upload(Bucket=self.src_bucket, Key=key)
        done = []
        for i, body in enumerate(parts, 1):
            r = self.s3.upload_part(Bucket=self.src_bucket, Key=key, UploadId=up["UploadId"], PartNumber=i, Body=body)
            done.append({"PartNumber": i, "ETag": r["ETag"]})
        r = self.s3.complete_multipart_upload(
            Bucket=self.src_bucket, Key=key, UploadId=up["UploadId"], MultipartUpload={"Parts": done}
        )
        return str(r["ETag"])

    def dest_names(self) -> list[str]:
        return sorted(b.name for b in self.gcs.list_blobs(self.dst_bucket))

    def dest_bytes(self, rel: str) -> bytes:
        data: bytes = self.gcs.bucket(self.dst_bucket).blob(f"mirror/{rel}").download_as_bytes()
        return data

    def manifests(self) -> list[str]:
        return [n for n in self.dest_names() if "/_tpu_ops/manifests/" in n]

    def reset_counts(self) -> None:
        self.s3_calls.clear()
        self.gcs_calls.clear()


@pytest.fixture
def env(stack: Any) -> Env:
    settings = stack.settings()
    s3, gcs = make_clients(settings, 8)
    tag = uuid.uuid4().hex[:10]
    e = Env(settings, s3, gcs, f"src-{tag}", f"dst-{tag}")
    s3.create_bucket(Bucket=e.src_bucket)
    gcs.create_bucket(e.dst_bucket)

    def count_s3(event_name: str, **_: Any) -> None:
        e.s3_calls[event_name.rsplit(".", 1)[-1]] += 1

    s3.meta.events.register("before-send.s3", count_s3)

    def count_gcs(resp: Any, *args: Any, **kw: Any) -> Any:
        e.gcs_calls.append(f"{resp.request.method} {resp.request.path_url.split('?')[0]}")
        return resp

    gcs._http.hooks["response"].append(count_gcs)
    return e
