"""Health: capacity counts every device, allocatable only healthy ones; running pods are not evicted.

The faults come from ``devplug_faults`` (the mock NVML, or the injector a plugin project's conftest
provides); without one these tests skip naming the contract to implement. A fault reaches every device
backed by the same hardware (``fault_domain``: the replicas of one GPU), and the counts are judged by that.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_devplug import (
    FaultInjector,
    PluginHandle,
    PodFactory,
    PodHandle,
    assert_allocatable,
    assert_devices_unhealthy,
)
from pytest_devplug.faults import fault_domain
from pytest_devplug.waiting import wait_for

from ._support import fault, wait_marked_unhealthy


def test_unhealthy_device_leaves_allocatable_not_capacity(
    devplug_plugin: PluginHandle, devplug_faults: FaultInjector
) -> None:
    """Devices turn unhealthy: allocatable drops by as many as the plugin marks, capacity stays; with a second
    fault domain, one comes back healthy and allocatable goes up again."""
    n = devplug_plugin.node.capacity(devplug_plugin.resource_name)
    ids = devplug_faults.device_ids
    if not ids:
        pytest.skip("needs at least one allocatable device; the plugin lists none")
    with fault("tell which devices a fault reaches"):
        first = fault_domain(devplug_faults, ids[0])
    with fault("mark a device unhealthy"):
        devplug_faults.set_unhealthy(first[0])
    marked = wait_marked_unhealthy(devplug_plugin, first, capacity=n)
    rest = [d for d in ids if d not in first]
    if not rest:
        return  # one fault domain: nothing left to turn unhealthy and back
    with fault("tell which devices a fault reaches"):
        second = fault_domain(devplug_faults, rest[0])
    devplug_faults.set_unhealthy(second[0])
    wait_marked_unhealthy(devplug_plugin, second, capacity=n, faulted=tuple(first))
    with fault("mark a device healthy again"):
        devplug_faults.set_healthy(second[0])
    assert_devices_unhealthy(
        devplug_plugin, marked, kept=second, capacity=n, cause=f"set_healthy({second[0]!r}) after faults"
    )


def test_device_turning_unhealthy_under_running_pod(
    devplug_plugin: PluginHandle, devplug_pod: PodFactory, devplug_faults: FaultInjector
) -> None:
    """The pod keeps running, allocatable drops, and allocatedResourcesStatus reports the device Unhealthy (where
    the node's release fills it: feature gate ResourceHealthStatus, on by default from 1.36)."""
    n = devplug_plugin.node.capacity(devplug_plugin.resource_name)
    reported = devplug_plugin.node.kube.gate("ResourceHealthStatus")
    pod = devplug_pod(gpus=1, wait=True)
    (dev,) = pod.allocated_devices
    if reported:
        assert pod.device_health == {dev: "Healthy"}, f"allocatedResourcesStatus: {pod.device_health}"
    with fault("tell which devices a fault reaches"):
        domain = fault_domain(devplug_faults, dev)
    with fault("mark a device unhealthy"):
        devplug_faults.set_unhealthy(dev)
    marked = wait_marked_unhealthy(devplug_plugin, domain, capacity=n)
    if dev not in marked:
        pytest.skip(
            f"the fault of {dev}'s hardware left {dev} Healthy (the plugin marked {marked}): the nvml-xid checks "
            "judge a fault's reach; nothing under this pod to judge"
        )
    assert pod.phase == "Running", f"a device going unhealthy must not evict its pod: {pod.phase} {pod.reason}"
    assert pod.restart_count == 0, f"the container restarted {pod.restart_count} times"
    assert pod.allocated_devices == [dev]
    if not reported:
        assert pod.device_health == {}, f"ResourceHealthStatus is off, yet the pod's status has {pod.device_health}"
        return
    # A real kubelet writes the pod's status on its own pod sync after the health update, not with the node's
    # allocatable: wait for it (bounded) rather than read it once.
    want = {dev: "Unhealthy"}
    wait_for(
        lambda: pod.device_health, lambda h: h == want, timeout=pod.timeout, what=f"allocatedResourcesStatus {want}"
    )


#: An image no node can pull: its registry is under the DNS top-level domain reserved never to resolve (RFC 2606).
UNPULLABLE_IMAGE = "devplug.invalid/no-such-image:1"
#: The kubelet's waiting reasons while it cannot pull a container's image.
PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff")


def _waiting(pod: PodHandle) -> dict[str, Any]:
    try:
        state = pod.container_status().get("state") or {}
    except KeyError:  # no status for the container yet
        return {}
    return dict(state.get("waiting") or {}) if "running" not in state else {"running": True}


def test_device_health_reported_for_a_pod_that_never_started(
    devplug_plugin: PluginHandle, devplug_pod: PodFactory, devplug_faults: FaultInjector
) -> None:
    """Upstream's failed pod: a container whose image cannot be pulled never starts (nor is PreStartContainer called
    for it), yet it holds its device from admission on; the device's health reaches its allocatedResourcesStatus,
    Healthy and then Unhealthy. A plugin that watches the health of free devices and of devices in use, but not
    of a device allocated to a container that has not started, leaves it Healthy here."""
    devplug_plugin.node.require_gate(
        "ResourceHealthStatus", "the kubelet reports a pod's device health in allocatedResourcesStatus"
    )
    n = devplug_plugin.node.capacity(devplug_plugin.resource_name)
    pod = devplug_pod(manifest=devplug_pod.manifest(count=1, image=UNPULLABLE_IMAGE))
    waiting = wait_for(
        lambda: _waiting(pod),
        lambda w: w.get("reason") in PULL_FAILURES or "running" in w,
        timeout=pod.timeout,
        what=f"container waiting with {' or '.join(PULL_FAILURES)} (image {UNPULLABLE_IMAGE})",
    )
    assert "running" not in waiting, f"a container of image {UNPULLABLE_IMAGE} is running"
    (dev,) = wait_for(
        lambda: pod.allocated_devices, lambda ids: len(ids) == 1, timeout=pod.timeout, what="the pod's device"
    )
    wait_for(
        lambda: pod.device_health,
        lambda h: h == {dev: "Healthy"},
        timeout=pod.timeout,
        what=f"allocatedResourcesStatus {dev} Healthy",
    )
    with fault("tell which devices a fault reaches"):
        domain = fault_domain(devplug_faults, dev)
    with fault("mark a device unhealthy"):
        devplug_faults.set_unhealthy(dev)
    try:
        marked = wait_marked_unhealthy(devplug_plugin, domain, capacity=n)
    except AssertionError as exc:
        raise AssertionError(
            f"{dev}, allocated to {pod.name} whose container never started ({waiting.get('reason')}), "
            f"was made Unhealthy and the plugin did not report it: {exc}"
        ) from None
    if dev not in marked:
        pytest.skip(
            f"the fault of {dev}'s hardware left {dev} Healthy (the plugin marked {marked}): "
            "the nvml-xid checks judge a fault's reach"
        )
    want = {dev: "Unhealthy"}
    wait_for(
        lambda: pod.device_health, lambda h: h == want, timeout=pod.timeout, what=f"allocatedResourcesStatus {want}"
    )
    assert pod.phase == "Pending", f"the pod's container never started, yet its phase is {pod.phase}"


def test_removed_and_added_devices_change_capacity(devplug_plugin: PluginHandle, devplug_faults: FaultInjector) -> None:
    """Removing a device from the plugin's list lowers capacity; adding one raises it."""
    res = devplug_plugin.resource_name
    n = devplug_plugin.node.capacity(res)
    victim = devplug_faults.device_ids[-1]
    with fault("tell which devices a fault reaches"):
        gone = len(fault_domain(devplug_faults, victim))
    with fault("remove a device"):
        devplug_faults.remove_device(victim)
    assert_allocatable(devplug_plugin, n - gone, capacity=n - gone)
    with fault("add a device"):
        added = devplug_faults.add_device()
    assert_allocatable(devplug_plugin, n, capacity=n)
    assert added in devplug_plugin.node.device_ids(res), (
        f"added {added}; allocatable {devplug_plugin.node.device_ids(res)}"
    )
