"""The kubelet's pod-resources v1 API (``PodResourcesLister``) on its own Unix socket.

Mirrors upstream ``pkg/kubelet/apis/podresources/server_v1.go`` for devices: ``List`` and ``Get``
report each container's devices, ``GetAllocatableResources`` the healthy ones; like
``containerDevicesFromResourceDeviceInstances`` every device is one ``ContainerDevices`` per NUMA
node it sits on (or one without topology). Errors are plain Go errors upstream, so they reach
the client as status ``Unknown`` with upstream's text.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from pytest_devplug.api.podresources import v1_pb2 as pr
from pytest_devplug.api.podresources import v1_pb2_grpc as pr_grpc
from pytest_devplug.sim.devicemanager import DeviceManager
from pytest_devplug.errors import SimError
from pytest_devplug.procs.workdir import check_socket_path

__all__ = ["PodResourcesServer", "PodInfo"]

#: (name, namespace, uid, names of the containers to report). The kubelet passes its active pods
#: and, per pod, the regular containers plus sidecar (restartable init) containers, as upstream.
PodInfo = tuple[str, str, str, Sequence[str]]


def _devices(rows: dict[str, dict[str, list[int]]]) -> list[pr.ContainerDevices]:
    out: list[pr.ContainerDevices] = []
    for resource, per_device in rows.items():
        for device_id, nodes in per_device.items():
            if not nodes:
                out.append(pr.ContainerDevices(resource_name=resource, device_ids=[device_id]))
                continue
            for n in nodes:
                out.append(
                    pr.ContainerDevices(
                        resource_name=resource,
                        device_ids=[device_id],
                        topology=pr.TopologyInfo(nodes=[pr.NUMANode(ID=n)]),
                    )
                )
    return out


class _Servicer(pr_grpc.PodResourcesListerServicer):
    def __init__(
        self, dm: DeviceManager, pods: Callable[[], list[PodInfo]], get_pods: Callable[[], list[PodInfo]]
    ) -> None:
        self._dm = dm
        self._pods = pods
        self._get_pods = get_pods

    def _pod(self, name: str, namespace: str, uid: str, containers: Sequence[str]) -> pr.PodResources:
        return pr.PodResources(
            name=name,
            namespace=namespace,
            containers=[
                pr.ContainerResources(name=c, devices=_devices(self._dm.container_device_topology(uid, c)))
                for c in containers
            ],
        )

    def List(self, request: pr.ListPodResourcesRequest, context: Any) -> pr.ListPodResourcesResponse:  # noqa: N802
        pods = self._pods()
        self._dm.remove_stale_pods({uid for _, _, uid, _ in pods})
        return pr.ListPodResourcesResponse(pod_resources=[self._pod(*p) for p in pods])

    def GetAllocatableResources(  # noqa: N802
        self, request: pr.AllocatableResourcesRequest, context: Any
    ) -> pr.AllocatableResourcesResponse:
        rows: dict[str, dict[str, list[int]]] = {}
        for resource, devs in self._dm.allocatable_devices().items():
            per = rows.setdefault(resource, {})
            for device_id, node in devs:
                per.setdefault(device_id, [])
                if node is not None:
                    per[device_id].append(node)
        return pr.AllocatableResourcesResponse(devices=_devices(rows))

    def Get(self, request: pr.GetPodResourcesRequest, context: Any) -> pr.GetPodResourcesResponse:  # noqa: N802
        for p in self._get_pods():
            if p[0] == request.pod_name and p[1] == request.pod_namespace:
                return pr.GetPodResourcesResponse(pod_resources=self._pod(*p))
        context.abort(grpc.StatusCode.UNKNOWN, f"pod {request.pod_name} in namespace {request.pod_namespace} not found")
        raise AssertionError("unreachable: context.abort raises")


class PodResourcesServer:
    """Serves pod-resources v1 for one node's device manager on ``socket_path``. ``pods_provider``: the active pods
    (``List``); ``get_pods``: the pods ``Get`` finds (default the same; a kubelet before 1.35 also finds a pod that
    has terminated, ``kubeletPodsProvider.GetPodByName``)."""

    def __init__(
        self,
        device_manager: DeviceManager,
        pods_provider: Callable[[], list[PodInfo]],
        socket_path: Path,
        *,
        get_pods: Callable[[], list[PodInfo]] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.socket_path = Path(socket_path)
        self._servicer = _Servicer(device_manager, pods_provider, get_pods or pods_provider)
        self._log = logger or logging.getLogger(__name__)
        self._server: Any = None

    def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="podresources"))
        pr_grpc.add_PodResourcesListerServicer_to_server(self._servicer, server)  # type: ignore[no-untyped-call]
        check_socket_path(self.socket_path, "the kubelet's pod-resources")
        if server.add_insecure_port(f"unix://{self.socket_path}") == 0:
            raise SimError(f"failed to listen on pod-resources socket {self.socket_path}")
        server.start()
        self._server = server
        self._log.info("Serving pod resources API v1 on %s", self.socket_path)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait(5.0)
            self._server = None
        self.socket_path.unlink(missing_ok=True)
