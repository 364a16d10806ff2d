"""What the kubelet's parts see: a pod as admission and the device manager see it, and what the container runtime
applies to a container (the merge of its Allocate responses, plus CDI edits where the runtime resolves them).

Plain values, kept apart from the control plane's Kubernetes-shaped dicts so that the device manager depends on
nothing but these, as the kubelet's device manager depends only on the pod spec; the backends hand the same
:class:`ContainerView` to tests whether it came from the embedded runtime or a real kubelet's checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["ContainerSpec", "PodSpecView", "ContainerView", "MountView", "DeviceNodeView"]


@dataclass(frozen=True)
class ContainerSpec:
    """A container as admission sees it: its extended-resource requests (== limits)."""

    name: str
    resources: dict[str, int] = field(default_factory=dict)
    init: bool = False
    #: An init container with ``restartPolicy: Always`` (a sidecar): its devices stay held.
    sidecar: bool = False


@dataclass(frozen=True)
class PodSpecView:
    """A pod as the device manager sees it; ``containers`` lists init containers first, in order."""

    uid: str
    name: str
    namespace: str
    containers: tuple[ContainerSpec, ...]

    def container(self, name: str) -> ContainerSpec:
        for c in self.containers:
            if c.name == name:
                return c
        raise KeyError(f"pod {self.namespace}/{self.name} has no container {name!r}")


@dataclass(frozen=True)
class MountView:
    """A bind mount: ``host_path`` at ``container_path``."""

    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True)
class DeviceNodeView:
    """A device node: ``host_path`` at ``container_path`` with cgroup ``permissions`` (``"rw"``, ``"rwm"``)."""

    container_path: str
    host_path: str
    permissions: str


@dataclass(frozen=True)
class ContainerView:
    """What the container runtime applied to a container from the plugin's Allocate responses."""

    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[MountView, ...] = ()
    devices: tuple[DeviceNodeView, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    #: Fully qualified CDI device names (``vendor.com/class=name``) the kubelet passed on.
    cdi_devices: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.envs or self.mounts or self.devices or self.annotations or self.cdi_devices)
