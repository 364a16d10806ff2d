"""The seam between the sim backend and "the control plane": what the backend asks of a cluster of embedded kubelets.

Two implementations: :class:`~pytest_devplug.sim.cluster.SimCluster` (the embedded control plane: its own
validation, scheduler and event store) and :class:`~pytest_devplug.sim.apicluster.ApiCluster` (a real
kube-apiserver and kube-scheduler; the kubelets are its Nodes). Pods and nodes are JSON-shaped dicts as
the API server returns them; refusals raise :class:`~pytest_devplug.sim.errors.ApiError` (404:
``NotFoundError``-compatible status), so the backend maps one error type for both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from .kubelet import SimNode

__all__ = ["ClusterApi"]


class ClusterApi(Protocol):
    """A cluster of :class:`SimNode` kubelets behind a control plane."""

    workdir: Path
    grace_period: float

    def close(self) -> None: ...

    def add_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, Any]] | None = None,
        numa_nodes: int = 2,
        topology_policy: str = "none",
    ) -> SimNode: ...

    def node(self, name: str) -> SimNode: ...

    @property
    def nodes(self) -> list[SimNode]: ...

    def get_node(self, name: str) -> dict[str, Any]: ...

    def list_nodes(self) -> list[dict[str, Any]]: ...

    def update_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, Any]] | None = None,
        unschedulable: bool | None = None,
    ) -> dict[str, Any]: ...

    def create_pod(self, manifest: Any) -> dict[str, Any]: ...

    def get_pod(self, name: str, namespace: str = "default") -> dict[str, Any]: ...

    def list_pods(self, namespace: str | None = None) -> list[dict[str, Any]]: ...

    def delete_pod(self, name: str, namespace: str = "default") -> dict[str, Any]: ...

    def restart_container(self, name: str, container: str, namespace: str = "default") -> dict[str, Any]: ...

    def finish_container(self, name: str, container: str, exit_code: int = 0, namespace: str = "default") -> dict[str, Any]: ...

    def pod_node(self, name: str, namespace: str = "default") -> SimNode: ...

    def events(self, *, namespace: str | None = None, involved_name: str | None = None) -> list[dict[str, Any]]: ...
