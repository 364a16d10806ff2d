"""Device health from DRA plugins: the ``NodeWatchResources`` stream and the kubelet's health cache.

Upstream ``pkg/kubelet/cm/dra/healthinfo.go`` and the stream loop of ``dra_plugin_manager.go``: each
message is the driver's complete device list; the kubelet stamps each reported device with its own
time, trusts a status for the device's ``health_check_timeout_seconds`` (30 s when unset) and then
reads it as Unknown; when the stream ends the driver's devices are forgotten (Unknown); a new stream is
attempted every 5 s for as long as the plugin is registered, whatever the previous attempt's error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from pytest_devplug.api.drahealth import v1alpha1_pb2 as hpb
from pytest_devplug.api.drahealth import v1alpha1_pb2_grpc as hpb_grpc
from pytest_devplug.sim.endpoint import go_rpc_error

__all__ = [
    "HEALTHY",
    "UNHEALTHY",
    "UNKNOWN",
    "DEFAULT_HEALTH_TIMEOUT_S",
    "STREAM_RETRY_PERIOD_S",
    "DeviceHealth",
    "HealthInfoCache",
    "HealthStream",
]

HEALTHY, UNHEALTHY, UNKNOWN = "Healthy", "Unhealthy", "Unknown"
#: ``DefaultHealthTimeout``.
DEFAULT_HEALTH_TIMEOUT_S = 30.0
#: ``wait.UntilWithContext(..., 5*time.Second)`` around each stream.
STREAM_RETRY_PERIOD_S = 5.0
#: ``v1.ResourceHealthMessageMaxLength``: longer messages are cut to this, ending in "...".
MAX_MESSAGE_LENGTH = 1024

_STATUS = {hpb.HEALTHY: HEALTHY, hpb.UNHEALTHY: UNHEALTHY}


@dataclass(frozen=True)
class DeviceHealth:
    """``state.DeviceHealth``: what the kubelet knows about one device (times from ``clock``)."""

    pool_name: str
    device_name: str
    health: str = UNKNOWN
    last_updated: float = 0.0
    #: seconds; 0 means :data:`DEFAULT_HEALTH_TIMEOUT_S`.
    timeout: float = 0.0
    message: str = ""


def _truncate(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE_LENGTH else message[: MAX_MESSAGE_LENGTH - 3] + "..."


class HealthInfoCache:
    """Driver -> ``"<pool>/<device>"`` -> :class:`DeviceHealth`. ``clock`` is injectable so tests
    control staleness instead of waiting 30 s."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        #: driver name -> device key ("<pool>/<device>") -> last reported health
        self._devices: dict[str, dict[str, DeviceHealth]] = {}

    def _timed_out(self, device: DeviceHealth, now: float) -> bool:
        return now - device.last_updated > (device.timeout or DEFAULT_HEALTH_TIMEOUT_S)

    def get(self, driver: str, pool: str, device: str) -> DeviceHealth:
        """``getHealthInfo``: the device's status, Unknown when never reported or stale."""
        with self._lock:
            known = self._devices.get(driver, {}).get(f"{pool}/{device}")
            if known is None or self._timed_out(known, self._clock()):
                return DeviceHealth(pool, device)
            return known

    def update(self, driver: str, response: hpb.NodeWatchResourcesResponse) -> list[DeviceHealth]:
        """``updateHealthInfo``: apply one stream message; returns the devices whose status changed."""
        changed: list[DeviceHealth] = []
        with self._lock:
            now = self._clock()
            current = self._devices.setdefault(driver, {})
            reported: set[str] = set()
            for d in response.devices:
                timeout = float(d.health_check_timeout_seconds) if d.health_check_timeout_seconds > 0 else 0.0
                new = DeviceHealth(
                    d.device.pool_name, d.device.device_name, _STATUS.get(d.health, UNKNOWN), now, timeout, _truncate(d.message)
                )
                key = f"{new.pool_name}/{new.device_name}"
                reported.add(key)
                old = current.get(key)
                if old is None or (old.health, old.message, old.timeout) != (new.health, new.message, new.timeout):
                    changed.append(new)
                current[key] = new
            for key, old in list(current.items()):
                if key not in reported and old.health != UNKNOWN and self._timed_out(old, now):
                    current[key] = DeviceHealth(old.pool_name, old.device_name, UNKNOWN, now, old.timeout)
                    changed.append(current[key])
        return changed

    def clear_driver(self, driver: str) -> None:
        """The stream ended: the driver's devices are Unknown until it reports again."""
        with self._lock:
            self._devices.pop(driver, None)


class HealthStream:
    """Reads ``NodeWatchResources`` of one plugin in a daemon thread, re-opening it every ``retry_period``
    seconds after it fails or ends, until :meth:`stop`. ``on_change`` gets each message's changed devices."""

    def __init__(
        self,
        driver_name: str,
        channel: Any,
        cache: HealthInfoCache,
        *,
        on_change: Callable[[str, list[DeviceHealth]], None] | None = None,
        retry_period: float = STREAM_RETRY_PERIOD_S,
        logger: logging.Logger | None = None,
    ) -> None:
        self.driver_name = driver_name
        self._stub = hpb_grpc.DRAResourceHealthStub(channel)  # type: ignore[no-untyped-call]
        self._cache = cache
        self._on_change = on_change
        self._retry_period = retry_period
        self._log = logger or logging.getLogger(__name__)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._call: Any = None
        #: Streams opened so far (a test reads it to see the retries).
        self.attempts = 0
        self._thread = threading.Thread(target=self._run, name=f"dra-health-{driver_name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._watch_once()
            self._stop.wait(self._retry_period)

    def _watch_once(self) -> None:
        with self._lock:
            if self._stop.is_set():
                return
            self.attempts += 1
            self._call = self._stub.NodeWatchResources(hpb.NodeWatchResourcesRequest())
        try:
            for response in self._call:
                changed = self._cache.update(self.driver_name, response)
                if changed and self._on_change is not None:
                    self._on_change(self.driver_name, changed)
            self._log.info("WatchResources health stream has ended driverName=%s", self.driver_name)
        except grpc.RpcError as err:
            if not self._stop.is_set():
                self._log.info("WatchResources health stream failed, will retry driverName=%s: %s", self.driver_name, go_rpc_error(err))
        finally:
            with self._lock:
                self._call = None
            self._cache.clear_driver(self.driver_name)
            if self._on_change is not None and not self._stop.is_set():
                self._on_change(self.driver_name, [])
