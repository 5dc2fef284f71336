"""A local stack that was never seeded: the run, and the command line, name the missing bucket and
say to run ``tpu-ops local seed`` (not a raw ``NotFoundError: 404 GET ...``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows.cli import main

ROOT = Path(__file__).resolve().parents[2]
SEED = "run `tpu-ops local seed`"


@pytest.fixture
def unseeded(local_stack: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The dry run's pipeline, pointed at buckets this stack has never had, and the env on the stack."""
    local_stack.seed_audit()
    tag = uuid.uuid4().hex[:8]
    doc = yaml.safe_load((ROOT / "flows" / "dryrun.yaml").read_text())
    doc["mirror"].update(source=f"s3://unseeded-{tag}/fraud/v1", destination=f"gs://unseeded-{tag}/fraud/v1")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in local_stack.env().items():
            mp.setenv(k, v)
        mp.setenv("TPU_OPS_AUDIT_URI", f"s3://tpu-ops-audit/t-{tag}")
        mp.setenv("TPU_OPS_AUDIT_SPOOL", str(tmp_path / "spool.jsonl"))
        mp.setenv("TPU_OPS_STATE_DIR", str(tmp_path / "state"))
        yield doc


def test_the_command_names_the_bucket_and_the_seed(
    unseeded: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    m = unseeded["mirror"]
    assert main(["mirror", m["source"], m["destination"], "--no-progress"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1, err
    bucket = err[0].removeprefix("error: bucket ").split()[0]
    assert bucket in (m["source"].rsplit("/", 2)[0], m["destination"].rsplit("/", 2)[0]), err
    assert err[0].endswith(f"does not exist — fix: the local stack was not seeded: {SEED} (in the shell that "
                           "loaded its env file; it makes the dry run's buckets, `--spec PIPELINE.yaml` those a "
                           "pipeline spec names)"), err  # fmt: skip
    assert "404" not in err[0] and "NotFound" not in err[0]


@pytest.mark.parametrize("flow", ["retraining_pipeline", "mirror_dataset", "train"])
def test_the_run_fails_naming_the_bucket_and_the_seed(unseeded: dict[str, Any], prefect_api: None, flow: str) -> None:
    from flows.mirror import mirror_dataset
    from flows.pipeline import retraining_pipeline
    from flows.train import train

    if flow == "mirror_dataset":
        state = mirror_dataset(spec=unseeded["mirror"], return_state=True)
    elif flow == "train":  # a train job (`tpu-ops launch`) whose checkpoint bucket was never made
        job = yaml.safe_load((ROOT / "examples" / "local-train.yaml").read_text())
        job["train"]["checkpoint_dir"] = unseeded["mirror"]["destination"].rsplit("/", 2)[0] + "/ckpt"
        state = train(spec=job, run_id=f"unseeded-{uuid.uuid4().hex[:8]}", return_state=True)
    else:
        state = retraining_pipeline(spec=unseeded, return_state=True)
    assert state.is_failed()
    message = str(state.message)
    assert "does not exist" in message and SEED in message, message
    assert "404 GET" not in message and "404 POST" not in message, message
