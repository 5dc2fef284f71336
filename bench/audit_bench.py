"""Audit verify benchmark: 10,000 records (100 runs x 99 records + 100 KMS-signed digests).

Prints the time `verify` takes on them from a JSONL file and from the S3 trail (moto), signatures
checked through KMS both times. The target is <= 5 s for 10,000 records.

    .venv/bin/python bench/audit_bench.py [--runs 100] [--per-run 99] [--skip-s3]
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.local.stack import LocalStack
from tpu_ops.audit.records import DIGEST_CHAIN, DIGEST_EVENT, GENESIS, Actor, new_event, seal, signed_bytes
from tpu_ops.audit.store import S3Store
from tpu_ops.audit.trail import SIGNING_ALGORITHM, audit_clients
from tpu_ops.audit.verify import items_from_jsonl, items_from_objects, verify
from tpu_ops.uris import parse_s3


def build(kms: Any, key_arn: str, runs: int, per_run: int) -> list[dict[str, Any]]:
    """Sealed records as the trail writes them: each run's chain, then a signed digest of its head."""
    actor = Actor(identity="service:bench", flow="retraining-pipeline", flow_run="0" * 32)
    out: list[dict[str, Any]] = []
    digest_head = (0, GENESIS)
    for r in range(runs):
        chain = f"bench-run-{r:04d}"
        prev = GENESIS
        for seq in range(1, per_run + 1):
            ev = new_event(chain, "train.step", actor, params={"step": seq * 100, "loss": 1.0 / seq},
                           subjects=[{"uri": f"gs://ckpt/{chain}/{seq * 100}", "kind": "checkpoint", "size": 4096,
                                      "crc32c": "AAAAAA=="}], request_ids=[f"req-{seq}"])  # fmt: skip
            rec = seal(ev, seq, prev)
            prev = rec["hash"]
            out.append(rec)
        body = new_event(DIGEST_CHAIN, DIGEST_EVENT, actor, params={"chain": chain, "head_seq": per_run,
                                                                    "head_hash": prev})  # fmt: skip
        body.update(key_id=key_arn, signing_algorithm=SIGNING_ALGORITHM)
        unsigned = seal(body, digest_head[0] + 1, digest_head[1])
        sig = kms.sign(KeyId=key_arn, Message=signed_bytes(unsigned), MessageType="RAW",
                       SigningAlgorithm=SIGNING_ALGORITHM)["Signature"]  # fmt: skip
        body["signature"] = base64.b64encode(sig).decode()
        digest = seal(body, digest_head[0] + 1, digest_head[1])
        digest_head = (digest["seq"], digest["hash"])
        out.append(digest)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--per-run", type=int, default=99)
    ap.add_argument("--skip-s3", action="store_true", help="only the JSONL figure")
    args = ap.parse_args()
    with LocalStack(tpu=False) as stack, tempfile.TemporaryDirectory() as tmp:
        settings = stack.settings(audit_uri="s3://tpu-ops-audit/bench")
        key_arn = stack.seed_audit()
        s3, kms = audit_clients(settings)
        records = build(kms, key_arn, args.runs, args.per_run)
        path = Path(tmp) / "trail.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        t0 = time.perf_counter()
        report = verify(items_from_jsonl(path), kms, key_arn)
        jsonl_s = time.perf_counter() - t0
        assert report.ok and report.records == len(records), report.damage
        print(f"records: {len(records)} ({args.runs} chains x {args.per_run} + {report.digests} signed digests)")
        print(f"verify JSONL ({path.stat().st_size / 2**20:.1f} MiB, signatures via KMS): {jsonl_s:.2f} s "
              f"({1e6 * jsonl_s / len(records):.0f} us/record)")  # fmt: skip
        if args.skip_s3:
            return 0
        store = S3Store(s3, parse_s3(settings.audit_uri), settings.audit_retention_days)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(store.put_new, records))
        print(f"(setup) {len(records)} locked records put in S3 in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        report = verify(items_from_objects(store.read_all()), kms, key_arn)
        s3_s = time.perf_counter() - t0
        assert report.ok and report.records == len(records), report.damage
        print(f"verify s3:// (list + {len(records)} GETs, 16 at a time, moto in-process): {s3_s:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
