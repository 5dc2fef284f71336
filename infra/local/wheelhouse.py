"""A wheelhouse for simulated workers, built offline from the host's installed distributions.

A worker of the host simulator has no package index, like a VM without external IP; a trainer's
packages reach it the way a user's would: wheels in GCS that the job's ``setup`` step installs.
Tests and the dry run need those wheels without a network: this repacks an installed
distribution (its files as its ``RECORD`` lists them) into a wheel with the installed ``WHEEL``
tags, which is what ``pip wheel`` would have downloaded for this interpreter.
"""

from __future__ import annotations

import csv
import importlib.metadata
import subprocess
import sys
import zipfile
from pathlib import Path

from tpu_ops.cloud.clients import storage_client
from tpu_ops.settings import Settings
from tpu_ops.uris import parse_gs

# The reference trainer's setup on a pip-less image: fetch the wheelhouse with the agent, unpack every
# wheel into a venv of the image's python3 (docs/training.md, the reference trainer's recipe).
# WHEELHOUSE is a gs:// prefix.
REFERENCE_SETUP = (
    'set -eu; "$TPU_OPS_AGENT_PYTHON" -m tpu_ops.agent fetch "$1" wheelhouse; python3 -m venv --without-pip venv; '
    'site=$(venv/bin/python -c "import sysconfig; print(sysconfig.get_path(\\"purelib\\"))"); '
    'for w in wheelhouse/*.whl; do venv/bin/python -m zipfile -e "$w" "$site"; done'
)


def reference_setup(wheelhouse: str) -> dict[str, object]:
    """The ``train`` fields that prepare the reference trainer from ``wheelhouse`` (gs://...)."""
    return {"setup": ["bash", "-c", REFERENCE_SETUP, "setup", wheelhouse], "python": "venv/bin/python"}


def repack(name: str, out_dir: Path) -> Path:
    """A wheel of the installed distribution ``name`` in ``out_dir`` (cached by file name)."""
    dist = importlib.metadata.distribution(name)
    info = Path(str(dist._path))  # type: ignore[attr-defined]  # the .dist-info directory
    tag = next(line.split(":", 1)[1].strip() for line in (info / "WHEEL").read_text().splitlines()
               if line.startswith("Tag:"))  # fmt: skip
    norm = dist.metadata["Name"].replace("-", "_")
    target = out_dir / f"{norm}-{dist.version}-{tag}.whl"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    root = info.parent
    tmp = target.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf, (info / "RECORD").open() as rec:
        for row in csv.reader(rec):
            rel = row[0]
            if not rel or rel.startswith(("..", "/")) or "__pycache__" in rel or rel.endswith(".pyc"):
                continue
            if (root / rel).is_file():
                zf.write(root / rel, rel)
    tmp.replace(target)
    return target


def upload_wheelhouse(settings: Settings, uri: str, names: tuple[str, ...] = ("numpy",)) -> str:
    """Repack ``names`` and upload them under ``uri`` (gs://...); returns ``uri``."""
    settings.check_safe("gcs_endpoint")
    gcs = storage_client(settings)
    dest = parse_gs(uri)
    for name in names:
        wheel = repack(name, Path(settings.state_dir) / "wheelhouse")
        gcs.bucket(dest.bucket).blob(dest.key(wheel.name)).upload_from_filename(str(wheel))
    return uri


# The JAX + Orbax trainer's setup (examples/orbax_trainer): fetch the runtime folder the user uploaded
# (wheels, pip's own wheel, requirements, constraints, the trainer), then `pip install --no-index
# --find-links` into a venv of the image's python3, with pip run from its wheel (the image has no pip).
ORBAX_SETUP = (
    'set -eu; "$TPU_OPS_AGENT_PYTHON" -m tpu_ops.agent fetch "$1" rt; python3 -m venv --without-pip venv; '
    'pip=$(ls rt/pip-*.whl); venv/bin/python "$pip/pip" install -q --no-index --no-compile --find-links rt '
    "-r rt/requirements.txt -c rt/constraints.txt"
)
ORBAX_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "orbax_trainer"


def pypi_wheelhouse(cache: Path, example: Path = ORBAX_EXAMPLE) -> Path:
    """Download ``example``'s requirements (pinned by its constraints) and pip's own wheel from the
    package index into ``cache``, once: a stamp holding both files' text skips later calls."""
    req, cons = example / "requirements.txt", example / "constraints.txt"
    stamp = cache / ".downloaded"
    want = req.read_text() + cons.read_text()
    if stamp.exists() and stamp.read_text() == want:
        return cache
    cache.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(cache)]
    # pip's own version comes from the constraints too (it is in the wheelhouse to install the rest)
    subprocess.run([*pip, "-r", str(req), "-c", str(cons), "pip"], check=True, timeout=1800)
    stamp.write_text(want)
    return cache


def upload_orbax_runtime(settings: Settings, uri: str, cache: Path, example: Path = ORBAX_EXAMPLE) -> str:
    """Upload the wheelhouse in ``cache`` and the example's requirements, constraints and trainer under
    ``uri`` (gs://...), which ``ORBAX_SETUP`` fetches on every worker; returns ``uri``."""
    settings.check_safe("gcs_endpoint")
    gcs = storage_client(settings)
    dest = parse_gs(uri)
    files = sorted(cache.glob("*.whl")) + [example / n for n in ("requirements.txt", "constraints.txt", "train.py")]
    for f in files:
        gcs.bucket(dest.bucket).blob(dest.key(f.name)).upload_from_filename(str(f))
    return uri
