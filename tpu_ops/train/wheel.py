"""The agent wheel the flow uploads under ``RUN/_tpu_ops/agent/`` (a real VM uses it without an index).

A pure-Python wheel of what a VM runs and nothing else: ``tpu_ops.agent`` (standard library only)
and the reference trainer (numpy, which the job's setup step installs, plus the agent's GCS
client). It declares no dependencies (no ``Requires-Dist``), so it installs, or simply unpacks,
on a bare Python 3.10 image. Built here with the standard library, so building needs neither a
package index nor a recent setuptools, and cached under ``settings.state_dir/wheels/<hash>/``.
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
import zipfile
from pathlib import Path

import tpu_ops
from tpu_ops.settings import Settings

PACKAGE = Path(tpu_ops.__file__).resolve().parent
NAME, VERSION = "tpu_ops", tpu_ops.__version__
# What a VM needs, relative to the package: the agent and the reference trainer.
VM_FILES = ("__init__.py", "agent/*.py", "train/__init__.py", "train/reference.py")


def _files(package: Path) -> list[Path]:
    found = {p for pattern in VM_FILES for p in package.glob(pattern) if p.is_file()}
    return sorted(p for p in found if "__pycache__" not in p.parts)


def _source_hash(package: Path) -> str:
    h = hashlib.sha256()
    for path in _files(package):
        h.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(out_dir: Path, package: Path = PACKAGE) -> Path:
    """Write ``tpu_ops-<version>-py3-none-any.whl`` into ``out_dir``; return its path."""
    dist = f"{NAME}-{VERSION}.dist-info"
    meta = "\n".join(
        ["Metadata-Version: 2.1", "Name: tpu-ops", f"Version: {VERSION}", "Requires-Python: >=3.10",
         "Summary: tpu-ops' worker agent (standard library only) and reference trainer"]
    ) + "\n"  # fmt: skip
    extra = {
        f"{dist}/METADATA": meta.encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tpu-ops\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist}/entry_points.txt": b"[console_scripts]\ntpu-ops-agent = tpu_ops.agent.__main__:console\n",
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{NAME}-{VERSION}-py3-none-any.whl"
    # A file of its own per build: two supervisors starting at once both build, and a shared name let one
    # rename the other's half-written file away (FileNotFoundError). The last rename wins; both are identical.
    fd, name = tempfile.mkstemp(dir=out_dir, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    records = []
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in _files(package):
            name = f"{NAME}/{path.relative_to(package).as_posix()}"
            data = path.read_bytes()
            zf.writestr(name, data)
            records.append(_record_line(name, data))
        for name, data in extra.items():
            zf.writestr(name, data)
            records.append(_record_line(name, data))
        records.append(f"{dist}/RECORD,,")
        zf.writestr(f"{dist}/RECORD", "\n".join(records) + "\n")
    tmp.replace(target)
    return target


def agent_wheel(settings: Settings, package: Path = PACKAGE) -> Path:
    """The wheel of this tpu-ops library, built once per source state."""
    out = Path(settings.state_dir) / "wheels" / _source_hash(package)
    target = out / f"{NAME}-{VERSION}-py3-none-any.whl"
    return target if target.is_file() else build_wheel(out, package)
