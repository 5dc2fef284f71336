"""The local stack: every emulated cloud tpu-ops talks to, on loopback, started and stopped together.

    with LocalStack() as stack:
        settings = stack.settings()      # tpu_ops Settings(dry_run=True, endpoints -> the stack)
        env = stack.env()                # the same, as environment variables for subprocesses
        stack.preempt("us-central2-b", "my-node")

Parts: moto in server mode (S3, SageMaker, STS) in a thread, fake-gcs-server as a subprocess in
its own process group, the fake Cloud TPU API in a thread, the fake Compute Engine in a thread,
the fake Storage Transfer Service in a thread (copying between the two storage emulators), and
the TPU-VM host simulators (one per TPU control plane), and a Google OAuth token endpoint with the
stack's service-account key (``infra.local.auth``): our fakes (TPU, Compute Engine, Storage Transfer,
Cloud Logging) refuse a request without a token it issued, so ``settings()`` and ``env()`` carry the
key, and a test's own Google clients take ``stack.google_credentials()`` (gcloud: ``env()``'s
``CLOUDSDK_AUTH_ACCESS_TOKEN_FILE``, or ``stack.mint_token()``). Every
part binds 127.0.0.1 on a free port; ``stop()`` (or leaving the ``with``) stops all of them and
kills every process the stack started.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from types import TracebackType
from typing import Any

from infra.local._proc import http_call
from infra.local.auth import StackAuth
from infra.local.aws import MotoServer
from infra.local.cloudlogging.server import CloudLoggingServer
from infra.local.compute.models import ComputeBackend
from infra.local.compute.models import Latency as ComputeLatency
from infra.local.compute.server import ComputeServer
from infra.local.gcs import FakeGcs
from infra.local.hostsim import HostSimulator
from infra.local.sts.models import StsBackend
from infra.local.sts.mover import EmulatorMover
from infra.local.sts.server import StsServer
from infra.local.tpu.models import Latency, TpuBackend
from infra.local.tpu.server import TpuServer
from tpu_ops.settings import Settings

AUDIT_KEY_ALIAS = "alias/tpu-ops-audit"  # created by LocalStack.seed_audit

PROJECT = "tpu-ops-local"
AWS_REGION = "us-east-1"
# moto accepts any keys; these are the ones its docs use, never real credentials.
FAKE_AWS_KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


class LocalStack:
    """Context manager owning the emulators. One live stack per process (moto state is global).

    ``tpu=False`` skips the fake TPU API, the fake Compute Engine and the host simulators (S3 +
    GCS only, fastest). ``provision_s``/``delete_s`` are the fake TPU and Compute Engine latencies;
    ``grace_s`` is the SIGTERM->SIGKILL grace period of simulated hosts (on delete, and on a TPU
    API preemption); ``preempt_notice_s`` is a Compute Engine spot VM's time between SIGTERM and
    its end (Google: 30 s); ``auth`` shares a started ``StackAuth`` (its key and OAuth endpoint) instead
    of starting one; ``workdir`` keeps worker directories (default: a temp dir removed on
    stop); ``gcs_access_log`` makes fake-gcs-server log every request to that file.
    """

    def __init__(
        self,
        *,
        project: str = PROJECT,
        tpu: bool = True,
        provision_s: float = 0.0,
        delete_s: float = 0.0,
        repair_s: float = 5.0,
        grace_s: float = 5.0,
        preempt_notice_s: float = 30.0,
        workdir: Path | None = None,
        gcs_access_log: Path | None = None,
        auth: StackAuth | None = None,
    ) -> None:
        self.project = project
        self._tpu_enabled = tpu
        # Google takes minutes to repair a multislice node; a few seconds here keep the order real (the run
        # notices the loss before the repair restarts the other slices' VMs).
        self._latency = Latency(provision_s, delete_s, repair_s)
        self._grace_s = grace_s
        self._preempt_notice_s = preempt_notice_s
        self._workdir = workdir
        self._gcs_access_log = gcs_access_log
        self.aws: MotoServer | None = None
        self.gcs: FakeGcs | None = None
        self.tpu: TpuServer | None = None
        self.sts: StsServer | None = None
        self.hosts: HostSimulator | None = None
        self.logging: CloudLoggingServer | None = None
        self.compute: ComputeServer | None = None
        self.compute_hosts: HostSimulator | None = None
        self._given_auth = auth  # a started StackAuth shared with fakes started outside the stack (tests)
        self.auth: StackAuth | None = None
        self._started = False

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> LocalStack:
        if self._started:
            return self
        try:
            self.auth = self._given_auth or StackAuth(self.project).start()
            oauth = self.auth.authority  # our fakes refuse a request without a token it issued
            self.gcs = FakeGcs(access_log=self._gcs_access_log)
            self.gcs.start()
            self.aws = MotoServer()
            self.aws.start()
            mover = EmulatorMover(self.aws.url, self.gcs.url, AWS_REGION)
            self.sts = StsServer(StsBackend(mover), auth=oauth).start()
            self.logging = CloudLoggingServer(auth=oauth).start()
            if self._tpu_enabled:
                backend = TpuBackend(latency=self._latency)
                self.tpu = TpuServer(backend, logs=self._logs, auth=oauth).start()
                latency = ComputeLatency(self._latency.provision_s, self._latency.delete_s)
                compute = ComputeBackend(latency=latency, preempt_notice_s=self._preempt_notice_s)
                self.compute = ComputeServer(compute, logs=self.compute_worker_logs, auth=oauth).start()
            self._started = True
            self.seed_audit()
            if self._tpu_enabled:
                assert self.tpu is not None
                vm = self.auth.vm_token
                self.hosts = HostSimulator(
                    self.tpu.backend, self.env(), grace_s=self._grace_s, workdir=self._workdir, vm_token=vm
                )
                assert self.compute is not None
                self.compute_hosts = HostSimulator(
                    self.compute.backend, self.env(), grace_s=self._grace_s, workdir=self._workdir, variant="compute",
                    vm_token=vm,
                )  # fmt: skip
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every part (workers first); safe to call twice and after a failed start."""
        own_auth = self.auth if self.auth is not self._given_auth else None
        parts = (self.hosts, self.compute_hosts, self.tpu, self.compute, self.sts, self.logging, self.aws, self.gcs,
                 own_auth)  # fmt: skip
        for part in parts:
            if part is not None:
                with contextlib.suppress(Exception):
                    part.stop()
        self.hosts = self.compute_hosts = self.tpu = self.sts = self.logging = None
        self.compute = self.auth = None
        self._started = False

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # -- endpoints ---------------------------------------------------------------------------
    def _need(self, part: Any, name: str) -> Any:
        if part is None or not self._started:
            raise RuntimeError(f"LocalStack is not running ({name} unavailable); use `with LocalStack()`")
        return part

    @property
    def aws_endpoint(self) -> str:
        """moto: ``http://127.0.0.1:PORT`` (S3 path-style, SageMaker, STS, ...)."""
        return str(self._need(self.aws, "aws").url)

    @property
    def gcs_endpoint(self) -> str:
        """fake-gcs-server: ``http://127.0.0.1:PORT`` (what ``STORAGE_EMULATOR_HOST`` takes)."""
        return str(self._need(self.gcs, "gcs").url)

    @property
    def tpu_endpoint(self) -> str:
        """Fake Cloud TPU API: ``http://127.0.0.1:PORT`` (no trailing slash; the Python client's form)."""
        return str(self._need(self.tpu, "tpu").url)

    @property
    def compute_endpoint(self) -> str:
        """Fake Compute Engine: ``http://127.0.0.1:PORT`` (google-cloud-compute's ``api_endpoint``)."""
        return str(self._need(self.compute, "compute").url)

    @property
    def compute_backend(self) -> ComputeBackend:
        """The fake Compute Engine's state model (in-process control: capacity, preempt, faults)."""
        return self._need(self.compute, "compute").backend  # type: ignore[no-any-return]

    @property
    def sts_endpoint(self) -> str:
        """Fake Storage Transfer Service: ``http://127.0.0.1:PORT`` (the Python client's ``api_endpoint``)."""
        return str(self._need(self.sts, "sts").url)

    @property
    def logging_endpoint(self) -> str:
        """Fake Cloud Logging API: ``http://127.0.0.1:PORT`` (the client's ``api_endpoint``)."""
        return str(self._need(self.logging, "logging").url)

    @property
    def google_auth(self) -> StackAuth:
        """The stack's Google credentials: the OAuth endpoint, the key (``key_file``), ``mint_token()``,
        ``credentials()``, the tokens issued and seen (``authority``)."""
        return self._need(self.auth, "auth")  # type: ignore[no-any-return]

    def google_credentials(self) -> Any:
        """``service_account.Credentials`` of the stack's key: what every Google client of a test passes."""
        return self.google_auth.credentials()

    def mint_token(self) -> str:
        """A bearer token the stack's key obtained from its OAuth endpoint (for gcloud, curl, raw HTTP)."""
        return self.google_auth.mint_token()

    @property
    def sts_backend(self) -> StsBackend:
        """The fake STS's state model (in-process control: fail an object, stall, deny a bucket)."""
        return self._need(self.sts, "sts").backend  # type: ignore[no-any-return]

    @property
    def backend(self) -> TpuBackend:
        """The fake TPU API's state model (in-process control without HTTP)."""
        return self._need(self.tpu, "tpu").backend  # type: ignore[no-any-return]

    def env(self) -> dict[str, str]:
        """Environment variables pointing every client (ours, SDKs, gcloud) at the stack."""
        env = {
            "AWS_ENDPOINT_URL": self.aws_endpoint,
            "AWS_DEFAULT_REGION": AWS_REGION,
            **FAKE_AWS_KEYS,
            "STORAGE_EMULATOR_HOST": self.gcs_endpoint,
            # TensorStore (Orbax's storage layer) ignores STORAGE_EMULATOR_HOST: without these an Orbax save
            # to gs:// goes to Google's host and hangs. Any token will do for the emulator.
            "TENSORSTORE_GCS_HTTP_URL": self.gcs_endpoint,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "fake-local-token",
            # gcsfs (how etils/Orbax reach gs://) would first ask the Storage Control gRPC API, which the
            # emulator lacks, for the bucket's layout: 60 s of timeouts per process. Its plain client suffices.
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            **self.google_auth.env(),  # the key (tpu-ops) and a token it obtained (gcloud)
            "CLOUDSDK_CORE_PROJECT": self.project,
            "GOOGLE_CLOUD_PROJECT": self.project,
            "NO_GCE_CHECK": "true",
            "TPU_OPS_DRY_RUN": "true",
            "TPU_OPS_GCP_PROJECT": self.project,
            "TPU_OPS_AWS_REGION": AWS_REGION,
            "TPU_OPS_AWS_ENDPOINT_URL": self.aws_endpoint,
            "TPU_OPS_GCS_ENDPOINT": self.gcs_endpoint,
            "TPU_OPS_STS_ENDPOINT": self.sts_endpoint,
            "TPU_OPS_LOGGING_ENDPOINT": self.logging_endpoint,
            "TPU_OPS_AWS_ACCESS_KEY_ID": FAKE_AWS_KEYS["AWS_ACCESS_KEY_ID"],
            "TPU_OPS_AWS_SECRET_ACCESS_KEY": FAKE_AWS_KEYS["AWS_SECRET_ACCESS_KEY"],
            "TPU_OPS_AUDIT_KMS_KEY_ID": AUDIT_KEY_ALIAS,
        }
        if self.tpu is not None:
            env["TPU_OPS_TPU_ENDPOINT"] = self.tpu_endpoint
            env["CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU"] = self.tpu_endpoint + "/"  # gcloud needs the slash
        if self.compute is not None:
            env["TPU_OPS_COMPUTE_ENDPOINT"] = self.compute_endpoint
            # gcloud compute goes to the fake (with the prefix, or the links gcloud writes lose it)
            env["CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE"] = self.compute_endpoint + "/compute/v1/"
        return env

    def settings(self, **overrides: Any) -> Settings:
        """``Settings(dry_run=True, ...)`` with every endpoint on this stack; ``overrides`` win."""
        values: dict[str, Any] = {
            "dry_run": True,
            "gcp_project": self.project,
            "aws_region": AWS_REGION,
            "aws_endpoint_url": self.aws_endpoint,
            "gcs_endpoint": self.gcs_endpoint,
            "sts_endpoint": self.sts_endpoint,
            "logging_endpoint": self.logging_endpoint,
            "tpu_endpoint": self.tpu_endpoint if self.tpu is not None else None,
            # Settings ignores fields it does not know (compute_endpoint arrives with the Compute Engine provider).
            "compute_endpoint": self.compute_endpoint if self.compute is not None else None,
            "aws_access_key_id": FAKE_AWS_KEYS["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": FAKE_AWS_KEYS["AWS_SECRET_ACCESS_KEY"],
            "audit_kms_key_id": AUDIT_KEY_ALIAS,
            **self.google_auth.settings_overrides(),
        }
        values.update(overrides)
        return Settings(**values)

    def tpu_client(self) -> Any:
        """A ``google.cloud.tpu_v2.TpuClient`` (REST, the stack's key) on the fake TPU API."""
        from google.cloud import tpu_v2

        return tpu_v2.TpuClient(
            transport="rest",
            credentials=self.google_credentials(),
            client_options={"api_endpoint": self.tpu_endpoint},
        )

    def compute_client(self, kind: str = "InstancesClient") -> Any:
        """A ``google.cloud.compute_v1`` client (REST, the stack's key) on the fake Compute Engine, e.g.
        ``compute_client("ZoneOperationsClient")``; poll operations with these, never ``.result()``."""
        from google.cloud import compute_v1

        return getattr(compute_v1, kind)(
            credentials=self.google_credentials(),
            client_options={"api_endpoint": self.compute_endpoint},
        )

    # -- control -----------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget all cloud state: AWS (moto), GCS buckets, TPU nodes/queued resources and Compute
        Engine resources (workers stopped)."""
        self._need(self.aws, "aws").reset()
        self.seed_audit()
        self.reset_gcs()
        self.sts_backend.reset()
        self._need(self.logging, "logging").backend.reset()
        self.google_auth.authority.forget_seen()  # tokens stay valid: clients keep theirs
        if self.tpu is not None:
            self.tpu.backend.reset()
        if self.compute is not None:
            self.compute.backend.reset()

    def seed_audit(self) -> str:
        """The audit trail's bucket (Object Lock on) and KMS signing key (alias ``AUDIT_KEY_ALIAS``);
        moto's reset forgets them, so after each. Returns the key's ARN; idempotent."""
        from infra.local.seed import ensure_s3_bucket
        from tpu_ops.cloud.clients import shared_client

        settings = self.settings()
        ensure_s3_bucket(settings, settings.audit_uri, object_lock=True)
        kms = shared_client(settings, "kms")
        aliases = {a["AliasName"]: a.get("TargetKeyId") for a in kms.list_aliases().get("Aliases", [])}
        key_id = aliases.get(AUDIT_KEY_ALIAS)
        if not key_id:
            key_id = kms.create_key(
                KeySpec="ECC_NIST_P256", KeyUsage="SIGN_VERIFY", Description="tpu-ops audit digests"
            )["KeyMetadata"]["KeyId"]
            kms.create_alias(AliasName=AUDIT_KEY_ALIAS, TargetKeyId=key_id)
        return str(kms.describe_key(KeyId=key_id)["KeyMetadata"]["Arn"])

    def reset_gcs(self) -> None:
        """Delete every object and bucket in the GCS emulator (it has no reset of its own)."""
        base = self.gcs_endpoint + "/storage/v1/b"
        for bucket in json.loads(http_call(base + f"?project={self.project}")).get("items", []):
            name = bucket["name"]
            for obj in json.loads(http_call(f"{base}/{name}/o")).get("items", []):
                http_call(f"{base}/{name}/o/{_quote(obj['name'])}", "DELETE")
            http_call(f"{base}/{name}", "DELETE")

    def preempt(self, zone: str, node_id: str) -> dict[str, Any]:
        """Spot-preempt a node: PREEMPTED, its queued resource SUSPENDED, its workers SIGTERMed."""
        return self.backend.preempt(zone, node_id, self.project)

    def preempt_instance(self, zone: str, name: str) -> dict[str, Any]:
        """Spot-preempt a Compute Engine instance: STOPPING, guest SIGTERMed, ended after the notice."""
        return self.compute_backend.preempt(zone, name, self.project)

    def set_compute_capacity(self, spec: dict[str, Any]) -> None:
        """``{"<zone>"|"*": {"STANDARD"|"SPOT"|"FLEX_START": chips, "reservations": {name: {"count": vms,
        "machineType": ...}}}}`` on the fake Compute Engine (0 chips = stocked out)."""
        self.compute_backend.configure_capacity(spec)

    def set_capacity(self, spec: dict[str, Any]) -> None:
        """``{"<zone>"|"*": {"spot": chips, "on-demand": chips, "reservations": {name: chips}}}``."""
        self.backend.configure_capacity(spec)

    def add_fault(self, path_regex: str, status: int, count: int = 1, method: str | None = None) -> None:
        """Answer the next ``count`` TPU API calls whose path matches with ``status`` (e.g. 503)."""
        self.backend.add_fault(path_regex, status, count, method)

    def set_latency(self, provision_s: float | None = None, delete_s: float | None = None) -> None:
        self.backend.set_latency(provision_s, delete_s)

    def state(self) -> dict[str, Any]:
        """Fake TPU counts by state (``nodes``, ``queued_resources``, ...), running worker pids of
        both simulators, and the fake Compute Engine's counts under ``compute``."""
        out = self.backend.state()
        out["worker_pids"] = [pid for h in (self.hosts, self.compute_hosts) if h for pid in h.running_pids()]
        if self.compute is not None:
            out["compute"] = self.compute.backend.state()
        return out

    def worker_logs(self, zone: str, node_id: str) -> dict[str, Any]:
        return self._logs(zone, node_id)

    def compute_worker_logs(self, zone: str, instance: str) -> dict[str, Any]:
        """The output of a Compute Engine instance's simulated host (latest incarnation)."""
        if self.compute_hosts is None:
            return {"zone": zone, "node": instance, "workers": []}
        return self.compute_hosts.logs(zone, instance)

    def _logs(self, zone: str, node_id: str) -> dict[str, Any]:
        if self.hosts is None:
            return {"zone": zone, "node": node_id, "workers": []}
        return self.hosts.logs(zone, node_id)


def _quote(name: str) -> str:
    from urllib.parse import quote

    return quote(name, safe="")
