"""Issue #19, points 1-4: hostile content never crashes verify, the record actually wrong is named,
signatures are checked only against a pinned key, and a KMS that cannot answer is not tampering."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from flows.cli import main
from tpu_ops.audit.records import GENESIS, record_hash, signed_bytes
from tpu_ops.audit.verify import Item, items_from_jsonl, items_from_objects, verify

# exit codes of `tpu-ops audit verify` (documented in its --help and the README)
INTACT, DAMAGED, UNCHECKED = 0, 1, 3


def _at(records: list[dict[str, Any]], chain: str, seq: int) -> int:
    return next(i for i, r in enumerate(records) if r["chain"] == chain and r["seq"] == seq)


def _lines(records: list[dict[str, Any]]) -> list[bytes]:
    return [json.dumps(r).encode() for r in records]


def _file(tmp_path: Path, lines: list[bytes]) -> Path:
    path = tmp_path / "trail.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


# -- point 1: hostile content -------------------------------------------------------------------
def _nan(line: bytes) -> bytes:
    return line.replace(b'"step": 2', b'"step": NaN')


def _infinity(line: bytes) -> bytes:
    return line.replace(b'"step": 2', b'"step": -Infinity')


def _duplicate_key(line: bytes) -> bytes:
    return line.replace(b'"params": {', b'"params": {"step": 1000}, "params": {', 1)


def _huge(line: bytes) -> bytes:
    return line.replace(b'"step": 2', b'"step": "' + b"x" * (3 << 20) + b'"')


def _deep(line: bytes) -> bytes:
    return line.replace(b'"step": 2', b'"step": ' + b"[" * 200_000 + b"]" * 200_000)


def _not_utf8(line: bytes) -> bytes:
    return line.replace(b'"train.step"', b'"train.\xff\xfestep"')


def _huge_int(line: bytes) -> bytes:
    return line.replace(b'"step": 2', b'"step": ' + b"9" * 50_000)


HOSTILE = {"nan": _nan, "infinity": _infinity, "duplicate-key": _duplicate_key, "huge": _huge, "deep": _deep,
           "not-utf8": _not_utf8, "huge-int": _huge_int}  # fmt: skip


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_content_is_named_never_a_crash(
    case: str, written: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = _lines(written)
    i = _at(written, "run-a", 3)
    lines[i] = HOSTILE[case](lines[i])
    assert lines[i] != _lines(written)[i]
    path = _file(tmp_path, lines)
    assert main(["audit", "verify", str(path), "--no-signatures"]) == DAMAGED
    err = capsys.readouterr().err
    assert "first bad record: malformed: chain " in err and "seq 3" in err and f"line {i + 1}" in err, err
    # the same bytes as S3 objects
    objects = [(f"t/chains/run-a/{r['seq']:012d}.json" if r["chain"] == "run-a" else
                f"t/chains/_digests/{r['seq']:012d}.json", b) for r, b in zip(written, lines, strict=True)]  # fmt: skip
    report = verify(items_from_objects(objects))
    assert [(d.kind, d.chain, d.seq) for d in report.damage][:1] == [("malformed", "run-a", 3)]


def test_a_record_that_is_not_an_object_or_lacks_fields_is_malformed(written: list[dict[str, Any]]) -> None:
    items = [Item(f"line {n}", r) for n, r in enumerate(written, 1)]
    items[_at(written, "run-a", 2)] = Item("line x", None, "run-a", 2)
    report = verify(items)
    assert [(d.kind, d.seq) for d in report.damage] == [("malformed", 2)]


# -- point 2: the record actually wrong is named ---------------------------------------------------
def test_forged_record_after_a_sealed_one_is_named_not_the_sealed_one(written: list[dict[str, Any]]) -> None:
    # seq 7 replaced by a forgery whose prev_hash is wrong; seq 6 is intact and digest 1 sealed its hash
    i = _at(written, "run-a", 7)
    forged = dict(written[i], params={"step": 1000}, prev_hash="ab" * 32)
    written[i] = {**forged, "hash": record_hash(forged)}
    report = verify([Item(f"line {n}", r) for n, r in enumerate(written, 1)])
    assert [(d.kind, d.seq) for d in report.damage][:1] == [("edited", 7)], report.damage
    assert "seq 6" in report.damage[0].detail and "digest 1" in report.damage[0].detail


def test_forged_record_appended_after_the_sealed_head_is_named(written: list[dict[str, Any]]) -> None:
    last = written[_at(written, "run-a", 8)]
    forged = {**last, "seq": 9, "prev_hash": "cd" * 32, "params": {"step": 9}}
    forged["hash"] = record_hash(forged)
    report = verify([Item(f"line {n}", r) for n, r in enumerate([*written, forged], 1)])
    assert [(d.kind, d.seq) for d in report.damage][:1] == [("inserted", 9)], report.damage


# -- point 3: signatures only against a pinned key --------------------------------------------------
def _rewrite_and_resign(records: list[dict[str, Any]], kms: Any, key: str) -> list[dict[str, Any]]:
    """A full rewrite: seq 3 edited, every later hash recomputed, every digest re-signed with ``key``."""
    out: list[dict[str, Any]] = []
    prev = {"run-a": GENESIS, "_digests": GENESIS}
    heads: dict[int, str] = {}
    for r in sorted(records, key=lambda r: (r["chain"] == "_digests", r["seq"])):
        r = copy.deepcopy(r)
        if r["chain"] == "run-a" and r["seq"] == 3:
            r["params"] = {"step": 1_000_000}
        r["prev_hash"] = prev[r["chain"]]
        if r["chain"] == "_digests":
            r["params"]["head_hash"] = heads[r["params"]["head_seq"]]
            r["links"] = [{"chain": "run-a", "seq": r["params"]["head_seq"], "hash": r["params"]["head_hash"]}]
            r["key_id"] = key
            r.pop("signature", None)
            sig = kms.sign(KeyId=key, Message=signed_bytes(r), MessageType="RAW", SigningAlgorithm="ECDSA_SHA_256")
            r["signature"] = base64.b64encode(sig["Signature"]).decode()
        r["hash"] = record_hash(r)
        prev[r["chain"]] = r["hash"]
        if r["chain"] == "run-a":
            heads[r["seq"]] = r["hash"]
        out.append(r)
    return out


def test_without_a_pinned_key_verify_never_claims_signatures_were_checked(
    run_a: Any, written: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    kms = run_a[0].kms
    attacker = kms.create_key(KeySpec="ECC_NIST_P256", KeyUsage="SIGN_VERIFY")["KeyMetadata"]["Arn"]
    path = _file(tmp_path, _lines(_rewrite_and_resign(written, kms, attacker)))
    monkeypatch.delenv("TPU_OPS_AUDIT_KMS_KEY_ID", raising=False)
    assert main(["audit", "verify", str(path)]) == INTACT  # the hashes are consistent...
    out = capsys.readouterr().out
    assert "signatures checked" not in out.replace("signatures not checked", "")
    assert "signatures not checked" in out and "no key pinned" in out, out  # ...and it says why that is not proof
    assert main(["audit", "verify", str(path), "--key", "alias/tpu-ops-audit"]) == DAMAGED
    assert "first bad record: forged-digest: chain _digests seq 1 " in capsys.readouterr().err
    monkeypatch.setenv("TPU_OPS_AUDIT_KMS_KEY_ID", "alias/tpu-ops-audit")
    assert main(["audit", "verify", str(path)]) == DAMAGED
    capsys.readouterr()
    assert verify(items_from_jsonl(path), kms).signatures_checked is False  # a KMS client alone pins nothing


# -- point 4: a KMS that cannot answer is not tampering --------------------------------------------
def test_no_credentials_or_unreachable_kms_is_reported_as_such_not_as_forgery(
    written: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import tpu_ops.cloud.clients as session

    path = _file(tmp_path, _lines(written))
    assert main(["audit", "verify", str(path), "--key", "alias/tpu-ops-audit"]) == INTACT
    capsys.readouterr()
    monkeypatch.setattr(session, "_sessions", {})  # no credentials cached from an earlier client
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "TPU_OPS_AWS_ACCESS_KEY_ID",
                "TPU_OPS_AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert main(["audit", "verify", str(path), "--key", "alias/tpu-ops-audit"]) == UNCHECKED
    err = capsys.readouterr().err
    assert "forged" not in err and "credentials" in err, err

    monkeypatch.setattr(session, "_sessions", {})
    monkeypatch.setenv("TPU_OPS_AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("TPU_OPS_AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("TPU_OPS_AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    assert main(["audit", "verify", str(path), "--key", "alias/tpu-ops-audit"]) == UNCHECKED
    err = capsys.readouterr().err
    assert "forged" not in err and ("unreachable" in err or "cannot reach" in err), err


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [("KMSInvalidSignatureException", 400, False), ("AccessDeniedException", 400, "AccessDeniedError"),
     ("InvalidSignatureException", 400, "AccessDeniedError"), ("DisabledException", 400, "CloudError"),
     ("InternalException", 500, "TransientError")],
)  # fmt: skip
def test_only_kms_saying_invalid_makes_a_signature_invalid(
    written: list[dict[str, Any]], code: str, status: int, expected: Any
) -> None:
    # KMS's answers that moto cannot give (it enforces no key policy and no SigV4), from botocore's Stubber
    from botocore.session import get_session
    from botocore.stub import Stubber

    from tpu_ops.audit.trail import verify_signature

    kms = get_session().create_client("kms", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    digest = written[_at(written, "_digests", 1)]
    with Stubber(kms) as stub:
        stub.add_client_error("verify", service_error_code=code, http_status_code=status)
        if expected is False:
            assert verify_signature(kms, digest) is False
        else:
            with pytest.raises(Exception) as exc:
                verify_signature(kms, digest)
            assert type(exc.value).__name__ == expected
