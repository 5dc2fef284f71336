"""Our fix to moto's ListObjectVersions: no body is copied, the answer is unchanged."""

from __future__ import annotations

import gc
import os
import uuid

from moto.s3.models import FakeKey

from infra.local import moto_patches
from tpu_ops.mirror.engine import make_clients, mirror
from tpu_ops.specs.jobs import MirrorSpec


def test_versioned_no_change_mirror_copies_no_body_and_listing_stays_correct(stack, monkeypatch):
    assert moto_patches.applied()
    settings = stack.settings()
    s3, gcs = make_clients(settings, 4)
    tag = uuid.uuid4().hex[:8]
    src, dst = f"lov-{tag}", f"lov-dst-{tag}"
    s3.create_bucket(Bucket=src)
    s3.put_bucket_versioning(Bucket=src, VersioningConfiguration={"Status": "Enabled"})
    gcs.create_bucket(dst)
    old, new = os.urandom(3 * 2**20), os.urandom(3 * 2**20)
    s3.put_object(Bucket=src, Key="d/a.bin", Body=old)
    s3.put_object(Bucket=src, Key="d/a.bin", Body=new)
    s3.put_object(Bucket=src, Key="d/b.bin", Body=b"b")
    s3.put_object(Bucket=src, Key="d/gone.bin", Body=b"g")
    s3.delete_object(Bucket=src, Key="d/gone.bin")  # now a delete marker over that version
    spec = MirrorSpec(source=f"s3://{src}/d", destination=f"gs://{dst}/m")
    assert mirror(spec, settings, clients=(s3, gcs)).objects_copied == 2

    # Stock moto deep-copies every stored version per page: FakeKey.__getstate__ reads each body.
    copied_bodies = []
    real = FakeKey.__getstate__
    monkeypatch.setattr(FakeKey, "__getstate__", lambda self: copied_bodies.append(self.name) or real(self))
    again = mirror(spec, settings, clients=(s3, gcs))
    assert (again.objects_copied, again.objects_skipped) == (0, 2)
    assert copied_bodies == []

    listed = s3.list_object_versions(Bucket=src, Prefix="d/")
    latest = {(v["Key"], v["IsLatest"]) for v in listed["Versions"]}
    assert latest == {("d/a.bin", True), ("d/a.bin", False), ("d/b.bin", True), ("d/gone.bin", False)}
    assert [(m["Key"], m["IsLatest"]) for m in listed["DeleteMarkers"]] == [("d/gone.bin", True)]
    gc.collect()  # the listing's views are gone; the stored bodies must still be readable
    versions = {v["VersionId"]: v["IsLatest"] for v in listed["Versions"] if v["Key"] == "d/a.bin"}
    for vid, is_latest in versions.items():
        body = s3.get_object(Bucket=src, Key="d/a.bin", VersionId=vid)["Body"].read()
        assert body == (new if is_latest else old)


NAMES = ["a", "a/b", "a/b/c", "a-b", "a0", "b/x", "b/y/z", "b/y/zz", "c", "c/", "d/e", "d/f"]


def _pages(list_v2, backend, bucket, **kw):
    """Every page's names (keys and common prefixes), following continuation tokens."""
    out, token = [], None
    while True:
        keys, truncated, token = list_v2(backend, bucket, kw.get("prefix"), kw.get("delimiter"), token,
                                         kw.get("start_after"), kw.get("max_keys", 1000))  # fmt: skip
        out.append([k if isinstance(k, str) else k.name for k in keys])
        if not truncated:
            return out


def test_paged_list_objects_v2_returns_what_stock_moto_returns(stack):
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import S3Backend, s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    bucket_name = f"lv2-{uuid.uuid4().hex[:8]}"
    backend.create_bucket(bucket_name, "us-east-1")
    stack.aws.put_objects(bucket_name, [(n, n.encode()) for n in NAMES])
    backend.delete_object(bucket_name, "c")  # unversioned: gone
    bucket = backend.get_bucket(bucket_name)
    cases = [{}, {"max_keys": 1}, {"max_keys": 2, "delimiter": "/"}, {"prefix": "b/", "delimiter": "/", "max_keys": 1},
             {"prefix": "a", "max_keys": 3}, {"start_after": "a0", "max_keys": 2},
             {"delimiter": "/", "start_after": "b/"}, {"prefix": "zz"}, {"max_keys": 0}]  # fmt: skip
    for kw in cases:
        ours = _pages(S3Backend.list_objects_v2, backend, bucket, **kw)
        assert ours == _pages(moto_patches.STOCK["list_objects_v2"], backend, bucket, **kw), kw
    stack.aws.put_objects(bucket_name, [("a/new", b"n")])  # the cached order follows new names
    assert ["a/new"] in _pages(S3Backend.list_objects_v2, backend, bucket, prefix="a/n", max_keys=1)


def test_timestamps_serialise_as_stock_moto_does(stack):
    from moto.core.serialize import TimestampSerializer

    ts = TimestampSerializer("iso8601")
    values = ["2026-11-23T07:29:18.123456Z", "2026-11-23T07:29:18Z", "2026-11-23T07:29:18+00:00",
              "2026-11-23T07:29:18.000Z", "1700000000", 1700000000]  # fmt: skip
    for fmt in ("iso8601", "rfc822", "unixtimestamp", "iso8601_zeroed"):
        for v in values:
            assert ts._convert_timestamp_to_str(v, fmt) == moto_patches.STOCK["timestamp"](ts, v, fmt), (v, fmt)
