"""PreStartContainer: called before the container starts when the plugin asks for it."""

from __future__ import annotations

import re

import pytest

from pytest_devplug import PluginHandle, PodFactory, wait_for
from pytest_devplug.waiting import WaitTimeout


def test_prestart_container_called_before_start(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """With ``pre_start_required`` the kubelet calls PreStartContainer for the container's devices, then starts it.

    Evidence, backend-neutral: the included plugin logs every call with its device IDs
    (``PreStartContainer: devices <ids>``); for another plugin, the kubelet's own line (the embedded
    kubelet always logs it; a real kubelet only at -v>=4: DEVPLUG_KIND_KUBELET_VERBOSITY=4 on kind).
    """
    if not devplug_plugin.spec.pre_start_required:
        pytest.skip("the plugin under test does not declare pre_start_required (--devplug-pre-start-required)")
    pod = devplug_pod(gpus=1, wait=True)
    (dev,) = pod.allocated_devices
    kubelet_rx = re.compile(
        rf"PreStartContainer call for container\W+(?:containerName=\W?)?{re.escape(pod.container)}\b.*{re.escape(pod.uid)}"
    )
    plugin_needle = f"PreStartContainer: devices {dev}"
    if devplug_plugin.has_mock:
        probe, what = devplug_plugin.log, f"{plugin_needle!r} in the plugin's log"

        def found(log: str) -> bool:
            return plugin_needle in log
    else:
        probe, what = devplug_plugin.node.kubelet_log, f"/{kubelet_rx.pattern}/ in the kubelet's log"

        def found(log: str) -> bool:
            return bool(kubelet_rx.search(log))

    try:
        wait_for(probe, found, timeout=devplug_plugin.node.timeout, what=what)
    except WaitTimeout:
        pytest.fail(f"no PreStartContainer call seen for {pod.name}/{pod.container} (devices {dev}): {what} missing")
    started = pod.container_status().get("state", {}).get("running")
    assert started, f"container not running after PreStartContainer: {pod.container_status()}"
