"""Cloud adapters: the only modules that import the cloud SDKs (``tests/foundation/test_import_rules.py``).

``clients`` builds the SDK clients from ``Settings``; ``translate`` turns every SDK error into the
error tree, in one place; ``tpu``, ``compute`` (with ``compute_types``), ``transfer`` (Storage
Transfer Service) and ``probes`` (the doctor's reads) answer with typed records; ``retry`` is the
one retry policy, ``session`` shares one botocore session per process.
"""
