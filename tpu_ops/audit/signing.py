"""Digest signatures: what KMS signs for a digest, and asking KMS whether a signature is valid.

Kept apart from :mod:`tpu_ops.audit.trail` so that verify can check signatures without the writer
(and its store) in its imports.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from tpu_ops.audit.records import signed_bytes
from tpu_ops.errors import AccessDeniedError

SIGNING_ALGORITHM = "ECDSA_SHA_256"


def verify_signature(kms: Any, record: dict[str, Any], key_id: str | None = None) -> bool:
    """True if ``record``'s signature is valid for ``key_id`` (default: the key it names), asked of KMS.

    False only when KMS says the signature is invalid (or it is not a signature at all). A KMS that
    cannot be asked (unreachable, access denied, no credentials) raises the translated ``CloudError``:
    that says nothing about the record.
    """
    from tpu_ops.cloud.translate import aws_error_code, translate_boto

    try:
        sig = base64.b64decode(str(record.get("signature", "")), validate=True)
    except ValueError:
        return False
    if not sig:
        return False
    message_type = record.get("message_type", "RAW")
    if record.get("signing_algorithm", SIGNING_ALGORITHM) != SIGNING_ALGORITHM or message_type not in ("RAW", "DIGEST"):
        return False  # the algorithm is pinned too: a record may not choose a weaker one
    try:
        resp = kms.verify(
            KeyId=key_id or record["key_id"],
            Message=signed_message(record),
            MessageType=message_type,
            Signature=sig,
            SigningAlgorithm=SIGNING_ALGORITHM,
        )
    except Exception as exc:
        code = aws_error_code(exc)[0]
        if code == "KMSInvalidSignatureException":  # KMS's own word that this signature is not valid
            return False
        if code in _DENIED:  # KMS answers these with HTTP 400: still "could not ask", never "forged"
            raise AccessDeniedError(f"kms: {exc}", service="kms", status=403) from exc
        raise translate_boto(exc, "kms") from exc
    return bool(resp.get("SignatureValid"))


# Not about the digest: the caller's credentials or permissions. ("InvalidSignatureException" is a
# request whose SigV4 signature is wrong, i.e. bad credentials, not a bad digest signature.)
_DENIED = (
    "AccessDeniedException", "AccessDenied", "UnrecognizedClientException", "InvalidSignatureException",
    "ExpiredTokenException", "InvalidClientTokenId", "MissingAuthenticationToken",
)  # fmt: skip


def signed_message(record: dict[str, Any]) -> bytes:
    """What KMS signs for ``record``: its signed bytes, or their SHA-256 when it says ``message_type: DIGEST``."""
    data = signed_bytes(record)
    return hashlib.sha256(data).digest() if record.get("message_type") == "DIGEST" else data
