"""Health: capacity counts every device, allocatable only healthy ones; running pods are not evicted.

The faults come from ``devplug_faults`` (the mock NVML, or the injector a plugin project's conftest
provides); without one these tests skip naming the contract to implement.
"""

from __future__ import annotations

from pytest_devplug import FaultInjector, PluginHandle, PodFactory, assert_allocatable
from pytest_devplug.waiting import wait_for

from ._support import fault


def test_unhealthy_device_leaves_allocatable_not_capacity(devplug_plugin: PluginHandle, devplug_faults: FaultInjector) -> None:
    """Two devices turn unhealthy: allocatable drops by two, capacity stays; one comes back: allocatable up again."""
    res = devplug_plugin.resource_name
    n = devplug_plugin.node.capacity(res)
    first, second = devplug_faults.device_ids[:2]
    with fault("mark a device unhealthy"):
        devplug_faults.set_unhealthy(first)
    assert_allocatable(devplug_plugin, n - 1, capacity=n)
    devplug_faults.set_unhealthy(second)
    assert_allocatable(devplug_plugin, n - 2, capacity=n)
    with fault("mark a device healthy again"):
        devplug_faults.set_healthy(second)
    assert_allocatable(devplug_plugin, n - 1, capacity=n)
    assert first not in devplug_plugin.node.device_ids(res), "unhealthy device still allocatable"


def test_device_turning_unhealthy_under_running_pod(
    devplug_plugin: PluginHandle, devplug_pod: PodFactory, devplug_faults: FaultInjector
) -> None:
    """The pod keeps running, allocatable drops, and allocatedResourcesStatus reports the device Unhealthy."""
    n = devplug_plugin.node.capacity(devplug_plugin.resource_name)
    pod = devplug_pod(gpus=1, wait=True)
    (dev,) = pod.allocated_devices
    assert pod.device_health == {dev: "Healthy"}, f"allocatedResourcesStatus: {pod.device_health}"
    with fault("mark a device unhealthy"):
        devplug_faults.set_unhealthy(dev)
    assert_allocatable(devplug_plugin, n - 1, capacity=n)
    assert pod.phase == "Running", f"a device going unhealthy must not evict its pod: {pod.phase} {pod.reason}"
    assert pod.restart_count == 0, f"the container restarted {pod.restart_count} times"
    # A real kubelet writes the pod's status on its own pod sync after the health update, not with the node's
    # allocatable: wait for it (bounded) rather than read it once.
    want = {dev: "Unhealthy"}
    wait_for(lambda: pod.device_health, lambda h: h == want, timeout=pod.timeout, what=f"allocatedResourcesStatus {want}")
    assert pod.allocated_devices == [dev]


def test_removed_and_added_devices_change_capacity(devplug_plugin: PluginHandle, devplug_faults: FaultInjector) -> None:
    """Removing a device from the plugin's list lowers capacity; adding one raises it."""
    res = devplug_plugin.resource_name
    n = devplug_plugin.node.capacity(res)
    victim = devplug_faults.device_ids[-1]
    with fault("remove a device"):
        devplug_faults.remove_device(victim)
    assert_allocatable(devplug_plugin, n - 1, capacity=n - 1)
    with fault("add a device"):
        added = devplug_faults.add_device()
    assert_allocatable(devplug_plugin, n, capacity=n)
    assert added in devplug_plugin.node.device_ids(res), f"added {added}; allocatable {devplug_plugin.node.device_ids(res)}"
