"""A throwaway PostgreSQL cluster on loopback, for the Prefect server's production database in tests.

Debian's ``postgresql`` package (``make tools`` installs it) ships ``initdb`` and ``pg_ctl`` under
``/usr/lib/postgresql/<version>/bin``. PostgreSQL refuses to run as root, so as root (CI) the
cluster belongs to the package's ``postgres`` user and every command runs through ``runuser``.
The cluster listens on 127.0.0.1 only, on a free port, with password (SCRAM) authentication; its
socket and data live in a fresh temporary directory that is removed when it stops.
"""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from infra.local._proc import LOOPBACK, free_port

USER = "tpuops"
DATABASE = "prefect"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries on this machine (or no user to run them as)."""


def binaries() -> Path:
    """The newest ``/usr/lib/postgresql/*/bin`` holding ``initdb`` and ``pg_ctl``."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if not found:
        raise PostgresUnavailable("no /usr/lib/postgresql/*/bin/initdb: install Debian's postgresql (make tools)")
    return Path(found[-1]).parent


@dataclass(frozen=True)
class Postgres:
    """A running cluster: where it listens and the asyncpg URL of its one database."""

    port: int
    password: str
    directory: Path

    @property
    def url(self) -> str:
        """``PREFECT_API_DATABASE_CONNECTION_URL`` for this cluster's database."""
        return f"postgresql+asyncpg://{USER}:{self.password}@{LOOPBACK}:{self.port}/{DATABASE}"


def _as_owner(argv: list[str]) -> list[str]:
    """``argv`` run as the ``postgres`` user when we are root (PostgreSQL will not run as root)."""
    if os.geteuid() != 0:
        return argv
    if shutil.which("runuser") is None:
        raise PostgresUnavailable("running as root and no runuser to start PostgreSQL as 'postgres'")
    return ["runuser", "-u", "postgres", "--", *argv]


@contextlib.contextmanager
def postgres() -> Iterator[Postgres]:
    """Start a fresh cluster (about a second), yield it, stop it and delete its files."""
    bin_dir = binaries()
    # Not under pytest's tmp_path: its parents are private to root, and the server runs as 'postgres'.
    directory = Path(tempfile.mkdtemp(prefix="tpu-ops-pg-"))
    if os.geteuid() == 0:
        import pwd

        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(directory)
            raise PostgresUnavailable("running as root and there is no 'postgres' user") from None
        os.chown(directory, owner.pw_uid, owner.pw_gid)
    password = secrets.token_hex(16)
    pwfile = directory / "pw"
    pwfile.write_text(password + "\n")
    if os.geteuid() == 0:
        os.chown(pwfile, owner.pw_uid, owner.pw_gid)
    data, port = directory / "data", free_port()

    def run(*argv: str) -> None:
        proc = subprocess.run(_as_owner(list(argv)), capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            log = directory / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"{Path(argv[0]).name} failed ({proc.returncode}): {proc.stderr[-2000:]}{tail}")

    started = False
    try:
        run(str(bin_dir / "initdb"), "-D", str(data), "-U", USER, f"--pwfile={pwfile}", "--auth=scram-sha-256",
            "-E", "UTF8", "--no-sync", "--no-instructions")  # fmt: skip
        pwfile.unlink()
        options = f"-c listen_addresses={LOOPBACK} -p {port} -c unix_socket_directories={directory} -c fsync=off"
        run(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(directory / "server.log"), "-w", "-t", "60",
            "-o", options, "start")  # fmt: skip
        started = True
        env_pw = {**os.environ, "PGPASSWORD": password}
        created = subprocess.run(
            _as_owner([str(bin_dir / "createdb"), "-h", LOOPBACK, "-p", str(port), "-U", USER, DATABASE]),
            capture_output=True, text=True, timeout=60, env=env_pw,
        )  # fmt: skip
        if created.returncode != 0:
            raise RuntimeError(f"createdb failed: {created.stderr[-2000:]}")
        yield Postgres(port, password, directory)
    finally:
        if started:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                run(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(directory, ignore_errors=True)
