"""How the fake STS touches data: reads from the S3 emulator, writes to the GCS emulator.

Real STS reads S3 with the job's AWS credentials (keys or a federated role) and writes GCS as
its service agent. Here the S3 endpoint is the local stack's moto (a role ARN maps to moto's
test keys) and GCS is fake-gcs-server, spoken to over its JSON API with plain HTTP.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote


class SourceError(Exception):
    """Reading the source failed; ``code`` is the canonical status STS reports for it."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class SourceObject:
    key: str
    size: int
    etag: str


class Mover(Protocol):
    """What an operation needs from the clouds."""

    def list_s3(self, creds: dict[str, Any], bucket: str, prefix: str) -> list[SourceObject]: ...

    def head_s3(self, creds: dict[str, Any], bucket: str, key: str) -> SourceObject: ...

    def read_s3(self, creds: dict[str, Any], bucket: str, key: str) -> bytes: ...

    def read_gcs(self, bucket: str, name: str) -> bytes: ...

    def gcs_md5(self, bucket: str, name: str) -> tuple[int, str] | None: ...

    def write_gcs(self, bucket: str, name: str, data: bytes) -> None: ...


_S3_CODES = {"AccessDenied": "PERMISSION_DENIED", "InvalidAccessKeyId": "PERMISSION_DENIED",
             "NoSuchKey": "NOT_FOUND", "NoSuchBucket": "NOT_FOUND", "404": "NOT_FOUND"}  # fmt: skip


class EmulatorMover:
    """A ``Mover`` on moto (``aws_endpoint``) and fake-gcs-server (``gcs_endpoint``)."""

    def __init__(self, aws_endpoint: str, gcs_endpoint: str, region: str = "us-east-1") -> None:
        self.aws_endpoint = aws_endpoint
        self.gcs_endpoint = gcs_endpoint.rstrip("/")
        self.region = region
        self._local = threading.local()

    def _s3(self, creds: dict[str, Any]) -> Any:
        from botocore.config import Config
        from botocore.session import get_session

        key = creds.get("accessKeyId") or "testing"  # a role ARN: moto takes any key
        clients = self._local.__dict__.setdefault("s3", {})
        if key not in clients:
            clients[key] = get_session().create_client(
                "s3",
                region_name=self.region,
                endpoint_url=self.aws_endpoint,
                aws_access_key_id=key,
                aws_secret_access_key=creds.get("secretAccessKey") or "testing",
                config=Config(retries={"mode": "standard", "max_attempts": 3}, max_pool_connections=16),
            )
        return clients[key]

    def _session(self) -> Any:
        import requests

        if not hasattr(self._local, "http"):
            self._local.http = requests.Session()
            self._local.http.trust_env = False
        return self._local.http

    def _s3_call(self, fn: Any, **kw: Any) -> Any:
        from botocore.exceptions import ClientError

        try:
            return fn(**kw)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            raise SourceError(_S3_CODES.get(code, "UNKNOWN"), f"{code}: {exc}") from exc

    def list_s3(self, creds: dict[str, Any], bucket: str, prefix: str) -> list[SourceObject]:
        s3 = self._s3(creds)
        out: list[SourceObject] = []
        token: dict[str, Any] = {}
        while True:
            page = self._s3_call(s3.list_objects_v2, Bucket=bucket, Prefix=prefix, **token)
            out += [SourceObject(o["Key"], int(o["Size"]), o["ETag"].strip('"')) for o in page.get("Contents", ())]
            if not page.get("IsTruncated"):
                return out
            token = {"ContinuationToken": page["NextContinuationToken"]}

    def head_s3(self, creds: dict[str, Any], bucket: str, key: str) -> SourceObject:
        r = self._s3_call(self._s3(creds).head_object, Bucket=bucket, Key=key)
        return SourceObject(key, int(r["ContentLength"]), str(r["ETag"]).strip('"'))

    def read_s3(self, creds: dict[str, Any], bucket: str, key: str) -> bytes:
        r = self._s3_call(self._s3(creds).get_object, Bucket=bucket, Key=key)
        data: bytes = r["Body"].read()
        return data

    def _object_url(self, bucket: str, name: str) -> str:
        return f"{self.gcs_endpoint}/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}"

    def read_gcs(self, bucket: str, name: str) -> bytes:
        r = self._session().get(self._object_url(bucket, name), params={"alt": "media"}, timeout=60)
        if r.status_code == 404:
            raise SourceError("NOT_FOUND", f"gs://{bucket}/{name} does not exist")
        r.raise_for_status()
        return bytes(r.content)

    def gcs_md5(self, bucket: str, name: str) -> tuple[int, str] | None:
        r = self._session().get(self._object_url(bucket, name), timeout=60)
        if r.status_code == 404:
            return None
        r.raise_for_status()
        meta = r.json()
        return int(meta.get("size", 0)), str(meta.get("md5Hash", ""))

    def write_gcs(self, bucket: str, name: str, data: bytes) -> None:
        url = f"{self.gcs_endpoint}/upload/storage/v1/b/{quote(bucket, safe='')}/o"
        r = self._session().post(
            url, params={"uploadType": "media", "name": name}, data=data, timeout=300,
            headers={"Content-Type": "application/octet-stream"},
        )  # fmt: skip
        if r.status_code >= 400:
            code = "PERMISSION_DENIED" if r.status_code == 403 else "UNKNOWN"
            raise SourceError(code, f"write gs://{bucket}/{name}: {r.status_code} {json.dumps(r.text[:200])}")
