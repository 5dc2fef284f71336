"""tpu-ops: the training half of a hybrid AWS + Google Cloud ML platform.

The library holds typed specs, cloud adapters and the engines; Prefect lives in ``flows/``.
"""

__version__ = "0.1.0"
