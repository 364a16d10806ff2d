"""PreStartContainer: called before the container starts when the plugin asks for it."""

from __future__ import annotations

import pytest

from pytest_devplug import PluginHandle, PodFactory, wait_for
from pytest_devplug.waiting import WaitTimeout


def test_prestart_container_called_before_start(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """With ``pre_start_required`` the kubelet calls PreStartContainer for the container's devices, then starts it."""
    if not devplug_plugin.spec.pre_start_required:
        pytest.skip("the plugin under test does not declare pre_start_required (--devplug-pre-start-required)")
    pod = devplug_pod(gpus=1, wait=True)
    needle = f"PreStartContainer call for container {pod.container} of pod {pod.uid}"
    try:
        wait_for(devplug_plugin.node.kubelet_log, lambda log: needle in log, timeout=devplug_plugin.node.timeout, what=needle)
    except WaitTimeout:
        pytest.fail(f"the kubelet never issued PreStartContainer for {pod.name}/{pod.container} ({needle!r} not in its log)")
    started = pod.container_status().get("state", {}).get("running")
    assert started, f"container not running after PreStartContainer: {pod.container_status()}"
    if devplug_plugin.has_mock:  # the included plugin logs the call with the device IDs
        (dev,) = pod.allocated_devices
        assert f"PreStartContainer: devices {dev}" in devplug_plugin.log(), "plugin log lacks the PreStartContainer call"
