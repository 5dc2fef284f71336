"""Issue #19, point 7: sealing on a schedule. A digest naming every chain's head is written every
interval even when nothing happened, so cutting off the newest records and digests is detected
within one interval; on S3, non-current versions and delete markers under the trail are evidence."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from flows.cli import main
from tpu_ops.audit.records import record_hash
from tpu_ops.audit.verify import Item, items_from_objects, verify

HOUR = 3600


def _items(records: list[dict[str, Any]]) -> list[Item]:
    return [Item(f"line {n}", r) for n, r in enumerate(records, 1)]


def _all(trail: Any) -> list[dict[str, Any]]:
    return [json.loads(b) for _, b in trail.store.read_all()]


def test_a_scheduled_seal_names_every_chain_even_when_nothing_happened(
    trail: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    trail.record("run-1", "train.step")
    trail.record("run-2", "train.step")
    trail.record("run-2", "train.step")
    assert main(["audit", "seal"]) == 0
    assert main(["audit", "seal"]) == 0  # nothing happened since: a seal all the same
    assert "sealed 2 chain(s)" in capsys.readouterr().out
    seals = [r for r in _all(trail) if r["chain"] == "_digests"]
    assert [r["event"] for r in seals] == ["audit.seal", "audit.seal"]
    for s in seals:
        heads = s["params"]["heads"]
        assert {c: h["seq"] for c, h in heads.items()} == {"run-1": 1, "run-2": 2}
        assert s["params"]["interval_s"] == HOUR and s["signature"]
    assert verify(_items(_all(trail)), seal_interval_s=HOUR).ok
    key = trail._key_arn()
    assert verify(_items(_all(trail)), trail.kms, key).ok  # seals sign their SHA-256 (KMS's RAW limit is 4 KiB)
    forged = _all(trail)
    last = next(r for r in forged if r["chain"] == "_digests" and r["seq"] == 2)
    last["params"]["heads"]["run-2"]["seq"] = 1  # a seal rewritten to hide run-2's seq 2
    last["hash"] = record_hash(last)
    report = verify(_items(forged), trail.kms, key)
    assert [(d.kind, d.seq) for d in report.damage][:1] == [("forged-digest", 2)], report.damage


def test_cutting_off_the_newest_records_and_digests_is_detected_within_one_interval(trail: Any) -> None:
    from tpu_ops.audit.verify import parse_time

    for i in range(3):
        trail.record("run-c", "train.step", params={"i": i})
    first = trail.seal(interval_s=HOUR).record
    t0 = parse_time(first["time"])
    trail.record("run-c", "model.exported")
    trail.digest("run-c")
    trail.seal(now=t0 + timedelta(hours=1), interval_s=HOUR)
    full = _all(trail)
    at = t0 + timedelta(hours=1, minutes=30)
    report = verify(_items(full), now=at, seal_interval_s=HOUR)
    assert report.ok and report.newest_digest_age_s == pytest.approx(1800, abs=1)

    # cut off: the newest record and every digest written after it (the per-run digest and the seal)
    cut = [r for r in full if not (r["chain"] == "run-c" and r["seq"] == 4) and not
           (r["chain"] == "_digests" and r["seq"] >= 2)]  # fmt: skip
    assert verify(_items(cut), now=t0 + timedelta(minutes=50), seal_interval_s=HOUR).ok  # within the interval
    report = verify(_items(cut), now=at, seal_interval_s=HOUR)
    assert [d.kind for d in report.damage] == ["stale"], report.damage
    assert "cut off" in report.damage[0].detail and report.newest_digest_age_s == pytest.approx(5400, abs=1)


def test_a_gap_in_the_schedule_fails(trail: Any) -> None:
    from tpu_ops.audit.verify import parse_time

    trail.record("run-g", "train.step")
    t0 = parse_time(trail.seal(interval_s=HOUR).record["time"])
    trail.seal(now=t0 + timedelta(hours=3), interval_s=HOUR)
    report = verify(_items(_all(trail)), now=t0 + timedelta(hours=3, minutes=1), seal_interval_s=HOUR)
    assert [(d.kind, d.chain, d.seq) for d in report.damage] == [("gap", "_digests", 2)], report.damage


def test_versions_and_delete_markers_under_the_trail_are_evidence(
    trail: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(3):
        trail.record("run-v", "train.step", params={"i": i})
    trail.seal()
    s3, bucket = trail.store.s3, trail.store.trail.bucket
    key2, key3 = trail.store.key("run-v", 2), trail.store.key("run-v", 3)
    body = s3.get_object(Bucket=bucket, Key=key2)["Body"].read()
    s3.put_object(Bucket=bucket, Key=key2, Body=body)  # the same bytes again: content verifies, history does not
    s3.delete_object(Bucket=bucket, Key=key3)  # a delete marker over the locked version
    assert verify(items_from_objects(trail.store.read_all())).damage[0].kind == "truncated"
    assert main(["audit", "verify", str(trail.store.trail)]) == 1
    err = capsys.readouterr().err
    assert f"non-current version of {key2}" in err and f"delete marker on {key3}" in err, err


def test_verify_reads_sealed_records_from_bundles_yet_sees_every_change(
    trail: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(4):
        trail.record("run-b", "train.step", params={"i": i})
    ref = trail.seal().record["params"]["bundles"]
    assert [(b["chain"], b["first"], b["last"], b["records"]) for b in ref] == [("run-b", 1, 4, 4)]
    trail.record("run-b", "train.step", params={"i": 4})  # after the seal: read from its own object
    objects, problems = trail.store.read_verified()
    assert [json.loads(b)["seq"] for k, b in objects if "/run-b/" in k] == [1, 2, 3, 4, 5] and not problems
    assert main(["audit", "verify", str(trail.store.trail)]) == 0
    capsys.readouterr()

    s3, bucket = trail.store.s3, trail.store.trail.bucket
    edited = json.loads(s3.get_object(Bucket=bucket, Key=trail.store.key("run-b", 2))["Body"].read())
    edited["params"] = {"i": 99}
    s3.put_object(Bucket=bucket, Key=trail.store.key("run-b", 2), Body=json.dumps(edited).encode())
    s3.put_object(Bucket=bucket, Key=ref[0]["key"], Body=b"{}\n")  # a new version over the locked bundle
    assert main(["audit", "verify", str(trail.store.trail)]) == 1
    err = capsys.readouterr().err
    assert "first bad record: " in err and "edited: chain run-b seq 2 " in err, err  # the edit, not the bundle's copy
    assert "this bundle does not match the sha256 its seal names" in err
