"""Parsing and checking of ``s3://`` / ``gs://`` URIs and object keys.

Everything a user or a bucket listing hands us passes through here before it reaches a client:
bucket names follow each cloud's rules, and keys never contain ``.``/``..`` segments or control
characters, so no key can climb out of its prefix or smuggle a terminal escape into a log.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from tpu_ops.errors import PolicyError
from tpu_ops.text import unsafe_char

_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_GCS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
MAX_KEY_BYTES = 1024


@dataclass(frozen=True, slots=True)
class ObjectUri:
    """A parsed ``scheme://bucket/prefix``; ``prefix`` has no leading or trailing slash."""

    scheme: str
    bucket: str
    prefix: str

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}" if self.prefix else f"{self.scheme}://{self.bucket}"

    def key(self, relative: str) -> str:
        """The full object key of ``relative`` under this prefix (``relative`` is checked)."""
        check_key(relative)
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def relative(self, key: str) -> str:
        """The part of ``key`` below this prefix."""
        if not self.prefix:
            return key
        head = self.prefix + "/"
        if not key.startswith(head):
            raise PolicyError(f"object key {key!r} is not under prefix {self.prefix!r}")
        return key[len(head) :]

    def child(self, relative: str) -> ObjectUri:
        """The URI of ``relative`` below this one."""
        return ObjectUri(self.scheme, self.bucket, self.key(relative))


def check_key(key: str) -> str:
    """Return ``key`` if it is a safe object key, else raise ``PolicyError`` saying why."""
    bad = unsafe_char(key)
    if bad:
        raise PolicyError(f"object key {key!r} contains {bad}")
    if key.startswith("/"):
        raise PolicyError(f"object key {key!r} starts with '/'")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise PolicyError(f"object key {key[:40]!r}... is longer than {MAX_KEY_BYTES} bytes")
    if any(seg in (".", "..") for seg in key.split("/")):
        raise PolicyError(f"object key {key!r} contains a '.' or '..' segment")
    return key


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def check_s3_bucket(name: str) -> str:
    """Return ``name`` if it is a valid S3 bucket name, else raise ``ValueError``."""
    if not _S3_BUCKET.fullmatch(name) or ".." in name or _is_ip(name):
        raise ValueError(
            f"invalid S3 bucket name {name!r}: 3-63 characters of lowercase letters, digits, '.' and '-', "
            "starting and ending with a letter or digit, no '..', not an IP address"
        )
    if name.startswith("xn--") or name.endswith("-s3alias"):
        raise ValueError(f"invalid S3 bucket name {name!r}: reserved prefix 'xn--' or suffix '-s3alias'")
    return name


def check_gcs_bucket(name: str) -> str:
    """Return ``name`` if it is a valid GCS bucket name, else raise ``ValueError``."""
    parts = name.split(".")
    if (
        not _GCS_BUCKET.fullmatch(name)
        or ".." in name
        or _is_ip(name)
        or any(len(p) > 63 or not p for p in parts)
        or ("." not in name and len(name) > 63)
    ):
        raise ValueError(
            f"invalid GCS bucket name {name!r}: 3-63 characters of lowercase letters, digits, '-', '_' "
            "and '.', starting and ending with a letter or digit, no '..', not an IP address"
        )
    if name.startswith("goog") or "google" in name:
        raise ValueError(f"invalid GCS bucket name {name!r}: may not start with 'goog' or contain 'google'")
    return name


def parse_uri(uri: str, scheme: str) -> ObjectUri:
    """Parse ``scheme://bucket[/prefix]``; raise ``ValueError`` naming what is wrong."""
    if not isinstance(uri, str):
        raise ValueError(f"expected a {scheme}://bucket/prefix string, got {type(uri).__name__}")
    head = f"{scheme}://"
    if not uri.startswith(head):
        raise ValueError(f"{uri!r} is not a {head}bucket/prefix URI")
    bad = unsafe_char(uri)
    if bad:
        raise ValueError(f"{uri!r} contains {bad}")
    bucket, _, prefix = uri[len(head) :].partition("/")
    (check_s3_bucket if scheme == "s3" else check_gcs_bucket)(bucket)
    prefix = prefix.strip("/")
    if prefix:
        try:
            check_key(prefix)
        except PolicyError as exc:
            raise ValueError(str(exc).replace("object key", "prefix")) from None
        if "//" in prefix:
            raise ValueError(f"prefix {prefix!r} contains an empty segment ('//')")
    return ObjectUri(scheme, bucket, prefix)


def parse_s3(uri: str) -> ObjectUri:
    """Parse an ``s3://bucket/prefix`` URI."""
    return parse_uri(uri, "s3")


def parse_gs(uri: str) -> ObjectUri:
    """Parse a ``gs://bucket/prefix`` URI."""
    return parse_uri(uri, "gs")
