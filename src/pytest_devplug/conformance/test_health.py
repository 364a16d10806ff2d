"""Health: capacity counts every device, allocatable only healthy ones; running pods are not evicted."""

from __future__ import annotations

import pytest

from pytest_devplug import PluginHandle, PodFactory, assert_allocatable


@pytest.mark.devplug_mock
def test_unhealthy_device_leaves_allocatable_not_capacity(devplug_plugin: PluginHandle) -> None:
    """An Xid makes one GPU unhealthy, a lost GPU another: allocatable drops, capacity stays; back when usable."""
    n = devplug_plugin.node.capacity(devplug_plugin.resource_name)
    first, second = devplug_plugin.mock.uuids[:2]
    devplug_plugin.mock.inject_xid(first, 79)
    assert_allocatable(devplug_plugin, n - 1, capacity=n)
    devplug_plugin.mock.set_lost(second)
    assert_allocatable(devplug_plugin, n - 2, capacity=n)
    devplug_plugin.mock.set_usable(second)
    assert_allocatable(devplug_plugin, n - 1, capacity=n)
    assert first not in devplug_plugin.node.device_ids(devplug_plugin.resource_name), "unhealthy device still allocatable"


@pytest.mark.devplug_mock
def test_device_turning_unhealthy_under_running_pod(devplug_plugin: PluginHandle, devplug_pod: PodFactory) -> None:
    """The pod keeps running, allocatable drops, and allocatedResourcesStatus reports the device Unhealthy."""
    n = devplug_plugin.node.capacity(devplug_plugin.resource_name)
    pod = devplug_pod(gpus=1, wait=True)
    (dev,) = pod.allocated_devices
    assert pod.device_health == {dev: "Healthy"}
    devplug_plugin.mock.inject_xid(dev, 79)
    assert_allocatable(devplug_plugin, n - 1, capacity=n)
    assert pod.phase == "Running", f"a device going unhealthy must not evict its pod: {pod.phase} {pod.reason}"
    assert pod.restart_count == 0
    assert pod.device_health == {dev: "Unhealthy"}, f"allocatedResourcesStatus: {pod.device_health}"
    assert pod.allocated_devices == [dev]


@pytest.mark.devplug_mock
def test_removed_and_added_devices_change_capacity(devplug_plugin: PluginHandle) -> None:
    """Removing a GPU from the inventory lowers capacity; adding one raises it."""
    n = devplug_plugin.node.capacity(devplug_plugin.resource_name)
    victim = devplug_plugin.mock.uuids[-1]
    devplug_plugin.mock.remove_gpu(victim)
    assert_allocatable(devplug_plugin, n - 1, capacity=n - 1)
    added = devplug_plugin.mock.add_gpu(numa_node=0)
    assert_allocatable(devplug_plugin, n, capacity=n)
    assert added in devplug_plugin.node.device_ids(devplug_plugin.resource_name)
