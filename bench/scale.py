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
from pathlib import Path
from typing import Any

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


def seed(stack: Any, root: Path, src_bucket: str, dst_bucket: str, n: int, log: Any) -> None:
    """``n`` objects in ``s3://src_bucket/data/``, already mirrored to ``gs://dst_bucket/data/``.

    The destination is written straight into the filesystem root of a fake-gcs-server (objects as
    files, attributes as the JSON its filesystem backend keeps in the ``user.metadata`` xattr):
    through its API, the memory backend's creates slow from ~270/s to ~40/s by 5,000 objects.
    """
    import os

    from google_crc32c import value as crc32c

    from tpu_ops.mirror.records import SourceObject
    from tpu_ops.mirror.strategies import provenance

    t = time.perf_counter()
    stack.aws.put_objects(src_bucket, ((f"data/{i:07d}.bin", body(i)) for i in range(n)))
    log(f"seeded {n} objects in moto in {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    folder = root / dst_bucket / "data"
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        data = body(i)
        md5 = hashlib.md5(data)  # = S3's ETag of a single-part object
        b64_md5 = base64.b64encode(md5.digest()).decode()
        crc = base64.b64encode(crc32c(data).to_bytes(4, "big")).decode()
        src = SourceObject(f"{i:07d}.bin", len(data), md5.hexdigest(), None)
        attrs = {
            "StorageClass": "STANDARD", "ContentType": "application/octet-stream", "Crc32c": crc,
            "Md5Hash": b64_md5, "Etag": b64_md5, "ACL": [], "Metadata": provenance(src, crc),
            "Created": "2026-11-23T00:00:00Z", "Updated": "2026-11-23T00:00:00Z", "Generation": 1_800_000_000_000 + i,
        }  # fmt: skip
        path = folder / f"{i:07d}.bin"
        path.write_bytes(data)
        os.setxattr(path, "user.metadata", json.dumps(attrs).encode())
    log(f"seeded {n} mirrored objects in fake-gcs-server's filesystem root in {time.perf_counter() - t:.1f} s")


def versioned_no_change(s3: Any, gcs: Any, cli: Any, log: Any, runs: int = 5) -> dict[str, float]:
    """Median no-change wall time over 4 x 64 MiB, versioned source vs unversioned.

    The two kinds take turns, so a machine getting busier or quieter weighs on both alike.
    """
    import os
    import statistics

    blob = os.urandom(64 * 1024 * 1024)
    args: dict[str, tuple[str, ...]] = {}
    for kind in ("unversioned", "versioned"):
        bucket = f"bench-{kind}"
        s3.create_bucket(Bucket=bucket)
        if kind == "versioned":
            s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        for i in range(4):
            s3.put_object(Bucket=bucket, Key=f"data/{i}.bin", Body=blob[i:] + blob[:i])  # four distinct bodies
        gcs.create_bucket(f"{bucket}-dst")
        args[kind] = ("mirror", f"s3://{bucket}/data", f"gs://{bucket}-dst/data", "--json")
        assert cli(*args[kind])[2]["objects_copied"] == 4
    walls: dict[str, list[float]] = {kind: [] for kind in args}
    for _ in range(runs):
        for kind in args:
            wall, _cpu, result = cli(*args[kind])
            assert result["objects_copied"] == 0 and result["source_versioned"] == (kind == "versioned")
            walls[kind].append(wall)
    out = {kind: statistics.median(w) for kind, w in walls.items()}
    log(f"no-change over 4 x 64 MiB: {out} (runs: {walls})")
    return out


def no_change_at_scale(stack: Any, s3: Any, n: int, cli: Any, log: Any) -> dict[str, Any]:
    """A no-change run over ``n`` objects, and the time of its listings alone."""
    import tempfile

    from infra.local.gcs import FakeGcs

    if n <= 0:
        return {}
    s3.create_bucket(Bucket="bench-scale")
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None  # in memory: a disk makes the walks I/O-bound
    with tempfile.TemporaryDirectory(dir=shm) as tmp:
        gcs = FakeGcs(filesystem_root=Path(tmp))
        gcs.start()
        try:
            env = {"STORAGE_EMULATOR_HOST": gcs.url, "TPU_OPS_GCS_ENDPOINT": gcs.url}
            import requests

            requests.post(f"{gcs.url}/storage/v1/b?project=p", json={"name": "bench-scale-dst"}, timeout=30)
            seed(stack, Path(tmp), "bench-scale", "bench-scale-dst", n, log)
            src, dst = "s3://bench-scale/data", "gs://bench-scale-dst/data"
            cli.run(env, "mirror", src, dst, "--json")  # unmeasured: warms the emulators and moto's key order
            wall, cpu, result = cli.run(env, "mirror", src, dst, "--json")
            assert (result["objects_copied"], result["objects_skipped"]) == (0, n), result
            _w, _c, alone = cli.python(env, LISTINGS_ALONE, src, dst)
        finally:
            gcs.stop()
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
