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


class Settings(BaseSettings):
    """Typed settings for every cloud client tpu-ops builds."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", populate_by_name=True)

    dry_run: bool = Field(False, description="Refuse any endpoint that is not on loopback.")
    gcp_project: str = Field("tpu-ops-local", validation_alias=_env("gcp_project", "GOOGLE_CLOUD_PROJECT"))
    aws_region: str = Field("us-east-1", validation_alias=_env("aws_region", "AWS_DEFAULT_REGION"))
    aws_endpoint_url: str | None = Field(None, validation_alias=_env("aws_endpoint_url", "AWS_ENDPOINT_URL"))
    gcs_endpoint: str | None = Field(None, validation_alias=_env("gcs_endpoint", "STORAGE_EMULATOR_HOST"))
    tpu_endpoint: str | None = Field(None, validation_alias=_env("tpu_endpoint"))
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
    state_dir: Path = Field(Path(".tpu-ops"), description="Local state: the cost ledgers of runs.")
    price_table: Path | None = Field(None, description="A JSON price table overriding the shipped one.")
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

    def endpoints(self) -> dict[str, str | None]:
        """The endpoint settings by name, as the clients will use them."""
        return {
            "aws_endpoint_url": self.aws_endpoint_url,
            "gcs_endpoint": self.gcs_endpoint,
            "tpu_endpoint": self.tpu_endpoint,
            "metadata_host": self.metadata_host,
        }

    def check_safe(self, *needed: str) -> None:
        """In a dry run, fail fast unless each needed endpoint is set and on loopback.

        ``needed`` names endpoint settings (default: all of them). Outside a dry run an unset
        endpoint means the real cloud, which is the point of production.
        """
        names = needed or ("aws_endpoint_url", "gcs_endpoint", "tpu_endpoint")
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
