"""One CDI spec per prepared claim: what a CDI-enabled runtime gives the claim's containers.

The spec's kind is ``<driver>/gpu`` (the driver name is the CDI vendor) and its file
``<cdi root>/<driver>-gpu_<claim UID>.json`` (the CDI package's transient-spec name), so unprepare needs
nothing but the claim's UID. Device names carry the claim UID, as the Go helper advises, so a runtime's
cached spec of an earlier claim never answers for a new one:

* ``<uid>-gpu-<minor>``: the GPU's ``/dev/nvidia<minor>``. It is each prepared device's first CDI ID, which
  the kubelet reports as the device's ``resourceID`` in ``allocatedResourcesStatus``.
* ``<uid>-req-<request>``: ``NVIDIA_VISIBLE_DEVICES`` = the UUIDs the request got. Every device of the
  request lists it, so a container that uses the request (or the whole claim) sees exactly those GPUs; a
  container using two requests or claims gets the variable once per CDI device and the runtime keeps the last.
* The spec's own edits, applied once with any of its devices: ``/dev/nvidiactl``, ``/dev/nvidia-uvm`` and
  the driver-library mount, as in the device plugin's CDI spec.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..allocation import CDI_VERSION, CONTROL_NODES, VISIBLE_DEVICES, atomic_write
from ..devices import Gpu

__all__ = ["CDI_CLASS", "CdiLayout", "InvalidClaimUidError"]

CDI_CLASS = "gpu"
#: A claim UID becomes part of a file name and of CDI device names: Kubernetes UIDs are UUIDs.
_SAFE_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}")


class InvalidClaimUidError(ValueError):
    """A claim UID that cannot name a spec file or CDI device (``../x``, empty)."""


def check_uid(uid: str) -> None:
    if not _SAFE_UID.fullmatch(uid):
        raise InvalidClaimUidError(f"claim UID {uid!r} is not a UID (letters, digits and '-' only)")


@dataclass(frozen=True)
class CdiLayout:
    """Where the specs go and what their edits point at on the host."""

    driver: str
    cdi_root: str = "/var/run/cdi"
    dev_root: str = "/dev"
    driver_lib_dir: str | None = None

    @property
    def kind(self) -> str:
        return f"{self.driver}/{CDI_CLASS}"

    def spec_path(self, claim_uid: str) -> str:
        check_uid(claim_uid)
        return os.path.join(self.cdi_root, f"{self.driver}-{CDI_CLASS}_{claim_uid}.json")

    def gpu_id(self, claim_uid: str, minor: int) -> str:
        return f"{self.kind}={claim_uid}-gpu-{minor}"

    def request_id(self, claim_uid: str, request: str) -> str:
        return f"{self.kind}={claim_uid}-req-{request}"

    def _node(self, name: str) -> dict[str, str]:
        return {"path": f"/dev/{name}", "hostPath": os.path.join(self.dev_root, name), "permissions": "rw"}

    def claim_spec(self, claim_uid: str, allocated: Sequence[tuple[str, Gpu]]) -> dict[str, Any]:
        """The spec for ``allocated`` (request, GPU) pairs of one claim."""
        common: dict[str, Any] = {"deviceNodes": [self._node(n) for n in CONTROL_NODES]}
        if self.driver_lib_dir:
            common["mounts"] = [
                {
                    "hostPath": self.driver_lib_dir,
                    "containerPath": self.driver_lib_dir,
                    "options": ["ro", "nosuid", "nodev", "bind"],
                }
            ]
        devices: list[dict[str, Any]] = []
        by_request: dict[str, list[str]] = {}
        for request, gpu in allocated:
            name = f"{claim_uid}-gpu-{gpu.info.minor}"
            if all(d["name"] != name for d in devices):
                devices.append(
                    {"name": name, "containerEdits": {"deviceNodes": [self._node(f"nvidia{gpu.info.minor}")]}}
                )
            uuids = by_request.setdefault(request, [])
            if gpu.uuid not in uuids:
                uuids.append(gpu.uuid)
        for request, uuids in by_request.items():
            devices.append(
                {
                    "name": f"{claim_uid}-req-{request}",
                    "containerEdits": {"env": [f"{VISIBLE_DEVICES}={','.join(uuids)}"]},
                }
            )
        return {"cdiVersion": CDI_VERSION, "kind": self.kind, "devices": devices, "containerEdits": common}

    def write(self, claim_uid: str, spec: dict[str, Any]) -> str:
        """Write atomically (a runtime never reads half a spec); returns the path."""
        path = self.spec_path(claim_uid)
        atomic_write(path, (json.dumps(spec, indent=2) + "\n").encode())
        return path

    def remove(self, claim_uid: str) -> bool:
        """Remove the claim's spec; False when there was none (unprepared already)."""
        try:
            os.unlink(self.spec_path(claim_uid))
        except FileNotFoundError:
            return False
        return True
