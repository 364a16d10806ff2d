"""The kubelet's checkpoint: what it holds for a pod, and that it survives a kubelet restart."""

from __future__ import annotations

import pytest

from pytest_devplug import PluginHandle, PodFactory, assert_checkpoint_survives_kubelet_restart
from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb


def test_checkpoint_records_the_allocation(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """One entry per container and resource: the devices by NUMA node, and the Allocate response as sent."""
    pod = devplug_pod(gpus=2, wait=True)
    cp = devplug_plugin.node.checkpoint()
    assert cp is not None, "no checkpoint file after an allocation"
    (entry,) = cp.entries_for(pod.uid)
    assert (entry.container_name, entry.resource_name) == (pod.container, devplug_plugin.resource_name)
    assert entry.all_device_ids == pod.allocated_devices
    numa = devplug_plugin.node.device_numa(devplug_plugin.resource_name)
    for key, ids in entry.device_ids.items():
        for d in ids:
            expected = str(numa[d][0]) if numa.get(d) else "-1"
            assert key == expected, f"device {d} filed under NUMA {key}, reports {numa.get(d)}"
    resp = pb.ContainerAllocateResponse.FromString(entry.alloc_resp)
    view = pod.view()
    assert dict(resp.envs) == {k: v for k, v in view.envs.items() if k in resp.envs}
    assert [d.container_path for d in resp.devices] == [d.container_path for d in view.devices]
    registered = set(cp.registered_devices.get(devplug_plugin.resource_name, ()))
    assert registered == set(devplug_plugin.node.device_ids(devplug_plugin.resource_name)) | set(pod.allocated_devices)


@pytest.mark.devplug_disruptive
def test_checkpoint_survives_kubelet_restart(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    pod = devplug_pod(gpus=1, wait=True)
    assert_checkpoint_survives_kubelet_restart(devplug_plugin, pod)
    again = devplug_pod(gpus=1, wait=True)
    assert not set(again.allocated_devices) & set(pod.allocated_devices), "restored assignment handed out twice"
