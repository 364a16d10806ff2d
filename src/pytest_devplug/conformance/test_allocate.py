"""Allocate: what the container sees, and a failing Allocate failing the pod's admission.

Core tests check what the kubelet requires of any plugin; ``test_convention_*`` tests check conventions
of one plugin family (device IDs visible to the workload, NVIDIA's env var), run only for a plugin that
declares them (``--devplug-conventions``).
"""

from __future__ import annotations

import pytest

from pytest_devplug import FaultInjector, PluginHandle, PodFactory, assert_allocate_injections

from ._support import device_count, fault


def test_allocate_injections_reach_the_container(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """Something is injected for the assigned devices (two, or the one a one-device node has), and its shapes
    are valid (permissions, CDI names)."""
    k = device_count(devplug_plugin, 2)
    pod = devplug_pod(gpus=k, wait=True)
    assert_allocate_injections(pod)
    assert len(pod.allocated_devices) == k, f"asked for {k} devices, pod-resources lists {pod.allocated_devices}"


@pytest.mark.devplug_convention("ids-visible")
def test_convention_ids_visible_in_injections(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """Every assigned device ID appears in some injection (env, annotation, mount, device path, CDI name)."""
    pod = devplug_pod(gpus=device_count(devplug_plugin, 2), wait=True)
    assert_allocate_injections(pod, ids_visible=True)


@pytest.mark.devplug_convention("ids-visible")
def test_convention_ids_visible_single_device_pod_sees_only_its_id(
    devplug_pod: PodFactory, devplug_plugin: PluginHandle
) -> None:
    """The IDs of devices the pod was not given appear in none of its injections."""
    pod = devplug_pod(gpus=1, wait=True)
    assert_allocate_injections(pod, ids_visible=True)
    others = [d for d in devplug_plugin.node.device_ids(devplug_plugin.resource_name) if d not in pod.allocated_devices]
    view = pod.view()
    texts = [
        *view.envs.values(),
        *view.annotations.values(),
        *view.cdi_devices,
        *(m.container_path for m in view.mounts),
    ]
    leaked = [d for d in others if any(d in t for t in texts)]
    assert not leaked, f"pod given {pod.allocated_devices} also sees {leaked} in {texts}"


@pytest.mark.devplug_convention("nvidia-env")
def test_convention_nvidia_env_lists_assigned_ids(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """NVIDIA's envvar strategy: NVIDIA_VISIBLE_DEVICES lists the assigned IDs, /dev/nvidiactl and the
    GPUs' /dev/nvidia<minor> are injected (minors read from the mock NVML where the plugin is on it)."""
    pod = devplug_pod(gpus=device_count(devplug_plugin, 2), wait=True)
    ids = pod.allocated_devices
    assert_allocate_injections(
        pod,
        env={"NVIDIA_VISIBLE_DEVICES": lambda v: sorted(v.split(",")) == ids},
        device_nodes=["/dev/nvidiactl"],
    )
    listing = pod.exec("ls", "/dev").stdout.split()
    if devplug_plugin.has_mock:
        minors = sorted(int(g["minor"]) for g in devplug_plugin.mock.state["gpus"] if g["uuid"] in ids)
        for m in minors:
            assert f"nvidia{m}" in listing, f"/dev/nvidia{m} missing from ls /dev: {listing}"
    else:
        gpus = [n for n in listing if n.startswith("nvidia") and n[6:].isdigit()]
        assert len(gpus) == len(ids), f"{len(ids)} GPUs assigned, /dev lists {gpus}"


def test_failing_allocate_fails_the_pod(devplug_pod: PodFactory, devplug_faults: FaultInjector) -> None:
    """Allocate returning an error: pod Failed, reason UnexpectedAdmissionError, the kubelet's message."""
    with fault("make Allocate fail"):
        devplug_faults.fail_allocate()
    pod = devplug_pod(gpus=1)
    pod.wait_phase("Failed")
    assert pod.reason == "UnexpectedAdmissionError", f"{pod.reason}: {pod.message}"
    assert (pod.message or "").startswith("Pod was rejected: Allocate failed due to "), pod.message
    assert (pod.message or "").endswith(", which is unexpected"), pod.message
    assert pod.allocated_devices == [], f"a pod whose Allocate failed holds {pod.allocated_devices}"
