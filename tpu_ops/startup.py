"""Render the ``startup-script`` every worker of a slice runs at boot.

The script runs as root on N hosts at once, and again after a recreate (with a fresh disk), so
"already done" is the run-level ``DONE`` marker in GCS, never a local file. A small stdlib-only
bootstrap checks that marker and fetches the agent wheel the flow uploaded under
``RUN/_tpu_ops/agent/``, both with the VM's service account (a token from the metadata server):
a real slice needs no package index. The wheel is pure Python with no dependencies, so the
bootstrap unpacks it and the image's own ``python3`` (3.10 on Google's TPU images) runs the agent
from there: no pip, no venv, no index.

Output goes where a person looks on a VM (the guest agent copies it to the serial console and
``journalctl -u google-startup-scripts.service``); a failure before the agent starts also leaves
one line with the reason on the console and in the journal (``logger``).

Every value is passed through ``shlex.quote``; the script carries no credentials. It is clean
under ``shellcheck`` (a test runs it on rendered scripts).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from tpu_ops.errors import SpecError
from tpu_ops.layout import check_run_id, state_root
from tpu_ops.uris import parse_gs

# Exit status 3 = the run is done. Reads only its argv: the script passes the standard endpoint
# variables (GCE_METADATA_HOST, STORAGE_EMULATOR_HOST; both unset on a real VM).
BOOTSTRAP = r"""
import json, os, sys, time, urllib.error, urllib.parse, urllib.request, zipfile
state_uri, prefix, dest, md, api = sys.argv[1:6]
md = md or "metadata.google.internal"
api = api or "https://storage.googleapis.com"
api = api if "://" in api else "http://" + api

def call(url, headers, tries=5):
    for i in range(tries):
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
                return r.read()
        except urllib.error.HTTPError as e:
            if e.code < 500 and e.code != 429:
                raise
        except (urllib.error.URLError, TimeoutError):
            pass
        time.sleep(min(2 ** i, 10))
    raise SystemExit("tpu-ops bootstrap: " + url.split("?")[0] + " kept failing")

tok = call("http://" + md + "/computeMetadata/v1/instance/service-accounts/default/token",
           {"Metadata-Flavor": "Google"})
auth = {"Authorization": "Bearer " + json.loads(tok)["access_token"]}

def obj(uri):
    bucket, _, key = uri[len("gs://"):].partition("/")
    return api + "/storage/v1/b/" + urllib.parse.quote(bucket, safe="") + "/o", key

base, key = obj(state_uri)  # RUN/_tpu_ops: the run-level DONE marker and the job spec
try:
    call(base + "/" + urllib.parse.quote(key + "/DONE", safe=""), auth)
    sys.exit(3)
except urllib.error.HTTPError as e:
    if e.code != 404:
        raise
try:  # the job spec, for the agent to start a Python trainer before its own imports finish
    job = call(base + "/" + urllib.parse.quote(key + "/job.json", safe="") + "?alt=media", auth)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with open(os.path.join(os.path.dirname(dest), "job.json"), "wb") as f:
        f.write(job)
except urllib.error.HTTPError as e:
    if e.code != 404:
        raise
if prefix:
    base, key = obj(prefix)
    os.makedirs(dest, exist_ok=True)
    listing = json.loads(call(base + "?" + urllib.parse.urlencode({"prefix": key + "/"}), auth))
    for item in listing.get("items", []):
        name = item["name"].rsplit("/", 1)[-1]
        if name.endswith(".whl") and "/" not in item["name"][len(key) + 1:]:
            data = call(base + "/" + urllib.parse.quote(item["name"], safe="") + "?alt=media", auth)
            with open(os.path.join(dest, name), "wb") as f:
                f.write(data)
            print("tpu-ops bootstrap: fetched " + name)
            if name.startswith("tpu_ops-"):  # pure Python, no dependencies: unpacked, it is importable
                lib = os.path.join(os.path.dirname(dest), "agent")
                with zipfile.ZipFile(os.path.join(dest, name)) as z:
                    for member in z.namelist():
                        if member.startswith("/") or ".." in member.split("/"):
                            raise SystemExit("tpu-ops bootstrap: unsafe path in " + name + ": " + member)
                    z.extractall(lib)
"""

TEMPLATE = """#!/bin/bash
# tpu-ops startup script for run {run_id} (rendered; do not edit by hand)
# Values are single-quoted on purpose, so "$" or "`" in them never expands:
# shellcheck disable=SC2016
set -euo pipefail
RUN_ID={run_id}
STATE_URI={state_uri}
AGENT_PREFIX={agent_prefix}
PYTHON={python}
STAGE="preparing the worker directory"
# A failure before the agent runs: one line with the reason on the console and in the journal.
say_failure() {{
  local status=$?
  [ "$status" -eq 0 ] && return 0
  local line="tpu-ops startup for run $RUN_ID failed (exit $status) while $STAGE"
  echo "$line" >&2
  if command -v logger >/dev/null 2>&1; then logger -t tpu-ops-startup -- "$line" || true; fi
  local console="${{TPU_OPS_CONSOLE:-/dev/console}}"
  if {{ [ -e "$console" ] && [ -w "$console" ]; }} || {{ [ ! -e "$console" ] && [ "$console" != /dev/console ]; }}; then
    echo "$line" >>"$console" 2>/dev/null || true
  fi
}}
trap say_failure EXIT
# A host may give each worker its own scratch directory (the local simulator does).
BASE="${{TPU_OPS_WORKER_DIR:-}}"
[ -n "$BASE" ] || BASE={state_dir}
WORK="$BASE/$RUN_ID"
mkdir -p "$WORK"
STAGE="fetching the DONE marker, the job spec and the agent from GCS ($PYTHON)"
status=0
"$PYTHON" - "$STATE_URI" "$AGENT_PREFIX" "$WORK/wheels" "${{GCE_METADATA_HOST:-}}" "${{STORAGE_EMULATOR_HOST:-}}" \
  <<'BOOTSTRAP' || status=$?
{bootstrap}
BOOTSTRAP
if [ "$status" -eq 3 ]; then
  echo "tpu-ops: run $RUN_ID is already done (DONE marker in GCS)"
  exit 0
fi
if [ "$status" -ne 0 ]; then
  exit "$status"
fi
if [ -d "$WORK/agent/tpu_ops" ]; then
  # the unpacked agent wheel (standard library only) comes first on the path
  export PYTHONPATH="$WORK/agent${{PYTHONPATH:+:$PYTHONPATH}}"
fi
STAGE="starting the agent ($PYTHON -m tpu_ops.agent)"
"$PYTHON" -c 'import tpu_ops.agent.run'
export TPU_OPS_WORKER_DIR="$WORK"
cd "$WORK"
trap - EXIT
exec "$PYTHON" -m tpu_ops.agent {args}
"""


def render_startup_script(
    run_id: str,
    agent_args: Sequence[str],
    *,
    run_uri: str,
    agent_prefix: str | None = None,
    python: str = "python3",
    state_dir: str = "/var/lib/tpu-ops",
) -> str:
    """A bash script that runs ``python -m tpu_ops.agent AGENT_ARGS`` once per worker until DONE.

    ``run_uri`` is ``RUN`` (``<checkpoint_dir>/<run_id>``): a ``RUN/_tpu_ops/DONE`` marker makes
    the script a no-op. ``agent_prefix`` (``RUN/_tpu_ops/agent``) holds the agent wheel.
    """
    check_run_id(run_id)
    for name, uri in (("run_uri", run_uri), ("agent_prefix", agent_prefix)):
        if uri is not None:
            try:
                parse_gs(uri)
            except ValueError as exc:
                raise SpecError(f"{name}: {exc}", [{"field": name, "value": uri}]) from None
    return TEMPLATE.format(
        run_id=shlex.quote(run_id),
        state_uri=shlex.quote(str(state_root(parse_gs(run_uri)))),
        agent_prefix=shlex.quote(agent_prefix or ""),
        python=shlex.quote(python),
        state_dir=shlex.quote(state_dir),
        bootstrap=BOOTSTRAP.strip(),
        args=" ".join(shlex.quote(a) for a in agent_args),
    )
