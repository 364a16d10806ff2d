"""Exclusivity: two pods never share a device."""

from __future__ import annotations

from pytest_devplug import PluginHandle, PodFactory


def test_pods_never_share_a_device(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """Fill the node one device per pod: all run, on disjoint devices; one more stays Pending."""
    n = devplug_plugin.node.allocatable(devplug_plugin.resource_name)
    pods = [devplug_pod(gpus=1) for _ in range(n)]
    seen: dict[str, str] = {}
    for pod in pods:
        pod.wait_running()
        (dev,) = pod.allocated_devices
        assert dev not in seen, f"device {dev} given to both {seen[dev]} and {pod.name}"
        seen[dev] = pod.name
    extra = devplug_pod(gpus=1)
    extra.wait_event(f"FailedScheduling: .*Insufficient {devplug_plugin.resource_name}")
    assert extra.phase == "Pending"
    cp = devplug_plugin.node.checkpoint()
    assert cp is not None
    ids = [d for e in cp.entries for d in e.all_device_ids]
    assert sorted(ids) == sorted(seen), f"checkpoint assignments {ids} vs pods {seen}"


def test_freed_devices_are_reused(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """Deleting a pod frees its devices for the next pod (reclaimed before the next allocation)."""
    n = devplug_plugin.node.allocatable(devplug_plugin.resource_name)
    first = devplug_pod(gpus=n, wait=True)
    held = first.allocated_devices
    first.delete()
    second = devplug_pod(gpus=n, wait=True)
    assert second.allocated_devices == held
