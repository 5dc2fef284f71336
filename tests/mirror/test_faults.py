"""Faults injected through real connections (a TCP proxy in front of moto, an endpoint that never
answers), not mocks of botocore: a body cut mid-way is retried; an unreachable S3 fails once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faultproxy import CutProxy, Refuser

from tpu_ops.cloud.clients import boto3_client
from tpu_ops.errors import TransientError
from tpu_ops.mirror.engine import make_clients, mirror
from tpu_ops.mirror.listing import list_source
from tpu_ops.uris import parse_s3

ROOT = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024


def test_a_body_cut_mid_way_is_retried_and_the_run_succeeds(env, stack) -> None:
    small, streamed = os.urandom(2 * MiB), os.urandom(9 * MiB)  # read whole / streamed in blocks
    env.put("small.bin", small)
    env.put("streamed.bin", streamed)
    cut = {f"/{env.src_bucket}/data/small.bin": MiB, f"/{env.src_bucket}/data/streamed.bin": 5 * MiB}
    with CutProxy(int(stack.aws_endpoint.rsplit(":", 1)[1]), cut) as proxy:
        settings = env.settings.model_copy(update={"aws_endpoint_url": proxy.url, "retry_initial_delay_s": 0.01})
        s3, _ = make_clients(settings, 4)
        result = mirror(env.spec(), settings, clients=(s3, env.gcs))
    assert sorted(proxy.cuts) == sorted(cut), "both bodies were really cut"
    assert result.objects_copied == 2
    assert env.dest_bytes("small.bin") == small and env.dest_bytes("streamed.bin") == streamed


def test_an_unreachable_s3_fails_the_cli_in_one_round_of_retries(env, stack) -> None:
    """An S3 endpoint that drops every connection: the run fails with the SDK's clear message after
    as many connections as ONE call makes under the retry policy (the listing is not retried twice)."""
    env.put("a.bin", b"x")
    with Refuser() as probe:  # how many connections one call makes with 3 attempts
        one_call = boto3_client(
            env.settings.model_copy(update={"aws_endpoint_url": probe.url, "retry_attempts": 3}), "s3"
        )
        with pytest.raises(TransientError):
            list_source(one_call, parse_s3(env.src))
        round_size = probe.connections
    assert 3 <= round_size <= 4
    with Refuser() as s3:
        cli_env = {
            **os.environ,
            **stack.env(),
            "PYTHONPATH": str(ROOT),
            "TPU_OPS_AWS_ENDPOINT_URL": s3.url,
            "AWS_ENDPOINT_URL": s3.url,
            "TPU_OPS_RETRY_ATTEMPTS": "3",
        }
        t = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "flows.cli", "mirror", env.src, env.dst, "--json"],
            cwd=ROOT,
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        elapsed = time.monotonic() - t
    assert proc.returncode == 1
    assert f"error: cannot reach {s3.url}" in proc.stderr and "fix: " in proc.stderr, proc.stderr  # one line
    assert proc.stderr.count("error:") == 1
    # the CLI first checks that the endpoint accepts a connection (flows.failures.check_endpoints): one more
    assert s3.connections == round_size + 1, f"one round is {round_size} connections, not {s3.connections}"
    assert elapsed < 60
