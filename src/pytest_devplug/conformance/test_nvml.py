"""NVML health events, as every NVML plugin on the mock NVML must treat them.

A critical Xid makes that GPU Unhealthy; the Xids NVIDIA documents as application errors (13, 31, 43,
45, 68, 109) leave it Healthy. NVIDIA's k8s-device-plugin and the included plugin agree on both. These
tests need the mock NVML (``--devplug-mock``): they write Xid events into its state, which the mock
``libnvidia-ml.so.1`` delivers through ``nvmlEventSetWait``; for a plugin without it they skip, saying so
(``--devplug-missing-faults=fail``: fail).
"""

from __future__ import annotations

import pytest

from pytest_devplug import MockNvml, PluginHandle, assert_allocatable
from pytest_devplug.plugin import DevplugSettings

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


def test_critical_xid_turns_that_gpu_unhealthy(devplug_plugin: PluginHandle, devplug_mock: MockNvml) -> None:
    """Xid 79 (GPU fell off the bus) on one GPU: allocatable drops by one, capacity stays, that GPU goes."""
    res = devplug_plugin.resource_name
    n = devplug_plugin.node.capacity(res)
    victim = devplug_mock.uuids[0]
    devplug_mock.inject_xid(victim, 79)
    assert_allocatable(devplug_plugin, n - 1, capacity=n)
    assert victim not in devplug_plugin.node.device_ids(res), f"{victim} got Xid 79 and is still allocatable"


def test_application_xids_leave_the_gpu_healthy(devplug_plugin: PluginHandle, devplug_mock: MockNvml) -> None:
    """Every application-error Xid on one GPU, then Xid 79 on another: only the second goes Unhealthy.

    The critical Xid, delivered after the others, is the evidence that they were handled (no sleeping).
    """
    res = devplug_plugin.resource_name
    n = devplug_plugin.node.capacity(res)
    spared, victim = devplug_mock.uuids[:2]
    for xid in APPLICATION_XIDS:
        devplug_mock.inject_xid(spared, xid)
    devplug_mock.inject_xid(victim, 79)
    assert_allocatable(devplug_plugin, n - 1, capacity=n)
    ids = devplug_plugin.node.device_ids(res)
    assert spared in ids, f"Xids {APPLICATION_XIDS} (application errors) made {spared} Unhealthy"
    assert victim not in ids
