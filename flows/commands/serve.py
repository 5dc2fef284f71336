"""``tpu-ops serve [--spec FILE]``: serve the flows as deployments, for the Prefect UI and schedules."""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "serve",
        help="Serve the flows as deployments to the Prefect API (UI forms, schedules, the reaper).",
        description="Needs a Prefect API: start one with `make ui` and set "
        "PREFECT_API_URL=http://127.0.0.1:4200/api. Point the clouds at the local stack with "
        "`tpu-ops local up` for a dry run. Runs until interrupted.",
    )
    p.add_argument("--spec", type=Path, help="a pipeline spec: its own deployment, on its cron schedule")
    p.add_argument(
        "--shutdown-grace",
        type=float,
        default=20.0,
        metavar="S",
        help="seconds a SIGTERM/SIGINT shutdown may take before the process exits anyway (20)",
    )
    p.add_argument(
        "--reap-every",
        type=_interval,
        default=None,
        metavar="DURATION",
        help="how often the reaper runs: 90s, 30m, 2h, 1d (15m)",
    )
    p.set_defaults(handler=run)


def _interval(text: str) -> timedelta:
    """``--reap-every``'s value: a duration from 5 s to 1 day, or a usage error saying what is allowed."""
    from tpu_ops.specs.common import parse_duration

    value = parse_duration(text)
    if not isinstance(value, timedelta) or not timedelta(seconds=5) <= value <= timedelta(days=1):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: a duration from 5s to 1d, e.g. 90s, 30m, 2h")
    return value


API_FIX = "start one with `make ui` and set PREFECT_API_URL=http://127.0.0.1:4200/api"


def require_api_url() -> None:
    """Refuse (``ConfigError``) when no Prefect API is configured.

    Without ``PREFECT_API_URL`` Prefect starts a temporary server inside this process: the
    deployments would be served to an API no UI, schedule or worker can reach, and go with it.
    """
    from prefect.settings import PREFECT_API_URL

    from tpu_ops.errors import ConfigError

    if not PREFECT_API_URL.value():
        err = ConfigError("serve needs a running Prefect API, and PREFECT_API_URL is not set")
        err.fix = API_FIX
        raise err


def check_api() -> None:
    """Raise ``ConfigError`` naming the API URL if no Prefect API answers there."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    from tpu_ops.errors import UnreachableError

    async def health() -> Exception | None:
        async with get_client() as client:
            return await client.api_healthcheck()

    try:
        problem = asyncio.run(health())
    except Exception as exc:  # the client could not even be built or reach the URL
        problem = exc
    if problem is not None:
        url = PREFECT_API_URL.value() or "the ephemeral server"
        err = UnreachableError(f"no Prefect API answers at {url} ({problem})", endpoint=url)
        err.fix = API_FIX
        raise err


def check_auth() -> None:
    """Raise ``ConfigError`` if the Prefect API refuses this client (401): a server started with
    ``PREFECT_SERVER_API_AUTH_STRING`` answers its health probe to anyone, everything else only to
    clients with the same ``PREFECT_API_AUTH_STRING`` (docs/production-server.md)."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL

    from tpu_ops.errors import ConfigError

    async def hello() -> int:
        async with get_client() as client:
            try:
                return (await client.hello()).status_code
            except Exception as exc:  # Prefect's client raises on 4xx; the status is on the response
                return int(getattr(getattr(exc, "response", None), "status_code", 0))

    if asyncio.run(hello()) == 401:
        given = "a different" if PREFECT_API_AUTH_STRING.value() else "no"
        url = PREFECT_API_URL.value()
        err = ConfigError(f"the Prefect API at {url} refuses this client (401): {given} auth string")
        err.fix = "set PREFECT_API_AUTH_STRING to the server's auth string, read from your secret store"
        raise err


def run(args: argparse.Namespace) -> int:
    from tpu_ops.specs import PipelineSpec, load_spec

    pipeline = load_spec(args.spec, PipelineSpec) if args.spec else None
    require_api_url()
    check_api()
    check_auth()
    from flows.deployments import REAP_INTERVAL, main

    main(pipeline, grace_s=args.shutdown_grace, reap_interval=args.reap_every or REAP_INTERVAL)
    return 0
