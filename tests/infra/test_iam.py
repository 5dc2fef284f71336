"""The real-cloud IAM templates parse, name only real actions and permissions, and render from a spec.

AWS actions are checked against botocore's service models (an action is an API operation of its
service, or one of the few IAM-only names listed here with the operation it authorises); GCP
permissions against the discovery documents shipped in google-api-python-client
(``service.resource.verb``: the resource exists in the service and the verb is one of its methods).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import botocore.session
import pytest
import yaml

from infra.iam.render import PLACEHOLDER, render, templates, values_from_spec
from tpu_ops.specs import PipelineSpec, load_spec

ROOT = Path(__file__).resolve().parents[2]
AWS = sorted((ROOT / "infra" / "iam" / "aws").glob("*.json"))
GCP_ROLES = sorted((ROOT / "infra" / "iam" / "gcp").glob("tpu_ops_*.yaml"))

# IAM action names with no operation of the same name, and the operation each one authorises.
IAM_ONLY = {
    "s3:ListBucket": "ListObjectsV2",
    "s3:ListBucketVersions": "ListObjectVersions",
    "s3:GetObjectVersion": "GetObject",
    "s3:DeleteObjectVersion": "DeleteObject",
    "s3:GetBucketObjectLockConfiguration": "GetObjectLockConfiguration",
    "s3:PutBucketObjectLockConfiguration": "PutObjectLockConfiguration",
    "s3:BypassGovernanceRetention": "PutObjectRetention",  # the x-amz-bypass-governance-retention header
    "iam:PassRole": "GetRole",  # no operation: authorises handing a role to a service
}
BOTO_SERVICE = {"s3": "s3", "sagemaker": "sagemaker", "kms": "kms", "iam": "iam", "sts": "sts"}
# GCP: the discovery document per permission prefix, and resource names that differ from the API's.
DISCOVERY = {"storage": "storage.v1", "tpu": "tpu.v2", "storagetransfer": "storagetransfer.v1", "compute": "compute.v1"}
RESOURCE_ALIAS = {
    ("storagetransfer", "jobs"): "transferJobs",
    ("storagetransfer", "operations"): "transferOperations",
    ("storagetransfer", "projects"): "googleServiceAccounts",
}
VERB_ALIAS = {("storage", "create"): "insert", ("storagetransfer", "update"): "patch",
              ("storagetransfer", "getServiceAccount"): "get", ("compute", "create"): "insert"}  # fmt: skip
# Compute Engine permissions with no method of the same name: what each authorises (the resource
# must still exist in compute.v1, checked by its ``get``).
GCP_IAM_ONLY = {
    "compute.images.useReadOnly": "a boot disk from a public image",
    "compute.subnetworks.use": "a network interface on the subnet",
    "compute.instanceTemplates.useReadOnly": "a group creating its instances from the template",
    "compute.resourcePolicies.use": "a group placed under the workload policy",
}
# The Compute Engine permissions the provider needs, each with the client call (or create-time
# field) that needs it: the role must hold exactly these.
COMPUTE_USED = {
    "compute.instances.create": "InstancesClient.insert_unary",
    "compute.instances.get": "InstancesClient.get",
    "compute.instances.list": "InstancesClient.list / aggregated_list",
    "compute.instances.delete": "InstancesClient.delete_unary",
    "compute.instances.setLabels": "insert with labels",
    "compute.instances.setMetadata": "insert with metadata (startup script)",
    "compute.instances.setServiceAccount": "insert with serviceAccounts",
    "compute.disks.create": "insert with a boot disk",
    "compute.images.useReadOnly": "the boot image",
    "compute.subnetworks.use": "the network interface",
    "compute.instanceTemplates.create": "InstanceTemplatesClient.insert_unary",
    "compute.instanceTemplates.get": "InstanceTemplatesClient.get",
    "compute.instanceTemplates.list": "InstanceTemplatesClient.list",
    "compute.instanceTemplates.delete": "InstanceTemplatesClient.delete_unary",
    "compute.instanceTemplates.useReadOnly": "the group's instance template",
    "compute.instanceGroupManagers.create": "InstanceGroupManagersClient.insert_unary",
    "compute.instanceGroupManagers.get": "get / list_managed_instances",
    "compute.instanceGroupManagers.list": "InstanceGroupManagersClient.list",
    "compute.instanceGroupManagers.delete": "InstanceGroupManagersClient.delete_unary",
    "compute.instanceGroups.create": "the group's instance group",
    "compute.instanceGroups.delete": "the group's instance group",
    "compute.resourcePolicies.create": "ResourcePoliciesClient.insert_unary",
    "compute.resourcePolicies.get": "ResourcePoliciesClient.get",
    "compute.resourcePolicies.list": "ResourcePoliciesClient.list",
    "compute.resourcePolicies.delete": "ResourcePoliciesClient.delete_unary",
    "compute.resourcePolicies.use": "the group's workloadPolicy",
    "compute.zoneOperations.get": "ZoneOperationsClient.get",
    "compute.zoneOperations.list": "ZoneOperationsClient.list (preempted operations)",
    "compute.regionOperations.get": "RegionOperationsClient.get",
    "compute.globalOperations.get": "GlobalOperationsClient.get",
    "compute.regions.get": "RegionsClient.get (doctor: quotas)",
    "compute.reservations.get": "ReservationsClient.get (doctor)",
}


def _operations(service: str) -> set[str]:
    model = botocore.session.get_session().get_service_model(BOTO_SERVICE[service])
    return set(model.operation_names)


def _actions(policy: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for st in policy["Statement"]:
        actions = st.get("Action", [])
        out += [actions] if isinstance(actions, str) else actions
    return out


@pytest.mark.parametrize("path", AWS, ids=lambda p: p.name)
def test_aws_policies_parse_and_name_real_actions(path: Path) -> None:
    policy = json.loads(path.read_text())
    assert policy["Version"] == "2012-10-17"
    assert policy["Statement"] and all(st["Effect"] in ("Allow", "Deny") for st in policy["Statement"])
    sids = [st["Sid"] for st in policy["Statement"]]
    assert len(sids) == len(set(sids)), "duplicate Sid"
    for action in _actions(policy):
        assert "*" not in action or action == "s3:*", f"{path.name}: wildcard action {action}"
        if action == "s3:*":  # only in a Deny (TLS-only)
            continue
        service, name = action.split(":")
        operation = IAM_ONLY.get(action, name)
        assert operation in _operations(service), f"{path.name}: {action} is not a {service} action"
    allows = [st for st in policy["Statement"] if st["Effect"] == "Allow"]
    for st in allows:  # least privilege: every Allow names its resources
        resources = st.get("Resource", "")
        assert (resources and resources != "*") or "Principal" in st, f"{path.name}: {st['Sid']} allows on *"


def _discovery(service: str) -> dict[str, Any]:
    import googleapiclient

    docs = Path(googleapiclient.__file__).parent / "discovery_cache" / "documents"
    return dict(json.loads((docs / f"{DISCOVERY[service]}.json").read_text()))


def _methods_of(doc: dict[str, Any], resource: str) -> set[str] | None:
    """Methods of ``resource`` wherever it sits in the document's resource tree."""
    for name, node in doc.get("resources", {}).items():
        if name == resource:
            return set(node.get("methods", {}))
        found = _methods_of(node, resource)
        if found is not None:
            return found
    return None


@pytest.mark.parametrize("path", GCP_ROLES, ids=lambda p: p.name)
def test_gcp_roles_name_real_permissions(path: Path) -> None:
    role = yaml.safe_load(path.read_text())
    assert role["stage"] == "GA" and role["title"] and role["description"]
    perms = role["includedPermissions"]
    assert perms and len(perms) == len(set(perms))
    for perm in perms:
        service, resource, verb = perm.split(".")
        methods = _methods_of(_discovery(service), RESOURCE_ALIAS.get((service, resource), resource))
        assert methods is not None, f"{path.name}: {perm}: no resource {resource} in {service}"
        if perm in GCP_IAM_ONLY:
            continue
        assert VERB_ALIAS.get((service, verb), verb) in methods, f"{path.name}: {perm}: no method {verb}"


def test_flows_role_holds_exactly_the_compute_engine_permissions_the_provider_uses() -> None:
    role = yaml.safe_load((ROOT / "infra" / "iam" / "gcp" / "tpu_ops_flows.yaml").read_text())
    compute = {p for p in role["includedPermissions"] if p.startswith("compute.")}
    assert compute == set(COMPUTE_USED)
    # and every client the adapter builds is one whose permissions are listed
    adapter = (ROOT / "tpu_ops" / "cloud" / "compute.py").read_text()
    import re

    clients = set(re.findall(r'client\("([A-Za-z]+)Client"\)', adapter))
    names = ("Instances", "InstanceTemplates", "ResourcePolicies", "InstanceGroupManagers", "ZoneOperations",
             "RegionOperations", "GlobalOperations", "Regions", "Reservations")  # fmt: skip
    resource = {n: n[0].lower() + n[1:] for n in names}
    assert clients <= set(resource), clients
    for c in clients:
        assert any(p.startswith(f"compute.{resource[c]}.") for p in compute), c


def test_templates_render_from_a_spec_with_nothing_left_over() -> None:
    spec = load_spec(ROOT / "flows" / "dryrun.yaml", PipelineSpec)
    values = values_from_spec(
        spec, AWS_ACCOUNT_ID="123456789012", AWS_REGION="us-east-1", STS_SERVICE_AGENT_SUBJECT_ID="1234567890",
        AUDIT_KMS_KEY_ARN="arn:aws:kms:us-east-1:123456789012:key/k",
        SAGEMAKER_EXECUTION_ROLE_ARN="arn:aws:iam::123456789012:role/sm",
    )  # fmt: skip
    for path in templates():
        text = render(path.read_text(), values)
        assert not PLACEHOLDER.search(text), path.name
        if path.suffix == ".json":
            resources = json.dumps(json.loads(text))
            assert "arn:aws:s3:::dryrun-curated/fraud/v1/*" in resources or "dryrun-curated" not in resources
    with pytest.raises(KeyError, match=r"AWS_REGION|AWS_ACCOUNT_ID|SAGEMAKER|KMS"):
        render((ROOT / "infra" / "iam" / "aws" / "flows-role-policy.json").read_text(), values_from_spec(spec))


def test_render_refuses_a_spec_that_is_not_a_pipeline_in_lines_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from infra.iam.render import main

    argv = ["--spec", str(ROOT / "examples" / "train.yaml"), "--account", "123456789012", "--kms-key-arn", "k",
            "--sagemaker-role-arn", "r", "--out", str(tmp_path / "iam")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "mirror: Field required" in err and "rendered from a pipeline spec" in err
    assert "Traceback" not in err and not (tmp_path / "iam").exists()
