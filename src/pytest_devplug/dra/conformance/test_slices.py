"""ResourceSlices: what the driver publishes for its node, and what the kubelet wipes.

The scheduler allocates only what ResourceSlices describe, so a driver must publish its node's devices (the API
server validates each slice) and publish them again whenever they are deleted: the kubelet deletes all of its
node's slices when it starts, and a driver's slices ``wiping_delay`` (30 s) after the driver went away. A driver
back within that delay must find its slices in place and leave them as they are.
"""

from __future__ import annotations

import pytest

from pytest_devplug.dra.assertions import assert_driver_registered, assert_slices_published
from pytest_devplug.dra.handles import DriverHandle
from pytest_devplug.dra.objects import RESOURCE_API, list_slices

from ._support import consistently, short_dra_timings, waited

#: The kubelet's ``defaultWipingDelay``.
WIPING_DELAY_S = 30.0


def test_slices_published(devplug_driver: DriverHandle) -> None:
    """The driver publishes ResourceSlices for this node (``spec.nodeName``) under its name, holding its devices in
    complete pools; each device name is unique in its pool."""
    devices = assert_slices_published(devplug_driver)
    assert len(devices) == len(set(devices)), f"a device is published twice in one pool: {devices}"
    for s in devplug_driver.slices():
        assert s.node == devplug_driver.node.name, f"slice {s.name} is for node {s.node}, not {devplug_driver.node.name}"


def _stale_slice(name: str, node: str, driver: str) -> dict[str, object]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "stale-0"}]},
    }  # fmt: skip


@pytest.mark.devplug_disruptive
def test_node_slices_removed_on_kubelet_start_then_published_again(devplug_driver: DriverHandle) -> None:
    """Upstream "must be removed on kubelet startup": a slice of this node left from before (here another driver's)
    is deleted when the kubelet starts, a slice of another node is not; the driver's own slices, deleted with them,
    are published again by the driver."""
    node, rest = devplug_driver.node, devplug_driver.dra.rest
    before = devplug_driver.devices()
    stale, other = f"{node.name}-stale", f"{node.name}-other-node"
    node.stop_kubelet()
    try:
        rest.create(f"{RESOURCE_API}/resourceslices", _stale_slice(stale, node.name, "stale.devplug.io"))
        rest.create(f"{RESOURCE_API}/resourceslices", _stale_slice(other, other, "stale.devplug.io"))
    finally:
        node.start_kubelet()
    try:
        names = waited(lambda: [s.name for s in list_slices(rest, driver="stale.devplug.io")], lambda n: n == [other],
                       "exactly the node's stale slice deleted by the starting kubelet", driver=devplug_driver)  # fmt: skip
        assert names == [other]
        assert_driver_registered(devplug_driver, node.reregistration_timeout)
        after = waited(devplug_driver.devices, lambda d: d == before, "the driver's devices published again after the wipe",
                       driver=devplug_driver, timeout=node.reregistration_timeout)  # fmt: skip
        assert after == before
    finally:
        rest.delete(f"{RESOURCE_API}/resourceslices/{other}")


@pytest.mark.devplug_disruptive
def test_slices_removed_after_driver_stops(devplug_driver: DriverHandle) -> None:
    """Upstream "must be removed after plugin unregistration": once the driver has been gone for the wiping delay
    (shortened to 1 s here; 30 s on a real kubelet), the kubelet deletes its slices, and they stay deleted."""
    assert_slices_published(devplug_driver)
    with short_dra_timings(devplug_driver, wiping_delay=1.0):
        devplug_driver.stop()
        waited(devplug_driver.slices, lambda s: not s, "the driver's slices deleted 1 s after it stopped", driver=devplug_driver)
        consistently(devplug_driver.slices, lambda s: not s, "no slices of the stopped driver")


@pytest.mark.devplug_disruptive
def test_slices_kept_when_driver_restarts_quickly(devplug_driver: DriverHandle) -> None:
    """Upstream "must not be removed if plugin restarts quickly enough": a driver stopped and started again within the
    wiping delay (30 s) finds its slices in place; it must leave them unchanged (same objects, same resourceVersion),
    or every restart makes the scheduler see its devices vanish and come back."""
    with short_dra_timings(devplug_driver, wiping_delay=WIPING_DELAY_S):
        before = [(s.name, s.uid, s.resource_version) for s in devplug_driver.slices()]
        devplug_driver.stop()
        devplug_driver.start()
        assert_driver_registered(devplug_driver)
        consistently(lambda: [(s.name, s.uid, s.resource_version) for s in devplug_driver.slices()], lambda now: now == before,
                     f"the slices as they were before the restart, {before}")  # fmt: skip
