"""NVML health events, as NVML plugins that monitor health treat them (convention ``nvml-xid``).

A critical Xid makes that GPU Unhealthy — every device the plugin backs with it (replicas of a shared
GPU, MIG devices): a GPU that fell off the bus serves none of them. The Xids NVIDIA documents as
application errors (13, 31, 43, 45, 68, 109) leave it Healthy. The kubelet requires no health checking,
so these are one plugin family's policy (NVIDIA's k8s-device-plugin, the included plugin), run only for
a plugin that declares ``nvml-xid``. They need the mock NVML (``--devplug-mock``): they write Xid events
into its state, which the mock ``libnvidia-ml.so.1`` delivers through ``nvmlEventSetWait``; without it
they skip, saying so (``--devplug-missing-faults=fail``: fail).
"""

from __future__ import annotations

import pytest

from pytest_devplug import MockNvml, PluginHandle, assert_devices_unhealthy
from pytest_devplug.errors import UnknownBackingError
from pytest_devplug.settings import DevplugSettings

from ._support import wait_marked_unhealthy

APPLICATION_XIDS = (13, 31, 43, 45, 68, 109)


@pytest.fixture
def devplug_mock(devplug_plugin: PluginHandle, devplug_settings: DevplugSettings) -> MockNvml:
    """The mock NVML's controls for the plugin under test (its edits get the plugin redeployed after the test)."""
    if not devplug_plugin.has_mock:
        reason = "needs the mock-NVML controls (--devplug-mock): the test writes Xid events into its state"
        if devplug_settings.missing_faults == "fail":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return devplug_plugin.mock


def _gpus_with_devices(mock: MockNvml, needed: int) -> list[tuple[str, list[str]]]:
    """Mock GPUs that back at least one advertised device, with those devices; skips when fewer than ``needed``."""
    try:
        backed = mock.backed_devices()
    except UnknownBackingError as exc:
        pytest.skip(f"cannot judge a GPU fault per device: {exc}")
    found = [(uuid, ids) for uuid, ids in backed.items() if ids]
    if len(found) < needed:
        pytest.skip(f"needs {needed} mock GPUs backing advertised devices; found {len(found)}: {backed}")
    return found


@pytest.mark.devplug_convention("nvml-xid")
def test_critical_xid_turns_that_gpu_unhealthy(devplug_plugin: PluginHandle, devplug_mock: MockNvml) -> None:
    """Xid 79 (GPU fell off the bus) on one GPU: every device it backs goes Unhealthy, capacity stays."""
    n = devplug_plugin.node.capacity(devplug_plugin.resource_name)
    (victim, doomed), *others = _gpus_with_devices(devplug_mock, 1)
    devplug_mock.inject_xid(victim, 79)
    assert_devices_unhealthy(
        devplug_plugin, doomed, kept=[d for _, ids in others for d in ids], capacity=n, cause=f"Xid 79 on {victim}"
    )


@pytest.mark.devplug_convention("nvml-xid")
def test_application_xids_leave_the_gpu_healthy(devplug_plugin: PluginHandle, devplug_mock: MockNvml) -> None:
    """Every application-error Xid on one GPU, then Xid 79 on another: only the second one's devices go Unhealthy.

    The critical Xid, delivered after the others, is the evidence that they were handled (no sleeping).
    """
    n = devplug_plugin.node.capacity(devplug_plugin.resource_name)
    (spared, kept), (victim, doomed), *_ = _gpus_with_devices(devplug_mock, 2)
    for xid in APPLICATION_XIDS:
        devplug_mock.inject_xid(spared, xid)
    devplug_mock.inject_xid(victim, 79)
    # Whether Xid 79 reaches all of the victim's devices is the check above; here its first effect is the proof
    # that the earlier events were handled.
    wait_marked_unhealthy(devplug_plugin, doomed, capacity=n)
    ids = devplug_plugin.node.device_ids(devplug_plugin.resource_name)
    lost = [d for d in kept if d not in ids]
    assert not lost, f"Xids {APPLICATION_XIDS} (application errors) on {spared} made {lost} Unhealthy"
