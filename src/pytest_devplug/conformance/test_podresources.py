"""The pod-resources API (v1 List / GetAllocatableResources) agrees with the pods and the node."""

from __future__ import annotations

from pytest_devplug import PluginHandle, PodFactory

from ._support import device_count


def test_pod_resources_lists_assigned_devices(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    res = devplug_plugin.resource_name
    k = device_count(devplug_plugin, 2)
    pod = devplug_pod(gpus=k, wait=True)
    entries = [p for p in devplug_plugin.node.pod_resources() if (p.name, p.namespace) == (pod.name, pod.namespace)]
    assert len(entries) == 1, f"pod-resources lists {entries}"
    (container,) = [c for c in entries[0].containers if c.name == pod.container]
    ids = container.device_ids(res)
    assert len(ids) == k and len(set(ids)) == k, ids
    cp = devplug_plugin.node.checkpoint()
    assert cp is not None and cp.entries_for(pod.uid)[0].all_device_ids == sorted(ids)
    numa = devplug_plugin.node.device_numa(res)
    for devs in container.devices:
        for d in devs.device_ids:
            assert tuple(devs.numa_nodes) == tuple(numa[d]), f"{d}: topology {devs.numa_nodes} vs allocatable {numa[d]}"


def test_pod_resources_allocatable_matches_node(devplug_plugin: PluginHandle) -> None:
    res = devplug_plugin.resource_name
    ids = devplug_plugin.node.device_ids(res)
    assert len(ids) == devplug_plugin.node.allocatable(res), f"{ids} vs allocatable {devplug_plugin.node.allocatable(res)}"


def test_deleted_pod_leaves_pod_resources(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    pod = devplug_pod(gpus=1, wait=True)
    pod.delete()
    names = [(p.name, p.namespace) for p in devplug_plugin.node.pod_resources()]
    assert (pod.name, pod.namespace) not in names
