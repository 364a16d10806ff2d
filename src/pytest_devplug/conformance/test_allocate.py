"""Allocate: what the container sees, and a failing Allocate failing the pod's admission."""

from __future__ import annotations

import pytest

from pytest_devplug import PluginHandle, PodFactory, assert_allocate_injections


def test_allocate_injections_reach_the_container(devplug_pod: PodFactory) -> None:
    """Something is injected, every assigned ID is visible to the workload, shapes are valid."""
    pod = devplug_pod(gpus=2, wait=True)
    assert_allocate_injections(pod)
    assert len(pod.allocated_devices) == 2


def test_single_device_pod_sees_only_its_device(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """Devices the pod was not given appear in none of its injections."""
    pod = devplug_pod(gpus=1, wait=True)
    assert_allocate_injections(pod)
    others = [d for d in devplug_plugin.node.device_ids(devplug_plugin.resource_name) if d not in pod.allocated_devices]
    view = pod.view()
    texts = [*view.envs.values(), *view.annotations.values(), *view.cdi_devices, *(m.container_path for m in view.mounts)]
    leaked = [d for d in others if any(d in t for t in texts)]
    assert not leaked, f"pod given {pod.allocated_devices} also sees {leaked}"


@pytest.mark.devplug_mock
def test_included_plugin_envvar_strategy(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """The included plugin's default strategy: NVIDIA_VISIBLE_DEVICES lists the assigned UUIDs, /dev nodes rw."""
    pod = devplug_pod(gpus=2, wait=True)
    ids = pod.allocated_devices
    assert_allocate_injections(
        pod,
        env={"NVIDIA_VISIBLE_DEVICES": lambda v: sorted(v.split(",")) == ids},
        device_nodes=["/dev/nvidiactl"],
    )
    minors = sorted(int(g["minor"]) for g in devplug_plugin.mock.state["gpus"] if g["uuid"] in ids)
    listing = pod.exec("ls", "/dev").stdout.split()
    for m in minors:
        assert f"nvidia{m}" in listing, f"/dev/nvidia{m} missing from ls /dev: {listing}"


@pytest.mark.devplug_mock
def test_failing_allocate_fails_the_pod(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """Allocate returning an error: pod Failed, reason UnexpectedAdmissionError, the kubelet's message."""
    for uuid in devplug_plugin.mock.uuids:
        devplug_plugin.mock.fail_allocate(uuid)
    pod = devplug_pod(gpus=1)
    pod.wait_phase("Failed")
    assert pod.reason == "UnexpectedAdmissionError", pod.reason
    assert (pod.message or "").startswith("Pod was rejected: Allocate failed due to "), pod.message
    assert (pod.message or "").endswith(", which is unexpected"), pod.message
    assert pod.allocated_devices == []
