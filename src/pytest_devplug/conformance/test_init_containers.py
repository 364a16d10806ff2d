"""Init and restartable-init (sidecar) containers with devices: the kubelet's reuse, the plugin's answers.

The kubelet allocates init containers first. A plain init container's devices become reusable by the
containers after it (``devicesToReuse`` in ``manager.go``): the next container asking for the resource gets
them again, and the plugin sees a second ``Allocate`` for IDs it already answered. A restartable init
container runs beside the app containers, so it takes devices out of the reusable set and keeps them. A
plugin that remembers what it handed out and refuses an ID twice, or answers the second call differently,
fails here.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_devplug import PluginHandle, PodFactory, PodHandle
from pytest_devplug.handles import DEFAULT_IMAGE


def _container(name: str, resource: str, count: int, *, command: list[str], sidecar: bool = False) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": name,
        "image": DEFAULT_IMAGE,
        "command": command,
        "resources": {"limits": {resource: str(count)}},
    }
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def _pod_with_inits(pods: PodFactory, inits: list[tuple[str, bool]], app: int) -> dict[str, Any]:
    """A pod of ``inits`` (name, restartable), each asking for one device, then one app container ``main``."""
    res = pods.resource_name
    body = pods.manifest(count=app)
    body["spec"]["initContainers"] = [
        _container(name, res, 1, command=["sleep", "3600"] if sidecar else ["sh", "-c", "true"], sidecar=sidecar)
        for name, sidecar in inits
    ]
    return body


def _checkpointed(plugin: PluginHandle, pod: PodHandle) -> dict[str, list[str]]:
    cp = plugin.node.checkpoint()
    assert cp is not None, "no checkpoint after allocating a pod's containers"
    return {
        e.container_name: e.all_device_ids for e in cp.entries_for(pod.uid) if e.resource_name == plugin.resource_name
    }


def test_init_container_devices_reused_by_app_container(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """The app container gets the init container's device again (a second Allocate of the same ID); the
    pod runs, holds one device, and the checkpoint and pod-resources agree."""
    res, node = devplug_plugin.resource_name, devplug_plugin.node
    n = node.capacity(res)
    pod = devplug_pod(manifest=_pod_with_inits(devplug_pod, [("init-1", False)], app=1))
    pod.wait_running()
    stored = _checkpointed(devplug_plugin, pod)
    assert set(stored) == {"init-1", "main"}, (
        f"checkpoint entries for containers {sorted(stored)}, want init-1 and main"
    )
    assert len(stored["init-1"]) == 1, f"init-1 holds {stored['init-1']}"
    assert stored["main"] == stored["init-1"], (
        f"the kubelet reuses a finished init container's devices for the next container: init-1 {stored['init-1']}, "
        f"main {stored['main']}"
    )
    assert pod.allocated_devices == stored["main"], (
        f"pod-resources {pod.allocated_devices}, checkpoint {stored['main']}"
    )
    others = devplug_pod(count=n - 1, wait=True)
    assert not set(others.allocated_devices) & set(stored["main"]), (
        f"{stored['main']} held by {pod.name} handed out again: {others.allocated_devices}"
    )


def test_restartable_init_container_keeps_its_devices(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """Upstream's sidecar case: init-1 runs to completion, the restartable init container reuses its device
    and keeps it, the app container gets another one. Both are listed by pod-resources."""
    res = devplug_plugin.resource_name
    n = devplug_plugin.node.capacity(res)
    if n < 2:
        pytest.skip(f"the sidecar case needs 2 devices of {res}; the plugin lists {n}")
    pod = devplug_pod(manifest=_pod_with_inits(devplug_pod, [("init-1", False), ("sidecar-2", True)], app=1))
    pod.wait_running()
    stored = _checkpointed(devplug_plugin, pod)
    assert set(stored) == {"init-1", "sidecar-2", "main"}, f"checkpoint entries for {sorted(stored)}"
    assert stored["sidecar-2"] == stored["init-1"], (
        f"init-1 {stored['init-1']} and sidecar-2 {stored['sidecar-2']} should share"
    )
    assert not set(stored["main"]) & set(stored["sidecar-2"]), (
        f"a restartable init container keeps its device while the app runs: main {stored['main']}, sidecar-2 "
        f"{stored['sidecar-2']}"
    )
    listed = {c: pod.allocated(container=c) for c in ("sidecar-2", "main")}
    assert listed == {"sidecar-2": stored["sidecar-2"], "main": stored["main"]}, (
        f"pod-resources {listed}, checkpoint {stored}"
    )
    sidecar = pod.container_status("sidecar-2")
    assert "running" in (sidecar.get("state") or {}), f"sidecar-2 should run beside main: {sidecar.get('state')}"
