"""Benchmark ``tpu-ops mirror`` against ``rclone sync --transfers 8`` on the local stack.

    .venv/bin/python bench/mirror_bench.py          # needs Debian's rclone: apt-get install -y rclone

Dataset: 200 x 1 MiB + 4 x 64 MiB objects (the large ones uploaded multipart) in moto S3, mirrored
into fake-gcs-server. Both tools run as subprocesses, so process start, CPU and peak RSS are real
(``os.wait4`` gives each child's own rusage). Runs: full copy, no-change re-run, re-run with 5
objects changed; then planning time and RSS for a synthetic 100,000-object listing. Prints a
table and whether each of the mirror's speed targets holds; exits 1 if one does not.

At scale (issue 12, ``bench/scale.py``): API requests per copied object for both tools (counted at
the emulators during a measured full copy), a no-change run over ``--scale-objects`` (100,000)
objects against the time of its two listings alone, and a no-change run over 4 x 64 MiB on a
versioned source against the same on an unversioned one (moto's ListObjectVersions fix).

The full copy is repeated ``--runs`` times per tool (default 5), each into a fresh bucket, the two
tools taking turns at going first; the table shows the median wall and CPU time and the highest
peak RSS, and lists every run's wall time. The re-runs use the last full copy's buckets.

The emulators are part of what is timed, so they are kept in the same state for both tools: one
unmeasured full copy per tool warms them up (fake-gcs-server's heap grows to its working size;
on a VM a first-touched page costs ~14 us), and each measured copy's bucket is emptied after the
run (the last ones are kept for the re-runs), so the emulator holds the same data for every run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MiB = 1024 * 1024
N_SMALL, SMALL, N_BIG, BIG = 200, 1 * MiB, 4, 64 * MiB
DATASET = N_SMALL * SMALL + N_BIG * BIG


@dataclass
class Run:
    tool: str
    case: str
    wall_s: float
    cpu_s: float
    rss_mb: float
    bytes_moved: int

    @property
    def mib_s(self) -> float:
        return self.bytes_moved / MiB / self.wall_s if self.wall_s else 0.0

    @property
    def cpu_per_gib(self) -> float:
        return self.cpu_s / (self.bytes_moved / 1024**3) if self.bytes_moved else float("nan")


def run_child(cmd: list[str], env: dict[str, str]) -> tuple[float, float, float, str]:
    """Run ``cmd``; return (wall s, cpu s, peak RSS MB, stdout).

    Measured by GNU time, a small process: a child forked from this one (which holds moto's
    in-memory S3) would report our RSS as its own peak, since Linux carries it across exec.
    """
    with tempfile.TemporaryDirectory() as tmp:
        stats = Path(tmp) / "time"
        t = time.perf_counter()
        proc = subprocess.run(
            ["/usr/bin/time", "-q", "-f", "%U %S %M", "-o", str(stats), *cmd],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - t
        if proc.returncode != 0:
            raise SystemExit(f"{cmd[0]} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        user, system, rss_kb = stats.read_text().split()[-3:]
    return wall, float(user) + float(system), int(rss_kb) / 1024, proc.stdout


def make_dataset(s3, bucket: str) -> None:
    s3.create_bucket(Bucket=bucket)
    for i in range(N_SMALL):
        s3.put_object(Bucket=bucket, Key=f"data/small/{i:04d}.bin", Body=os.urandom(SMALL))
    for i in range(N_BIG):
        key = f"data/big/{i}.bin"
        up = s3.create_multipart_upload(Bucket=bucket, Key=key)
        parts = []
        for n in range(1, BIG // (8 * MiB) + 1):
            r = s3.upload_part(Bucket=bucket, Key=key, UploadId=up["UploadId"], PartNumber=n, Body=os.urandom(8 * MiB))
            parts.append({"PartNumber": n, "ETag": r["ETag"]})
        s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up["UploadId"], MultipartUpload={"Parts": parts})


def rclone_conf(stack, path: Path) -> None:
    path.write_text(
        "[s3]\ntype = s3\nprovider = Other\n"
        f"endpoint = {stack.aws_endpoint}\nforce_path_style = true\n"
        "access_key_id = testing\nsecret_access_key = testing\nregion = us-east-1\n\n"
        "[gcs]\ntype = google cloud storage\nanonymous = true\n"
        f"endpoint = {stack.gcs_endpoint}/storage/v1/\nbucket_policy_only = true\n"
    )


PLAN_100K = """
import resource, time
t0 = time.perf_counter()
from tpu_ops.mirror.plan import plan
from tpu_ops.mirror.records import DestObject, SourceObject
n = 100_000
src = [SourceObject(f"shards/{i:06d}.safetensors", 1 << 20, f"{i:032x}-4", f"v{i}") for i in range(n)]
dst = {s.rel: DestObject(s.rel, s.size, "AAAAAA==", s.etag, s.version_id, s.size, "AAAAAA==")
       for s in src if s.size and int(s.etag[:32], 16) % 10}  # 90% already mirrored
t1 = time.perf_counter()
p = plan(src, dst)
t2 = time.perf_counter()
assert len(p.copy) + len(p.skip) == n
print(t2 - t1, t2 - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def median_run(tool: str, case: str, runs: list[Run]) -> Run:
    """One row for several runs: median wall and CPU time, the highest peak RSS."""
    wall, cpu = statistics.median(r.wall_s for r in runs), statistics.median(r.cpu_s for r in runs)
    return Run(tool, case, wall, cpu, max(r.rss_mb for r in runs), runs[0].bytes_moved)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description="tpu-ops mirror vs rclone sync on the local stack")
    parser.add_argument("--runs", type=int, default=5, help="full copies per tool; the table shows medians")
    parser.add_argument("--scale-objects", type=int, default=100_000, help="objects in the no-change run (0: skip)")
    args = parser.parse_args()
    os.environ.setdefault("NO_GCE_CHECK", "true")
    from bench import scale
    from infra.local.stack import LocalStack
    from tpu_ops.mirror.engine import make_clients

    rclone = shutil.which("rclone")
    if not rclone:
        print("rclone is not installed; install it with: apt-get install -y rclone", file=sys.stderr)
    tpu_ops_bin = Path(sys.executable).with_name("tpu-ops")
    ours = [str(tpu_ops_bin)] if tpu_ops_bin.exists() else [sys.executable, "-m", "flows.cli"]
    runs: list[Run] = []
    tmp = tempfile.mkdtemp()
    counter = scale.RequestCounter(Path(tmp) / "gcs-access.log")
    requests: dict[str, tuple[int, int, int]] = {}  # tool -> (S3 requests, GCS requests, objects copied)
    with LocalStack(gcs_access_log=counter.gcs_log) as stack:
        env = {**os.environ, **stack.env(), "PYTHONPATH": str(ROOT)}
        env.pop("AWS_CA_BUNDLE", None)
        s3, gcs = make_clients(stack.settings(), 8)
        print(f"uploading {N_SMALL} x 1 MiB + {N_BIG} x 64 MiB (multipart) to moto ...", file=sys.stderr)
        make_dataset(s3, "bench-src")
        conf = Path(tmp) / "rclone.conf"
        rclone_conf(stack, conf)
        dest = {"tpu-ops": "", "rclone": ""}

        def ours_run(case: str) -> None:
            cmd = [*ours, "mirror", "s3://bench-src/data", f"gs://{dest['tpu-ops']}/data", "--json"]
            wall, cpu, rss, out = run_child([*cmd, "--concurrency", "8"], env)
            runs.append(Run("tpu-ops", case, wall, cpu, rss, json.loads(out)["bytes_copied"]))

        class Cli:
            """Measured children: ``cli(*tpu-ops args)``, ``cli.python(code, *args)``; JSON output."""

            def __call__(self, *args: str) -> tuple[float, float, dict]:
                return self.run({}, *args)

            def run(self, override: dict[str, str], *args: str) -> tuple[float, float, dict]:
                wall, cpu, _rss, out = run_child([*ours, *args], {**env, **override})
                return wall, cpu, json.loads(out)

            def python(self, override: dict[str, str], code: str, *args: str) -> tuple[float, float, dict]:
                wall, cpu, _rss, out = run_child([sys.executable, "-c", code, *args], {**env, **override})
                return wall, cpu, json.loads(out)

        cli = Cli()

        def rclone_run(case: str, moved: int) -> None:
            if not rclone:
                return
            cmd = [rclone, "--config", str(conf), "sync", "s3:bench-src/data", f"gcs:{dest['rclone']}/data"]
            wall, cpu, rss, _ = run_child([*cmd, "--transfers", "8"], env)
            runs.append(Run("rclone", case, wall, cpu, rss, moved))

        def empty(bucket: str) -> None:
            for blob in list(gcs.bucket(bucket).list_blobs()):
                blob.delete()

        # Full copies into fresh buckets, the tools taking turns at going first; one median row each.
        # Round -1 is the warm-up, not measured.
        n = max(1, args.runs)
        for k in range(-1, n):
            for tool in ("tpu-ops", "rclone") if k % 2 == 0 else ("rclone", "tpu-ops"):
                if tool == "rclone" and not rclone:
                    continue
                dest[tool] = f"bench-{'ours' if tool == 'tpu-ops' else 'rclone'}-{k + 1}"
                gcs.create_bucket(dest[tool])
                counter.start()
                if tool == "tpu-ops":
                    ours_run("full copy")
                else:
                    rclone_run("full copy", DATASET)
                if k == 0:
                    requests[tool] = (*counter.counts(), N_SMALL + N_BIG)
                if k == -1:
                    runs.pop()
                if k < n - 1:
                    empty(dest[tool])
        full = {t: [r for r in runs if r.tool == t] for t in ("tpu-ops", "rclone")}
        runs[:] = [median_run(t, "full copy", rs) for t, rs in full.items() if rs]
        ours_run("no change")
        rclone_run("no change", 0)
        for i in range(5):
            s3.put_object(Bucket="bench-src", Key=f"data/small/{i * 40:04d}.bin", Body=os.urandom(SMALL))
        ours_run("5 changed")
        rclone_run("5 changed", 5 * SMALL)
        versioned = scale.versioned_no_change(s3, gcs, cli, log)
        at_scale = scale.no_change_at_scale(stack, s3, args.scale_objects, cli, log)

    shutil.rmtree(tmp, ignore_errors=True)
    t = time.perf_counter()
    plan_s, build_plan_s, plan_rss = map(float, run_child([sys.executable, "-c", PLAN_100K], env)[3].split())
    plan_wall = time.perf_counter() - t

    print(f"\ndataset: {N_SMALL} x 1 MiB + {N_BIG} x 64 MiB = {DATASET / MiB:.0f} MiB; both tools 8 transfers")
    for tool, rs in full.items():
        if rs:
            print(f"full copy, {tool}: median of {len(rs)} runs; wall s " + ", ".join(f"{r.wall_s:.2f}" for r in rs))
    print()
    head = ("tool", "case", "wall s", "MiB/s", "CPU s", "CPU s/GiB", "peak RSS MB", "moved MiB")
    print("{:<8} {:<10} {:>7} {:>7} {:>6} {:>9} {:>11} {:>9}".format(*head))
    for r in runs:
        print(
            f"{r.tool:<8} {r.case:<10} {r.wall_s:7.2f} {r.mib_s:7.1f} {r.cpu_s:6.2f} {r.cpu_per_gib:9.2f} "
            f"{r.rss_mb:11.0f} {r.bytes_moved / MiB:9.1f}"
        )
    print(
        f"\n100k-object plan: plan() {plan_s:.2f} s, build listings + plan {build_plan_s:.2f} s, "
        f"process {plan_wall:.2f} s, peak RSS {plan_rss:.0f} MB"
    )
    per_object = scale.print_requests(requests)
    scale.print_versioned(versioned)
    if at_scale:
        scale.print_at_scale(at_scale)

    by = {(r.tool, r.case): r for r in runs}
    o_full, o_none = by[("tpu-ops", "full copy")], by[("tpu-ops", "no change")]
    checks = [
        ("no-change re-run moves 0 bytes", o_none.bytes_moved == 0),
        ("peak RSS <= 300 MB (64 MiB objects)", max(r.rss_mb for r in runs if r.tool == "tpu-ops") <= 300),
        ("100k plan <= 15 s and <= 500 MB", build_plan_s <= 15 and plan_rss <= 500),
    ]
    checks += scale.checks(per_object, versioned, at_scale)
    if rclone:
        r_full, r_none = by[("rclone", "full copy")], by[("rclone", "no change")]
        checks.insert(0, ("full copy at least as fast as rclone", o_full.wall_s <= r_full.wall_s))
        checks.insert(2, ("no-change beats rclone's, process start included", o_none.wall_s < r_none.wall_s))
    print("\ntargets:")
    for what, ok in checks:
        print(f"  [{'PASS' if ok else 'FAIL'}] {what}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
