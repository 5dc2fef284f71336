"""The mirror end to end on the local stack (moto S3 + fake-gcs-server), with real SDK clients."""

from __future__ import annotations

import json
import os

import pytest
from mirror_helpers import safetensors_bytes

from tpu_ops.errors import IntegrityError, PolicyError, SourceChangedError, SpecError
from tpu_ops.mirror import strategies
from tpu_ops.mirror.engine import mirror
from tpu_ops.mirror.manifest import load

MiB = 1024 * 1024
SCHEMA = b"""
version: 1
shards:
  - pattern: "train/*.safetensors"
    tensors:
      - {name: tokens, dtype: int32, shape: [null, 8]}
      - {name: emb, dtype: bfloat16, shape: [4, 16]}
"""


def _good_shard(rows: int = 32, fill: int = 0) -> bytes:
    return safetensors_bytes({"tokens": ("I32", [rows, 8]), "emb": ("BF16", [4, 16])}, fill=fill)


def _dataset(env, n_small: int = 6) -> dict[str, bytes]:
    files = {"_schema.yaml": SCHEMA, "README.md": b"curated"}
    for i in range(n_small):
        files[f"train/{i:03d}.safetensors"] = _good_shard(rows=16 + i, fill=i)
    for rel, body in files.items():
        env.put(rel, body)
    return files


@pytest.fixture(params=["streamed", "composed"])
def large(request) -> dict[str, int]:
    """Spec fields for both ways a large object is copied: one GET streamed into one upload, or
    parallel ranged parts (4 MiB) composed."""
    return {"part_size_mib": 4, "ranged_min_mib": 256 if request.param == "streamed" else 9}


def test_full_then_no_change_run_costs_no_per_object_requests(env, large):
    files = _dataset(env)
    big = [os.urandom(5 * MiB), os.urandom(5 * MiB), os.urandom(3 * MiB)]  # 13 MiB: streamed, or 4 parts
    env.put_multipart("blob/big.bin", big)
    files["blob/big.bin"] = b"".join(big)

    first = mirror(env.spec(**large), env.settings, clients=(env.s3, env.gcs))
    assert first.objects_copied == len(files) and first.bytes_copied == sum(map(len, files.values()))
    assert first.shards_validated == 6 and first.schema_file == "_schema.yaml"
    for rel, body in files.items():
        assert env.dest_bytes(rel) == body, rel
    assert not [n for n in env.dest_names() if "/_tpu_ops/parts/" in n], "temporary parts are cleaned up"

    # The manifest is the last thing written (fake-gcs-server generations are increasing timestamps).
    blobs = {b.name: b for b in env.gcs.list_blobs(env.dst_bucket)}
    manifest_name = first.manifest_uri.split(f"gs://{env.dst_bucket}/", 1)[1]
    assert blobs[manifest_name].generation > max(b.generation for n, b in blobs.items() if n != manifest_name)
    doc = load(env.gcs, first.manifest_uri)
    assert doc["snapshot_id"] == first.snapshot_id and doc["totals"]["objects"] == len(files)
    assert {o["key"] for o in doc["objects"]} == set(files)

    env.reset_counts()
    again = mirror(env.spec(**large), env.settings, clients=(env.s3, env.gcs))
    assert (again.objects_copied, again.bytes_copied, again.objects_skipped) == (0, 0, len(files))
    assert again.snapshot_id == first.snapshot_id and again.manifest_uri == first.manifest_uri
    # One versioning check and one listing page on S3; one listing page and the create-only
    # manifest write (refused: it exists) on GCS. No HEAD or GET per object.
    assert dict(env.s3_calls) == {"GetBucketVersioning": 1, "ListObjectsV2": 1}
    assert len(env.gcs_calls) == 2, env.gcs_calls
    assert env.gcs_calls[0].startswith("GET ") and env.gcs_calls[0].endswith(f"/b/{env.dst_bucket}/o")


def test_bad_shards_fail_validation_by_name_and_nothing_is_copied(env):
    _dataset(env, n_small=3)
    env.put("train/wrong-dtype.safetensors", safetensors_bytes({"tokens": ("I32", [2, 8]), "emb": ("F32", [4, 16])}))
    whole = _good_shard()
    env.put("train/truncated.safetensors", whole[:40])  # the header is cut off
    with pytest.raises(SpecError) as err:
        mirror(env.spec(), env.settings, clients=(env.s3, env.gcs))
    msg = str(err.value)
    assert "2 of 5 shard(s)" in msg
    assert "train/wrong-dtype.safetensors" in msg and "dtype F32, schema says BF16" in msg
    assert "train/truncated.safetensors" in msg and "truncated header" in msg
    assert {e["shard"] for e in err.value.errors} == {"train/wrong-dtype.safetensors", "train/truncated.safetensors"}
    assert env.dest_names() == []


def test_corrupted_upload_is_retried_then_caught(env, large):
    files = _dataset(env, n_small=2)
    env.put("blob/big.bin", os.urandom(9 * MiB))  # a large object (streamed, or in parts) too

    flipped: list[str] = []

    def flip_once(rel: str, data: bytes) -> bytes:
        if rel not in flipped and data:
            flipped.append(rel)
            return bytes([data[0] ^ 0xFF]) + data[1:]
        return data

    res = mirror(env.spec(**large), env.settings, clients=(env.s3, env.gcs), fault=flip_once)
    assert set(flipped) == {*files, "blob/big.bin"} and res.objects_copied == len(files) + 1
    for rel, body in files.items():
        assert env.dest_bytes(rel) == body

    def always(rel: str, data: bytes) -> bytes:
        return bytes([data[0] ^ 0xFF]) + data[1:] if rel == "README.md" and data else data

    env.put("README.md", b"changed, so it is copied again")
    before = env.manifests()
    with pytest.raises(IntegrityError, match=r"README.md.*after 3 attempts"):
        mirror(env.spec(), env.settings, clients=(env.s3, env.gcs), fault=always)
    assert env.manifests() == before, "no snapshot commits an unverified object"
    # The bad copy left behind is not taken as up to date: the next clean run copies it again.
    res = mirror(env.spec(), env.settings, clients=(env.s3, env.gcs))
    assert res.objects_copied == 1 and env.dest_bytes("README.md") == b"changed, so it is copied again"


def test_same_size_overwrite_of_a_multipart_object_is_recopied(env):
    env.put("_schema.yaml", b"version: 1\nshards: []\n")
    one = [os.urandom(5 * MiB), os.urandom(1 * MiB)]
    etag1 = env.put_multipart("big.bin", one)
    first = mirror(env.spec(), env.settings, clients=(env.s3, env.gcs))
    two = [os.urandom(5 * MiB), os.urandom(1 * MiB)]  # same size, same part layout
    etag2 = env.put_multipart("big.bin", two)
    assert etag1 != etag2 and etag1.endswith('-2"')
    second = mirror(env.spec(), env.settings, clients=(env.s3, env.gcs))
    assert second.objects_copied == 1 and second.objects_skipped == 1
    assert env.dest_bytes("big.bin") == b"".join(two)
    assert second.snapshot_id != first.snapshot_id


def test_source_change_mid_run_is_detected_unversioned(env):
    for i in range(6):
        env.put(f"f{i}.bin", bytes([i]) * 1000)

    def overwrite_later_object(p):
        if p.phase == "copy" and p.objects_done == 1:
            for i in range(6):  # whichever are not copied yet now differ from the listing
                env.put(f"f{i}.bin", b"NEW" * 500)

    spec = env.spec(concurrency=1)
    with pytest.raises(SourceChangedError, match="changed or vanished during the run"):
        mirror(spec, env.settings, progress=overwrite_later_object, clients=(env.s3, env.gcs))
    assert env.manifests() == []
    res = mirror(spec, env.settings, clients=(env.s3, env.gcs))  # the re-run mirrors the new state
    doc = load(env.gcs, res.manifest_uri)
    assert all(env.dest_bytes(o["key"]) == b"NEW" * 500 for o in doc["objects"])


def test_source_change_mid_run_never_leaks_versioned(env):
    env.s3.put_bucket_versioning(Bucket=env.src_bucket, VersioningConfiguration={"Status": "Enabled"})
    for i in range(6):
        env.put(f"f{i}.bin", bytes([i]) * 1000)

    def overwrite(p):
        if p.phase == "copy" and p.objects_done == 1:
            for i in range(6):
                env.put(f"f{i}.bin", b"NEW" * 500)

    res = mirror(env.spec(concurrency=1), env.settings, progress=overwrite, clients=(env.s3, env.gcs))
    doc = load(env.gcs, res.manifest_uri)
    assert doc["source_versioned"] is True
    for o in doc["objects"]:  # exactly the listed versions, all of them
        i = int(o["key"][1])
        assert env.dest_bytes(o["key"]) == bytes([i]) * 1000
        assert o["source_version"] and o["size"] == 1000


def test_disallowed_bucket_location_is_refused(env):
    env.put("a.bin", b"x")
    location = env.gcs.get_bucket(env.dst_bucket).location
    with pytest.raises(PolicyError, match="data residency"):
        mirror(env.spec(allowed_locations=["EUROPE-WEST4"]), env.settings, clients=(env.s3, env.gcs))
    assert env.dest_names() == []
    res = mirror(env.spec(allowed_locations=[location]), env.settings, clients=(env.s3, env.gcs))
    assert res.objects_copied == 1


@pytest.mark.parametrize("bad", ["data/../escape.bin", "data/x/./y.bin", "data/ctl\x01.bin", "data/_tpu_ops/x"])
def test_unsafe_keys_are_refused(env, bad):
    env.put("ok.bin", b"x")
    env.s3.put_object(Bucket=env.src_bucket, Key=bad, Body=b"y")
    assert any(o["Key"] == bad for o in env.s3.list_objects_v2(Bucket=env.src_bucket)["Contents"])
    with pytest.raises(PolicyError, match="unsafe source key"):
        mirror(env.spec(), env.settings, clients=(env.s3, env.gcs))
    assert env.dest_names() == []


def test_snapshot_names_are_immutable_and_ids_content_derived(env):
    env.put("a.bin", b"x")
    r1 = mirror(env.spec(snapshot="day-1"), env.settings, clients=(env.s3, env.gcs))
    r2 = mirror(env.spec(snapshot="day-1"), env.settings, clients=(env.s3, env.gcs))
    assert r1.snapshot_id == r2.snapshot_id
    pointer = env.gcs.bucket(env.dst_bucket).blob("mirror/_tpu_ops/snapshots/day-1.json").download_as_bytes()
    assert json.loads(pointer)["manifest"] == r1.manifest_uri
    env.put("a.bin", b"y")
    with pytest.raises(PolicyError, match="immutable"):
        mirror(env.spec(snapshot="day-1"), env.settings, clients=(env.s3, env.gcs))


def test_copies_are_checked_against_s3_full_object_checksums(env):
    """botocore sends its default CRC32 with each PUT and moto returns it on GET: a small and a
    streamed object are checked against it (their reads meet the end of the body); a multipart
    object has no full-object checksum."""
    env.put("_schema.yaml", b"version: 1\nshards: []\n")
    env.put("big.bin", os.urandom(9 * MiB))
    env.put_multipart("parts.bin", [os.urandom(5 * MiB), os.urandom(1 * MiB)])
    head = env.s3.head_object(Bucket=env.src_bucket, Key="data/big.bin", ChecksumMode="ENABLED")
    assert head.get("ChecksumCRC32"), "the emulator keeps the PUT's checksum"
    res = mirror(env.spec(), env.settings, clients=(env.s3, env.gcs))
    assert res.objects_copied == 3
    assert res.objects_s3_checksum_verified == 2


@pytest.mark.parametrize("size", [1 * MiB, 9 * MiB], ids=["small", "streamed"])
def test_bytes_that_do_not_match_s3s_checksum_fail_the_run(env, size):
    """Rot inside S3 itself: the stored bytes change under an unchanged ETag and checksum (moto
    runs in this process, so its stored object is altered directly). The end-of-body check
    catches it, the copy is retried, then the run fails and commits nothing."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    env.put("_schema.yaml", b"version: 1\nshards: []\n")
    env.put("blob.bin", os.urandom(size))
    key = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].buckets[env.src_bucket].keys["data/blob.bin"]
    etag = key.etag  # computed and kept: only the bytes change
    data = key.value
    key.value = bytes([data[0] ^ 0xFF]) + data[1:]
    assert key.etag == etag
    with pytest.raises(IntegrityError, match=r"blob.bin.*S3's checksum.*after 3 attempts"):
        mirror(env.spec(), env.settings, clients=(env.s3, env.gcs))
    assert env.manifests() == []


def test_a_source_without_its_schema_is_refused_when_required(env):
    env.put("train/000.safetensors", _good_shard())
    with pytest.raises(PolicyError, match=r"_schema.yaml does not exist and require_schema is set"):
        mirror(env.spec(require_schema=True), env.settings, clients=(env.s3, env.gcs))
    assert env.dest_names() == []
    res = mirror(env.spec(), env.settings, clients=(env.s3, env.gcs))  # the default warns and copies
    assert res.objects_copied == 1 and res.schema_file is None


def test_edge_objects_are_copied_exactly(env):
    """An empty object, names with spaces and non-ASCII letters, and sizes either side of the
    in-memory limit: each one byte for byte, and a re-run copies none of them again."""
    files = {
        "_schema.yaml": b"version: 1\nshards: []\n",
        "empty.bin": b"",
        "dir with space/ünïcødé ✓.bin": os.urandom(1000),
        "limit/at.bin": os.urandom(strategies.SMALL_MAX),
        "limit/over.bin": os.urandom(strategies.SMALL_MAX + 1),
    }
    for rel, body in files.items():
        env.put(rel, body)
    res = mirror(env.spec(), env.settings, clients=(env.s3, env.gcs))
    assert res.objects_copied == len(files) and res.bytes_copied == sum(map(len, files.values()))
    for rel, body in files.items():
        assert env.dest_bytes(rel) == body, rel
    again = mirror(env.spec(), env.settings, clients=(env.s3, env.gcs))
    assert again.objects_copied == 0 and again.snapshot_id == res.snapshot_id
