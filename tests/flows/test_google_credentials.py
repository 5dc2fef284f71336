"""One pipeline run, one set of Google credentials: its GcpCredentials block's key, for every call.

The block's key is a service-account key the local stack's OAuth endpoint knows, and nothing else in
the environment names a key. Our fakes refuse any request without a token that endpoint issued or a
JWT signed by a key it knows, and record whose token each request carried: after the run, every
request to the fake Compute Engine, the fake TPU API and the fake Storage Transfer Service carried
the block's key, and every Cloud Logging write the block's key or (from the workers) the VM's
metadata token. Without the block, the same command fails on one line naming the missing key.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_ID = "gcp-creds-run"
PIPELINE_EMAIL = "pipeline@tpu-ops-local.iam.gserviceaccount.com"


def _whose(stack: Any, fake: str) -> set[tuple[str, str | None] | None]:
    """(subject, key id) of every token a fake saw since the reset (None: none, or refused)."""
    grants = stack.google_auth.authority.grants_seen(fake)
    return {(g.subject, g.key_id) if g is not None else None for g in grants}


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_every_google_call_of_a_pipeline_run_carries_the_blocks_key(
    stack: Any, monkeypatch: pytest.MonkeyPatch, pipeline_on_stack: Any
) -> None:
    from prefect_gcp import GcpCredentials

    from flows.pipeline import retraining_pipeline
    from flows.provision import run_on_slice
    from tpu_ops.specs import PipelineSpec, load_spec

    def tweak(doc: dict[str, Any]) -> None:
        doc["mirror"]["engine"] = "sts"  # the fake Storage Transfer Service copies the dataset
        doc["train"].update(steps=10, checkpoint_every=5, goodput_logging=True)  # workers write to Cloud Logging

    admin, spec = pipeline_on_stack.seed("dryrun-compute.yaml", RUN_ID, "gcp-creds", tweak)
    authority = stack.google_auth.authority
    key = authority.new_key(PIPELINE_EMAIL, stack.project)  # the block's own key: not the stack's
    GcpCredentials(service_account_info=key, project=stack.project).save("pipeline-gcp", overwrite=True)
    pipeline_on_stack.enter(admin)
    monkeypatch.delenv("TPU_OPS_GCP_CREDENTIALS_FILE")  # the block is the only way to a token
    authority.forget_seen()

    summary = retraining_pipeline(spec, gcp_credentials_block="pipeline-gcp")
    assert isinstance(summary, dict), summary
    assert summary["training"]["outcome"] == "done" and summary["export"]["package_arn"]
    # the TPU API too: a slice there, provisioned and torn down by the flow with the same block
    tpu_spec = load_spec(ROOT / "flows" / "dryrun.yaml", PipelineSpec).provision
    run_on_slice(tpu_spec, "gcp-creds-tpu", gcp_credentials_block="pipeline-gcp")

    block = (PIPELINE_EMAIL, key["private_key_id"])
    vm = (stack.google_auth.vm_email, None)
    assert _whose(stack, "fake-compute") == {block}
    assert _whose(stack, "fake-tpu") == {block}
    assert _whose(stack, "fake-sts") == {block}
    assert _whose(stack, "logging") <= {block, vm} and vm in _whose(stack, "logging")
    # GCS (its client asks the token endpoint) got its tokens with the block's key too
    assert authority.tokens_of(key_id=key["private_key_id"])


def test_without_the_block_the_command_names_the_missing_key(stack: Any, tmp_path: Path) -> None:
    """The same environment without a key: the fakes answer 401 to a request without a token, and
    the command refuses before sending one, on one line."""
    env = {**os.environ, **stack.env(), "TPU_OPS_STATE_DIR": str(tmp_path / "state")}
    env.pop("TPU_OPS_GCP_CREDENTIALS_FILE")
    exe = str(Path(sys.executable).with_name("tpu-ops"))
    spec = ROOT / "examples" / "provision.yaml"
    for argv in (["provision", "--spec", str(spec), "--run-id", "no-key", "--no-flow"], ["teardown", "no-key"]):
        res = subprocess.run([exe, *argv], env=env, capture_output=True, text=True, timeout=180, cwd=ROOT)
        lines = res.stderr.strip().splitlines()
        assert res.returncode != 0 and len(lines) == 1, res.stderr
        assert "Google Cloud credentials not found: no service-account key" in lines[0], lines[0]
        assert "TPU_OPS_GCP_CREDENTIALS_FILE" in lines[0] and "GcpCredentials block" in lines[0]
    assert _whose(stack, "fake-compute") <= {None} and _whose(stack, "fake-tpu") <= {None}  # nothing sent with a key
