"""Registration through the kubelet's plugin watcher, and again after everything that ends a registration.

A DRA driver announces itself with a socket in ``plugins_registry/`` serving ``pluginregistration.Registration``:
``GetInfo`` must name plugin type ``DRAPlugin``, the driver's name and a DRA service the kubelet supports; the
kubelet then connects to the driver's DRA socket. After a kubelet restart the new plugin watcher finds the same
socket; after a driver restart (or a SIGKILL, which leaves the old sockets behind) the driver must serve again
on its sockets; after a registration the kubelet refused, it must stay up so the kubelet's retry registers it.
"""

from __future__ import annotations

import pytest

from pytest_devplug.dra.assertions import (
    assert_driver_registered,
    assert_driver_reregisters_after_kubelet_restart,
    assert_slices_published,
)
from pytest_devplug.dra.handles import DriverHandle

from ._support import waited

#: The DRA services of the kubelet 1.34 (``servicesSupportedByKubelet``).
KUBELET_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


def test_driver_registers_with_the_kubelet(devplug_driver_started: DriverHandle) -> None:
    """The plugin watcher registers the driver under its name and chooses a DRA service the kubelet supports; the
    kubelet connects to the driver's DRA socket. Upstream: every registration of ``dra_test.go``."""
    driver = devplug_driver_started
    assert_driver_registered(driver)
    assert driver.service in KUBELET_SERVICES, f"the kubelet chose {driver.service!r}; it supports {KUBELET_SERVICES}"
    # the watcher records its outcome once the driver answered NotifyRegistrationStatus, after the kubelet's handler
    # registered it (what assert_driver_registered saw): wait for the record, do not read it once
    waited(
        driver.node.registration_events,
        lambda events: any(e.kind == "registered" and e.name == driver.name for e in events),
        f"the watcher's outcomes to hold a registration of {driver.name}",
        driver=driver,
    )


@pytest.mark.devplug_disruptive
def test_reregisters_after_kubelet_restart(devplug_driver: DriverHandle) -> None:
    """Upstream "must register after Kubelet restart": the new kubelet's watcher registers the driver again from its
    socket and connects to it (the slices the new kubelet deletes:
    ``test_node_slices_removed_on_kubelet_start_...``)."""
    assert_driver_reregisters_after_kubelet_restart(devplug_driver)


@pytest.mark.devplug_disruptive
def test_reregisters_after_driver_restart(devplug_driver: DriverHandle) -> None:
    """Upstream "must register after plugin restart": stopped (SIGTERM) and started again, the driver registers and
    publishes the same devices."""
    before = devplug_driver.devices()
    devplug_driver.restart()
    assert_driver_registered(devplug_driver)
    assert_slices_published(devplug_driver)
    after = devplug_driver.devices()
    assert after == before, f"after a restart the driver publishes {after}; before it published {before}"


@pytest.mark.devplug_disruptive
def test_abrupt_kill_then_start_registers_again(devplug_driver: DriverHandle) -> None:
    """SIGKILL: no clean-up runs and the old sockets stay in ``plugins_registry`` and ``plugins``. Started again, the
    driver must serve on its sockets so the kubelet registers and connects to it, publishing the same devices."""
    before = devplug_driver.devices()
    devplug_driver.kill()
    devplug_driver.start()
    assert_driver_registered(devplug_driver)
    after = waited(
        devplug_driver.devices,
        lambda d: d == before,
        "the same devices published after the kill and start",
        driver=devplug_driver,
    )
    assert after == before


@pytest.mark.devplug_disruptive
def test_recovers_after_refused_registration(devplug_driver: DriverHandle) -> None:
    """Upstream "must recover and register after registration failure": the kubelet refuses a registration (it tells
    the driver so through NotifyRegistrationStatus) and tries again after its back-off (0.5 s, doubling). The driver
    must keep its registration socket serving and stay up, so the retry registers it."""
    node, driver = devplug_driver.node, devplug_driver
    reason = "devplug: this registration attempt is refused on purpose"
    restarts = driver.restarts
    node.stop_kubelet()
    try:
        node.refuse_next_registration(reason)
    finally:
        node.start_kubelet()
    waited(
        lambda: [e for e in node.registration_events() if e.kind == "failed" and reason in e.detail],
        bool,
        "the kubelet refusing the driver's registration once",
        driver=driver,
    )
    assert_driver_registered(driver, node.reregistration_timeout)
    assert driver.running and driver.restarts == restarts, (
        f"the driver exited after the refused registration (restarted {driver.restarts - restarts} times since): "
        f"{driver.log()[-2000:]}"
    )
