"""The Prefect UI, driven by a real browser, against `tpu-ops serve` on the local stack.

A user's path, as the README walks it: a Prefect server (own PREFECT_HOME, free port), the
emulated clouds (`tpu-ops local up`, seeded with `tpu-ops local seed`), `tpu-ops serve --spec`;
then in Chromium: the pipeline deployment and its schedule, the parameter form, an invalid value
refused with its field named (and no run created), a run started from the form that completes,
and its artifacts. Screenshots go to ``TPU_OPS_UI_SHOTS`` (default ``.tpu-ops/ui-screenshots``);
with ``TPU_OPS_UPDATE_DOCS=1`` the walkthrough's ones are copied into ``docs/ui/``.

Playwright comes from PyPI; the browser is Debian's ``chromium`` (``make setup`` installs it),
since Playwright's own browser download does not work offline.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.local._proc import free_port, http_ok, kill_group, wait_until

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CONSOLE = Path(sys.executable).with_name("tpu-ops")
PREFECT = Path(sys.executable).with_name("prefect")
DEPLOYMENT = "dry-run"  # the deployment is named after the spec (flows/dryrun.yaml)
DOC_SHOTS = ("01-deployments", "02-deployment", "03-form", "04-invalid-value", "05-run-completed", "06-artifacts",
             "07-summary", "08-ladder")  # fmt: skip
RUN_ARTIFACTS = ("pipeline-summary", "run-cost", "run-ladder", "run-goodput", "run-lineage")

pytestmark = pytest.mark.slow


@dataclass
class Served:
    ui: str
    api: str
    shots: Path
    serve_log: list[bytes]


def _read_env(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition("=")
        out[key] = shlex.split(value)[0] if value else ""
    return out


def _spec_with_schedule(tmp: Path) -> Path:
    """The dry run's spec, on a cron schedule if it has none, so the deployment shows one."""
    spec = yaml.safe_load((ROOT / "flows" / "dryrun.yaml").read_text())
    if not spec.get("schedule"):
        spec["schedule"] = "0 3 * * *"
    path = tmp / "pipeline.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _popen(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )


def _api(api: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{api}{path}", data=data, method="POST" if data else "GET",
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Prefect server + local stack + ``tpu-ops serve``, each in its own process group."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make setup` installs Debian's chromium for the browser test")
    tmp = tmp_path_factory.mktemp("ui")
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    base = {**os.environ, "PREFECT_HOME": str(tmp / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "NO_GCE_CHECK": "true", "PYTHONPATH": str(ROOT)}  # fmt: skip
    base.pop("PREFECT_API_URL", None)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        # the UI's own API URL: without it the browser calls 127.0.0.1:4200
        server_env = {**base, "PREFECT_UI_API_URL": api}
        procs.append(_popen([str(PREFECT), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                            server_env, tmp / "server.log"))  # fmt: skip
        env_file = tmp / "local.env"
        stack = _popen([str(CONSOLE), "local", "up", "--env-file", str(env_file), "--grace", "1"], base,
                       tmp / "local.log")  # fmt: skip
        procs.append(stack)
        wait_until(lambda: env_file.exists() or stack.poll() is not None, 60, interval=0.2, what="local up")
        assert stack.poll() is None, (tmp / "local.log").read_text()[-3000:]
        env = {**base, **_read_env(env_file), "TPU_OPS_STATE_DIR": str(tmp / "state"),
               "TPU_OPS_POLL_INTERVAL_S": "0.2", "PREFECT_API_URL": api}  # fmt: skip
        seed = subprocess.run([str(CONSOLE), "local", "seed", "--ladder-demo"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert seed.returncode == 0, seed.stderr
        wait_until(lambda: http_ok(f"{api}/health"), 120, interval=0.2, what="prefect server")
        serve = subprocess.Popen(
            [str(CONSOLE), "serve", "--spec", str(_spec_with_schedule(tmp)), "--shutdown-grace", "5"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        procs.append(serve)
        log: list[bytes] = []
        threading.Thread(target=lambda: log.extend(serve.stdout), daemon=True).start()  # type: ignore[arg-type]
        wait_until(lambda: any(b"serving " in x for x in log) or serve.poll() is not None, 120, interval=0.2,
                   what="tpu-ops serve")  # fmt: skip
        assert serve.poll() is None, b"".join(log).decode()[-3000:]
        shots = Path(os.environ.get("TPU_OPS_UI_SHOTS", ROOT / ".tpu-ops" / "ui-screenshots"))
        shots.mkdir(parents=True, exist_ok=True)
        yield Served(ui=f"http://127.0.0.1:{port}", api=api, shots=shots, serve_log=log)
    finally:
        for proc in reversed(procs):
            kill_group(proc, grace=10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=str(CHROMIUM),
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
                  "--disable-dev-shm-usage"],
        )  # fmt: skip
        try:
            yield chromium
        finally:
            chromium.close()


def _field_input(page: Any, label: str) -> Any:
    """The input of the form property labelled ``label`` (the innermost such property)."""
    name = page.locator(".schema-form-property__label", has_text=re.compile(rf"^{re.escape(label)}\b"))
    return page.locator(".schema-form-property", has=name).last.locator("input").first


def _flow_runs(api: str) -> list[dict[str, Any]]:
    """The pipeline's runs started by hand (the scheduler's upcoming cron runs are auto_scheduled)."""
    runs: list[dict[str, Any]] = _api(api, "/flow_runs/filter", {"flow_runs": {"tags": {"all_": ["pipeline"]}}})
    return [r for r in runs if not r.get("auto_scheduled")]


ADDED_RUNG = {"kind": "reservation", "name": "extra-reservation", "zone": "us-central2-c"}
# A rung's fields, in order, each title naming the tiers that use it (the form shows them all, whatever the kind).
RUNG_TITLES = (
    "Kind (capacity tier)",
    "Reservation name (reservation, calendar rungs)",
    "Reservation zone (reservation, calendar rungs)",
    "Max run duration (flex-start, calendar rungs)",
)


def _ladder(page: Any) -> Any:
    label = page.locator(".schema-form-property__label", has_text=re.compile(r"^Ladder\b"))
    return page.locator(".schema-form-property", has=label).last


def _menu(page: Any, menu: Any, item: str) -> None:
    menu.click()
    page.get_by_text(item, exact=True).click()


def _the_ladder_keeps_its_rungs(page: Any, shot: Callable[[str], None]) -> None:
    """One array of typed rungs: adding, switching to JSON and back, deleting never empties the ladder;
    a new rung is spot (the default kind) and its fields' titles say which tiers use them."""
    from playwright.sync_api import expect

    ladder = _ladder(page)
    rungs = ladder.locator(".schema-form-property-array-item")
    expect(rungs).to_have_count(3)  # the spec's reservation, spot, on-demand
    expect(ladder.get_by_text("Rungs or shorthand")).to_have_count(0)  # no choice of list schemas to toggle
    add = ladder.get_by_role("button", name=re.compile("Add item", re.I))
    add.click()
    add.click()
    expect(rungs).to_have_count(5)
    spot = rungs.nth(3)
    expect(spot.locator(".p-select-button__control").first).to_have_text("spot")
    titles = spot.locator(".schema-form-property__label")
    expect(titles).to_have_text([re.compile(rf"^{re.escape(t)}") for t in RUNG_TITLES])
    spot.scroll_into_view_if_needed()
    shot("03b-spot-rung")
    # the ladder as JSON, then as a form again: the same five rungs
    _menu(page, ladder.locator(".schema-form-property-menu").first, "Use JSON input")
    expect(rungs).to_have_count(0)
    _menu(page, ladder.locator(".schema-form-property-menu").first, "Use form input")
    expect(rungs).to_have_count(5)
    expect(rungs.nth(0).locator(".p-select-button__control").first).to_have_text("reservation")
    rungs.last.locator(".schema-form-property-array-item__control").first.locator(":scope > button").click()
    expect(rungs).to_have_count(4)


def _add_a_reservation_rung(page: Any) -> None:
    """The ladder's new last rung becomes a typed reservation rung (a kind choice, then the reservation's
    name and zone), last in the ladder, so spot in zone c still wins before it is tried."""
    rung = _ladder(page).locator(".schema-form-property-array-item").last
    kind = rung.locator(".p-select-button__control").first  # Kind: a select of the tiers
    kind.focus()
    kind.press(" ")  # opens its options (a click toggles it open and shut again here)
    page.get_by_role("option", name=ADDED_RUNG["kind"], exact=True).click()
    from playwright.sync_api import expect

    expect(kind).to_have_text(ADDED_RUNG["kind"])  # waits for the form to re-render the choice
    for field in ("name", "zone"):
        name = page.locator(".schema-form-property__label", has_text=re.compile(rf"^Reservation {field}\b"))
        prop = rung.locator(".schema-form-property", has=name)
        prop.get_by_role("button", name="str", exact=True).click()  # optional: from None to a string
        prop.locator("input, textarea").first.fill(ADDED_RUNG[field])
    rung.scroll_into_view_if_needed()


def test_the_ui_runs_the_pipeline_from_its_form(served: Served, browser: Any) -> None:
    # UTC, as the cron schedules are; the screenshots are the README's walkthrough
    page = browser.new_page(viewport={"width": 1400, "height": 1000}, timezone_id="UTC")
    page.set_default_timeout(30_000)
    # What the UI asked the API that failed: a failure names it (once, in CI, only "Oops" showed)
    broken: list[str] = []
    page.on("response", lambda r: broken.append(f"{r.status} {r.request.method} {r.url}") if r.status >= 500 else None)
    page.on("requestfailed", lambda r: broken.append(f"failed {r.method} {r.url}: {r.failure}"))
    try:
        _walk_through(page, served)
    except Exception as exc:
        page.screenshot(path=str(served.shots / "failure.png"), full_page=True)
        raise AssertionError(f"{exc}; the UI's failed requests: {broken or 'none'}") from exc


def _submit(page: Any, submit: Any, api: str) -> None:
    """Submit the form until it made the flow run. Once in CI the UI answered a submit with its generic
    "Oops. Something went wrong." toast and made no run, as it does when ``create_flow_run`` answers 500
    (checked by failing that request once): a user would submit again, and so does this, once; a form that
    never makes its run stays red."""
    oops = page.get_by_text("Oops. Something went wrong.")
    for attempt in range(2):
        shown = oops.count()
        submit.click()
        wait_until(lambda shown=shown: bool(_flow_runs(api)) or oops.count() > shown, 30, interval=0.2,
                   what="the flow run the form created")  # fmt: skip
        if _flow_runs(api) or attempt:
            break
        print("the UI answered the submit with 'Oops. Something went wrong.': submitting again", flush=True)
    assert len(_flow_runs(api)) == 1, _flow_runs(api)


def _walk_through(page: Any, served: Served) -> None:

    def shot(name: str, full_page: bool = False) -> None:
        page.screenshot(path=str(served.shots / f"{name}.png"), full_page=full_page)

    # The deployments list: the pipeline, named after its spec, and the reaper on its interval.
    page.goto(f"{served.ui}/deployments")
    row = page.locator("tr", has=page.get_by_role("link", name=DEPLOYMENT, exact=True))
    row.get_by_text("retraining-pipeline").wait_for()
    page.locator("tr", has=page.get_by_text("reap-tpu-slices")).get_by_text("Every 15 minutes").wait_for()
    shot("01-deployments")

    # The deployment's page: its cron schedule is listed.
    page.get_by_role("link", name=DEPLOYMENT, exact=True).click()
    page.get_by_text("Deployment ID").wait_for()
    page.get_by_text(re.compile(r"At 03:00 AM")).first.wait_for()
    shot("02-deployment")

    # The parameter form, generated from the pydantic spec.
    page.get_by_role("button", name="Run", exact=True).click()
    page.get_by_role("link", name="Custom run").click()
    submit = page.get_by_role("button", name="Submit")
    submit.wait_for()
    concurrency = _field_input(page, "Concurrency")
    assert concurrency.input_value() == "8"
    # A description with angle brackets reads whole (the form renders descriptions as markdown).
    page.get_by_text("steps below <checkpoint_dir>/<run_id>: ").first.wait_for()
    shot("03-form")
    _the_ladder_keeps_its_rungs(page, shot)
    _add_a_reservation_rung(page)

    # An invalid value is refused before a run exists, with the field's path and what is allowed.
    concurrency.fill("999")
    submit.click()
    toast = page.get_by_text(re.compile("Validation failed for field")).first
    toast.wait_for()
    text = toast.inner_text()
    assert "spec.mirror.concurrency" in text and "maximum of 64" in text, text
    concurrency.scroll_into_view_if_needed()  # the picture shows the field next to the message
    shot("04-invalid-value")
    assert _flow_runs(served.api) == []

    # A good value: the run is created, runs in `tpu-ops serve` against the local stack, completes.
    concurrency.fill("8")
    _submit(page, submit, served.api)
    run_id, run_name = _flow_runs(served.api)[0]["id"], _flow_runs(served.api)[0]["name"]
    # the submit lands on the run's page, or on a list that may not show the new run yet: go to it by id
    link = page.get_by_role("link", name=run_name, exact=True)
    if f"/runs/flow-run/{run_id}" not in page.url and link.count():
        link.first.click()
    if f"/runs/flow-run/{run_id}" not in page.url:
        page.goto(f"{served.ui}/runs/flow-run/{run_id}")
    page.wait_for_url(re.compile(rf"/runs/flow-run/{run_id}"))
    page.locator(".state-badge", has_text="Completed").first.wait_for(timeout=150_000)
    shot("05-run-completed")
    run = _api(served.api, f"/flow_runs/{run_id}")
    assert run["state_type"] == "COMPLETED", b"".join(served.serve_log).decode()[-3000:]
    sent = [{k: v for k, v in r.items() if v is not None} for r in run["parameters"]["spec"]["provision"]["ladder"]]
    assert [r["kind"] for r in sent] == ["reservation", "spot", "on-demand", "reservation"]  # all kept, as objects
    assert sent[-1] == ADDED_RUNG  # the rung typed into the form

    # Its artifacts, on the pipeline run's own page: summary, cost by tier, ladder, goodput, lineage.
    run_url = page.url
    page.get_by_text("Artifacts", exact=True).click()
    for key in RUN_ARTIFACTS:
        page.get_by_text(key, exact=True).first.wait_for()
    shot("06-artifacts")
    page.get_by_text("pipeline-summary", exact=True).first.click()
    page.wait_for_url(re.compile(r"/artifacts/"))
    for row in ("winning rung", "goodput", "cost by tier", "model package"):
        page.get_by_text(row, exact=True).first.wait_for()
    shot("07-summary", full_page=True)
    page.goto(run_url)
    page.get_by_text("Artifacts", exact=True).click()
    page.get_by_text("run-ladder", exact=True).first.click()
    page.wait_for_url(re.compile(r"/artifacts/"))
    page.get_by_text("stockout", exact=True).first.wait_for()  # the ladder's first rungs had no capacity
    shot("08-ladder", full_page=True)

    if os.environ.get("TPU_OPS_UPDATE_DOCS") == "1":
        docs = ROOT / "docs" / "ui"
        docs.mkdir(parents=True, exist_ok=True)
        for name in DOC_SHOTS:
            shutil.copyfile(served.shots / f"{name}.png", docs / f"{name}.png")


def test_the_ui_summary_has_the_rows_the_dry_run_printed(served: Served, browser: Any, tmp_path: Path) -> None:
    """`tpu-ops dry-run` reporting to the server: its table and the run's pipeline-summary in the UI agree."""
    from flows.report import glance_rows

    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_OPS_", "AWS_", "PREFECT_API"))}
    env.update(PREFECT_API_URL=served.api, PREFECT_HOME=str(tmp_path / "prefect"), NO_GCE_CHECK="true")
    done = subprocess.run([str(CONSOLE), "dry-run", "--json", "--workdir", str(tmp_path / "work")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout[done.stdout.index("{\n") :])
    # the disk and the comparison with an uninterrupted run are the dry run's, not the flow's
    cli = glance_rows({k: v for k, v in summary.items() if k not in ("disk", "final_params")})
    tag = f"tpu-ops-run:{summary['run_id']}"
    runs = _api(served.api, "/flow_runs/filter", {"flows": {"name": {"any_": ["retraining-pipeline"]}},
                                                  "flow_runs": {"tags": {"all_": [tag]}}})  # fmt: skip
    (run,) = runs
    page = browser.new_page(viewport={"width": 1400, "height": 1000}, timezone_id="UTC")
    page.set_default_timeout(30_000)
    try:
        page.goto(f"{served.ui}/runs/flow-run/{run['id']}")
        page.get_by_text("Artifacts", exact=True).click()
        page.get_by_text("pipeline-summary", exact=True).first.click()
        page.wait_for_url(re.compile(r"/artifacts/"))
        page.locator("table").first.wait_for()
        cells = page.locator("table tbody tr").evaluate_all(
            "rows => rows.map(r => Array.from(r.querySelectorAll('td')).map(c => c.innerText.trim()))"
        )
        ui = [(k, v) for k, v in cells]
        assert ui == [(k, v.replace("|", "/")) for k, v in cli]  # the same rows, in the same order
    except Exception:
        page.screenshot(path=str(served.shots / "summary-failure.png"), full_page=True)
        raise
    finally:
        page.close()
