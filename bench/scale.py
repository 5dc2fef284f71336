"""The mirror at scale, for ``bench/mirror_bench.py``: a no-change run over N objects, and request counts.

Seeding N objects through HTTP would take most of an hour on the emulators, so the source goes
straight into moto's in-process backend (``MotoServer.put_objects``) and the destination gets
what a previous mirror would have left (same bytes, provenance metadata) by parallel small
uploads to fake-gcs-server. Requests are counted at the emulators: moto's access log (werkzeug)
and fake-gcs-server's (``LocalStack(gcs_access_log=...)``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

_REQUEST = re.compile(r'"(GET|PUT|POST|PATCH|DELETE|HEAD) ')

LISTINGS_ALONE = """
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
from tpu_ops.mirror.engine import make_clients
from tpu_ops.mirror.listing import list_dest, list_source
from tpu_ops.settings import Settings
from tpu_ops.uris import parse_gs, parse_s3
s3, gcs = make_clients(Settings(), 8)
src, dst = parse_s3(sys.argv[1]), parse_gs(sys.argv[2])
t = time.perf_counter(); n_src = len(list_source(s3, src).objects); t_src = time.perf_counter() - t
t = time.perf_counter(); n_dst = len(list_dest(gcs, dst).objects); t_dst = time.perf_counter() - t
t = time.perf_counter()
with ThreadPoolExecutor(2) as pool:
    a, b = pool.submit(list_source, s3, src), pool.submit(list_dest, gcs, dst)
    a.result(), b.result()
print(json.dumps({"s3": t_src, "gcs": t_dst, "both": time.perf_counter() - t, "n": [n_src, n_dst]}))
"""


class RequestCounter(logging.Handler):
    """Counts requests moto served (its werkzeug access log) and fake-gcs-server served (its log)."""

    def __init__(self, gcs_log: Path) -> None:
        super().__init__()
        self.gcs_log = gcs_log
        self.s3 = 0
        self._gcs_start = 0
        self._lock = threading.Lock()
        logging.getLogger("werkzeug").addHandler(self)
        logging.getLogger("werkzeug").setLevel(logging.INFO)

    def emit(self, record: logging.LogRecord) -> None:
        if _REQUEST.search(record.getMessage()):
            with self._lock:
                self.s3 += 1

    def _gcs_lines(self) -> int:
        text = self.gcs_log.read_text(errors="replace") if self.gcs_log.exists() else ""
        return len(_REQUEST.findall(text))

    def start(self) -> None:
        with self._lock:
            self.s3 = 0
        self._gcs_start = self._gcs_lines()

    def counts(self) -> tuple[int, int]:
        """(S3 requests, GCS requests) since ``start``."""
        time.sleep(0.3)  # fake-gcs-server writes its log line after the response
        return self.s3, self._gcs_lines() - self._gcs_start


def body(i: int) -> bytes:
    return f"object {i:08d} of the scale benchmark\n".encode()


def seed(stack: Any, src_bucket: str, dst_bucket: str, n: int, log: Any) -> None:
    """``n`` objects in ``s3://src_bucket/data/``, already mirrored to ``gs://dst_bucket/data/``."""
    from google_crc32c import value as crc32c

    from tpu_ops.mirror.records import SourceObject
    from tpu_ops.mirror.strategies import provenance

    t = time.perf_counter()
    stack.aws.put_objects(src_bucket, ((f"data/{i:07d}.bin", body(i)) for i in range(n)))
    log(f"seeded {n} objects in moto in {time.perf_counter() - t:.1f} s")
    import requests

    url = f"{stack.gcs_endpoint}/upload/storage/v1/b/{quote(dst_bucket, safe='')}/o?uploadType=multipart"
    local = threading.local()

    def upload(i: int) -> None:
        data = body(i)
        crc = base64.b64encode(crc32c(data).to_bytes(4, "big")).decode()
        src = SourceObject(f"{i:07d}.bin", len(data), hashlib.md5(data).hexdigest(), None)  # = S3's ETag
        meta = {"name": f"data/{src.rel}", "metadata": provenance(src, crc)}
        payload = (
            b"--b\r\nContent-Type: application/json\r\n\r\n" + json.dumps(meta).encode()
            + b"\r\n--b\r\nContent-Type: application/octet-stream\r\n\r\n" + data + b"\r\n--b--\r\n"
        )  # fmt: skip
        if not hasattr(local, "s"):
            local.s = requests.Session()
            local.s.trust_env = False
        r = local.s.post(url, data=payload, headers={"Content-Type": "multipart/related; boundary=b"}, timeout=60)
        r.raise_for_status()

    t = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(upload, range(n), chunksize=256))
    log(f"seeded {n} mirrored objects in fake-gcs-server in {time.perf_counter() - t:.1f} s")


def versioned_no_change(s3: Any, gcs: Any, cli: Any, log: Any, runs: int = 3) -> dict[str, float]:
    """Median no-change wall time over 4 x 64 MiB, versioned source vs unversioned."""
    import os
    import statistics

    out: dict[str, float] = {}
    blob = os.urandom(64 * 1024 * 1024)
    for kind in ("unversioned", "versioned"):
        bucket = f"bench-{kind}"
        s3.create_bucket(Bucket=bucket)
        if kind == "versioned":
            s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        for i in range(4):
            s3.put_object(Bucket=bucket, Key=f"data/{i}.bin", Body=blob[i:] + blob[:i])  # four distinct bodies
        gcs.create_bucket(f"{bucket}-dst")
        args = ("mirror", f"s3://{bucket}/data", f"gs://{bucket}-dst/data", "--json")
        assert cli(*args)[2]["objects_copied"] == 4
        walls = []
        for _ in range(runs):
            wall, _cpu, result = cli(*args)
            assert result["objects_copied"] == 0 and result["source_versioned"] == (kind == "versioned")
            walls.append(wall)
        out[kind] = statistics.median(walls)
        log(f"no-change over 4 x 64 MiB, {kind}: {out[kind]:.2f} s")
    return out


def no_change_at_scale(stack: Any, s3: Any, gcs: Any, n: int, cli: Any, log: Any) -> dict[str, Any]:
    """A no-change run over ``n`` objects, and the time of its listings alone."""
    if n <= 0:
        return {}
    s3.create_bucket(Bucket="bench-scale")
    gcs.create_bucket("bench-scale-dst")
    seed(stack, "bench-scale", "bench-scale-dst", n, log)
    src, dst = "s3://bench-scale/data", "gs://bench-scale-dst/data"
    cli("mirror", src, dst, "--json")  # unmeasured: warms the emulators (and moto's sorted key cache)
    wall, cpu, result = cli("mirror", src, dst, "--json")
    assert (result["objects_copied"], result["objects_skipped"]) == (0, n), result
    _w, _c, alone = cli.python(LISTINGS_ALONE, src, dst)
    assert alone["n"] == [n, n], alone
    log(f"no-change over {n} objects: {wall:.2f} s; listings alone {alone}")
    return {"objects": n, "wall": wall, "cpu": cpu, "timings": result["timings_s"], **alone}


def print_requests(requests: dict[str, tuple[int, int, int]]) -> dict[str, float]:
    """The requests table; returns requests per copied object by tool."""
    print("\nAPI requests during a full copy (counted at the emulators)")
    print("{:<8} {:>8} {:>8} {:>8} {:>12}".format("tool", "S3", "GCS", "objects", "per object"))
    per: dict[str, float] = {}
    for tool, (s3n, gcsn, objects) in requests.items():
        per[tool] = (s3n + gcsn) / objects
        print(f"{tool:<8} {s3n:8d} {gcsn:8d} {objects:8d} {per[tool]:12.2f}")
    return per


def print_versioned(v: dict[str, float]) -> None:
    print(
        f"\nno-change over 4 x 64 MiB: versioned source {v['versioned']:.2f} s, unversioned {v['unversioned']:.2f} s "
        f"({v['versioned'] / v['unversioned']:.2f}x)"
    )


def print_at_scale(a: dict[str, Any]) -> None:
    print(
        f"\nno-change over {a['objects']:,} objects: {a['wall']:.2f} s wall, {a['cpu']:.2f} s CPU "
        f"(in-process: {', '.join(f'{k} {v:.2f}' for k, v in a['timings'].items())})\n"
        f"  its listings alone: S3 {a['s3']:.2f} s, GCS {a['gcs']:.2f} s, both at once {a['both']:.2f} s "
        f"-> the run takes {a['wall'] / a['both']:.2f}x its listings"
    )


def checks(per: dict[str, float], v: dict[str, float], a: dict[str, Any]) -> list[tuple[str, bool]]:
    out = [("versioned no-change within 1.5x of unversioned", v["versioned"] <= 1.5 * v["unversioned"])]
    if "rclone" in per:
        out.append(("tpu-ops makes no more requests per copied object than rclone", per["tpu-ops"] <= per["rclone"]))
    if a:
        out.append((f"{a['objects']:,}-object no-change run within 2x of its listings", a["wall"] <= 2 * a["both"]))
    return out
