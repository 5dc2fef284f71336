"""Shared fixtures: one local stack per test session, a Prefect test API when a test needs one.

The stack is session-scoped because it takes seconds to start and moto keeps global state; tests
that need a clean slate use ``stack`` (which resets the emulators' state first).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

# Tests never reach a real cloud: these make any client that slips past Settings fail fast.
os.environ.setdefault("NO_GCE_CHECK", "true")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ["TPU_OPS_DRY_RUN"] = "true"
for _var in ("AWS_PROFILE", "GOOGLE_APPLICATION_CREDENTIALS"):
    os.environ.pop(_var, None)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``make pytest`` runs ``-n 3``) each worker gets its own Prefect home (unless the
    shell set one): the in-process Prefect of two workers must not share ~/.prefect's files."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and "PREFECT_HOME" not in os.environ:
        home = os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix=f"tpu-ops-prefect-{worker}-")
        config.add_cleanup(lambda: shutil.rmtree(home, ignore_errors=True))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker, files holding a ``slow`` test come first: the scheduler hands out files in this
    order, so the long ones start at once instead of leaving one worker busy at the end."""
    if hasattr(config, "workerinput"):
        slow = {item.path for item in items if item.get_closest_marker("slow")}
        items.sort(key=lambda item: item.path not in slow)


# Test files whose tests share a session fixture too slow to build twice: under pytest-xdist each group runs
# on one worker. (Not ``xdist_group`` marks: pytest-xdist 3.8 groups by renaming ``item._nodeid``, which
# pytest 9 no longer reads, so the marks are silently ignored.)
SHARED_SESSION = {
    "tests/flows/test_dryrun.py": "default_dry_run",  # tests/flows/conftest.py's dry run, ~60-110 s
    "tests/flows/test_dryrun_records.py": "default_dry_run",
    "tests/flows/test_prefect_server.py": "prefect_server",  # a `prefect server start`, ~30-50 s
    "tests/flows/test_operate_prefect.py": "prefect_server",
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadfile`` (``make pytest``): a test file is one unit of work for one worker (its module
    fixtures are built once), and the files of a ``SHARED_SESSION`` group are one unit. Units go out in
    collection order (see above)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileOrGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return SHARED_SESSION.get(path, path)

    config.option.loadscopereorder = False  # keep the order above, not largest-file-first
    return FileOrGroup(config, log)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def google_auth() -> Iterator[object]:
    """The Google OAuth endpoint and service-account key every test's Google clients use (the local
    stack's fakes refuse requests without a token from it): ``Settings(**google_auth.settings_overrides())``,
    ``google_auth.credentials()``, ``google_auth.mint_token()``. Started once, shared with ``local_stack``."""
    from infra.local.auth import StackAuth

    auth = StackAuth("tpu-ops-local").start()
    yield auth
    auth.stop()


@pytest.fixture(scope="session")
def local_stack(google_auth: object) -> Iterator[object]:
    """The emulated clouds (moto, fake-gcs-server, fake TPU API, host simulator), started once."""
    from infra.local.stack import LocalStack

    with LocalStack(auth=google_auth) as stack:  # type: ignore[arg-type]
        yield stack


@pytest.fixture
def stack(local_stack: object) -> Iterator[object]:
    """The session stack with its state reset before the test."""
    local_stack.reset()  # type: ignore[attr-defined]
    yield local_stack


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[None]:
    """A throwaway Prefect API (≈10 s to start), for tests that run flows."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=60):
        yield


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A real ``prefect server start`` (server, scheduler, UI) on a free loopback port with its own
    PREFECT_HOME; yields the environment for processes that talk to it (``PREFECT_API_URL`` set)."""
    import subprocess
    import sys
    from pathlib import Path

    from infra.local._proc import free_port, http_ok, kill_group, wait_until

    home = tmp_path_factory.mktemp("prefect-home")
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    prefect = str(Path(sys.executable).with_name("prefect"))
    log = (home / "server.log").open("wb")
    server = subprocess.Popen(
        [prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    api = f"http://127.0.0.1:{port}/api"
    try:
        wait_until(
            lambda: http_ok(f"{api}/health") or server.poll() is not None, 120, interval=0.2, what="prefect server"
        )
        assert server.poll() is None, (home / "server.log").read_text()[-3000:]
        yield {**env, "PREFECT_API_URL": api}
    finally:
        kill_group(server, grace=10)
        log.close()
