"""PreStartContainer: called before the container starts when the plugin asks for it."""

from __future__ import annotations

import re

import pytest

from pytest_devplug import PluginHandle, PodFactory, UnsupportedOperationError, wait_for
from pytest_devplug.waiting import WaitTimeout


def _registered_pre_start(plugin: PluginHandle) -> bool | None:
    """What the plugin told the kubelet (GetDevicePluginOptions), where the backend shows it; else None."""
    try:
        return plugin.backend.plugin_pre_start_required(plugin.node.name, plugin.resource_name)
    except UnsupportedOperationError:
        return None


def test_prestart_container_called_before_start(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """With ``pre_start_required`` the kubelet calls PreStartContainer for the container's devices, then starts it.

    Whether the plugin asks is read from the options the kubelet got (sim), else from
    ``--devplug-pre-start-required``. Evidence of the call, backend-neutral: the kubelet's own line (the
    embedded kubelet always logs it; a real kubelet only at -v>=4: DEVPLUG_KIND_KUBELET_VERBOSITY=4 on
    kind) or the included plugin's (``PreStartContainer: devices <ids>``).
    """
    declared = devplug_plugin.spec.pre_start_required
    registered = _registered_pre_start(devplug_plugin)
    if registered is False:
        why = (
            "the plugin registered with pre_start_required=false (its GetDevicePluginOptions answer), so the "
            "kubelet never calls PreStartContainer"
        )
        if declared:
            pytest.fail(f"{why}; yet it was declared to require it (--devplug-pre-start-required)", pytrace=False)
        pytest.skip(why)
    if registered is None and not declared:
        pytest.skip(
            "the plugin is declared without pre_start_required (the kubelet calls PreStartContainer only for a "
            "plugin that registers with pre_start_required=true; --devplug-pre-start-required if it does)"
        )
    pod = devplug_pod(gpus=1, wait=True)
    (dev,) = pod.allocated_devices
    kubelet_rx = re.compile(
        rf"PreStartContainer call for container\W+(?:containerName=\W?)?{re.escape(pod.container)}\b.*{re.escape(pod.uid)}"
    )
    plugin_needle = f"PreStartContainer: devices {dev}"
    what = f"/{kubelet_rx.pattern}/ in the kubelet's log or {plugin_needle!r} in the plugin's"
    try:
        wait_for(
            lambda: (devplug_plugin.node.kubelet_log(), devplug_plugin.log()),
            lambda logs: bool(kubelet_rx.search(logs[0])) or plugin_needle in logs[1],
            timeout=devplug_plugin.node.timeout,
            what=what,
        )
    except WaitTimeout:
        pytest.fail(
            f"no PreStartContainer call seen for {pod.name}/{pod.container} (devices {dev}): {what} missing; "
            + ("the plugin registered with pre_start_required=true" if registered else "on kind a real kubelet logs the call only at -v>=4"),
            pytrace=False,
        )
    started = pod.container_status().get("state", {}).get("running")
    assert started, f"container not running after PreStartContainer: {pod.container_status()}"
