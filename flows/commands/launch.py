"""``tpu-ops launch SPEC``: run any spec — a pipeline, a train job or a provision spec — and follow it.

Where the run goes on: a flow run of the served deployment when a Prefect API is configured
(``PREFECT_API_URL``; it must answer), else a detached process on this machine
(``python -m flows.commands._launched RUN_ID``, its own session: closing the terminal does not stop
it). Like ``sky launch``, the command then streams the run's logs until it ends; Ctrl-C stops
following, not the run. ``--detach`` returns at once. Either way it prints the run id, the UI link
(with a Prefect API) and the commands that follow the run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tpu_ops.errors import SpecError

DEPLOYMENTS = {"pipeline": "retraining-pipeline", "train-job": "train", "provision": "provision-slice"}
"""Spec kind → the flow whose deployment runs it (``tpu-ops serve`` serves each as ``<flow>/default``)."""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "launch",
        help="Run a spec (pipeline, train job or provision) and stream its logs; Ctrl-C detaches.",
        description="The spec's kind is what its first comment line declares (`# kind: train-job`), else "
        "what its keys look like. With a Prefect API configured (PREFECT_API_URL) the run is a flow run of "
        "the served deployment (`tpu-ops serve`); otherwise a detached process on this machine. The command "
        "streams the trainers' logs until the run ends (Ctrl-C stops following; the run goes on), or "
        "returns at once with --detach. Follow it with `tpu-ops status RUN`, `tpu-ops logs RUN --follow`, "
        "stop it with `tpu-ops cancel RUN`.",
    )
    p.add_argument("spec", metavar="SPEC", type=Path, help="a pipeline, train job or provision spec (YAML or JSON)")
    p.add_argument("--run-id", help="the run's id (default: the pipeline's run_id, else <name>-<yymmdd>-<hhmmss>)")
    p.add_argument("-d", "--detach", action="store_true", help="return once the run started; do not stream logs")
    p.add_argument("--local", action="store_true", help="run on this machine even when a Prefect API is configured")
    p.add_argument("--json", action="store_true", help="print the launch record as JSON (implies --detach)")
    p.set_defaults(handler=run)


def _default_run_id(kind: str, spec: Any, path: Path) -> str:
    from flows.pipeline import new_run_id

    if kind == "pipeline":
        return str(spec.run_id or new_run_id(spec.name))
    stem = re.sub(r"[^a-z0-9-]+", "-", path.stem.lower()).strip("-")
    return new_run_id(stem if stem[:1].isalpha() else f"run-{stem}".rstrip("-"))


def load(path: Path) -> tuple[str, Any]:
    """``(kind, spec)`` of a launchable spec file; ``SpecError`` in one line for any other."""
    from flows.commands._specs import NAMES, RUNS, kind_of
    from flows.commands.validate import spec_class
    from tpu_ops.specs import parse_spec

    kind, doc = kind_of(path)
    if kind is None:
        raise SpecError(f"{path}: not a spec launch recognises: declare it on the first line, e.g. `# kind: train-job` "
                        "(pipeline, train-job or provision)")  # fmt: skip
    if kind not in DEPLOYMENTS:
        raise SpecError(f"{path} is {NAMES[kind]}; launch runs a pipeline, train job or provision spec "
                        f"(this one: {RUNS[kind].format(path=path)})")  # fmt: skip
    return kind, parse_spec(spec_class(kind), doc, what=f"{path}: {kind} spec")


def prefect_api() -> str | None:
    """The configured Prefect API's URL (checked to answer), or None when none is configured."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        return None
    from flows.commands.serve import check_api

    check_api()  # configured but silent: one line naming the URL, never a quiet switch to local
    return str(url)


def run(args: argparse.Namespace) -> int:
    from flows.settings import resolve_settings
    from tpu_ops.layout import check_run_id
    from tpu_ops.provision.cost import check_budget
    from tpu_ops.provision.prices import load as load_prices
    from tpu_ops.train import launches

    kind, spec = load(args.spec)
    run_id = check_run_id(args.run_id or _default_run_id(kind, spec, args.spec))
    if kind == "pipeline":
        spec = spec.model_copy(update={"run_id": run_id})
    provision = spec if kind == "provision" else spec.provision
    settings = resolve_settings()
    check_budget(provision, load_prices(settings))  # refuse before anything starts or any cloud call
    if kind == "train-job":
        from tpu_ops.train.incarnations import check_command

        check_command(spec, run_id)
    previous = launches.load(settings, run_id)
    if previous is not None and previous.supervisor_alive():
        raise SpecError(f"run {run_id} is already running (pid {previous.pid}): tpu-ops status {run_id}",
                        [{"field": "run_id", "message": "already running", "value": run_id}])  # fmt: skip
    api = None if args.local else prefect_api()  # a configured API that does not answer: refused first
    record = launches.from_spec(kind, spec, run_id)
    _clear_cancel(settings, record)  # launching a cancelled run's id again means: go on
    where = launches.launch_dir(settings, run_id)
    where.mkdir(parents=True, exist_ok=True)
    (where / "spec.json").write_text(json.dumps(spec.model_dump(mode="json"), indent=2), encoding="utf-8")
    if api is not None:
        _through_prefect(record, spec, kind)
    else:
        _in_process(settings, record, spec)
    launches.save(settings, record)
    if args.json:
        print(json.dumps(record.to_json(), indent=2, default=str))
        return 0
    print(describe(record, settings))
    if args.detach:
        return 0
    from flows.commands.logs import follow

    return follow(settings, record, None, stream=sys.stdout, announce=True)


def _clear_cancel(settings: Any, record: Any) -> None:
    if record.layout is None:
        return
    from tpu_ops.cloud.clients import Clients
    from tpu_ops.errors import NotFoundError
    from tpu_ops.train import cancel

    with contextlib.suppress(NotFoundError):  # no bucket yet: nothing to clear
        cancel.clear(Clients(settings).gcs(), record.layout)


def _through_prefect(record: Any, spec: Any, kind: str) -> None:
    """Start a flow run of the served deployment for ``kind`` (``tpu-ops serve`` serves them)."""
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_UI_URL

    from flows.provision import run_tag
    from tpu_ops.errors import ConfigError
    from tpu_ops.train.launches import LAUNCH_TAG, PREFECT

    name = f"{DEPLOYMENTS[kind]}/default"
    params: dict[str, Any] = {"spec": spec.model_dump(mode="json")}
    if kind != "pipeline":
        params["run_id"] = record.run_id
    try:
        flow_run: Any = run_deployment(name, parameters=params, timeout=0, tags=[run_tag(record.run_id), LAUNCH_TAG])
    except ObjectNotFound:
        err = ConfigError(f"the Prefect API has no deployment {name}")
        err.fix = "serve the flows: tpu-ops serve (or run here with --local)"
        raise err from None
    record.mode, record.flow_run_id = PREFECT, str(flow_run.id)
    ui = PREFECT_UI_URL.value()
    record.ui_url = f"{str(ui).rstrip('/')}/runs/flow-run/{flow_run.id}" if ui else ""


def _in_process(settings: Any, record: Any, spec: Any) -> None:
    """Start the run in a detached process (its own session) that outlives this command."""
    from tpu_ops.train.launches import launch_dir, save

    save(settings, record)  # the child reads it
    where = launch_dir(settings, record.run_id)
    env = {**os.environ, "TPU_OPS_STATE_DIR": str(Path(settings.state_dir).resolve())}
    if record.kind == "pipeline" and not env.get("PREFECT_API_URL"):
        # The pipeline is a flow: it runs on a temporary Prefect server, as `dry-run`'s does, with its own
        # home beside the run (not ~/.prefect), no analytics, and time to start on a loaded machine.
        env["PREFECT_HOME"] = str((where / "prefect-home").resolve())
        env.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        env.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    with (where / "supervisor.log").open("ab") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "flows.commands._launched", record.run_id],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
        )  # fmt: skip
    record.pid = child.pid


def describe(record: Any, settings: Any) -> str:
    """What ``launch`` prints: the run, where it goes on, and the commands that follow it."""
    from flows.commands._disk import tpu_ops_exe
    from tpu_ops.train.launches import PREFECT, launch_dir

    what = {"pipeline": "pipeline", "train-job": "train job", "provision": "slice"}[record.kind]
    if record.mode == PREFECT:
        where = f"flow run {record.flow_run_id} of deployment {DEPLOYMENTS[record.kind]}/default"
    else:
        where = f"a background process on this machine (pid {record.pid})"
    lines = [f"launched {what} {record.run_id} in {where}"]
    if record.ui_url:
        lines.append(f"  UI:      {record.ui_url}")
    elif record.mode != PREFECT:
        lines.append(f"  its own output: {launch_dir(settings, record.run_id) / 'supervisor.log'}")
    exe = tpu_ops_exe()  # `.venv/bin/tpu-ops`: runs in the shell the README's walk uses, venv active or not
    lines += [f"  status:  {exe} status {record.run_id}",
              f"  logs:    {exe} logs {record.run_id} --follow" if record.kind != "provision" else "",
              f"  cancel:  {exe} cancel {record.run_id}"]  # fmt: skip
    return "\n".join(line for line in lines if line)

