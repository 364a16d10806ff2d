"""A node as its kubelet reports it: identity, labels and taints, capacity and allocatable, the Ready condition.

Upstream ``pkg/kubelet/nodestatus/setters.go``: cpu, memory and pods are fixed here; device-plugin resources come
from the device manager (capacity: healthy + unhealthy devices; allocatable: healthy ones). A resource whose
plugin's grace period ended is set to 0, not dropped: that tells device-plugin resources from cluster-level ones.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..kubeletmodel.quantity import parse_quantity
from .apiserver import now_rfc3339

__all__ = ["NodeStatus", "node_labels", "DEFAULT_CPU", "DEFAULT_MEMORY", "DEFAULT_PODS"]

DEFAULT_CPU = "8"
DEFAULT_MEMORY = "32Gi"
DEFAULT_PODS = "110"


def node_labels(name: str, labels: Mapping[str, str] | None = None) -> dict[str, str]:
    """The labels a kubelet puts on its Node (hostname, os, arch), then ``labels`` (``--node-labels``)."""
    return {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        **(labels or {}),
    }


class NodeStatus:
    """One node's object; the device-plugin counts are updated from the device manager (thread-safe)."""

    def __init__(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, Any]] | None = None,
        cpu: str = DEFAULT_CPU,
        memory: str = DEFAULT_MEMORY,
        pods: str = DEFAULT_PODS,
        kubelet_version: str = "",
    ) -> None:
        self.name = name
        #: ``status.nodeInfo.kubeletVersion``: the release the embedded kubelet behaves as.
        self.kubelet_version = kubelet_version
        self.labels = node_labels(name, labels)
        self.taints: list[dict[str, Any]] = [dict(t) for t in taints or []]
        self.unschedulable = False
        self.uid = str(uuid.uuid4())
        self.creation_timestamp = now_rfc3339()
        #: cpu, memory, pods: the same in capacity and allocatable.
        self._base = {"cpu": cpu, "memory": memory, "pods": pods}
        self._lock = threading.Lock()
        #: device-plugin resource -> healthy + unhealthy devices (0 once removed).
        self._ext_capacity: dict[str, int] = {}
        #: device-plugin resource -> healthy devices (0 once removed).
        self._ext_allocatable: dict[str, int] = {}

    def set_device_resources(
        self, capacity: Mapping[str, int], allocatable: Mapping[str, int], removed: Iterable[str]
    ) -> None:
        """The device manager's ``GetCapacity``; a resource it no longer reports (or ``removed``) stays at 0."""
        with self._lock:
            cap, alloc = dict(capacity), dict(allocatable)
            for res in set(removed) | (set(self._ext_capacity) - set(cap)):
                cap.setdefault(res, 0)
                alloc.setdefault(res, 0)
            self._ext_capacity, self._ext_allocatable = cap, alloc

    def capacity(self) -> dict[str, str]:
        with self._lock:
            return {**self._base, **{k: str(v) for k, v in self._ext_capacity.items()}}

    def allocatable(self) -> dict[str, str]:
        with self._lock:
            return {**self._base, **{k: str(v) for k, v in self._ext_allocatable.items()}}

    def allocatable_amounts(self) -> dict[str, int]:
        """Allocatable as the scheduler counts it (cpu in milli-units, memory in bytes)."""
        out: dict[str, int] = {}
        for k, v in self.allocatable().items():
            q = parse_quantity(v)
            out[k] = q.milli() if k == "cpu" else q.ceil_int()
        return out

    def node_info(self) -> dict[str, str]:
        """``status.nodeInfo``: what a plugin or a report reads of the node's release."""
        return {"kubeletVersion": self.kubelet_version, "operatingSystem": "linux", "architecture": "amd64"}

    def node_dict(self, *, ready: bool) -> dict[str, Any]:
        """The node as a Kubernetes ``Node`` object; ``ready``: its kubelet runs and posts status."""
        condition = {
            "type": "Ready",
            "status": "True" if ready else "Unknown",
            "reason": "KubeletReady" if ready else "NodeStatusUnknown",
            "message": "kubelet is posting ready status" if ready else "Kubelet stopped posting node status.",
        }
        spec: dict[str, Any] = {"taints": [dict(t) for t in self.taints]} if self.taints else {}
        if self.unschedulable:
            spec["unschedulable"] = True
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "uid": self.uid,
                "labels": dict(self.labels),
                "creationTimestamp": self.creation_timestamp,
            },
            "spec": spec,
            "status": {
                "capacity": self.capacity(),
                "allocatable": self.allocatable(),
                "conditions": [condition],
                "nodeInfo": self.node_info(),
            },
        }
