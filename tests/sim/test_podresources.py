"""pod-resources v1 over gRPC, consistent with the device manager's allocations (real plugin)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from .dm_helpers import GPU, DmMockState, DmWaiter, dm_capacity_probe, dm_gpu
from pytest_devplug.api.podresources import v1_pb2 as pr
from pytest_devplug.api.podresources import v1_pb2_grpc as pr_grpc
from pytest_devplug.sim.devicemanager import DeviceManager
from pytest_devplug.kubeletmodel.views import ContainerSpec, PodSpecView
from pytest_devplug.sim.podresources import PodInfo, PodResourcesServer
from pytest_devplug.procs.process import PluginProcess

Make = Callable[..., tuple[DeviceManager, DmWaiter]]


def rows(devs: list[pr.ContainerDevices]) -> list[tuple[str, list[str], list[int] | None]]:
    return sorted(
        (d.resource_name, list(d.device_ids), [n.ID for n in d.topology.nodes] if d.HasField("topology") else None)
        for d in devs
    )


@pytest.fixture
def dm_podres(
    dm_dir: Path, dm_make: Make, dm_plugin: Callable[..., PluginProcess], dm_state: DmMockState
) -> Iterator[tuple[DeviceManager, list[PodInfo], pr_grpc.PodResourcesListerStub]]:
    dm_state.write([dm_gpu(0, 0), dm_gpu(1, 1), dm_gpu(2, None)])
    dm, w = dm_make()
    dm_plugin()
    w.until("3 GPUs", dm_capacity_probe(dm), lambda s: s == (3, 3))
    pods: list[PodInfo] = []
    server = PodResourcesServer(dm, lambda: list(pods), dm_dir.parent / "pod-resources.sock")
    server.start()
    channel = grpc.insecure_channel(f"unix://{server.socket_path}")
    try:
        yield dm, pods, pr_grpc.PodResourcesListerStub(channel)
    finally:
        channel.close()
        server.stop()


def test_list_get_and_allocatable_match_allocations(
    dm_podres: tuple[DeviceManager, list[PodInfo], pr_grpc.PodResourcesListerStub],
) -> None:
    dm, pods, stub = dm_podres
    alloc = stub.GetAllocatableResources(pr.AllocatableResourcesRequest(), timeout=5)
    assert rows(list(alloc.devices)) == [(GPU, ["GPU-0000"], [0]), (GPU, ["GPU-0001"], [1]), (GPU, ["GPU-0002"], None)]

    c = ContainerSpec("main", {GPU: 3})
    side = ContainerSpec("side", {})
    p = PodSpecView("uid-1", "trainer", "ml", (c, side))
    dm.admit_container(p, c)
    pods.append(("trainer", "ml", "uid-1", ["main", "side"]))
    listed = stub.List(pr.ListPodResourcesRequest(), timeout=5)
    (res,) = listed.pod_resources
    assert (res.name, res.namespace, [x.name for x in res.containers]) == ("trainer", "ml", ["main", "side"])
    expected = [(GPU, ["GPU-0000"], [0]), (GPU, ["GPU-0001"], [1]), (GPU, ["GPU-0002"], None)]
    assert rows(list(res.containers[0].devices)) == expected
    assert list(res.containers[1].devices) == []
    got = stub.Get(pr.GetPodResourcesRequest(pod_name="trainer", pod_namespace="ml"), timeout=5)
    assert rows(list(got.pod_resources.containers[0].devices)) == expected

    # List reclaims devices of pods that are no longer active, like the kubelet's List does
    dm.sources_ready = True
    pods.clear()
    assert list(stub.List(pr.ListPodResourcesRequest(), timeout=5).pod_resources) == []
    assert dm.pod_devices() == {}


def test_get_unknown_pod_is_an_error_with_upstream_text(
    dm_podres: tuple[DeviceManager, list[PodInfo], pr_grpc.PodResourcesListerStub],
) -> None:
    _, _, stub = dm_podres
    with pytest.raises(grpc.RpcError) as exc:
        stub.Get(pr.GetPodResourcesRequest(pod_name="ghost", pod_namespace="default"), timeout=5)
    assert exc.value.code() == grpc.StatusCode.UNKNOWN
    assert exc.value.details() == "pod ghost in namespace default not found"
