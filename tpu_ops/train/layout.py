"""Reading and writing a run's JSON records in GCS; the paths themselves are :mod:`tpu_ops.layout`'s."""

from __future__ import annotations

import json
from typing import Any

from tpu_ops.cloud.translate import google_errors
from tpu_ops.errors import NotFoundError
from tpu_ops.layout import RunLayout as RunLayout  # the paths are tpu_ops.layout's
from tpu_ops.uris import ObjectUri


def put_json(gcs: Any, uri: ObjectUri, doc: Any) -> None:
    """Write ``doc`` as JSON at ``uri``."""
    with google_errors("gcs"):
        gcs.bucket(uri.bucket).blob(uri.prefix).upload_from_string(
            json.dumps(doc, sort_keys=True, default=str), content_type="application/json"
        )


def get_json(gcs: Any, uri: ObjectUri) -> Any:
    """Read JSON at ``uri``; ``NotFoundError`` if absent."""
    with google_errors("gcs"):
        return json.loads(gcs.bucket(uri.bucket).blob(uri.prefix).download_as_bytes())


def exists(gcs: Any, uri: ObjectUri) -> bool:
    with google_errors("gcs"):
        return bool(gcs.bucket(uri.bucket).blob(uri.prefix).exists())


def list_json(gcs: Any, prefix: ObjectUri) -> list[Any]:
    """Every JSON document directly under ``prefix`` (one listing), skipping ones that vanish."""
    out = []
    with google_errors("gcs"):
        blobs = list(gcs.list_blobs(prefix.bucket, prefix=prefix.prefix + "/"))
    for blob in blobs:
        try:
            with google_errors("gcs"):
                out.append(json.loads(blob.download_as_bytes()))
        except (NotFoundError, json.JSONDecodeError):
            continue  # replaced or half-written between the listing and the read
    return out
