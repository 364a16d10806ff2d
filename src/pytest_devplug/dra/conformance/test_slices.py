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
from pytest_devplug.dra.resyncwatch import ResyncWatch, assert_slices_back_after_an_update_then_a_kubelet_start
from pytest_devplug.kubeletmodel.periods import DRA_WIPING_DELAY_S

from ._support import consistently, short_dra_timings, waited


def test_slices_published(devplug_driver: DriverHandle) -> None:
    """The driver publishes ResourceSlices for this node (``spec.nodeName``) under its name, holding its devices in
    complete pools; each device name is unique in its pool."""
    devices = assert_slices_published(devplug_driver)
    assert len(devices) == len(set(devices)), f"a device is published twice in one pool: {devices}"
    for s in devplug_driver.slices():
        assert s.node == devplug_driver.node.name, (
            f"slice {s.name} is for node {s.node}, not {devplug_driver.node.name}"
        )


@pytest.mark.devplug_dra_resync
def test_node_slices_removed_on_kubelet_start_then_published_again(
    devplug_dra_resync: ResyncWatch, devplug_driver: DriverHandle
) -> None:
    """Upstream "must be removed on kubelet startup": a slice of the node left from before (another driver's, planted
    while the kubelet was down) is deleted when the kubelet starts, a slice of another node is not; the driver's own
    slices, deleted with them, must be published again by the driver (the scheduler allocates nothing on the node
    until then): within 90 s, as a driver on upstream's ``kubeletplugin`` helper resyncs 30 s after the deletion or
    once the slice it made is a minute old. Run on a second copy of the driver on a node of its own whose kubelet
    restarted when the suite began, so the wait overlaps the other checks; where the backend has no node to spare,
    on the node under test, here."""
    devplug_dra_resync.verdict(devplug_driver)


@pytest.mark.devplug_disruptive
@pytest.mark.upstream_library_bug
def test_slices_come_back_after_an_update_then_a_kubelet_start(devplug_driver: DriverHandle) -> None:
    """kubernetes/kubernetes#140011, forced: a driver restarted (a rolling upgrade) finds its slice other than it
    publishes (the harness dropped a device while it was down) and updates it in place; the kubelet restarts right
    after, and its start deletes the node's slices. The driver must publish its devices again within 90 s, as after
    any deletion. Drivers on upstream's ``kubeletplugin`` library up to v0.37 lose them for good: its cache keeps the
    updated slice and hides the deletion (fixed in v0.38 by kubernetes/kubernetes#140063). Marked
    ``upstream_library_bug``: a driver's CI may deselect it knowingly (``-m "not upstream_library_bug"``) until it can
    upgrade."""
    assert_slices_back_after_an_update_then_a_kubelet_start(devplug_driver)


@pytest.mark.devplug_disruptive
def test_slices_removed_after_driver_stops(devplug_driver: DriverHandle) -> None:
    """Upstream "must be removed after plugin unregistration": once the driver has been gone for the wiping delay
    (shortened to 1 s where the backend can; 30 s on a real kubelet), the kubelet deletes its slices, and they stay
    deleted."""
    assert_slices_published(devplug_driver)
    with short_dra_timings(devplug_driver, wiping_delay=1.0) as periods:
        delay = periods["wiping_delay"]
        devplug_driver.stop()
        waited(
            devplug_driver.slices,
            lambda s: not s,
            f"the driver's slices deleted {delay:g} s after it stopped",
            driver=devplug_driver,
            timeout=devplug_driver.node.timeout + delay,
        )
        consistently(devplug_driver.slices, lambda s: not s, "no slices of the stopped driver")


@pytest.mark.devplug_disruptive
def test_slices_kept_when_driver_restarts_quickly(devplug_driver: DriverHandle) -> None:
    """Upstream "must not be removed if plugin restarts quickly enough": a driver stopped and started again within the
    wiping delay (30 s) finds its slices in place and keeps them: the same objects (name, UID) with the same pools and
    devices, never deleted and made again, or every restart makes the scheduler see its devices vanish and come back.
    (Upstream compares whole objects; an update in place, e.g. its devices listed in another order, is not a
    removal.)"""

    def kept() -> list[tuple[str, str, str, frozenset[str]]]:
        return [(s.name, s.uid, s.pool, frozenset(s.devices)) for s in devplug_driver.slices()]

    with short_dra_timings(devplug_driver, wiping_delay=DRA_WIPING_DELAY_S):
        before = kept()
        devplug_driver.stop()
        devplug_driver.start()
        assert_driver_registered(devplug_driver)
        consistently(kept, lambda now: now == before, f"the slices kept as they were before the restart, {before}")
