"""How long `tpu-ops validate` takes to refuse each hostile file (in-process, best of 5), and the
biggest legitimate spec-sized document for comparison. Prints one line per file.

    .venv/bin/python bench/hostile_bench.py
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flows.cli import main  # noqa: E402
from tests.foundation.test_hostile_files import hostile_files  # noqa: E402


def refuse_s(path: Path) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = main(["validate", str(path)])
        best = min(best, time.perf_counter() - t0)
        assert code == 1, path
    return best


def run() -> None:
    main(["validate", str(ROOT / "flows" / "dryrun.yaml")])  # warm: imports, pydantic models
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for name, (content, _, _) in sorted(hostile_files().items()):
            path = Path(tmp) / name
            path.write_bytes(content)
            rows.append((name, len(content), refuse_s(path)))
        big = Path(tmp) / "limit-sized.yaml"  # 64 KiB of plain YAML: the most a spec may cost
        big.write_text("a:\n" + "".join(f"  k{i}: v{i}\n" for i in range(4900))[: 64 * 1024 - 16])
        rows.append(("limit-sized.yaml (refused: extra fields)", big.stat().st_size, refuse_s(big)))
    for name, size, took in rows:
        print(f"{name:45s} {size:>10,d} bytes  refused in {took * 1000:7.1f} ms")
    print(f"slowest: {max(r[2] for r in rows) * 1000:.1f} ms")


if __name__ == "__main__":
    run()
