"""Restarts and disappearance: kubelet restart, plugin restart, plugin gone (grace period)."""

from __future__ import annotations

import pytest

from pytest_devplug import PluginHandle, PodFactory, assert_allocatable, assert_reregisters_after_kubelet_restart
from pytest_devplug.assertions import UNLOGGED_PATH, registration_path
from pytest_devplug.report import note_check
from pytest_devplug.waiting import wait_for
from pytest_devplug.errors import WaitTimeout

from ._support import device_count, short_grace_period


@pytest.mark.devplug_disruptive
def test_reregisters_after_kubelet_restart(devplug_plugin: PluginHandle, request: pytest.FixtureRequest) -> None:
    """The resource comes back after a kubelet restart without the plugin being restarted: by a new ``Register`` on
    the new kubelet.sock, or by the kubelet's plugin watcher finding the plugin's socket in ``plugins_registry/``
    again (the report notes which)."""
    assert_reregisters_after_kubelet_restart(devplug_plugin)
    note_check(
        request.node,
        "registration",
        registration_path(devplug_plugin.node, devplug_plugin.resource_name) or UNLOGGED_PATH,
    )


@pytest.mark.devplug_disruptive
def test_plugin_restart_keeps_assignments(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """After the plugin restarts and registers again, running pods keep their devices; new pods get others."""
    n = devplug_plugin.node.capacity(devplug_plugin.resource_name)
    spare = device_count(devplug_plugin, 2) > 1
    pod = devplug_pod(gpus=1, wait=True)
    held = pod.allocated_devices
    devplug_plugin.restart()
    assert_allocatable(devplug_plugin, n, capacity=n)
    assert pod.phase == "Running" and pod.restart_count == 0, f"{pod.phase} restarts={pod.restart_count}"
    assert pod.allocated_devices == held
    if not spare:
        return  # one device: it is the running pod's; no other pod to give one
    other = devplug_pod(gpus=1, wait=True)
    assert not set(other.allocated_devices) & set(held), f"{held} handed out again after the plugin restart"


def test_container_restart_keeps_devices(devplug_pod: PodFactory) -> None:
    """A crashed container comes back with the same devices and the same injections."""
    pod = devplug_pod(gpus=1, wait=True)
    held, env = pod.allocated_devices, pod.env
    pod.restart_container()
    wait_for(lambda: pod.restart_count, lambda c: c >= 1, timeout=pod.timeout, what="container restart")
    pod.wait_running()
    assert pod.allocated_devices == held and pod.env == env


@pytest.mark.devplug_disruptive
@pytest.mark.devplug_grace_period
def test_plugin_gone_then_resource_removed(devplug_plugin: PluginHandle) -> None:
    """Plugin stops: capacity kept, allocatable 0; after the grace period the resource goes (capacity 0).

    On the sim the grace period is shortened for this test; on kind it is the kubelet's own (5 min).
    """
    res, node = devplug_plugin.resource_name, devplug_plugin.node
    n = node.capacity(res)
    devplug_plugin.stop()
    assert_allocatable(devplug_plugin, 0, capacity=n)
    with short_grace_period(devplug_plugin, 0.5) as grace:
        try:
            counts = wait_for(
                lambda: node.counts(res),
                lambda c: (c[0] or 0) == 0 and (c[1] or 0) == 0,
                timeout=grace + node.timeout,
                what="resource removal",
            )
        except WaitTimeout as exc:
            raise AssertionError(
                f"{res} should be removed {grace:g}s after its plugin went away; (capacity, allocatable) = {exc.last}"
            ) from None
    assert counts[0] in (0, None)
