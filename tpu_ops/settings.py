"""The one settings object: projects, regions, endpoints, credentials and knobs.

Read from the environment with the ``TPU_OPS_`` prefix; the cloud SDKs' own standard variables
(``AWS_ENDPOINT_URL``, ``STORAGE_EMULATOR_HOST``, ``AWS_ACCESS_KEY_ID``, ...) are accepted as
aliases so a shell that sourced ``tpu-ops local up`` works unchanged. No other module of tpu-ops
reads the environment: everything else takes a ``Settings``.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from tpu_ops.errors import ConfigError

ENV_PREFIX = "TPU_OPS_"


def _env(name: str, *aliases: str) -> AliasChoices:
    return AliasChoices(ENV_PREFIX + name.upper(), *aliases)


def is_loopback(url: str) -> bool:
    """True when ``url`` (``http://host:port`` or bare ``host:port``) names a loopback host."""
    if "://" not in url:
        url = "http://" + url
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def env_names(field: str) -> list[str]:
    """The environment variables that set ``Settings`` field ``field``, the first one winning."""
    alias = Settings.model_fields[field].validation_alias
    if isinstance(alias, AliasChoices):
        return [str(c) for c in alias.choices]
    return [str(alias) if isinstance(alias, str) else ENV_PREFIX + field.upper()]


def env_name(field: str) -> str:
    """``TPU_OPS_FIELD`` and, when the SDKs' own variable sets it too, ``(or THAT)``: for messages."""
    names = env_names(field)
    return names[0] + (f" (or {', '.join(names[1:])})" if len(names) > 1 else "")


class Settings(BaseSettings):
    """Typed settings for every cloud client tpu-ops builds."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", populate_by_name=True)

    dry_run: bool = Field(False, description="Refuse any endpoint that is not on loopback.")
    gcp_project: str = Field("tpu-ops-local", validation_alias=_env("gcp_project", "GOOGLE_CLOUD_PROJECT"))
    aws_region: str = Field("us-east-1", validation_alias=_env("aws_region", "AWS_DEFAULT_REGION"))
    aws_endpoint_url: str | None = Field(None, validation_alias=_env("aws_endpoint_url", "AWS_ENDPOINT_URL"))
    gcs_endpoint: str | None = Field(None, validation_alias=_env("gcs_endpoint", "STORAGE_EMULATOR_HOST"))
    tpu_endpoint: str | None = Field(None, validation_alias=_env("tpu_endpoint"))
    compute_endpoint: str | None = Field(
        None,
        validation_alias=_env("compute_endpoint"),
        description="Compute Engine API (a local fake in a dry run), e.g. http://127.0.0.1:PORT.",
    )
    sts_endpoint: str | None = Field(
        None, validation_alias=_env("sts_endpoint"), description="Storage Transfer Service (a local fake in a dry run)."
    )
    logging_endpoint: str | None = Field(
        None, validation_alias=_env("logging_endpoint"), description="Cloud Logging API (a local fake in a dry run)."
    )
    sts_aws_role_arn: str | None = Field(
        None,
        pattern=r"^arn:aws:iam::[0-9]{12}:role/[A-Za-z0-9_+=,.@/-]+$",
        max_length=600,
        description="IAM role Storage Transfer Service assumes (federated identity) to read S3; "
        "without it, the AWS keys are handed to STS.",
    )
    mirror_sts_min_bytes: int = Field(
        256 * 1024**3, ge=0, description="engine=auto: copy with Storage Transfer Service from this many planned bytes."
    )
    mirror_sts_min_objects: int = Field(
        500_000, ge=0, description="engine=auto: ... or from this many planned objects."
    )
    aws_access_key_id: SecretStr | None = Field(None, validation_alias=_env("aws_access_key_id", "AWS_ACCESS_KEY_ID"))
    aws_secret_access_key: SecretStr | None = Field(
        None, validation_alias=_env("aws_secret_access_key", "AWS_SECRET_ACCESS_KEY")
    )
    aws_session_token: SecretStr | None = Field(
        None,
        validation_alias=_env("aws_session_token", "AWS_SESSION_TOKEN"),
        description="The session token of temporary credentials (STS), sent with the key pair.",
    )
    aws_profile: str | None = Field(
        None,
        validation_alias=_env("aws_profile", "AWS_PROFILE"),
        description="A named profile of the AWS config files; used when no key pair is set.",
    )
    gcp_credentials_file: Path | None = Field(
        None, validation_alias=_env("gcp_credentials_file", "GOOGLE_APPLICATION_CREDENTIALS")
    )
    gcp_credentials_info: SecretStr | None = Field(
        None, description="A service-account key as JSON (e.g. from a Prefect GcpCredentials block)."
    )
    metadata_host: str = Field(
        "metadata.google.internal",
        validation_alias=_env("metadata_host", "GCE_METADATA_HOST"),
        description="The VM metadata server (a local fake on a simulated TPU host).",
    )
    retry_attempts: int = Field(6, ge=1, le=20)
    retry_initial_delay_s: float = Field(0.2, ge=0.0, le=60.0)
    retry_max_delay_s: float = Field(10.0, ge=0.0, le=600.0)
    poll_interval_s: float = Field(2.0, ge=0.01, le=300.0)
    state_dir: Path = Field(Path(".tpu-ops"), description="Local state: ledgers, audit spool.")
    worker_dir: Path | None = Field(
        None, description="A worker's scratch directory (trainer log, progress file); default: a temp dir."
    )
    price_table: Path | None = Field(None, description="A JSON price table overriding the shipped one.")
    audit_uri: str = Field(
        "s3://tpu-ops-audit/trail",
        description="s3://bucket/prefix of the audit trail; the bucket has Object Lock enabled.",
    )
    audit_retention_days: int = Field(
        2555, ge=1, le=36500, description="Object Lock retention (compliance mode) of each audit record."
    )
    audit_kms_key_id: str | None = Field(
        None,
        description="KMS asymmetric key (ECC_NIST_P256, SIGN_VERIFY) that signs audit digests; `audit verify` "
        "checks digest signatures only against this pinned key (or its --key).",
    )
    audit_seal_interval_s: int = Field(
        3600,
        ge=0,
        le=7 * 86400,
        description="Seconds between scheduled audit seals (`tpu-ops audit seal`, the served `seal-audit-trail` "
        "deployment); `audit verify` fails when the newest digest is older than this (+10%). 0: no schedule.",
    )
    audit_spool: Path | None = Field(
        None, description="Local JSONL spool for audit records while S3 is unreachable (default: state_dir)."
    )
    sagemaker_role_arn: str = Field(
        "arn:aws:iam::123456789012:role/tpu-ops-sagemaker-execution",
        description="The execution role SageMaker models deployed by tpu-ops run as.",
    )
    audit_actor: str | None = Field(None, description="The user or service identity audit records name.")
    tpu_zones: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Zones teardown and the reaper scan (comma-separated in the environment); "
        "empty means every zone (locations/-).",
    )

    @field_validator("tpu_zones", mode="before")
    @classmethod
    def _split_zones(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [z.strip() for z in value.split(",") if z.strip()]
        return value

    @property
    def audit_spool_path(self) -> Path:
        """Where audit records wait while S3 is unreachable."""
        return self.audit_spool or self.state_dir / "audit-spool.jsonl"

    @field_validator("audit_uri")
    @classmethod
    def _check_audit_uri(cls, value: str) -> str:
        from tpu_ops.uris import parse_s3

        return str(parse_s3(value))

    def endpoints(self) -> dict[str, str | None]:
        """The endpoint settings by name, as the clients will use them."""
        return {
            "aws_endpoint_url": self.aws_endpoint_url,
            "gcs_endpoint": self.gcs_endpoint,
            "tpu_endpoint": self.tpu_endpoint,
            "compute_endpoint": self.compute_endpoint,
            "sts_endpoint": self.sts_endpoint,
            "logging_endpoint": self.logging_endpoint,
            "metadata_host": self.metadata_host,
        }

    def check_safe(self, *needed: str) -> None:
        """In a dry run, fail fast unless each needed endpoint is set and on loopback.

        ``needed`` names endpoint settings (default: all of them). Outside a dry run an unset
        endpoint means the real cloud, which is the point of production.
        """
        # Compute Engine is checked by default only when set: a dry run on the TPU API needs none.
        names = needed or ("aws_endpoint_url", "gcs_endpoint", "tpu_endpoint") + (
            ("compute_endpoint",) if self.compute_endpoint else ()
        )
        if not self.dry_run:
            return
        for name in names:
            value = self.endpoints()[name]
            env = ENV_PREFIX + name.upper()
            if not value:
                raise ConfigError(
                    f"dry run: endpoint {name} is not set (set {env}, or start the local stack with "
                    f"`tpu-ops local up`); refusing to fall back to the real cloud"
                )
            if not is_loopback(value):
                raise ConfigError(f"dry run: endpoint {name}={value!r} is not on loopback; refusing to start")
