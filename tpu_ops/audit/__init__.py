"""The tamper-evident audit trail: hash-chained records in S3 (Object Lock), signed digests, verify.

Modules: ``records`` (canonical JSON, hashing, redaction), ``store`` (write-once objects in S3,
seal bundles, parallel bounded reads), ``spool`` (local JSONL while S3 is down), ``trail``
(appending, digests, scheduled seals), ``signing`` (KMS digest signatures), ``reading`` (hostile
bytes to records), ``verify`` (naming damage), ``check`` (reading and verifying a trail where it lives),
``lineage`` (a model's provenance from its run's chain), ``events`` (every event's one name),
``recorder`` (a run's records, never failing the run).
"""
