"""PreStartContainer: called before the container starts when the plugin asks for it, and its error keeps the
container from starting."""

from __future__ import annotations

import re
from typing import Any

import pytest

from pytest_devplug import FaultInjector, PluginHandle, PodFactory, PodHandle, UnsupportedOperationError, wait_for
from pytest_devplug.faults import fail_pre_start
from pytest_devplug.errors import WaitTimeout

from ._support import fault

#: What the kubelet reports for a container whose PreStartContainer failed (``GetDeviceRunContainerOptions``'s
#: error, the container's waiting reason, ``kuberuntime``'s ``ErrCreateContainerConfig``).
PRE_START_FAILED = "device plugin PreStartContainer rpc failed with err: "
CONFIG_ERROR = "CreateContainerConfigError"


def _registered_pre_start(plugin: PluginHandle) -> bool | None:
    """What the plugin told the kubelet (GetDevicePluginOptions), where the backend shows it; else None."""
    try:
        return plugin.backend.plugin_pre_start_required(plugin.node.name, plugin.resource_name)
    except UnsupportedOperationError:
        return None


def _require_pre_start(plugin: PluginHandle) -> bool | None:
    """Whether the plugin registered with ``pre_start_required`` (``None``: the backend does not show it, and it is
    declared so); a skip when it does not ask for PreStartContainer, a failure when it was declared to but did not."""
    declared = plugin.spec.pre_start_required
    registered = _registered_pre_start(plugin)
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
    return registered


def test_prestart_container_called_before_start(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """With ``pre_start_required`` the kubelet calls PreStartContainer for the container's devices, then starts it.

    Whether the plugin asks is read from the options the kubelet got (sim), else from
    ``--devplug-pre-start-required``. Evidence of the call, backend-neutral: the kubelet's own line (the
    embedded kubelet always logs it; a real kubelet only at -v>=4: DEVPLUG_KIND_KUBELET_VERBOSITY=4 on
    kind) or the included plugin's (``PreStartContainer: devices <ids>``).
    """
    registered = _require_pre_start(devplug_plugin)
    pod = devplug_pod(gpus=1, wait=True)
    (dev,) = pod.allocated_devices
    kubelet_rx = re.compile(
        rf"PreStartContainer call for container\W+(?:containerName=\W?)?{re.escape(pod.container)}\b.*"
        rf"{re.escape(pod.uid)}"
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
            + (
                "the plugin registered with pre_start_required=true"
                if registered
                else "on kind a real kubelet logs the call only at -v>=4"
            ),
            pytrace=False,
        )
    started = pod.container_status().get("state", {}).get("running")
    assert started, f"container not running after PreStartContainer: {pod.container_status()}"


def _state(pod: PodHandle) -> dict[str, Any]:
    try:
        return dict(pod.container_status().get("state") or {})
    except KeyError:  # no status for the container yet
        return {}


def test_failing_prestart_keeps_the_container_from_starting(
    devplug_pod: PodFactory, devplug_plugin: PluginHandle, devplug_faults: FaultInjector
) -> None:
    """PreStartContainer answering an error (the fault injector's ``fail_pre_start``): the pod is admitted (Allocate
    came first, its device is held) but its container never starts; it waits with the kubelet's reason
    ``CreateContainerConfigError`` and message ``device plugin PreStartContainer rpc failed with err: ...``, and a
    ``Failed`` event says the same. A plugin that logs the failure and answers success lets the container start
    on a device it did not prepare."""
    _require_pre_start(devplug_plugin)
    with fault("make PreStartContainer fail"):
        fail_pre_start(devplug_faults)
    pod = devplug_pod(gpus=1)

    def settled(state: dict[str, Any]) -> bool:
        return "running" in state or (state.get("waiting") or {}).get("reason") == CONFIG_ERROR

    try:
        state = wait_for(
            lambda: _state(pod), settled, timeout=pod.timeout, what=f"container state {CONFIG_ERROR} (or running)"
        )
    except WaitTimeout as exc:
        pytest.fail(
            f"the container of {pod.name} neither started nor reported {CONFIG_ERROR} after PreStartContainer was "
            f"made to fail; last state {exc.last}, pod phase {pod.phase!r} {pod.reason} {pod.message}",
            pytrace=False,
        )
    assert "running" not in state, (
        f"the container started although PreStartContainer was made to fail for its device {pod.allocated_devices}: "
        "the plugin answered PreStartContainer with success (an error it logged is not enough: only an error "
        f"answer keeps the container off a device it did not prepare); state {state}"
    )
    message = str(state["waiting"].get("message") or "")
    assert message.startswith(PRE_START_FAILED), (
        f"waiting message {message!r}, expected it to start {PRE_START_FAILED!r}"
    )
    status = pod.container_status()
    assert not status.get("started") and status.get("restartCount", 0) == 0, f"container status {status}"
    assert pod.phase == "Pending", (
        f"a pod whose container cannot be created stays Pending, not {pod.phase} {pod.reason}"
    )
    assert len(pod.allocated_devices) == 1, f"admitted before PreStartContainer, the pod holds {pod.allocated_devices}"
    pod.wait_event(f"Failed: Error: {re.escape(PRE_START_FAILED)}")
