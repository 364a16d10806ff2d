"""The seam between the sim backend and "the control plane": what the backend asks of a cluster of embedded kubelets.

Two implementations: :class:`~pytest_devplug.sim.embeddedplane.EmbeddedPlane` (the embedded control plane: its own
validation, scheduler and event store) and :class:`~pytest_devplug.sim.realplane.RealPlane` (a real
kube-apiserver and kube-scheduler; the kubelets are its Nodes). Pods and nodes are JSON-shaped dicts as
the API server returns them; refusals raise :class:`~pytest_devplug.errors.ApiError` (404:
``NotFoundError``-compatible status), so the backend maps one error type for both.

Both inherit :class:`PlaneBase`: what they do alike (the work dir, the context manager, the container
operations on a bound pod's node) is written once there; :class:`SimControlPlane` stays what the backend types against.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TypeVar

from ..kubeletmodel.releases import KubeVersion
from .kubelet import SimNode
from ..procs.workdir import create as create_workdir
from ..procs.workdir import remove as remove_workdir

__all__ = ["SimControlPlane", "PlaneBase"]

_C = TypeVar("_C", bound="PlaneBase")


class SimControlPlane(Protocol):
    """What the sim backend needs of either control plane: :class:`SimNode` kubelets behind it, pods, events."""

    workdir: Path
    grace_period: float
    kube: KubeVersion

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

    def finish_container(
        self, name: str, container: str, exit_code: int = 0, namespace: str = "default"
    ) -> dict[str, Any]: ...

    def pod_node(self, name: str, namespace: str = "default") -> SimNode: ...

    def events(self, *, namespace: str | None = None, involved_name: str | None = None) -> list[dict[str, Any]]: ...


class PlaneBase(ABC):
    """What both planes share; each gives ``close``, ``get_pod`` and ``_bound`` (where a pod runs) its own way."""

    def __init__(self, workdir: Path | None, grace_period: float, kube: KubeVersion | None = None) -> None:
        """Use ``workdir`` (made if missing) or a fresh one that ``close()`` removes, since no one else will.
        ``kube``: the release every kubelet (and the embedded control plane) behaves as (default: the default one)."""
        self._own_dir = workdir is None
        self.workdir = create_workdir("devplug-sim-") if workdir is None else Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.grace_period = grace_period
        self.kube = kube or KubeVersion.of()

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @abstractmethod
    def close(self) -> None:
        """Stop everything; once only, ending with :meth:`_remove_own_workdir`."""

    def _remove_own_workdir(self) -> None:
        """The last step of ``close()``: a work dir the caller passed in is theirs to keep."""
        if self._own_dir:
            remove_workdir(self.workdir)

    @abstractmethod
    def get_pod(self, name: str, namespace: str = "default") -> dict[str, Any]: ...

    @abstractmethod
    def _bound(self, name: str, namespace: str) -> tuple[SimNode, str]:
        """The node a pod is bound to and the pod's UID (``NotFoundError`` if no such pod, ``SimError`` if unbound)."""

    def restart_container(self, name: str, container: str, namespace: str = "default") -> dict[str, Any]:
        """The container crashes and is restarted by its kubelet (same devices)."""
        node, uid = self._bound(name, namespace)
        node.restart_container(uid, container)
        return self.get_pod(name, namespace)

    def finish_container(
        self, name: str, container: str, exit_code: int = 0, namespace: str = "default"
    ) -> dict[str, Any]:
        """The container exits with ``exit_code`` (restarted or not per the pod's restartPolicy)."""
        node, uid = self._bound(name, namespace)
        node.finish_container(uid, container, exit_code)
        self._container_finished()
        return self.get_pod(name, namespace)

    def _container_finished(self) -> None:  # noqa: B027 - a hook, a no-op unless the cluster schedules pods itself
        """Called after a container exits, before the pod is read back (``EmbeddedPlane`` retries pending pods)."""

    def pod_node(self, name: str, namespace: str = "default") -> SimNode:
        return self._bound(name, namespace)[0]
