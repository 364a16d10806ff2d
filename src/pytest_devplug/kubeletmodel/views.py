"""Data shared by the embedded kubelet's parts: the device manager's view of pods and containers.

Kept apart from the control plane's Kubernetes-shaped dicts so that the device manager depends on
nothing but these plain values, as the kubelet's device manager depends only on the pod spec.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ContainerSpec", "PodSpecView", "ContainerRuntimeOptions", "MountSpec", "DeviceNodeSpec"]


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
class MountSpec:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True)
class DeviceNodeSpec:
    container_path: str
    host_path: str
    permissions: str


@dataclass
class ContainerRuntimeOptions:
    """What the runtime applies to a container: the merge of every Allocate response it got."""

    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[MountSpec] = field(default_factory=list)
    devices: list[DeviceNodeSpec] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: list[str] = field(default_factory=list)
