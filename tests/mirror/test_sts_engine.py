"""The Storage Transfer Service engine on the local stack (moto + fake-gcs-server + the fake STS)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from tpu_ops.errors import AccessDeniedError, CloudError
from tpu_ops.mirror.engine import mirror
from tpu_ops.mirror.manifest import load
from tpu_ops.specs.jobs import MirrorSpec

ROOT = Path(__file__).resolve().parents[2]
SECRET = "sts-test-secret-key-0123456789"


def _spec(env, folder: str) -> MirrorSpec:
    return MirrorSpec(source=env.src, destination=f"gs://{env.dst_bucket}/{folder}", engine="auto")


def _versioned_source(env) -> dict[str, bytes]:
    env.s3.put_bucket_versioning(Bucket=env.src_bucket, VersioningConfiguration={"Status": "Enabled"})
    files = {f"train/{i:02d}.bin": os.urandom(3000 + i) for i in range(5)}
    env.put("train/00.bin", b"an older version STS must not be mistaken for")
    files["blob/multi.bin"] = b"".join([os.urandom(5 * 1024 * 1024), os.urandom(1000)])
    for rel, body in files.items():
        if rel != "blob/multi.bin":
            env.put(rel, body)
    env.put_multipart("blob/multi.bin", [files["blob/multi.bin"][: 5 * 1024 * 1024], files["blob/multi.bin"][-1000:]])
    return files


def _cli(stack, *args: str) -> dict:
    env = {**os.environ, **stack.env(), "PYTHONPATH": str(ROOT), "TPU_OPS_POLL_INTERVAL_S": "0.05"}
    env["TPU_OPS_AWS_SECRET_ACCESS_KEY"] = SECRET  # moto takes any secret; this one is easy to look for
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "mirror", *args, "--json"],
        cwd=ROOT, env=env, capture_output=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert SECRET.encode() not in proc.stderr + proc.stdout  # the AWS key handed to STS is never logged
    return dict(json.loads(proc.stdout))


def test_sts_engine_mirrors_a_versioned_source_to_the_same_snapshot_as_the_local_engine(env, stack):
    files = _versioned_source(env)
    first = _cli(stack, env.src, env.dst, "--engine", "sts")
    assert first["engine"] == "sts" and first["objects_copied"] == len(files) and first["source_versioned"]
    for rel, body in files.items():
        assert env.dest_bytes(rel) == body, rel
    assert stack.sts_backend.state()["jobs"] == 1
    # Verified against S3 (size + MD5 ETag or CRC32C) and labelled, so the next run copies nothing.
    again = _cli(stack, env.src, env.dst, "--engine", "sts")
    assert (again["objects_copied"], again["objects_skipped"]) == (0, len(files))
    assert again["manifest_uri"] == first["manifest_uri"] and stack.sts_backend.state()["jobs"] == 1

    local_dst = f"gs://{env.dst_bucket}/by-local"
    local = mirror(MirrorSpec(source=env.src, destination=local_dst), env.settings, clients=(env.s3, env.gcs))
    assert local.engine == "local" and local.snapshot_id == first["snapshot_id"]  # same rows, same id
    by_sts, by_local = load(env.gcs, first["manifest_uri"]), load(env.gcs, local.manifest_uri)
    differ = {k for k in by_sts if by_sts[k] != by_local[k]}
    assert differ == {"destination", "created_at"} or differ == {"destination"}
    assert not [n for n in env.dest_names() if "/_tpu_ops/sts/" in n]  # the transfer list is cleaned up


def test_a_failed_object_fails_the_run_by_name_and_commits_nothing(env, stack):
    files = _versioned_source(env)
    stack.sts_backend.fail_object(f"s3://{env.src_bucket}/data/train/03.bin", "DATA_LOSS", "checksum mismatch")
    settings = env.settings.model_copy(update={"poll_interval_s": 0.05})
    with pytest.raises(CloudError, match=r"train/03\.bin") as err:
        mirror(env.spec(engine="sts"), settings, clients=(env.s3, env.gcs))
    assert "DATA_LOSS" in str(err.value) and "nothing was committed" in str(err.value)
    assert env.manifests() == []
    assert stack.sts_backend.state()["jobs"] == 1 and not stack.sts_backend.list_jobs({"projectId": stack.project})
    assert len(files) == 6


def test_permission_denied_on_the_source_is_an_access_error_naming_the_bucket(env, stack, caplog):
    env.put("a.bin", b"a")
    stack.sts_backend.deny_bucket(env.src_bucket)
    settings = env.settings.model_copy(update={"poll_interval_s": 0.05, "aws_secret_access_key": SecretStr(SECRET)})
    caplog.set_level(logging.DEBUG)
    with pytest.raises(AccessDeniedError, match=env.src_bucket) as err:
        mirror(env.spec(engine="sts"), settings, clients=(env.s3, env.gcs))
    assert "s3:GetObject" in str(err.value) and env.manifests() == []
    assert stack.sts_backend.jobs  # the key went to STS ...
    assert SECRET not in caplog.text  # ... and appears in no log line, even at DEBUG


def test_auto_picks_sts_from_the_threshold_on_and_a_role_arn_replaces_keys(env, stack):
    for i in range(4):
        env.put(f"o{i}.bin", os.urandom(100))
    role = "arn:aws:iam::123456789012:role/tpu-ops-sts-reader"
    low = env.settings.model_copy(
        update={"mirror_sts_min_objects": 4, "poll_interval_s": 0.05, "sts_aws_role_arn": role}
    )
    below = mirror(_spec(env, "a"), env.settings, clients=(env.s3, env.gcs))
    seen = []
    above = mirror(_spec(env, "b"), low, seen.append, clients=(env.s3, env.gcs))
    copy = [(p.objects_done, p.bytes_done) for p in seen if p.phase == "copy"]
    assert copy[0] == (0, 0) and copy[-1] == (4, 400)  # the STS operation's counters are the progress
    assert (below.engine, below.objects_copied) == ("local", 4)
    assert (above.engine, above.objects_copied) == ("sts", 4) and above.snapshot_id == below.snapshot_id
    [job] = stack.sts_backend.jobs.values()
    assert job.body["transferSpec"]["awsS3DataSource"]["roleArn"] == role
    assert "awsAccessKey" not in job.body["transferSpec"]["awsS3DataSource"]
    again = mirror(_spec(env, "b"), low, clients=(env.s3, env.gcs))
    assert (again.engine, again.objects_copied) == ("local", 0)  # nothing planned: no transfer job


def test_an_interrupted_run_cancels_its_transfer_and_commits_nothing(env, stack):
    for i in range(3):
        env.put(f"o{i}.bin", b"x" * 10)
    stack.sts_backend.stall(True)  # the transfer cannot finish before the run is interrupted
    calls = []

    def progress(p):
        calls.append(p.phase)
        if calls.count("copy") == 2:  # the first report from the STS operation's counters
            raise KeyboardInterrupt

    settings = env.settings.model_copy(update={"poll_interval_s": 0.05})
    try:
        with pytest.raises(KeyboardInterrupt):
            mirror(env.spec(engine="sts"), settings, progress, clients=(env.s3, env.gcs))
        assert list(stack.sts_backend.state()["operations"].values()) == ["ABORTED"]
        assert env.manifests() == [] and not stack.sts_backend.list_jobs({"projectId": stack.project})
    finally:
        stack.sts_backend.stall(False)
