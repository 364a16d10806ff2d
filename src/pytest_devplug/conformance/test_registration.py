"""Registration: the plugin serves first, then registers v1beta1 with its resource name."""

from __future__ import annotations

import pytest

from pytest_devplug import PluginHandle, assert_registered
from pytest_devplug.assertions import UNLOGGED_PATH, registration_path, watcher_refusals
from pytest_devplug.report import note_check


def test_registers_its_resource(devplug_plugin_started: PluginHandle, request: pytest.FixtureRequest) -> None:
    """The node lists the resource by exactly the name the plugin was configured with, registered either way the
    kubelet takes device plugins: ``Register`` on kubelet.sock, or a socket in ``plugins_registry/`` its plugin
    watcher finds (the report notes which)."""
    devplug_plugin = devplug_plugin_started
    cap, alloc = assert_registered(devplug_plugin)
    capacity = devplug_plugin.node.obj["status"]["capacity"]
    assert devplug_plugin.resource_name in capacity, f"node capacity lists {sorted(capacity)}"
    assert alloc == cap, f"all devices healthy at start, so allocatable should equal capacity: {cap}/{alloc}"
    note_check(
        request.node,
        "registration",
        registration_path(devplug_plugin.node, devplug_plugin.resource_name) or UNLOGGED_PATH,
    )


def test_registration_accepted_without_errors(devplug_plugin: PluginHandle) -> None:
    """The kubelet accepted the registration first time: right version, valid name, plugin already serving (through
    the plugin watcher: its socket answered ``GetInfo`` as a device plugin's must)."""
    assert_registered(devplug_plugin)
    res = devplug_plugin.resource_name
    lines = devplug_plugin.node.kubelet_log().splitlines()
    # Judge the first registration only: later restarts (kubelet, plugin) have their own tests.
    first_ok = next((i for i, ln in enumerate(lines) if "Device plugin connected" in ln and res in ln), len(lines))
    bad = [
        ln
        for ln in lines[:first_ok]
        if res in ln
        and any(
            r in ln
            for r in (
                "Bad registration request",
                "Error connecting to device plugin client",
                "Failed to connect to new client",
            )
        )
    ] + watcher_refusals(lines[:first_ok], res)
    assert not bad, (
        "the kubelet refused a registration of the plugin (wrong version, bad name, or registered before the plugin "
        f"served its socket): {bad}"
    )


def test_devices_listed_match_capacity(devplug_plugin: PluginHandle) -> None:
    """Capacity counts exactly the devices the plugin listed (pod-resources GetAllocatableResources)."""
    cap, alloc = assert_registered(devplug_plugin)
    ids = devplug_plugin.node.device_ids(devplug_plugin.resource_name)
    assert len(ids) == alloc == cap, f"pod-resources lists {len(ids)} devices {ids}; node says {cap}/{alloc}"
    assert len(set(ids)) == len(ids), f"device IDs must be unique: {ids}"
