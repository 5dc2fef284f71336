"""Public images: ``global/images/family/<f>`` and ``global/images/<name>`` of the image projects a TPU
VM boots from (``ubuntu-os-accelerator-images``), read-only, what ``gcloud compute instance-templates
create --image-family F --image-project P`` resolves before it sends the template."""

from __future__ import annotations

import re
import zlib
from typing import Any

from infra.local.compute import exceptions as cexc
from infra.local.compute.base import API, ComputeBase

# Image project -> the families it serves (TPU VM images: Ubuntu 22.04, TPU7x 24.04; see CLOUD-FACTS.md).
FAMILIES: dict[str, re.Pattern[str]] = {
    "ubuntu-os-accelerator-images": re.compile(r"^ubuntu-accel-(2204|2404)-amd64-tpu-[a-z0-9]+$"),
    "ubuntu-os-cloud": re.compile(r"^ubuntu-(2204|2404)-lts(-amd64)?$"),
}
VERSION = "v20261101"  # every family's newest image in the fake
CREATED = "2026-11-01T12:00:00.000-07:00"


class ImagesMixin(ComputeBase):
    """``images.get`` and ``images.getFromFamily`` of public image projects."""

    def _image_json(self, project: str, family: str) -> dict[str, Any]:
        name = f"{family}-{VERSION}"
        path = f"projects/{project}/global/images/{name}"
        release = family.split("-")[2] if family.startswith("ubuntu-accel-") else family.split("-")[1]
        return {
            "kind": "compute#image",
            "id": str(zlib.crc32(path.encode()) * 1000 + 3),
            "creationTimestamp": CREATED,
            "name": name,
            "description": f"Canonical, Ubuntu, {release[:2]}.{release[2:]} LTS, amd64 image ({family})",
            "family": family,
            "sourceType": "RAW",
            "status": "READY",
            "archiveSizeBytes": "2147483648",
            "diskSizeGb": "10",
            "architecture": "X86_64",
            "guestOsFeatures": [{"type": "VIRTIO_SCSI_MULTIQUEUE"}, {"type": "UEFI_COMPATIBLE"}, {"type": "GVNIC"}],
            "licenses": [f"{self.link_base}projects/{project}/global/licenses/ubuntu-{release}-lts"],
            "selfLink": self.link_base + path,
            "labelFingerprint": "42WmSpB8rSM=",
        }

    def _family_of(self, project: str, family: str) -> str | None:
        pattern = FAMILIES.get(project)
        return family if pattern is not None and pattern.match(family) else None

    def get_image_from_family(self, project: str, family: str) -> dict[str, Any]:
        path = f"projects/{project}/global/images/family/{family}"

        def run() -> dict[str, Any]:
            if self._family_of(project, family) is None:
                raise cexc.not_found(path)
            return self._image_json(project, family)

        return self._call("GET", API + path, run)

    def get_image(self, project: str, name: str) -> dict[str, Any]:
        path = f"projects/{project}/global/images/{name}"

        def run() -> dict[str, Any]:
            family = name.removesuffix(f"-{VERSION}")
            if family == name or self._family_of(project, family) is None:
                raise cexc.not_found(path)
            return self._image_json(project, family)

        return self._call("GET", API + path, run)
