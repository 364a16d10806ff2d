"""The kubelet's merge of a container's Allocate responses into what the runtime applies.

Upstream ``podDevices.deviceRunContainerOptions`` (``pkg/kubelet/cm/devicemanager/pod_devices.go``):
over the responses of every resource of the container, the first env var, device node (by container
path), mount (by container path) and annotation wins, a later one is skipped (a different value is
logged as a conflict); CDI device names are de-duplicated. So two device IDs sharing one ``/dev``
node (time-slicing replicas) reach the container as one device node. Both backends' views of a
container come from here: the sim's runtime record and the real-cluster backends' checkpoint-derived view.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb
from pytest_devplug.kubeletmodel.checkpoint import CheckpointEntry
from pytest_devplug.kubeletmodel.views import ContainerView, DeviceNodeView, MountView

__all__ = ["run_container_options", "applied_view"]


class _FirstWins:
    """One kind of setting, keyed: the first value for a key wins; a later, different one is logged as a conflict
    with upstream's text (``conflict`` formats ``key``, ``old`` and ``new``)."""

    def __init__(self, conflict: str, log: logging.Logger | None) -> None:
        self.seen: dict[str, str] = {}
        self._conflict = conflict
        self._log = log

    def add(self, key: str, value: str) -> bool:
        """Whether ``key`` is new (and now taken by ``value``)."""
        if key not in self.seen:
            self.seen[key] = value
            return True
        if self.seen[key] != value and self._log is not None:
            self._log.error("%s", self._conflict.format(key=key, old=self.seen[key], new=value))
        return False


#: Upstream's conflict messages (``key``: the env var, container path or annotation; ``old``: the value kept).
_ENV_CONFLICT = "Environment variable has conflicting setting envKey={key} expected={new} got={old}"
_DEVICE_CONFLICT = "Container device has conflicting mapping host devices containerPath={key} got={old} expected={new}"
_MOUNT_CONFLICT = (
    "Container mount has conflicting mapping host mounts containerPath={key} conflictingPath={old} hostPath={new}"
)
_ANNOTATION_CONFLICT = "Annotation has conflicting setting annotationKey={key} expected={old} got={new}"


def run_container_options(
    responses: Iterable[pb.ContainerAllocateResponse], log: logging.Logger | None = None
) -> ContainerView:
    """Merge ``responses`` (one per resource, in the kubelet's order) as the kubelet does."""
    envs, annotations = _FirstWins(_ENV_CONFLICT, log), _FirstWins(_ANNOTATION_CONFLICT, log)
    device_paths, mount_paths = _FirstWins(_DEVICE_CONFLICT, log), _FirstWins(_MOUNT_CONFLICT, log)
    devices: list[DeviceNodeView] = []
    mounts: list[MountView] = []
    cdi: dict[str, None] = {}  # an ordered set
    for resp in responses:
        for k, v in sorted(resp.envs.items()):
            envs.add(k, v)
        for d in resp.devices:
            if device_paths.add(d.container_path, d.host_path):
                devices.append(DeviceNodeView(d.container_path, d.host_path, d.permissions))
        for m in resp.mounts:
            if mount_paths.add(m.container_path, m.host_path):
                mounts.append(MountView(m.container_path, m.host_path, m.read_only))
        for k, v in sorted(resp.annotations.items()):
            annotations.add(k, v)
        cdi.update((c.name, None) for c in resp.cdi_devices)
    return ContainerView(envs.seen, tuple(mounts), tuple(devices), annotations.seen, tuple(cdi))


def applied_view(entries: Sequence[CheckpointEntry]) -> ContainerView:
    """What the kubelet hands the runtime for a container from its checkpointed Allocate responses
    (one entry per resource): merged and de-duplicated by container path as upstream does."""
    ordered = sorted(entries, key=lambda e: e.resource_name)
    return run_container_options(pb.ContainerAllocateResponse.FromString(e.alloc_resp) for e in ordered)
