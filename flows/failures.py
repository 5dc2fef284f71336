"""How a failed ``tpu-ops`` command reads: one line naming what is missing and the fix.

``flows.cli`` calls ``one_line`` for any exception a command raises; the SDK error behind it is
found and named by ``tpu_ops.cloud.translate.explain`` (a missing credential, an endpoint that did
not answer, a refused permission). ``quiet_library_tracebacks`` keeps the libraries' own console
logging (Prefect logs a failed flow run's traceback) to the one line of its message, so the
terminal ends with our line, not a traceback; ``--debug`` turns both off.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

_quiet = False
_patched = False


def _host_port(url: str) -> tuple[str, int | None]:
    parts = urlsplit(url if "://" in url else "http://" + url)
    try:
        port = parts.port
    except ValueError:
        port = None
    return (parts.hostname or "").lower(), port


def endpoint_variable(url: str) -> str:
    """The environment variable that points tpu-ops at ``url`` ("" if none does)."""
    if not url:
        return ""
    want = _host_port(url)
    prefect = os.environ.get("PREFECT_API_URL", "")
    if prefect and _host_port(prefect) == want:
        return "PREFECT_API_URL"
    try:
        from tpu_ops.settings import Settings, env_name

        # every *_endpoint* setting, including those other modules add (compute, logging)
        configured = {k: v for k, v in Settings().model_dump().items() if "endpoint" in k and isinstance(v, str)}
    except Exception:  # settings that do not validate are reported elsewhere
        return ""
    for field, value in configured.items():
        if value and _host_port(value) == want:
            return env_name(field)
    return ""


def _unreachable_fix(url: str) -> str:
    var = endpoint_variable(url)
    if var == "PREFECT_API_URL":
        return "start the Prefect server (`make ui`), or unset PREFECT_API_URL to let the command start a temporary one"
    if var:
        return f"start it (`tpu-ops local up` for the emulated clouds), or point {var} at a running one"
    return "check the network and the endpoint settings (`tpu-ops doctor` checks each)"


def _flat(text: str, limit: int = 400) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def one_line(exc: BaseException, debug: bool = False) -> str:
    """The one line a person reads for ``exc``: ``error: WHAT — fix: HOW``."""
    from tpu_ops.cloud.translate import explain
    from tpu_ops.errors import CredentialsError, TpuOpsError, UnreachableError

    if _is_settings_error(exc):
        return f"error: settings: {_settings_problem(exc)} — fix: correct or unset that environment variable"
    if (gone := missing_bucket_error(exc)) is not None:
        return f"error: {gone} — fix: {gone.fix}"
    why = explain(exc)
    if isinstance(why, UnreachableError) and why.fix:
        return f"error: {_flat(str(why))}: nothing answers there — fix: {why.fix}"
    if isinstance(why, UnreachableError):
        var = endpoint_variable(why.endpoint)
        what = f"{why.endpoint or 'an endpoint'}" + (f", set by {var}" if var else "")
        fix = why.fix or _unreachable_fix(why.endpoint)
        return f"error: cannot reach {what}: nothing answers there — fix: {fix}"
    if isinstance(why, CredentialsError) or why.fix:
        return f"error: {_flat(str(why))} — fix: {why.fix}"
    if why is exc and isinstance(exc, TpuOpsError):  # our own message, as written (a log tail has lines)
        return f"error: {exc}"
    if type(why) is TpuOpsError and not isinstance(exc, TpuOpsError):  # no SDK's: a builtin reached the edge
        return _foreign(exc, debug)
    text = f"error: {_flat(str(why), 600)}"  # a cloud's answer, translated: its message names the service
    return text if debug else text + " (run with --debug for the traceback)"


# Raised with a message meant for a person (a bad argument, a file that cannot be read); any other
# builtin reaching the edge (KeyError, TypeError, ...) is a bug, and says so.
_MEANT_FOR_PEOPLE = (ValueError, OSError, RuntimeError, TimeoutError)


def _foreign(exc: BaseException, debug: bool) -> str:
    message = _flat(str(exc), 600)
    if isinstance(exc, _MEANT_FOR_PEOPLE) and message:
        text = f"error: {message}"
    else:
        text = f"error: unexpected {type(exc).__name__}: {message} (a bug in tpu-ops, please report it)"
    return text if debug else text + " (run with --debug for the traceback)"


LOCAL_SEED_FIX = ("the local stack was not seeded: run `tpu-ops local seed` (in the shell that loaded its env file; "
                  "it makes the dry run's buckets, `--spec PIPELINE.yaml` those a pipeline spec names)")
REAL_BUCKET_FIX = "create it, or correct the URI that names it (`tpu-ops doctor --spec SPEC` checks each bucket)"


def missing_bucket_error(exc: BaseException) -> Any:
    """A ``NotFoundError`` naming the bucket and the fix, when ``exc`` says a bucket does not exist; else None.

    On the local stack (``TPU_OPS_DRY_RUN``) a missing bucket means ``tpu-ops local seed`` was not run.
    """
    from tpu_ops.cloud.translate import missing_bucket
    from tpu_ops.errors import NotFoundError

    bucket = missing_bucket(exc)
    if not bucket:
        return None
    try:
        from tpu_ops.settings import Settings

        local = Settings().dry_run
    except Exception:  # settings that do not validate are reported elsewhere
        local = False
    out = NotFoundError(f"bucket {bucket} does not exist", status=404)
    out.fix = LOCAL_SEED_FIX if local else REAL_BUCKET_FIX
    return out


@contextlib.contextmanager
def missing_buckets_named() -> Iterator[None]:
    """Inside a flow: a missing bucket fails the run with one line naming it and the fix, not a raw 404."""
    try:
        yield
    except Exception as exc:
        gone = missing_bucket_error(exc)
        if gone is None:
            raise
        raise type(gone)(f"{gone} — fix: {gone.fix}", status=404) from exc


def _is_settings_error(exc: BaseException) -> bool:
    from pydantic import ValidationError

    return isinstance(exc, ValidationError) and exc.title == "Settings"


def _settings_problem(exc: Any) -> str:
    errors = exc.errors(include_url=False)
    parts = [f"TPU_OPS_{'_'.join(str(x) for x in e['loc']).upper()}: {e['msg']}" for e in errors[:3]]
    return _flat("; ".join(parts))


def _handle(self: logging.Handler, record: logging.LogRecord) -> bool:
    if _quiet and record.exc_info and isinstance(self, logging.StreamHandler):
        record = copy.copy(record)
        record.exc_info, record.exc_text, record.stack_info = None, None, None
    return _original_handle(self, record)


_original_handle = logging.Handler.handle


@contextlib.contextmanager
def quiet_library_tracebacks(quiet: bool = True) -> Iterator[None]:
    """While the block runs, console log handlers print a record's message without its traceback."""
    global _quiet, _patched
    if not _patched:
        logging.StreamHandler.handle = _handle  # type: ignore[method-assign]
        _patched = True
    before, _quiet = _quiet, quiet
    try:
        yield
    finally:
        _quiet = before


# Commands that call no cloud endpoint, or start their own (``local up``, ``dry-run``), or check
# endpoints themselves and report each (``doctor``).
NO_ENDPOINTS = frozenset({"validate", "dry-run", "doctor", "cost", "local up"})


def reads_files_only(args: Any) -> bool:
    """True for a command line that reads local files only (a dry run's trail, a ledger)."""
    command = " ".join(str(getattr(args, a)) for a in ("command", "local_command", "audit_command")
                       if getattr(args, a, None))  # fmt: skip
    if command in NO_ENDPOINTS:
        return True
    if command == "audit verify":
        return bool(args.source) and not str(args.source).startswith("s3://") and bool(args.no_signatures)
    return command == "audit lineage" and bool(getattr(args, "trail", None))


def check_endpoints(timeout_s: float = 2.0) -> None:
    """Refuse at once, naming it, an endpoint setting where nothing listens.

    The SDKs retry a refused connection for up to two minutes (google-cloud-storage's default
    deadline) before giving up; a configured endpoint (an emulator, a private endpoint) that does
    not accept a TCP connection now will not answer those retries either. The real clouds' own
    endpoints (settings left unset) are not probed.
    """
    import socket

    from tpu_ops.errors import UnreachableError
    from tpu_ops.settings import Settings, env_name

    settings = Settings()
    for field, url in settings.model_dump().items():
        if "endpoint" not in field or not isinstance(url, str) or not url:
            continue
        host, port = _host_port(url)
        if port is None:
            port = 443 if url.startswith("https") else 80
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
        except OSError:
            err = UnreachableError(f"cannot reach {url} ({env_name(field)})", endpoint=url)
            err.fix = (
                f"start it (`tpu-ops local up` for the emulated clouds), or point {env_name(field)} at one that runs"
            )
            raise err from None
