"""Which devices each container holds: upstream's ``podDevices`` (``pkg/kubelet/cm/devicemanager/pod_devices.go``).

The device manager's record of its allocations: written into the checkpoint, restored from it after a restart,
merged into what the runtime applies to a container, read by pod-resources. Unlike upstream's it has no lock of
its own: the device manager holds its state lock around every call.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb
from pytest_devplug.kubeletmodel.checkpoint import PodDevicesEntry
from pytest_devplug.kubeletmodel.runoptions import run_container_options
from pytest_devplug.kubeletmodel.views import ContainerView

__all__ = ["NO_NUMA", "DeviceAllocateInfo", "PodDevices"]

#: Devices without topology sit under this fake NUMA node (``nodeWithoutTopology``).
NO_NUMA = -1


@dataclass(frozen=True)
class DeviceAllocateInfo:
    """``deviceAllocateInfo``: one container's devices of one resource."""

    #: NUMA node -> the device IDs allocated on it (``DevicesPerNUMA``; node -1: devices without topology).
    device_ids: Mapping[int, tuple[str, ...]]
    #: The plugin's Allocate answer for the container, cached (``allocResp``).
    alloc_resp: pb.ContainerAllocateResponse

    def devices(self) -> set[str]:
        return {d for ids in self.device_ids.values() for d in ids}


class PodDevices:
    """``podDevices``: the allocations of every pod the device manager knows, by pod, container and resource."""

    def __init__(self) -> None:
        #: pod UID -> container name -> resource name -> that container's devices of the resource.
        self._devs: dict[str, dict[str, dict[str, DeviceAllocateInfo]]] = {}

    def pods(self) -> set[str]:
        return set(self._devs)

    def insert(
        self,
        pod_uid: str,
        container: str,
        resource: str,
        device_ids: Mapping[int, Sequence[str]],
        resp: pb.ContainerAllocateResponse,
    ) -> None:
        info = DeviceAllocateInfo({n: tuple(ids) for n, ids in device_ids.items()}, resp)
        self._devs.setdefault(pod_uid, {}).setdefault(container, {})[resource] = info

    def delete(self, pod_uids: Iterable[str]) -> None:
        for uid in pod_uids:
            self._devs.pop(uid, None)

    def container_devices(self, pod_uid: str, container: str, resource: str) -> set[str] | None:
        """The container's devices of ``resource``; ``None`` when none are cached (``containerDevices``)."""
        info = self._devs.get(pod_uid, {}).get(container, {}).get(resource)
        return None if info is None else info.devices()

    def container_resources(self, pod_uid: str, container: str) -> dict[str, set[str]]:
        """resource -> the container's devices of it (``addContainerAllocatedResources``' view)."""
        return {r: info.devices() for r, info in self._devs.get(pod_uid, {}).get(container, {}).items()}

    def devices(self) -> dict[str, set[str]]:
        """resource -> every device allocated to a known pod (``devices``)."""
        out: dict[str, set[str]] = {}
        for _, _, resource, info in self._entries():
            out.setdefault(resource, set()).update(info.devices())
        return out

    def as_dict(self) -> dict[str, dict[str, dict[str, list[str]]]]:
        """pod UID -> container -> resource -> sorted device IDs: a snapshot for tests and benchmarks."""
        out: dict[str, dict[str, dict[str, list[str]]]] = {}
        for uid, container, resource, info in self._entries():
            out.setdefault(uid, {}).setdefault(container, {})[resource] = sorted(info.devices())
        return out

    def get_container_devices(self, pod_uid: str, container: str) -> dict[str, dict[str, list[int]]]:
        """resource -> device -> the NUMA nodes it was allocated on (``[]``: none), for pod-resources
        (``getContainerDevices``)."""
        out: dict[str, dict[str, list[int]]] = {}
        for resource, info in sorted(self._devs.get(pod_uid, {}).get(container, {}).items()):
            per: dict[str, list[int]] = {}
            for node, ids in sorted(info.device_ids.items()):
                for d in ids:
                    per.setdefault(d, [])
                    if node != NO_NUMA:
                        per[d].append(node)
            out[resource] = dict(sorted(per.items()))
        return out

    def device_run_container_options(
        self, pod_uid: str, container: str, log: logging.Logger | None = None
    ) -> ContainerView:
        """What the runtime applies for the container's devices: its Allocate responses merged, by resource
        name (``deviceRunContainerOptions``; see :mod:`~pytest_devplug.kubeletmodel.runoptions`)."""
        resources = self._devs.get(pod_uid, {}).get(container, {})
        return run_container_options((resources[r].alloc_resp for r in sorted(resources)), log)

    def to_checkpoint_data(self) -> list[PodDevicesEntry]:
        """One checkpoint entry per pod, container and resource, in a stable order (``toCheckpointData``)."""
        return [
            PodDevicesEntry(
                pod_uid=uid,
                container_name=container,
                resource_name=resource,
                device_ids={n: list(ids) for n, ids in sorted(info.device_ids.items())},
                alloc_resp=info.alloc_resp.SerializeToString(deterministic=True),
            )
            for uid, container, resource, info in self._entries()
        ]

    def from_checkpoint_data(self, entries: Iterable[PodDevicesEntry], log: logging.Logger) -> None:
        """Insert a checkpoint's entries; one whose Allocate response does not decode is skipped and logged, as
        the kubelet does (``fromCheckpointData``)."""
        for e in entries:
            try:
                resp = pb.ContainerAllocateResponse.FromString(e.alloc_resp or b"")
            except DecodeError as err:
                log.error(
                    "Can't unmarshal allocResp for %s %s %s: %s", e.pod_uid, e.container_name, e.resource_name, err
                )
                continue
            self.insert(
                e.pod_uid,
                e.container_name,
                e.resource_name,
                {n: ids or [] for n, ids in (e.device_ids or {}).items()},
                resp,
            )

    def _entries(self) -> Iterator[tuple[str, str, str, DeviceAllocateInfo]]:
        """(pod UID, container, resource, allocation), sorted."""
        for uid, containers in sorted(self._devs.items()):
            for container, resources in sorted(containers.items()):
                for resource, info in sorted(resources.items()):
                    yield uid, container, resource, info
