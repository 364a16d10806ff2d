"""The pod-resources API (v1 List / Get / GetAllocatableResources) agrees with the pods and the node."""

from __future__ import annotations

from collections.abc import Mapping

from pytest_devplug import PluginHandle, PodFactory, PodResourcesContainer, PodResourcesPod

from ._support import device_count


def _assert_topology_as_sent(
    container: PodResourcesContainer, resource: str, numa: Mapping[str, tuple[int, ...]], api: str
) -> None:
    """The container's devices of ``resource`` are listed by ``api`` with the NUMA nodes the plugin sent for them, as
    GetAllocatableResources lists them (``numa``); a NUMA node below 0 is named first: an index counts from 0 (the
    machine's), and a plugin reading sysfs's ``-1`` ("unknown") must send no topology instead, or the device fits no
    NUMA mask and a Topology Manager policy never admits it. The kubelet files ``-1`` as no topology, so ``api``
    lists the allocated device with none."""
    __tracebackhide__ = True
    for devs in container.devices:
        if devs.resource_name != resource:
            continue
        for d in devs.device_ids:
            sent = tuple(numa[d])
            bad = [n for n in sent if n < 0]
            assert not bad, (
                f"device {d} is reported on NUMA node {bad}: NUMA node IDs count from 0; "
                "a device whose node is unknown (sysfs numa_node -1) must be sent without topology"
            )
            assert tuple(devs.numa_nodes) == sent, f"{d}: {api} lists topology {devs.numa_nodes}, allocatable {sent}"


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
    _assert_topology_as_sent(container, res, devplug_plugin.node.device_numa(res), "List")


def test_pod_resources_allocatable_matches_node(devplug_plugin: PluginHandle) -> None:
    res = devplug_plugin.resource_name
    ids = devplug_plugin.node.device_ids(res)
    assert len(ids) == devplug_plugin.node.allocatable(res), (
        f"{ids} vs allocatable {devplug_plugin.node.allocatable(res)}"
    )


def test_deleted_pod_leaves_pod_resources(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    pod = devplug_pod(gpus=1, wait=True)
    pod.delete()
    names = [(p.name, p.namespace) for p in devplug_plugin.node.pod_resources()]
    assert (pod.name, pod.namespace) not in names


def _shape(pod: PodResourcesPod) -> list[tuple[str, list[tuple[str, tuple[str, ...], tuple[int, ...]]]]]:
    """A pod-resources entry, order-free: containers, each with its (resource, device IDs, NUMA nodes)."""
    return sorted(
        (c.name, sorted((d.resource_name, d.device_ids, d.numa_nodes) for d in c.devices)) for c in pod.containers
    )


def test_pod_resources_get_lists_one_pod(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """pod-resources ``Get`` answers for one pod what ``List`` does: a pod with a device lists its container with
    that device and the NUMA nodes the plugin reported for it (none below 0); a pod asking for no device lists its
    container with none."""
    res, node = devplug_plugin.resource_name, devplug_plugin.node
    pod = devplug_pod(gpus=1, wait=True)
    plain = devplug_pod(wait=True)
    got = node.pod_resources_get(pod.name, pod.namespace)
    assert (got.name, got.namespace) == (pod.name, pod.namespace), f"Get({pod.namespace}/{pod.name}) answered {got}"
    listed = [p for p in node.pod_resources() if (p.name, p.namespace) == (pod.name, pod.namespace)]
    assert [_shape(p) for p in listed] == [_shape(got)], f"Get answered {got}; List lists {listed}"
    (container,) = [c for c in got.containers if c.name == pod.container]
    ids = container.device_ids(res)
    assert len(ids) == 1 and ids == pod.allocated_devices, (
        f"Get lists {ids} for {pod.container}; List {pod.allocated_devices}"
    )
    _assert_topology_as_sent(container, res, node.device_numa(res), "Get")
    empty = node.pod_resources_get(plain.name, plain.namespace)
    assert [c.name for c in empty.containers] == [plain.container], f"Get({plain.name}) lists {empty.containers}"
    assert all(not c.devices for c in empty.containers), f"a pod asking for no device lists {empty.containers}"
