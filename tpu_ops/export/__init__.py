"""Export to AWS: ``model.tar.gz`` streamed GCS → S3 (write-once, verified), SageMaker model
packages with lineage metadata, approval and deployment (``exporter``, ``artifact``, ``registry``,
``release``).
"""
