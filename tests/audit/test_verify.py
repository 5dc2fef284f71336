"""`tpu-ops audit verify`: an intact trail passes; each kind of damage is detected and named."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from flows.cli import main
from tpu_ops.audit.records import record_hash
from tpu_ops.audit.verify import items_from_objects, verify


def _rehash(rec: dict[str, Any]) -> dict[str, Any]:
    rec["hash"] = record_hash(rec)
    return rec


def _by(records: list[dict[str, Any]], chain: str, seq: int) -> int:
    return next(i for i, r in enumerate(records) if r["chain"] == chain and r["seq"] == seq)


def _edited(rs: list[dict[str, Any]], trail: Any) -> None:
    rs[_by(rs, "run-a", 3)]["params"]["step"] = 99


def _edited_rehashed(rs: list[dict[str, Any]], trail: Any) -> None:
    i = _by(rs, "run-a", 3)
    rs[i]["params"]["step"] = 99
    _rehash(rs[i])


def _deleted(rs: list[dict[str, Any]], trail: Any) -> None:
    del rs[_by(rs, "run-a", 4)]


def _reordered(rs: list[dict[str, Any]], trail: Any) -> None:
    i, j = _by(rs, "run-a", 4), _by(rs, "run-a", 5)
    rs[i], rs[j] = rs[j], rs[i]


def _inserted(rs: list[dict[str, Any]], trail: Any) -> None:
    i = _by(rs, "run-a", 4)
    forged = copy.deepcopy(rs[i])
    forged["params"] = {"step": 1000}
    rs.insert(i, _rehash(forged))  # claims seq 4 after seq 3, exactly as a writer would


def _truncated(rs: list[dict[str, Any]], trail: Any) -> None:
    for seq in (8, 7):
        del rs[_by(rs, "run-a", seq)]


def _forged_digest(rs: list[dict[str, Any]], trail: Any) -> None:
    # Hide a truncation by rewriting the last digest to name seq 6 (rehashed, but not re-signed).
    for seq in (8, 7):
        del rs[_by(rs, "run-a", seq)]
    d = rs[_by(rs, "_digests", 2)]
    d["params"]["head_seq"] = 6
    d["params"]["head_hash"] = rs[_by(rs, "run-a", 6)]["hash"]
    _rehash(d)


def _digest_other_key(rs: list[dict[str, Any]], trail: Any) -> None:
    # A digest properly signed, but with a key that is not the trail's.
    key = trail.kms.create_key(KeySpec="ECC_NIST_P256", KeyUsage="SIGN_VERIFY")["KeyMetadata"]["Arn"]
    from tpu_ops.audit.records import signed_bytes

    d = rs[_by(rs, "_digests", 2)]
    d["key_id"] = key
    sig = trail.kms.sign(KeyId=key, Message=signed_bytes(d), MessageType="RAW", SigningAlgorithm="ECDSA_SHA_256")
    import base64

    d["signature"] = base64.b64encode(sig["Signature"]).decode()
    _rehash(d)


DAMAGE = {
    "edited": (_edited, "edited", "run-a", 3),
    "edited-and-rehashed": (_edited_rehashed, "edited", "run-a", 3),
    "deleted": (_deleted, "deleted", "run-a", 4),
    "reordered": (_reordered, "reordered", "run-a", 5),
    "inserted": (_inserted, "inserted", "run-a", 4),
    "truncated": (_truncated, "truncated", "run-a", 7),
    "forged-digest": (_forged_digest, "forged-digest", "_digests", 2),
    "digest-signed-by-another-key": (_digest_other_key, "forged-digest", "_digests", 2),
}


def _jsonl(tmp_path: Path, records: list[dict[str, Any]]) -> Path:
    path = tmp_path / "trail.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_intact_trail_verifies_from_s3_and_jsonl(
    run_a: Any, written: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert [r["seq"] for r in written if r["chain"] == "run-a"] == list(range(1, 9))
    assert main(["audit", "verify", str(run_a[0].store.trail)]) == 0
    out = capsys.readouterr().out
    assert "intact: 8 records in 1 chain, and 2 digests (signatures checked)" in out
    assert main(["audit", "verify", str(_jsonl(tmp_path, written))]) == 0
    assert main(["audit", "verify", "s3://tpu-ops-audit/no-trail-here"]) == 1  # a wrong prefix is not "intact"
    capsys.readouterr()
    assert main(["audit", "dump", str(run_a[0].store.trail)]) == 0  # to verify offline
    dumped = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert dumped == written


@pytest.mark.parametrize("case", list(DAMAGE))
def test_each_kind_of_damage_is_named(
    case: str, run_a: Any, written: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tamper, kind, chain, seq = DAMAGE[case]
    records = written
    tamper(records, run_a[0])
    assert main(["audit", "verify", str(_jsonl(tmp_path, records))]) == 1
    err = capsys.readouterr().err
    assert f"first bad record: {kind}: chain {chain} seq {seq} " in err, err


def test_locked_records_refuse_overwrite_and_delete(run_a: Any) -> None:
    trail = run_a[0]
    s3, bucket = trail.store.s3, trail.store.trail.bucket
    key = trail.store.key("run-a", 3)
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=bucket, Key=key, Body=b"{}", IfNoneMatch="*")
    assert exc.value.response["Error"]["Code"] == "PreconditionFailed"
    head = s3.head_object(Bucket=bucket, Key=key)
    assert head["ObjectLockMode"] == "COMPLIANCE" and head["ObjectLockRetainUntilDate"]
    with pytest.raises(ClientError) as exc:
        s3.delete_object(Bucket=bucket, Key=key, VersionId=head["VersionId"])
    assert exc.value.response["Error"]["Code"] == "AccessDenied"
    assert s3.get_object(Bucket=bucket, Key=key, VersionId=head["VersionId"])["Body"].read()


def test_damage_in_s3_is_named(trail: Any, write_run: Callable[[Any], list[dict[str, Any]]]) -> None:
    """What S3 does allow (a new version on top of a locked one) still shows up in verify."""
    written = write_run(trail)
    s3, bucket = trail.store.s3, trail.store.trail.bucket
    edited = dict(written[_by(written, "run-a", 2)], params={"step": 42})
    s3.put_object(Bucket=bucket, Key=trail.store.key("run-a", 2), Body=json.dumps(edited).encode(),
                  ChecksumAlgorithm="SHA256")  # fmt: skip
    report = verify(items_from_objects(trail.store.read_all()), trail.kms)
    assert [(d.kind, d.seq) for d in report.damage] == [("edited", 2)]
    s3.put_object(Bucket=bucket, Key=trail.store.key("run-a", 2), Body=json.dumps(written[_by(written, "run-a", 3)]),
                  ChecksumAlgorithm="SHA256")  # fmt: skip
    report = verify(items_from_objects(trail.store.read_all()), trail.kms)
    assert [(d.kind, d.seq) for d in report.damage] == [("reordered", 3)]


def test_concurrent_writers_never_fork_a_chain(audit_settings: Any) -> None:
    from tpu_ops.audit.trail import AuditTrail

    writers = [AuditTrail.from_settings(audit_settings) for _ in range(3)]
    errors: list[BaseException] = []

    def write(w: Any, n: int) -> None:
        try:
            for i in range(8):
                w.record("run-c", "train.step", params={"writer": n, "i": i})
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w, n)) for n, w in enumerate(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    writers[0].digest("run-c")
    records = [json.loads(b) for _, b in writers[0].store.read_all()]
    chain = [r for r in records if r["chain"] == "run-c"]
    assert [r["seq"] for r in chain] == list(range(1, 25))
    got = sorted((r["params"]["writer"], r["params"]["i"]) for r in chain)
    assert got == [(w, i) for w in range(3) for i in range(8)]
    assert verify(items_from_objects(writers[0].store.read_all()), writers[0].kms).ok


def test_secrets_never_reach_a_record(trail: Any) -> None:
    rec = trail.record("run-s", "slice.provisioned", params={
        "aws_secret_access_key": "abc", "password": "hunter2", "nested": {"api_token": "t"},
        "note": "-----BEGIN PRIVATE KEY----- xyz", "id": "AKIAABCDEFGHIJKLMNOP", "aws_credentials_block": "prod",
        "zone": "us-central2-b",
    }).record  # fmt: skip
    body = json.dumps(rec)
    for secret in ("abc", "hunter2", '"t"', "xyz", "AKIAABCDEFGHIJKLMNOP"):
        assert secret not in body
    assert rec["params"]["aws_credentials_block"] == "prod" and rec["params"]["zone"] == "us-central2-b"
    assert set(rec["redacted"]) == {"aws_secret_access_key", "password", "nested.api_token", "note", "id"}
