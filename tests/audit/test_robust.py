"""Issue #19, points 5-6: a torn spool line or a foreign object in S3 is quarantined, reported and
audited; it is never glued to and never blocks other runs' records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flows.cli import main
from tpu_ops.audit.verify import items_from_objects, verify

QUARANTINE_CHAIN = "_trail"  # the chain of events about the trail itself


def _chain(trail: Any, chain: str) -> list[dict[str, Any]]:
    return [json.loads(b) for k, b in trail.store.read_all() if f"/chains/{chain}/" in k]


def test_a_torn_spool_line_is_quarantined_never_glued_to(
    trail: Any, audit_settings: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from tpu_ops.audit.records import Actor, new_event

    ok = new_event("run-t", "train.step", Actor(identity="t"), params={"n": 1})
    torn = json.dumps({"kind": "record", "event": new_event("run-t", "train.step", Actor(identity="t"))})[:57]
    spool: Path = trail.spool.path
    spool.write_text(json.dumps({"kind": "record", "event": ok}) + "\n" + torn)  # a crash mid-append
    trail.spool.append({"kind": "record", "event": new_event("run-t", "train.step", Actor(identity="t"),
                                                             params={"n": 2})})  # fmt: skip
    lines = spool.read_text().splitlines()
    assert lines[1] == torn and json.loads(lines[2])["event"]["params"] == {"n": 2}  # not glued to the torn line
    assert main(["audit", "flush"]) == 0
    out = capsys.readouterr().out
    assert "2 spooled record(s) sent; 0 waiting" in out and "1 damaged line(s) quarantined" in out, out
    assert trail.spool.pending() == 0
    quarantined = trail.spool.quarantine_path.read_text()
    assert torn in quarantined
    assert [r["params"]["n"] for r in _chain(trail, "run-t")] == [1, 2]
    note = _chain(trail, QUARANTINE_CHAIN)
    assert [r["event"] for r in note] == ["audit.spool_quarantined"]
    assert note[0]["params"]["bytes"] == len(torn) and note[0]["params"]["sha256"]
    assert trail.record("run-t", "train.step", params={"n": 3}).record["seq"] == 3


def test_a_garbage_object_in_one_chain_blocks_no_run(trail: Any, audit_settings: Any) -> None:
    s3, bucket = trail.store.s3, trail.store.trail.bucket
    trail.record("run-x", "train.step", params={"n": 1})
    trail.record("run-y", "train.step", params={"n": 1})
    # anyone who may append may create new keys, even under Object Lock
    s3.put_object(Bucket=bucket, Key=trail.store.key("run-x", 2), Body=b"\x00not json{")
    s3.put_object(Bucket=bucket, Key=trail.store.chain_prefix("run-x") + "zz-garbage.json", Body=b"[1, 2")

    from tpu_ops.audit.trail import AuditTrail

    fresh = AuditTrail.from_settings(audit_settings)  # knows no head: must read it from S3
    for n in (2, 3):
        for chain in ("run-x", "run-y"):
            written = fresh.record(chain, "train.step", params={"n": n})
            assert written.record is not None and not written.spooled
    assert fresh.spool.pending() == 0
    parsed = []  # the garbage object keeps seq 2; the chain goes on after it
    for k, b in trail.store.read_all():
        if "/chains/run-x/" in k:
            try:
                parsed.append(json.loads(b)["event"])
            except ValueError:
                parsed.append("garbage")
    assert parsed == ["train.step", "garbage", "audit.foreign_object", "train.step", "train.step", "garbage"]
    assert [r["seq"] for r in _chain(trail, "run-y")] == [1, 2, 3]
    report = verify(items_from_objects(trail.store.read_all()))
    kinds = sorted((d.kind, d.chain, d.seq) for d in report.damage)
    assert kinds == [("foreign", "run-x", None), ("malformed", "run-x", 2)], report.damage
    assert report.records == 9


def test_a_spooled_entry_that_fails_blocks_only_its_own_chain(trail: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from tpu_ops.audit.records import Actor, new_event

    bad = new_event("run-p", "train.step", Actor(identity="t"))
    trail.spool.append({"kind": "record", "event": bad})
    trail.spool.append({"kind": "record", "event": new_event("run-q", "train.step", Actor(identity="t"))})
    real = trail._send

    def send(entry: dict[str, Any]) -> dict[str, Any]:
        if entry["event"]["chain"] == "run-p":
            raise RuntimeError("refused for this chain only")
        return real(entry)  # type: ignore[no-any-return]

    monkeypatch.setattr(trail, "_send", send)
    written = trail.record("run-r", "train.step")
    assert written.record is not None and not written.spooled
    assert [json.loads(line)["event"]["chain"] for line in trail.spool.path.read_text().splitlines()] == ["run-p"]
    assert trail.record("run-p", "train.step").spooled  # after its stuck predecessor, in order
    monkeypatch.setattr(trail, "_send", real)
    assert trail.flush() == 2 and trail.spool.pending() == 0
