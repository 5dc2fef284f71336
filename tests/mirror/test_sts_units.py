"""The STS engine's decisions that need no server: engine choice, credentials, endpoint safety."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tpu_ops.cloud.transfer import transfer_client
from tpu_ops.errors import ConfigError
from tpu_ops.mirror import sts
from tpu_ops.mirror.strategies import CopyContext
from tpu_ops.settings import Settings
from tpu_ops.specs.jobs import MirrorSpec
from tpu_ops.uris import parse_gs, parse_s3

GiB = 1024**3


def _settings(**kw) -> Settings:
    return Settings(dry_run=False, mirror_sts_min_objects=1000, mirror_sts_min_bytes=10 * GiB, **kw)


def test_auto_picks_sts_from_either_threshold_on_and_never_for_nothing():
    s = _settings()
    assert sts.choose("auto", s, 999, 10 * GiB - 1) == "local"
    assert sts.choose("auto", s, 1000, 1) == "sts"
    assert sts.choose("auto", s, 1, 10 * GiB) == "sts"
    assert sts.choose("auto", Settings(dry_run=False, mirror_sts_min_objects=0), 0, 0) == "local"
    assert sts.choose("sts", s, 1, 1) == "sts" and sts.choose("local", s, 10**9, 10**15) == "local"


def test_engine_is_validated_with_the_allowed_values():
    with pytest.raises(ValidationError, match="'local', 'sts' or 'auto'"):
        MirrorSpec(source="s3://bucket-a/p", destination="gs://bucket-b/p", engine="fast")


def _ctx(settings: Settings) -> CopyContext:
    return CopyContext(None, None, parse_s3("s3://bucket-a/p"), parse_gs("gs://bucket-b/q"), settings, 4, 1)


def test_aws_access_reaches_sts_as_a_role_or_keys_never_temporary_ones():
    role = "arn:aws:iam::123456789012:role/reader"
    both = _ctx(_settings(sts_aws_role_arn=role, aws_access_key_id="AKIA1", aws_secret_access_key="s"))
    assert sts._aws_source(both) == {"bucket_name": "bucket-a", "path": "p/", "role_arn": role}
    keys = sts._aws_source(_ctx(_settings(aws_access_key_id="AKIA1", aws_secret_access_key="s")))
    assert keys["aws_access_key"] == {"access_key_id": "AKIA1", "secret_access_key": "s"}
    temporary = _settings(aws_access_key_id="ASIA1", aws_secret_access_key="s", aws_session_token="t")
    with pytest.raises(ConfigError, match="STS_AWS_ROLE_ARN"):
        sts._aws_source(_ctx(temporary))
    nothing = _settings(aws_access_key_id=None, aws_secret_access_key=None, aws_session_token=None)
    with pytest.raises(ConfigError, match="needs AWS access"):
        sts._aws_source(_ctx(nothing))
    with pytest.raises(ValidationError):
        _settings(sts_aws_role_arn="arn:aws:iam::1:user/not-a-role")


def test_client_factory_refuses_a_missing_or_remote_endpoint_in_a_dry_run():
    with pytest.raises(ConfigError, match="sts_endpoint is not set"):
        transfer_client(Settings(dry_run=True))
    with pytest.raises(ConfigError, match="not on loopback"):
        transfer_client(Settings(dry_run=True, sts_endpoint="https://storagetransfer.googleapis.com"))
