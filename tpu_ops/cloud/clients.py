"""Build the real SDK clients from ``Settings``, pointed at local servers in a dry run.

Every factory checks the settings first, so a dry run with a missing or non-loopback endpoint
fails before any request leaves the process.

Google credentials are the same in a dry run as in production: a service-account key (a Prefect
``GcpCredentials`` block's, or a key file) becomes ``google.oauth2.service_account.Credentials``
the way prefect-gcp's ``GcpCredentials.get_credentials_from_service_account`` makes them, and each
client signs its own token request to the key's ``token_uri`` (the local stack's OAuth endpoint in
a dry run, whose fakes refuse a request without a token it issued). Without a key: application
default credentials in production; in a dry run, a one-line ``CredentialsError`` naming what is
missing, before any request (only the GCS emulator, which is not ours, takes anonymous requests).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from tpu_ops.errors import ConfigError, CredentialsError
from tpu_ops.settings import Settings, env_name, is_loopback

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"  # the scope prefect-gcp's blocks ask for


def _service_account_key(settings: Settings) -> dict[str, Any] | None:
    """The service-account key JSON the settings name (a block's key, else a key file), or None."""
    if settings.gcp_credentials_info:
        where = "the GcpCredentials block's service_account_info"
        text = settings.gcp_credentials_info.get_secret_value()
    elif settings.gcp_credentials_file:
        where = f"{env_name('gcp_credentials_file')}={settings.gcp_credentials_file}"
        try:
            text = settings.gcp_credentials_file.read_text()
        except OSError as e:
            raise ConfigError(f"cannot read the service-account key {where}: {e.strerror or e}") from None
    else:
        return None
    try:
        key = json.loads(text)
    except ValueError:
        key = None
    if not isinstance(key, dict) or key.get("type") != "service_account" or not key.get("private_key"):
        raise ConfigError(f"{where} is not a service-account key (JSON with type service_account and a private_key)")
    return key


def missing_google_credentials() -> CredentialsError:
    """The dry run's "no key" error: which credentials are missing and where they come from."""
    err = CredentialsError(
        "Google Cloud credentials not found: no service-account key (no GcpCredentials block named, "
        f"{env_name('gcp_credentials_file')} unset); the emulated Google APIs answer 401 without a token",
        service="google",
    )
    err.fix = (
        "name a Prefect GcpCredentials block (gcp_credentials_block) or set TPU_OPS_GCP_CREDENTIALS_FILE to a "
        "service-account key; the local stack writes one (`tpu-ops local up --env-file FILE` names it)"
    )
    return err


def _google_credentials(settings: Settings, emulated: bool, *, anonymous_ok: bool = False) -> Any:
    """The run's Google credentials (see the module docstring); None: application default credentials.

    ``anonymous_ok``: an emulator that takes any request (fake-gcs-server) may be called without a key.
    """
    key = _service_account_key(settings)
    if key is None:
        if emulated and anonymous_ok:
            from google.auth.credentials import AnonymousCredentials

            return AnonymousCredentials()  # type: ignore[no-untyped-call]
        if emulated or settings.dry_run:
            raise missing_google_credentials()
        return None
    token_uri = str(key.get("token_uri") or "")
    if settings.dry_run and not is_loopback(token_uri):  # a refresh would ask Google's real token endpoint
        raise ConfigError(f"dry run: the service-account key's token_uri {token_uri!r} is not on loopback; refusing")
    return service_account_credentials(key, loopback=emulated or settings.dry_run)


def service_account_credentials(key: dict[str, Any], *, loopback: bool) -> Any:
    """``service_account.Credentials`` of ``key`` with the cloud-platform scope (prefect-gcp's way).

    ``loopback``: for emulated endpoints. google-auth (2.6x) asks Google's IAM Credentials API
    (``iamcredentials.googleapis.com/.../allowedLocations``) for the account's regional access
    boundary in a background thread after each token; against the fakes that request would leave
    loopback, so these credentials skip that lookup (the only difference).
    """
    from google.oauth2 import service_account

    cls = _LoopbackCredentials() if loopback else service_account.Credentials
    try:
        return cls.from_service_account_info(key, scopes=[CLOUD_PLATFORM])
    except ValueError as e:  # a field missing, a key that does not parse
        raise ConfigError(f"the service-account key of {key.get('client_email', '?')} is unusable: {e}") from None


_loopback_class: list[Any] = []


def _LoopbackCredentials() -> Any:  # a class, made on first use (google-auth is imported lazily)
    if not _loopback_class:
        from google.oauth2 import service_account

        class LoopbackCredentials(service_account.Credentials):
            """Service-account credentials that never look up a regional access boundary at Google."""

            def _is_regional_access_boundary_lookup_required(self) -> bool:
                return False

        _loopback_class.append(LoopbackCredentials)
    return _loopback_class[0]


def tpu_client(settings: Settings) -> Any:
    """A ``google.cloud.tpu_v2.TpuClient`` over REST."""
    settings.check_safe("tpu_endpoint")
    from google.cloud import tpu_v2

    endpoint = settings.tpu_endpoint
    opts = {"api_endpoint": endpoint.rstrip("/")} if endpoint else None
    return tpu_v2.TpuClient(
        transport="rest", credentials=_google_credentials(settings, bool(endpoint)), client_options=opts
    )


def compute_options(settings: Settings) -> dict[str, Any]:
    """``credentials`` and ``client_options`` for every ``google.cloud.compute_v1`` client of a run.

    The operations clients that poll must be built with exactly these too: an operation's own
    ``.result()`` polls through a client built without them, i.e. Google's real host.
    """
    settings.check_safe("compute_endpoint")
    from google.api_core.client_options import ClientOptions

    endpoint = settings.compute_endpoint
    opts = ClientOptions(api_endpoint=endpoint.rstrip("/")) if endpoint else None
    return {"credentials": _google_credentials(settings, bool(endpoint)), "client_options": opts}


def storage_client(settings: Settings) -> Any:
    """A ``google.cloud.storage.Client``."""
    settings.check_safe("gcs_endpoint")
    from google.cloud import storage  # type: ignore[attr-defined]

    endpoint = settings.gcs_endpoint
    if endpoint and "://" not in endpoint:
        endpoint = "http://" + endpoint
    opts = {"api_endpoint": endpoint.rstrip("/")} if endpoint else None
    return storage.Client(
        project=settings.gcp_project,
        credentials=_google_credentials(settings, bool(endpoint), anonymous_ok=True),
        client_options=opts,
    )


def boto3_client(
    settings: Settings,
    service: str,
    *,
    text_timestamps: bool = False,
    session: Any = None,
    max_attempts: int | None = None,
    **config: Any,
) -> Any:
    """An AWS SDK client for ``service`` (``s3``, ``sagemaker``, ``sts``) with credentials from ``settings``.

    A key pair goes with its session token (temporary credentials); otherwise a named profile, or
    botocore's own chain. Built from botocore's session, which is what ``boto3.client`` does
    underneath: the client is the same object with the same API, without ~0.1 s of boto3's
    imports (s3transfer, asyncio) that we would not use. ``text_timestamps`` leaves timestamps
    (``LastModified``...) as the strings AWS sent, as the AWS CLI does: parsing each with dateutil
    costs more than the rest of a listed object. ``session`` reuses a botocore session (its loaded
    service models) instead of a new one; ``max_attempts`` overrides the settings' retry attempts.
    """
    settings.check_safe("aws_endpoint_url")
    from botocore.config import Config
    from botocore.session import get_session

    kw: dict[str, Any] = {"region_name": settings.aws_region}
    if settings.aws_endpoint_url:
        kw["endpoint_url"] = settings.aws_endpoint_url
    if settings.aws_access_key_id and settings.aws_secret_access_key:
        kw["aws_access_key_id"] = settings.aws_access_key_id.get_secret_value()
        kw["aws_secret_access_key"] = settings.aws_secret_access_key.get_secret_value()
        if settings.aws_session_token:  # temporary credentials are worthless without it
            kw["aws_session_token"] = settings.aws_session_token.get_secret_value()
    session = session or get_session()
    if settings.aws_profile:
        session.set_config_variable("profile", settings.aws_profile)
    if text_timestamps:
        session.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=str)
    cfg = Config(retries={"mode": "standard", "max_attempts": max_attempts or settings.retry_attempts}, **config)
    return session.create_client(service, config=cfg, **kw)


# One botocore session per AWS profile (a session carries its profile as config): loading the service
# models and the endpoint resolver is most of the cost of a new client (0.3-1 s each on a busy 2-core
# machine), so a process pays it once. Clients are created under a lock (a session is not thread-safe
# while it builds a client); the clients themselves are.
_sessions: dict[str | None, Any] = {}
_session_lock = threading.Lock()


def shared_client(settings: Settings, service: str, *, max_attempts: int | None = None, **config: Any) -> Any:
    """An AWS client for ``service`` built from ``settings`` on the process's shared botocore session."""
    from botocore.session import get_session

    with _session_lock:
        session = _sessions.get(settings.aws_profile) or _sessions.setdefault(settings.aws_profile, get_session())
        return boto3_client(settings, service, session=session, max_attempts=max_attempts, **config)


class Clients:
    """One run's cloud clients: built on first use from its settings, then reused.

    The only holder of the run's credentials (a Prefect block's key pair with its session token,
    its profile, or the role it assumed, resolved once at the edge): every step of the run asks
    this object for a client, so every record it writes carries the same credentials. AWS clients
    come from the process's shared botocore session (:func:`shared_client`); clients are thread-safe.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._made: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()

    def _once(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        with self._lock:
            if key not in self._made:
                self._made[key] = make()
            return self._made[key]

    def gcs(self) -> Any:
        """The run's ``google.cloud.storage.Client``."""
        return self._once(("gcs",), lambda: storage_client(self.settings))

    def tpu(self) -> Any:
        """The run's ``google.cloud.tpu_v2.TpuClient``."""
        return self._once(("tpu",), lambda: tpu_client(self.settings))

    def compute_options(self) -> dict[str, Any]:
        """``credentials`` and ``client_options`` for the run's ``compute_v1`` clients."""
        return dict(self._once(("compute",), lambda: compute_options(self.settings)))

    def aws(self, service: str, *, max_attempts: int | None = None, **config: Any) -> Any:
        """The run's AWS client for ``service`` (one per service and client configuration)."""
        key = ("aws", service, max_attempts, tuple(sorted(config.items())))
        return self._once(key, lambda: shared_client(self.settings, service, max_attempts=max_attempts, **config))
