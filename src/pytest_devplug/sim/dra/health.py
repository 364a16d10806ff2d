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

from pytest_devplug.api.drahealth import v1_pb2 as hpb1
from pytest_devplug.api.drahealth import v1_pb2_grpc as hpb1_grpc
from pytest_devplug.api.drahealth import v1alpha1_pb2 as hpb
from pytest_devplug.api.drahealth import v1alpha1_pb2_grpc as hpb_grpc
from pytest_devplug.sim.endpoint import go_rpc_error

__all__ = [
    "HEALTH_SERVICE_V1",
    "HEALTH_SERVICE_V1ALPHA1",
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
#: The health services' names as plugins list them in GetInfo (``DRAResourceHealthService``).
HEALTH_SERVICE_V1, HEALTH_SERVICE_V1ALPHA1 = "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"
#: ``DefaultHealthTimeout``.
DEFAULT_HEALTH_TIMEOUT_S = 30.0
#: ``wait.UntilWithContext(..., 5*time.Second)`` around each stream.
STREAM_RETRY_PERIOD_S = 5.0
#: ``v1.ResourceHealthMessageMaxLength``: longer messages are cut to this, ending in "...".
MAX_MESSAGE_LENGTH = 1024

#: The health enum's numbers (the same in v1 and v1alpha1).
_STATUS: dict[int, str] = {int(hpb.HEALTHY): HEALTHY, int(hpb.UNHEALTHY): UNHEALTHY}


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
    """``truncateHealthMessage``: Go's ``len`` counts bytes, so the cut is at 1021 bytes, maybe inside a character
    (whose broken bytes JSON then writes as U+FFFD)."""
    data = message.encode()
    return (
        message if len(data) <= MAX_MESSAGE_LENGTH else data[: MAX_MESSAGE_LENGTH - 3].decode(errors="replace") + "..."
    )


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

    def update(
        self, driver: str, response: hpb.NodeWatchResourcesResponse | hpb1.NodeWatchResourcesResponse
    ) -> list[DeviceHealth]:
        """``updateHealthInfo``: apply one stream message; returns the devices whose status changed."""
        changed: list[DeviceHealth] = []
        with self._lock:
            now = self._clock()
            current = self._devices.setdefault(driver, {})
            reported: set[str] = set()
            for d in response.devices:
                timeout = float(d.health_check_timeout_seconds) if d.health_check_timeout_seconds > 0 else 0.0
                new = DeviceHealth(
                    d.device.pool_name,
                    d.device.device_name,
                    _STATUS.get(int(d.health), UNKNOWN),
                    now,
                    timeout,
                    _truncate(d.message),
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
    seconds after it fails or ends, until :meth:`stop`. ``on_change`` gets each message's changed devices.

    ``service``: :data:`HEALTH_SERVICE_V1` or :data:`HEALTH_SERVICE_V1ALPHA1` (the messages are the same, field
    for field; the stream's method name differs). ``stop_on_unimplemented``: a plugin answering Unimplemented is
    not asked again (Kubernetes 1.37+); before, the kubelet retries it every period like any failure."""

    def __init__(
        self,
        driver_name: str,
        channel: Any,
        cache: HealthInfoCache,
        *,
        service: str = HEALTH_SERVICE_V1ALPHA1,
        stop_on_unimplemented: bool = False,
        on_change: Callable[[str, list[DeviceHealth]], None] | None = None,
        retry_period: float = STREAM_RETRY_PERIOD_S,
        logger: logging.Logger | None = None,
    ) -> None:
        self.driver_name = driver_name
        self.service = service
        self._stub: Any = (
            hpb1_grpc.DRAResourceHealthStub(channel)  # type: ignore[no-untyped-call]
            if service == HEALTH_SERVICE_V1
            else hpb_grpc.DRAResourceHealthStub(channel)  # type: ignore[no-untyped-call]
        )
        self._stop_on_unimplemented = stop_on_unimplemented
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
            if self._stop_on_unimplemented and err.code() == grpc.StatusCode.UNIMPLEMENTED:
                self._log.info(
                    "Driver does not support WatchResources health stream, stopping driverName=%s", self.driver_name
                )
                self._stop.set()
            elif not self._stop.is_set():
                self._log.info(
                    "WatchResources health stream failed, will retry driverName=%s: %s",
                    self.driver_name,
                    go_rpc_error(err),
                )
        finally:
            with self._lock:
                self._call = None
            self._cache.clear_driver(self.driver_name)
            if self._on_change is not None and not self._stop.is_set():
                self._on_change(self.driver_name, [])
