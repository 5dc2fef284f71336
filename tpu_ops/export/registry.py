"""SageMaker: the model package group, packages with lineage metadata, approval, endpoints.

A run has at most one package in a group: registering finds an existing package whose metadata
names the run before creating one, so a repeated export is idempotent. ``update_model_package``
always passes ``ModelApprovalStatus`` and the whole ``CustomerMetadataProperties`` (moto wipes
fields that an update leaves out).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tpu_ops.errors import NotFoundError, PolicyError, SpecError

PENDING, APPROVED, REJECTED = "PendingManualApproval", "Approved", "Rejected"
_ARN = re.compile(r"^arn:aws[a-z-]*:sagemaker:[a-z0-9-]+:\d{12}:model-package/[A-Za-z0-9-]{1,63}(/\d+)?$", re.ASCII)
_ENDPOINT = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")


@dataclass(frozen=True)
class Package:
    """A model package as tpu-ops reads it."""

    arn: str
    group: str
    version: int | None
    status: str
    metadata: dict[str, str]
    model_data_url: str | None
    image: str | None
    approval_description: str | None

    @property
    def run_id(self) -> str | None:
        return self.metadata.get("run_id")


def check_package_arn(arn: str) -> str:
    """``arn`` if it is a versioned model package ARN, else ``SpecError``."""
    if not _ARN.fullmatch(arn):
        raise SpecError(
            f"{arn!r} is not a model package ARN like arn:aws:sagemaker:REGION:ACCOUNT:model-package/GROUP/1"
        )
    return arn


def check_endpoint_name(name: str) -> str:
    if not _ENDPOINT.fullmatch(name):
        raise SpecError(f"endpoint name {name!r} is not allowed: letters, digits and '-', ≤ 63, no leading '-'")
    return name


def ensure_group(sm: Any, group: str, description: str = "") -> bool:
    """Create the model package group unless it exists; True if it was created."""
    try:
        sm.describe_model_package_group(ModelPackageGroupName=group)
        return False
    except Exception as exc:
        if "does not exist" not in str(exc) and "not found" not in str(exc).lower():
            raise
    sm.create_model_package_group(ModelPackageGroupName=group, ModelPackageGroupDescription=description[:1024])
    return True


def describe(sm: Any, arn: str) -> Package:
    """The package ``arn``; ``NotFoundError`` if there is none."""
    try:
        d = sm.describe_model_package(ModelPackageName=arn)
    except Exception as exc:
        if "not found" in str(exc).lower() or "does not exist" in str(exc):
            raise NotFoundError(f"model package {arn} not found", service="sagemaker", status=404) from exc
        raise
    containers = (d.get("InferenceSpecification") or {}).get("Containers") or [{}]
    return Package(
        arn=d["ModelPackageArn"],
        group=d.get("ModelPackageGroupName") or "",
        version=d.get("ModelPackageVersion"),
        status=d.get("ModelApprovalStatus") or "",
        metadata=dict(d.get("CustomerMetadataProperties") or {}),
        model_data_url=containers[0].get("ModelDataUrl"),
        image=containers[0].get("Image"),
        approval_description=d.get("ApprovalDescription"),
    )


def find_for_run(sm: Any, group: str, run_id: str) -> Package | None:
    """The package of ``run_id`` in ``group``, if one was registered."""
    pages = sm.get_paginator("list_model_packages").paginate(ModelPackageGroupName=group)
    for page in pages:
        for summary in page.get("ModelPackageSummaryList", []):
            pkg = describe(sm, summary["ModelPackageArn"])
            if pkg.run_id == run_id:
                return pkg
    return None


def register(sm: Any, group: str, image: str, model_data_url: str, metadata: dict[str, str], description: str) -> str:
    """Create a package pending manual approval; returns its ARN."""
    for k, v in metadata.items():
        if len(k) > 128 or len(v) > 256:
            raise ValueError(f"model package metadata {k!r} is too long for SageMaker (key ≤ 128, value ≤ 256)")
    resp = sm.create_model_package(
        ModelPackageGroupName=group,
        ModelPackageDescription=description[:1024],
        InferenceSpecification={
            "Containers": [{"Image": image, "ModelDataUrl": model_data_url}],
            "SupportedContentTypes": ["application/json"],
            "SupportedResponseMIMETypes": ["application/json"],
        },
        ModelApprovalStatus=PENDING,
        CustomerMetadataProperties=metadata,
    )
    return str(resp["ModelPackageArn"])


def set_approval(sm: Any, pkg: Package, status: str, approver: str, reason: str, when: str) -> Package:
    """Approve or reject ``pkg``, recording who, when and why in its metadata."""
    if status not in (APPROVED, REJECTED):
        raise SpecError(f"approval status {status!r} is not one of {APPROVED}, {REJECTED}")
    if status == pkg.status:
        raise PolicyError(f"model package {pkg.arn} is already {status}")
    if pkg.status == REJECTED:
        raise PolicyError(f"model package {pkg.arn} was rejected; export the run again for a new package")
    metadata = {**pkg.metadata, "approval_status": status, "approved_by": approver[:256], "approval_time": when}
    if reason:
        metadata["approval_reason"] = reason[:256]
    sm.update_model_package(
        ModelPackageArn=pkg.arn,
        ModelApprovalStatus=status,
        ApprovalDescription=f"{status} by {approver}" + (f": {reason}" if reason else ""),
        CustomerMetadataProperties=metadata,
    )
    return describe(sm, pkg.arn)


@dataclass(frozen=True)
class Deployment:
    """What a deploy created or updated."""

    endpoint: str
    endpoint_arn: str
    endpoint_config: str
    model: str
    created: bool
    request_ids: tuple[str, ...]


def deploy(sm: Any, pkg: Package, endpoint: str, role_arn: str, instance_type: str, count: int) -> Deployment:
    """Serve an APPROVED package on ``endpoint`` (created, or updated to a new config)."""
    if pkg.status != APPROVED:
        raise PolicyError(f"model package {pkg.arn} is {pkg.status or 'not approved'}; only an Approved package "
                          "may be deployed (tpu-ops approve ARN --approver NAME)")  # fmt: skip
    check_endpoint_name(endpoint)
    suffix = f"{pkg.group}-v{pkg.version or 0}"[:50]
    model = f"{suffix}"
    ids: list[str] = []
    try:
        sm.describe_model(ModelName=model)
    except Exception:
        r = sm.create_model(ModelName=model, ExecutionRoleArn=role_arn, Containers=[{"ModelPackageName": pkg.arn}])
        ids.append(r.get("ResponseMetadata", {}).get("RequestId", ""))
    config = f"{endpoint}-{suffix}"[:63].rstrip("-")
    try:
        sm.describe_endpoint_config(EndpointConfigName=config)
    except Exception:
        sm.create_endpoint_config(
            EndpointConfigName=config,
            ProductionVariants=[
                {
                    "VariantName": "primary",
                    "ModelName": model,
                    "InstanceType": instance_type,
                    "InitialInstanceCount": count,
                }
            ],
        )
    try:
        sm.describe_endpoint(EndpointName=endpoint)
        created = False
    except Exception:
        created = True
    if created:
        r = sm.create_endpoint(EndpointName=endpoint, EndpointConfigName=config)
    else:
        r = sm.update_endpoint(EndpointName=endpoint, EndpointConfigName=config)
    ids.append(r.get("ResponseMetadata", {}).get("RequestId", ""))
    return Deployment(endpoint, str(r["EndpointArn"]), config, model, created, tuple(i for i in ids if i))
