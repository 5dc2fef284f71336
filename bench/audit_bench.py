"""Audit verify benchmark: 10,000 records (100 runs x 99 records + 100 KMS-signed digests).

Prints, in one run on the local stack (moto in this process):

1. verify from a JSONL file (signatures checked through KMS);
2. verify from ``s3://`` the way it was read before issue #19: list, then one GET at a time;
3. verify from ``s3://`` as ``tpu-ops audit verify`` reads it now: one ``ListObjectVersions`` pass,
   the digests, each sealed chain from its seal's bundle (one GET per chain) where S3 still holds
   exactly the bundled versions, anything else fetched 16 at a time with at most 256 in flight;

with the speed-up of 3 over 2 (the target is >= 4x) and the peak resident memory of each read (in
this process, moto's store included) and of read 3 again in a process of its own (the reader's own).
The records are stored straight into moto's backend (seeding 10,000 objects over HTTP would take a
minute and is not what is measured); the scheduled seal that writes the bundles runs over HTTP.

    .venv/bin/python bench/audit_bench.py [--runs 100] [--per-run 99] [--skip-s3]
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.local.stack import LocalStack
from tpu_ops.audit.records import DIGEST_CHAIN, DIGEST_EVENT, GENESIS, Actor, canonical, new_event, seal, signed_bytes
from tpu_ops.audit.spool import Spool
from tpu_ops.audit.store import S3Store
from tpu_ops.audit.trail import SIGNING_ALGORITHM, AuditTrail, audit_clients
from tpu_ops.audit.verify import Report, item_from_object, items_from_jsonl, verify
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


def rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096 / 2**20


def hwm_mib() -> float:
    """This process's peak RSS (``VmHWM``: unlike ``ru_maxrss``, not inherited across fork and exec)."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:")) / 1024


def measured(fn: Callable[[], Report]) -> tuple[Report, float, float, float]:
    """(report, seconds, peak RSS MiB, RSS before MiB), RSS sampled every 5 ms while ``fn`` runs."""
    before, peak, done = rss_mib(), [0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mib())
            time.sleep(0.005)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    t0 = time.perf_counter()
    report = fn()
    seconds = time.perf_counter() - t0
    done.set()
    t.join()
    return report, seconds, max(peak[0], rss_mib()), before


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--per-run", type=int, default=99)
    ap.add_argument("--skip-s3", action="store_true", help="only the JSONL figure")
    args = ap.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with LocalStack(tpu=False) as stack, tempfile.TemporaryDirectory() as tmp:
        settings = stack.settings(audit_uri="s3://tpu-ops-audit/bench", audit_spool=Path(tmp) / "spool.jsonl")
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
        assert stack.aws is not None
        t0 = time.perf_counter()
        stack.aws.put_objects(store.trail.bucket, ((store.key(r["chain"], r["seq"]), canonical(r)) for r in records))
        print(f"(setup) {len(records)} records stored in moto's backend in {time.perf_counter() - t0:.1f} s")
        trail = AuditTrail(store, kms, Spool(Path(tmp) / "spool.jsonl"), key_arn, "service:bench")
        t0 = time.perf_counter()
        bundles = trail.seal(interval_s=3600).record["params"]["bundles"]  # type: ignore[index]
        print(f"(setup) scheduled seal over HTTP: {len(bundles)} bundles, {time.perf_counter() - t0:.1f} s")
        n = len(records) + 1

        def sequential() -> Report:  # how `audit verify s3://` read before: list, then GET by GET
            bucket = store.trail.bucket
            keys = list(store._list(store.trail.key("chains") + "/"))
            items = [item_from_object(k, s3.get_object(Bucket=bucket, Key=k)["Body"].read()) for k in keys]
            return verify(items, kms, key_arn)

        def parallel() -> Report:  # how it reads now
            objects, problems = store.read_verified()
            items = [item_from_object(k, b) for k, b in objects]
            return verify(items, kms, key_arn, seal_interval_s=3600, history=problems)

        new, new_s, new_peak, new_before = measured(parallel)
        assert new.ok and new.records == n, new.damage
        old, old_s, old_peak, old_before = measured(sequential)
        assert old.ok and old.records == n, old.damage
        print(f"verify s3:// sequential (list + {n} GETs one at a time): {old_s:.2f} s, "
              f"peak RSS {old_peak:.0f} MiB ({old_peak - old_before:+.0f} MiB)")  # fmt: skip
        print(f"verify s3:// as `audit verify` reads it (versions + digests + {len(bundles)} bundles, 16 at a time): "
              f"{new_s:.2f} s, peak RSS {new_peak:.0f} MiB ({new_peak - new_before:+.0f} MiB)")  # fmt: skip
        print(f"speed-up: {old_s / new_s:.1f}x (target >= 4x); moto runs in this process, so RSS includes its store")
        # the reader's own memory, without moto's: the same read in a process of its own
        env = {**os.environ, **stack.env(), "TPU_OPS_AUDIT_URI": settings.audit_uri}
        child = subprocess.run([sys.executable, __file__, "--reader", key_arn], env=env, capture_output=True,
                               text=True, check=True, timeout=600)  # fmt: skip
        got = json.loads(child.stdout.strip().splitlines()[-1])
        print(f"the same read in its own process: {got['seconds']:.2f} s, {got['records']} records, peak RSS "
              f"{got['peak_mib']:.0f} MiB ({got['peak_mib'] - got['base_mib']:+.0f} MiB over the interpreter with "
              "its imports)")  # fmt: skip
    return 0


def reader(key_arn: str) -> int:
    """``--reader``: read and verify the trail the environment names; print seconds and peak RSS as JSON."""
    from tpu_ops.settings import Settings

    settings = Settings()
    s3, kms = audit_clients(settings)
    store = S3Store(s3, parse_s3(settings.audit_uri), 1)
    base = hwm_mib()  # peak so far: the interpreter and its imports
    t0 = time.perf_counter()
    objects, problems = store.read_verified()
    items = [item_from_object(k, b) for k, b in objects]
    report = verify(items, kms, key_arn, seal_interval_s=3600, history=problems)
    seconds = time.perf_counter() - t0
    assert report.ok, report.damage
    peak = hwm_mib()
    print(json.dumps({"seconds": seconds, "records": report.records, "peak_mib": peak, "base_mib": base}))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--reader":
        sys.exit(reader(sys.argv[2]))
    sys.exit(main())
