"""The kubelet's checkpoint: what it holds for a pod, and that it survives a kubelet restart."""

from __future__ import annotations

import pytest

from pytest_devplug import PluginHandle, PodFactory, assert_checkpoint_survives_kubelet_restart
from pytest_devplug.assertions import describe_view
from pytest_devplug.backends.base import applied_view

from ._support import device_count


def test_checkpoint_records_the_allocation(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """One entry per container and resource: the devices by NUMA node, and the Allocate response that
    the container got: the kubelet's merge of it (device nodes and mounts de-duplicated by container
    path, as for two IDs sharing one ``/dev`` node) is what the runtime applied."""
    res = devplug_plugin.resource_name
    pod = devplug_pod(gpus=device_count(devplug_plugin, 2), wait=True)
    cp = devplug_plugin.node.checkpoint()
    assert cp is not None, "no checkpoint file after an allocation"
    entries = cp.entries_for(pod.uid)
    assert len(entries) == 1, f"one entry expected for {pod.container}/{res}; checkpoint has {entries}"
    (entry,) = entries
    assert (entry.container_name, entry.resource_name) == (pod.container, res)
    assert entry.all_device_ids == pod.allocated_devices, (
        f"checkpoint {entry.all_device_ids}, pod-resources {pod.allocated_devices}"
    )
    numa = devplug_plugin.node.device_numa(res)
    for key, ids in entry.device_ids.items():
        for d in ids:
            expected = str(numa[d][0]) if numa.get(d) else "-1"
            assert key == expected, f"device {d} filed under NUMA {key}, reports {numa.get(d)}"
    stored, view = applied_view([entry]), pod.view()
    devices, mounts = list(view.devices), list(view.mounts)
    if stored.cdi_devices or any(k.startswith("cdi.k8s.io/") for k in stored.annotations):
        # A CDI-enabled runtime adds the named devices' edits from the plugin's spec: judge what was stored.
        devices = [d for d in devices if d in stored.devices]
        mounts = [m for m in mounts if m in stored.mounts]
    seen = (
        {k: v for k, v in view.envs.items() if k in stored.envs},
        sorted(devices, key=str),
        sorted(mounts, key=str),
        {k: v for k, v in view.annotations.items() if k in stored.annotations},
        sorted(view.cdi_devices),
    )
    want = (
        stored.envs,
        sorted(stored.devices, key=str),
        sorted(stored.mounts, key=str),
        stored.annotations,
        sorted(stored.cdi_devices),
    )
    assert seen == want, (
        f"the container got other injections than the checkpointed Allocate response:\nstored (merged as the kubelet "
        f"does):\n{describe_view(stored)}\ncontainer:\n{describe_view(view)}"
    )
    registered = set(cp.registered_devices.get(res, ()))
    assert registered == set(devplug_plugin.node.device_ids(res)) | set(pod.allocated_devices), (
        f"RegisteredDevices {sorted(registered)}; healthy devices {devplug_plugin.node.device_ids(res)}"
    )


@pytest.mark.devplug_disruptive
def test_checkpoint_survives_kubelet_restart(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """The assignment is restored after a kubelet restart; with a second device, a new pod gets another one."""
    spare = device_count(devplug_plugin, 2) > 1
    pod = devplug_pod(gpus=1, wait=True)
    assert_checkpoint_survives_kubelet_restart(devplug_plugin, pod)
    if not spare:
        return  # one device: it is the restored pod's; nothing to hand out twice
    again = devplug_pod(gpus=1, wait=True)
    assert not set(again.allocated_devices) & set(pod.allocated_devices), "restored assignment handed out twice"
