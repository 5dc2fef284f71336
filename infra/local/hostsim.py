"""TPU-VM host simulator: runs a READY node's ``startup-script`` once per worker host, locally.

``variant="compute"`` plays Compute Engine TPU VMs instead: one worker per RUNNING instance (its
rank is the event's ``workerId``), with Compute Engine's metadata (``worker-id``, host names in
``worker-network-endpoints``); a ``terminating`` event (spot preemption notice) sends SIGTERM and
the following ``stopped`` kills at once.

Each worker is ``bash startup-script.sh`` in its own process group and working directory, with
its own fake metadata server (``GCE_METADATA_HOST``/``GCE_METADATA_IP``). Like Google's TPU
images, a worker sees a bare interpreter: ``python3`` is a virtual environment of the host's
base Python without pip or any third-party package, pip finds no index (``PIP_NO_INDEX=1``, no
config file), and the environment is rebuilt from scratch: only the endpoints a VM would know
(metadata server, GCS emulator and what TensorStore and gcsfs need to use it) and the dry-run flag pass
through, never the host's ``PATH``, virtual environment or credentials. When the node is
preempted, deleted or the fake is reset, every worker's group gets SIGTERM (the notice) and, after
``grace_s``, SIGKILL. stdout/stderr go to files in the worker's directory and stay readable after
the worker ends (``logs``); ``console.log`` stands in for the serial console. ``stop()`` ends
everything it started.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from infra.local._proc import kill_group, wait_until
from infra.local.core import tempdirs
from infra.local.core.backend import NodeEvent
from infra.local.metadata import MetadataServer, compute_vm_values, tpu_vm_values


class HostBackend(Protocol):
    """What the simulator needs of a fake (the TPU API's or Compute Engine's backend)."""

    def subscribe(self, listener: Callable[[NodeEvent], None]) -> None: ...

    def set_guest_attribute(self, name: str, worker: int, namespace: str, key: str, value: str) -> None: ...


# The only variables of the stack's environment a worker inherits: what a VM knows (on Google's
# cloud these point at Google; here at the emulators) and the dry-run flag.
PREFIX = "tpu-ops-hosts-"  # a stack's simulated hosts under the temp dir
WORKER_ENV = frozenset({
    "STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING", "TPU_OPS_DRY_RUN",
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT",
    "TPU_OPS_LOGGING_ENDPOINT", "GOOGLE_CLOUD_PROJECT",
})  # fmt: skip

# A worker's bash hangs off a lifeline: stdin is a pipe only the simulator's process holds. A
# background subshell waits on it and kills the worker's whole process group when it closes,
# which happens however that process ends (SIGKILL included). The script itself is exec'd, so
# the worker's pid, signals and exit status stay those of `bash startup-script.sh`.
_LIFELINE = 'exec 3<&0 </dev/null; (read -r _ <&3; kill -KILL 0) & exec bash "$0" 3<&-'


@dataclass
class Worker:
    """One simulated host of a slice."""

    number: int
    workdir: Path
    proc: subprocess.Popen[bytes]
    metadata: MetadataServer

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def logs(self) -> dict[str, Any]:
        return {
            "worker": self.number,
            "pid": self.pid,
            "running": self.running,
            "returncode": self.proc.poll(),
            "workdir": str(self.workdir),
            "stdout": _read(self.workdir / "stdout.log"),
            "stderr": _read(self.workdir / "stderr.log"),
        }


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


class HostSimulator:
    """Subscribe to a fake's backend and play the worker hosts of its nodes (or instances)."""

    def __init__(
        self,
        backend: HostBackend,
        env: dict[str, str],
        *,
        grace_s: float = 5.0,
        workdir: Path | None = None,
        variant: Literal["tpu-api", "compute"] = "tpu-api",
        vm_token: Callable[[], str] | None = None,
    ) -> None:
        self.backend = backend
        self.vm_token = vm_token  # the metadata server's token document (the stack's: one its OAuth endpoint issued)
        self.variant = variant
        self._terminating: set[tuple[str, str]] = set()  # told to stop (SIGTERM sent), kill comes next
        self.grace_s = grace_s
        # A guest slow to act on its preemption notice: its workers get the SIGTERM this long after the control
        # plane shows the VM stopping (a test's knob; the kill on delete still counts from the notice).
        self.notice_lag_s = 0.0
        self._own_workdir = workdir is None
        if workdir is None:
            tempdirs.sweep(PREFIX)  # a killed stack's simulated hosts (their logs, a venv of the image's python)
        self.workdir = Path(workdir) if workdir is not None else tempdirs.owned(PREFIX)
        self._env = dict(env)
        self._lock = threading.Lock()
        self._nodes: dict[tuple[str, str], list[Worker]] = {}  # (zone, node id) -> latest incarnation
        self._reapers: list[threading.Thread] = []
        self._closed = False
        self._bare: Path | None = None
        backend.subscribe(self._on_event)

    # -- events from the fake TPU API ----------------------------------------------------------
    def _on_event(self, event: NodeEvent) -> None:
        if event.kind == "ready":
            self._start_node(event)
        elif event.kind == "terminating":
            self._term_node(event.zone, event.node_id)
        elif event.kind == "stopped":
            self._stop_node(event.zone, event.node_id)

    def _bare_python(self) -> Path:
        """A pip-less virtual environment of the host's base interpreter: the image's ``python3``."""
        with self._lock:
            if self._bare is None:
                bare = self.workdir / "image-python"
                base = getattr(sys, "_base_executable", None) or sys.executable
                if not (bare / "bin" / "python3").exists():
                    subprocess.run([base, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120,
                                   env={"PATH": "/usr/bin:/bin"}, capture_output=True)  # fmt: skip
                self._bare = bare
            return self._bare

    def _base_env(self, wd: Path) -> dict[str, str]:
        """What a worker's startup script sees: a VM's environment, nothing of the host's."""
        env = {k: v for k, v in self._env.items() if k in WORKER_ENV}
        env.update({
            "PATH": f"{self._bare_python() / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(wd),
            "LANG": "C.UTF-8",
            "PIP_NO_INDEX": "1",
            "PIP_CONFIG_FILE": os.devnull,  # no pip.conf of the host's (its index, find-links, constraints)
            "TPU_OPS_CONSOLE": str(wd / "console.log"),
        })  # fmt: skip
        return env

    def _start_node(self, event: NodeEvent) -> None:
        node = event.node
        script = (node.get("metadata") or {}).get("startup-script")
        hosts = len(node.get("networkEndpoints", []))
        if not script or self._closed:
            return
        base = self.workdir / event.project / event.zone / f"{event.node_id}-{node.get('id', '0')}"
        boot = 1
        while base.exists():  # restarted VMs (a multislice repair) boot again; the last boot's logs stay
            boot += 1
            base = base.with_name(f"{event.node_id}-{node.get('id', '0')}-boot{boot}")
        workers = []
        # A Compute Engine instance is one host of its slice; a TPU API node is all of them.
        for w in [int(node["workerId"])] if self.variant == "compute" else range(hosts):
            workers.append(self._start_worker(event, node, w, base / f"worker-{w}", script))
        with self._lock:
            old = self._nodes.get((event.zone, event.node_id), [])
            self._nodes[(event.zone, event.node_id)] = workers
        self._kill(old)  # a recreated node replaces a stale incarnation

    def _start_worker(self, event: NodeEvent, node: dict[str, Any], w: int, wd: Path, script: str) -> Worker:
        wd.mkdir(parents=True, exist_ok=True)
        (wd / "startup-script.sh").write_text(script)
        name = node["name"]

        def sink(ns: str, key: str, value: str) -> None:
            self.backend.set_guest_attribute(name, w, ns, key, value)

        values = (compute_vm_values if self.variant == "compute" else tpu_vm_values)(node, event.project, event.zone, w)
        md = MetadataServer(values, sink, token=self.vm_token).start()
        env = self._base_env(wd)
        env.update({"GCE_METADATA_HOST": md.host, "GCE_METADATA_IP": md.host, "TPU_OPS_WORKER_DIR": str(wd)})
        with open(wd / "stdout.log", "wb") as out, open(wd / "stderr.log", "wb") as err:
            proc = subprocess.Popen(
                ["bash", "-c", _LIFELINE, str(wd / "startup-script.sh")],
                cwd=wd, env=env, stdout=out, stderr=err, stdin=subprocess.PIPE, start_new_session=True,
            )  # fmt: skip
        return Worker(w, wd, proc, md)

    def _term_node(self, zone: str, node_id: str) -> None:
        """SIGTERM only (``notice_lag_s`` later): the kill comes with the ``stopped`` event, when the fake's notice
        runs out."""
        with self._lock:
            workers = list(self._nodes.get((zone, node_id), []))
            self._terminating.add((zone, node_id))
        if self.notice_lag_s > 0:
            timer = threading.Timer(self.notice_lag_s, self._signal, (workers,))
            timer.daemon = True
            timer.start()
        else:
            self._signal(workers)

    @staticmethod
    def _signal(workers: list[Worker]) -> None:
        for wk in workers:
            if wk.running:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(wk.pid, signal.SIGTERM)

    def _stop_node(self, zone: str, node_id: str) -> None:
        with self._lock:
            workers = list(self._nodes.get((zone, node_id), []))
            noticed = (zone, node_id) in self._terminating
            self._terminating.discard((zone, node_id))
        self._kill(workers, 0.0 if noticed else self.grace_s)

    def _kill(self, workers: list[Worker], grace_s: float | None = None) -> None:
        """SIGTERM now (so the caller's preempt/delete has signalled before it returns), SIGKILL later."""
        if not workers:
            return
        grace = self.grace_s if grace_s is None else grace_s
        for wk in workers:
            if wk.running:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(wk.pid, signal.SIGTERM)

        def reap() -> None:
            for wk in workers:
                kill_group(wk.proc, grace)
                if wk.proc.stdin:
                    wk.proc.stdin.close()
                wk.metadata.stop()

        t = threading.Thread(target=reap, name="hostsim-reaper", daemon=True)
        t.start()
        with self._lock:
            self._reapers.append(t)

    # -- API ---------------------------------------------------------------------------------
    def workers(self, zone: str, node_id: str) -> list[Worker]:
        with self._lock:
            return list(self._nodes.get((zone, node_id), []))

    def logs(self, zone: str, node_id: str) -> dict[str, Any]:
        """Every worker's output of the node's latest incarnation (also served at /_fake/logs/...)."""
        return {"zone": zone, "node": node_id, "workers": [w.logs() for w in self.workers(zone, node_id)]}

    def wait_workers(self, zone: str, node_id: str, count: int, timeout: float = 10.0) -> list[Worker]:
        """Wait until the node has ``count`` workers started."""
        wait_until(lambda: len(self.workers(zone, node_id)) >= count, timeout, what=f"{count} workers of {node_id}")
        return self.workers(zone, node_id)

    def wait_exited(self, zone: str, node_id: str, timeout: float = 10.0) -> None:
        wait_until(lambda: not any(w.running for w in self.workers(zone, node_id)), timeout, what=f"{node_id} exit")

    def running_pids(self) -> list[int]:
        with self._lock:
            return [w.pid for ws in self._nodes.values() for w in ws if w.running]

    def stop(self) -> None:
        """Kill every worker (SIGTERM, SIGKILL after the grace period) and wait for them."""
        self._closed = True
        with self._lock:
            everything = [w for ws in self._nodes.values() for w in ws]
        self._kill(everything)
        with self._lock:
            reapers = list(self._reapers)
        for t in reapers:
            t.join(timeout=self.grace_s + 10)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
