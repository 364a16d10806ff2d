"""Two device IDs sharing one /dev node (the included plugin's ``--replicas``, NVIDIA's time-slicing form)
on the embedded kubelet: the checkpoint keeps the response as sent, the container gets the node once,
and the conformance suite's checkpoint test judges it right. The same case runs against kind in
``tests/differential`` (``test_sharing_two_ids_one_device_node``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pytest_devplug import ClusterHandle, NodeSpec, PluginHandle, PluginSpec, PodFactory
from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb
from pytest_devplug.backends.base import BackendOptions, applied_view
from pytest_devplug.backends.sim import SimBackend
from pytest_devplug.conformance.test_checkpoint import test_checkpoint_records_the_allocation as checkpoint_conformance
from pytest_devplug.settings import default_plugin_argv


@pytest.fixture
def shared() -> Iterator[tuple[PluginHandle, PodFactory]]:
    """The included plugin on one mock GPU advertised as two devices (``DP_REPLICAS=2``)."""
    backend = SimBackend(BackendOptions(timeout=20.0))
    backend.start()
    try:
        cluster = ClusterHandle(backend, timeout=20.0)
        node = cluster.ensure_node(NodeSpec("devplug-shared", numa_nodes=1))
        spec = PluginSpec(
            argv=default_plugin_argv("nvidia.com/gpu"), mock=True, gpus=1, numa_nodes=1, env={"DP_REPLICAS": "2"}
        )
        plugin = cluster.deploy(node, spec)
        plugin.wait_ready(2)
        pods = cluster.pods(node, spec.resource_name, prefix="shared")
        try:
            yield plugin, pods
        finally:
            pods.cleanup()
    finally:
        backend.close()


def test_two_ids_one_device_node_reach_the_container_once(shared: tuple[PluginHandle, PodFactory]) -> None:
    plugin, pods = shared
    (uuid,) = plugin.mock.uuids
    assert plugin.node.device_ids(plugin.resource_name) == [f"{uuid}::0", f"{uuid}::1"]
    pod = pods(gpus=2, wait=True)
    assert pod.allocated_devices == [f"{uuid}::0", f"{uuid}::1"]
    cp = plugin.node.checkpoint()
    assert cp is not None
    (entry,) = cp.entries_for(pod.uid)
    sent = [d.container_path for d in pb.ContainerAllocateResponse.FromString(entry.alloc_resp).devices]
    assert sent.count("/dev/nvidia0") == 2, sent  # the plugin's answer, stored as sent
    seen = [d.container_path for d in pod.view().devices]
    assert sorted(seen) == ["/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"], seen  # applied once
    assert pod.view() == applied_view([entry])  # the kind backend's view of the same checkpoint
    assert pod.env["NVIDIA_VISIBLE_DEVICES"] == uuid


def test_checkpoint_conformance_holds_for_shared_device_nodes(shared: tuple[PluginHandle, PodFactory]) -> None:
    """The shipped checkpoint test compares the kubelet's de-duplicated view, so sharing is no false failure."""
    plugin, pods = shared
    checkpoint_conformance(pods, plugin)
