"""Exclusivity: two pods never share a device ID (what the kubelet guarantees of any plugin), and, for a plugin that
declares its devices exclusive, never a device node either."""

from __future__ import annotations

import pytest

from pytest_devplug import PluginHandle, PodFactory

from ._support import device_count


def test_pods_never_share_a_device(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """Fill the node one device per pod: all run, on disjoint devices; one more stays Pending."""
    n = devplug_plugin.node.allocatable(devplug_plugin.resource_name)
    pods = [devplug_pod(gpus=1) for _ in range(n)]
    seen: dict[str, str] = {}
    for pod in pods:
        pod.wait_running()
        (dev,) = pod.allocated_devices
        assert dev not in seen, f"device {dev} given to both {seen[dev]} and {pod.name}"
        seen[dev] = pod.name
    extra = devplug_pod(gpus=1)
    extra.wait_event(f"FailedScheduling: .*Insufficient {devplug_plugin.resource_name}")
    assert extra.phase == "Pending"
    cp = devplug_plugin.node.checkpoint()
    assert cp is not None
    ids = [d for e in cp.entries for d in e.all_device_ids]
    assert sorted(ids) == sorted(seen), f"checkpoint assignments {ids} vs pods {seen}"


def test_freed_devices_are_reused(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """Deleting a pod frees its devices for the next pod (reclaimed before the next allocation)."""
    n = devplug_plugin.node.allocatable(devplug_plugin.resource_name)
    first = devplug_pod(gpus=n, wait=True)
    held = first.allocated_devices
    first.delete()
    second = devplug_pod(gpus=n, wait=True)
    assert second.allocated_devices == held


@pytest.mark.devplug_convention("exclusive-devices")
def test_convention_exclusive_devices_reach_one_container(
    devplug_pod: PodFactory, devplug_plugin: PluginHandle
) -> None:
    """Filled one device per pod (3 at least: with 2, a node both get cannot be told from a control node), no device
    node (host path) reaches two pods unless it reaches them all: a plugin that answers one device's Allocate with
    another device's node hands one exclusive device to two containers."""
    n = device_count(devplug_plugin, devplug_plugin.node.allocatable(devplug_plugin.resource_name), needed=3)
    pods = [devplug_pod(gpus=1) for _ in range(n)]
    nodes: dict[str, set[str]] = {}
    for pod in pods:
        pod.wait_running()
        nodes[f"{pod.name} ({pod.allocated_devices[0]})"] = {d.host_path for d in pod.device_nodes}
    everywhere = set.intersection(*nodes.values())
    holders: dict[str, list[str]] = {}
    for pod_name, held in nodes.items():
        for path in sorted(held - everywhere):
            holders.setdefault(path, []).append(pod_name)
    twice = {path: names for path, names in holders.items() if len(names) > 1}
    assert not twice, (
        f"device nodes given to pods holding different {devplug_plugin.resource_name} devices: {twice} (every pod's "
        f"shared nodes, {sorted(everywhere)}, aside): one device handed to two containers"
    )
