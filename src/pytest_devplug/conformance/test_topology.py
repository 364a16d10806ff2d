"""NUMA: preferred allocation and the Topology Manager's single-numa-node policy."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from pytest_devplug import ClusterHandle, NodeSpec, PluginHandle, PluginSpec, PodFactory

from ._support import require_topology


@pytest.mark.devplug_convention("numa-packing")
def test_convention_numa_packing_two_devices_on_one_node(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """A pod asking for two devices gets them from one NUMA node, even after another pod took one.

    With the Topology Manager's default policy (none) the kubelet takes the plugin's preferred
    allocation as it is, so this judges the plugin's GetPreferredAllocation, not the kubelet."""
    numa = require_topology(devplug_plugin)
    per_node = {n: sum(1 for v in numa.values() if v == n) for n in set(numa.values())}
    if max(per_node.values()) < 2:
        pytest.skip(f"needs a NUMA node with 2+ devices; have {per_node}")
    first = devplug_pod(gpus=1, wait=True)
    second = devplug_pod(gpus=2, wait=True)
    got = second.allocated_devices
    assert len({numa[d] for d in got}) == 1, f"2 devices spread over NUMA nodes {[numa[d] for d in got]}: {got}"
    assert not set(got) & set(first.allocated_devices)


@pytest.mark.devplug_convention("numa-packing")
def test_convention_numa_packing_fills_one_node_first(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """Single-device pods fill one NUMA node before the next (best fit), leaving whole nodes free for big requests."""
    numa = require_topology(devplug_plugin)
    per_node = {n: sum(1 for v in numa.values() if v == n) for n in set(numa.values())}
    if min(per_node.values()) < 2:
        pytest.skip(f"needs 2+ devices on every NUMA node; have {per_node}")
    pods = [devplug_pod(gpus=1, wait=True) for _ in range(2)]
    used = [numa[p.allocated_devices[0]] for p in pods]
    assert used[0] == used[1], f"two 1-device pods landed on NUMA nodes {used}; a NUMA node had room for both"


@pytest.fixture
def numa_strict_node(
    devplug_cluster: ClusterHandle,
    devplug_plugin_spec: PluginSpec,
    devplug_plugin: PluginHandle,
    devplug_node_spec: NodeSpec,
) -> Iterator[tuple[PluginHandle, PodFactory]]:
    """A second node with the Topology Manager's single-numa-node policy, running the same plugin."""
    require_topology(devplug_plugin)
    node = devplug_cluster.ensure_node(
        replace(
            devplug_node_spec,
            name="devplug-numa-strict",
            numa_nodes=max(devplug_plugin_spec.numa_nodes, 2),
            topology_policy="single-numa-node",
        )
    )
    plugin = devplug_cluster.deploy(node, devplug_plugin_spec)
    pods = devplug_cluster.pods(node, devplug_plugin_spec.resource_name, prefix="numa-strict")
    try:
        plugin.wait_ready()
        yield plugin, pods
    finally:
        pods.cleanup()
        devplug_cluster.backend.remove_plugin(node.name)


@pytest.mark.devplug_disruptive
def test_single_numa_node_policy_rejects_cross_numa_request(numa_strict_node: tuple[PluginHandle, PodFactory]) -> None:
    """More devices than any one NUMA node has: rejected with TopologyAffinityError; fitting requests run.

    "NUMA node" is one of the machine's: the Topology Manager builds hints over the NUMA nodes the kubelet's
    machine has (cadvisor), so a device reporting a node the machine lacks (mock GPUs on NUMA 1 of a
    1-NUMA host, on kind) fits no single-node mask. Computed here from the machine, so the rule is checked
    on any host."""
    plugin, pods = numa_strict_node
    numa = require_topology(plugin)
    machine = set(plugin.node.machine_numa_nodes)
    per_node = {n: sum(1 for v in numa.values() if v == n) for n in set(numa.values()) & machine}
    if not per_node:  # no device on any of the machine's NUMA nodes: no request fits one
        pod = pods(gpus=1)
        pod.wait_phase("Failed")
        assert pod.reason == "TopologyAffinityError", f"{pod.reason}: {pod.message} (devices {numa}, machine {machine})"
        return
    biggest = max(per_node.values())
    fits = pods(gpus=biggest, wait=True)
    assert {numa[d] for d in fits.allocated_devices} <= machine
    assert len({numa[d] for d in fits.allocated_devices}) == 1
    fits.delete()
    pod = pods(gpus=biggest + 1)
    pod.wait_phase("Failed")
    assert pod.reason == "TopologyAffinityError", f"{pod.reason}: {pod.message}"
    assert pod.allocated_devices == []
