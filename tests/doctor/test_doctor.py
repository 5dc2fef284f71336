"""`tpu-ops doctor` against the local stack: passes on a set-up environment, names what is missing
(with the fix) on an empty one, and fails fast when an endpoint is not there. No real cloud host."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from flows.cli import main
from infra.local._proc import free_port
from infra.local.seed import DRY_RUN_CAPACITY, ensure_s3_bucket, seed_pipeline, set_tpu_capacity
from tpu_ops.cloud.clients import boto3_client
from tpu_ops.doctor import MISSING, OK, run_checks
from tpu_ops.specs import PipelineSpec, load_spec

ROOT = Path(__file__).resolve().parents[2]
SPEC_FILE = ROOT / "flows" / "dryrun.yaml"


# The dry run's reservation is too small on purpose (8 chips of the 16 a v4-32 needs): the ladder must
# move on. A set-up environment has one the slice fits in.
FITTING_CAPACITY = {**DRY_RUN_CAPACITY, "us-central2-b": {"spot": 0, "on-demand": 64,
                                                          "reservations": {"fraud-v4-reservation": 16}}}  # fmt: skip


def _spec() -> PipelineSpec:
    spec = load_spec(SPEC_FILE, PipelineSpec)
    return spec.model_copy(update={"audit_bucket": "s3://dryrun-audit/trail"})


def _set_up(stack: Any, spec: PipelineSpec) -> str:
    """What a correct environment has: the dataset, buckets, the locked audit bucket, group, key."""
    settings = stack.settings()
    seed_pipeline(settings, spec)
    set_tpu_capacity(settings, FITTING_CAPACITY)
    ensure_s3_bucket(settings, spec.export.destination)
    ensure_s3_bucket(settings, str(spec.audit_bucket), object_lock=True)
    boto3_client(settings, "sagemaker").create_model_package_group(
        ModelPackageGroupName=spec.export.model_package_group
    )
    key = boto3_client(settings, "kms").create_key(KeyUsage="SIGN_VERIFY", KeySpec="ECC_NIST_P256")
    return str(key["KeyMetadata"]["KeyId"])


def _env(monkeypatch: pytest.MonkeyPatch, stack: Any, **extra: str) -> None:
    for key, value in {**stack.env(), **extra}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)


def test_doctor_passes_on_a_set_up_local_stack(stack: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys):
    spec = _spec()
    key_id = _set_up(stack, spec)
    checks = run_checks(stack.settings(), spec, kms_key_id=key_id)
    by_name = {c.name: c for c in checks}
    assert [c for c in checks if c.status == MISSING] == []
    assert by_name["reservation fraud-v4-reservation in us-central2-b"].status == OK
    assert by_name["s3 audit: s3://dryrun-audit"].detail.startswith("Object Lock enabled")
    assert "SIGN_VERIFY" in by_name[f"kms key: {key_id}"].detail
    assert by_name["tpu v4-32 in us-central2-c"].status == OK

    # the command: a spec file, JSON out, exit 0
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(spec.model_dump_json())
    _env(monkeypatch, stack)
    assert main(["doctor", "--spec", str(spec_file), "--kms-key", key_id, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and len(report["checks"]) >= 10


def test_doctor_names_what_is_missing_and_how_to_fix_it(stack: Any, monkeypatch: pytest.MonkeyPatch, capsys):
    spec = _spec()
    settings = stack.settings()
    seed_pipeline(settings, spec)
    s3 = boto3_client(settings, "s3")
    if any(b["Name"] == "dryrun-models" for b in s3.list_buckets()["Buckets"]):
        s3.delete_bucket(Bucket="dryrun-models")  # as if nobody had created it
    ensure_s3_bucket(settings, str(spec.audit_bucket), object_lock=False)
    stack.set_capacity({"us-central2-b": {"reservations": {}}})
    checks = {c.name: c for c in run_checks(settings, spec)}
    group = checks["sagemaker group: fraud-model"]  # absent, but the first export creates it
    assert group.status == OK and "first export creates it" in group.detail
    audit = checks["s3 audit: s3://dryrun-audit"]
    assert audit.status == MISSING and "Object Lock is not enabled" in audit.detail and "object-lock" in audit.fix
    reservation = checks["reservation fraud-v4-reservation in us-central2-b"]
    assert reservation.status == MISSING and "not found" in reservation.detail
    export = checks["s3 export: s3://dryrun-models"]
    assert export.status == MISSING and "create-bucket --bucket dryrun-models" in export.fix

    _env(monkeypatch, stack)
    assert main(["doctor", "--spec", str(SPEC_FILE)]) == 1
    out = capsys.readouterr().out
    assert "MISSING  s3 export: s3://dryrun-models" in out
    assert "fix: aws s3api create-bucket --bucket dryrun-models" in out
    assert out.rstrip().endswith("missing")


def test_doctor_fails_fast_on_an_endpoint_that_is_not_there(stack: Any) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    checks = run_checks(stack.settings(aws_endpoint_url=dead), _spec())
    assert time.monotonic() - t0 < 10
    assert [(c.name, c.status) for c in checks] == [("endpoint aws_endpoint_url", MISSING)]
    assert dead in checks[0].detail


def test_doctor_refuses_a_dry_run_without_endpoints(stack: Any) -> None:
    checks = run_checks(stack.settings(tpu_endpoint=None), None)
    assert [c.status for c in checks] == [MISSING]
    assert "tpu_endpoint is not set" in checks[0].detail and "local up" in checks[0].fix


def test_doctor_on_compute_engine_checks_the_api_quota_and_reservations(stack: Any) -> None:
    from flows.commands.dryrun import COMPUTE_CAPACITY, COMPUTE_SPEC

    spec = load_spec(COMPUTE_SPEC, PipelineSpec)
    settings = stack.settings()
    seed_pipeline(settings, spec)
    stack.set_compute_capacity(COMPUTE_CAPACITY)
    checks = {c.name: c for c in run_checks(settings, spec)}
    assert checks["compute api"].status == OK and "backend compute" in checks["compute api"].detail
    quota = checks["compute quota spot v5p in us-east5"]
    assert quota.status == OK and "PREEMPTIBLE_" in quota.detail and "needs 16" in quota.detail
    # the dry run's reservation holds 2 of the 4 hosts a v5p-32 needs: named with both sizes
    small = checks["reservation fraud-v5p-reservation in us-east5-b"]
    assert small.status == MISSING, small
    assert small.detail == "holds 2 x ct5p-hightpu-4t, smaller than the slice (v5p-32: 4 x ct5p-hightpu-4t)"
    assert not any(name.startswith("tpu ") for name in checks)  # the TPU API is not this spec's backend
    fits = {"reservations": {"fraud-v5p-reservation": {"count": 4, "machineType": "ct5p-hightpu-4t"}}}
    stack.set_compute_capacity({**COMPUTE_CAPACITY, "us-east5-b": {**COMPUTE_CAPACITY["us-east5-b"], **fits}})
    checks = {c.name: c for c in run_checks(settings, spec)}
    assert checks["reservation fraud-v5p-reservation in us-east5-b"].status == OK

    stack.compute_backend.set_quotas({"us-east5": {"PREEMPTIBLE_TPU_PODSLICE_V5P": 8}})
    stack.set_compute_capacity({"us-east5-b": {"reservations": {}}})
    checks = {c.name: c for c in run_checks(settings, spec)}
    quota = checks["compute quota spot v5p in us-east5"]
    assert quota.status == MISSING and "8 free; the slice needs 16" in quota.detail
    res = checks["reservation fraud-v5p-reservation in us-east5-b"]
    assert res.status == MISSING and "--machine-type=ct5p-hightpu-4t --vm-count=4" in res.fix


def test_doctor_fails_a_reservation_smaller_than_the_slice(stack: Any) -> None:
    spec = _spec()
    settings = stack.settings()
    seed_pipeline(settings, spec)
    set_tpu_capacity(settings, DRY_RUN_CAPACITY)  # 8 chips reserved; a v4-32 is 16
    res = {c.name: c for c in run_checks(settings, spec)}["reservation fraud-v4-reservation in us-central2-b"]
    assert res.status == MISSING
    assert res.detail == "size 8 chips, smaller than the slice (v4-32: 16 chips)"
    assert "at least 16 chips" in res.fix


def test_doctor_says_a_bucket_is_missing_instead_of_asking_for_a_grant(stack: Any) -> None:
    """An unseeded stack: no IAM grant is suggested for buckets that are not there; the fix is the seed."""
    spec = _spec().model_copy(deep=True)
    tag = str(time.monotonic_ns())[-8:]
    mirror = spec.mirror.model_copy(update={"source": f"s3://gone-{tag}/data", "destination": f"gs://gone-{tag}/data"})
    spec = spec.model_copy(update={"mirror": mirror})
    checks = {c.name: c for c in run_checks(stack.settings(), spec)}
    for name, bucket in ((f"s3 source: s3://gone-{tag}/data", f"s3://gone-{tag}"),
                         (f"gcs dataset: gs://gone-{tag}", f"gs://gone-{tag}")):  # fmt: skip
        check = checks.get(name) or next(c for c in checks.values() if c.name.startswith(name.split(":")[0]))
        assert check.status == MISSING and check.detail == f"bucket {bucket} does not exist", check
        assert "grant" not in check.fix and "local seed" in check.fix, check
