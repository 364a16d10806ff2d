"""The kubelet's device-health cache: staleness by the device's timeout (clock under the test's control)."""

from __future__ import annotations

from pytest_devplug.api.drahealth import v1alpha1_pb2 as hpb
from pytest_devplug.sim.dra.health import DEFAULT_HEALTH_TIMEOUT_S, MAX_MESSAGE_LENGTH, HealthInfoCache


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _msg(*devices: tuple[str, int, int, str]) -> hpb.NodeWatchResourcesResponse:
    return hpb.NodeWatchResourcesResponse(
        devices=[
            hpb.DeviceHealth(
                device=hpb.DeviceIdentifier(pool_name="pool", device_name=d),
                health=h,
                health_check_timeout_seconds=t,
                message=m,
            )
            for d, h, t, m in devices
        ]
    )


def test_status_goes_unknown_after_its_timeout() -> None:
    clock = Clock()
    cache = HealthInfoCache(clock)
    changed = cache.update("drv", _msg(("a", hpb.UNHEALTHY, 0, "xid 79"), ("b", hpb.HEALTHY, 5, "")))
    assert [(c.device_name, c.health, c.message) for c in changed] == [
        ("a", "Unhealthy", "xid 79"),
        ("b", "Healthy", ""),
    ]
    assert cache.update("drv", _msg(("a", hpb.UNHEALTHY, 0, "xid 79"), ("b", hpb.HEALTHY, 5, ""))) == []  # no change
    clock.now += 6
    assert cache.get("drv", "pool", "b").health == "Unknown"  # its own 5 s timeout
    assert cache.get("drv", "pool", "a").health == "Unhealthy"  # the default 30 s
    clock.now += DEFAULT_HEALTH_TIMEOUT_S
    assert cache.get("drv", "pool", "a").health == "Unknown"
    assert cache.get("drv", "pool", "never").health == "Unknown"


def test_unreported_stale_devices_become_unknown_and_messages_are_cut() -> None:
    clock = Clock()
    cache = HealthInfoCache(clock)
    cache.update("drv", _msg(("a", hpb.HEALTHY, 1, ""), ("b", hpb.HEALTHY, 0, "")))
    clock.now += 2
    changed = cache.update("drv", _msg(("b", hpb.UNHEALTHY, 0, "x" * (MAX_MESSAGE_LENGTH + 10))))
    assert {(c.device_name, c.health) for c in changed} == {("a", "Unknown"), ("b", "Unhealthy")}
    message = cache.get("drv", "pool", "b").message
    assert len(message) == MAX_MESSAGE_LENGTH and message.endswith("...")
    cache.clear_driver("drv")
    assert cache.get("drv", "pool", "b").health == "Unknown"
