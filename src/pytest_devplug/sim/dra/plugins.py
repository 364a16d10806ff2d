"""The registered DRA plugins of one kubelet (upstream ``DRAPluginManager``).

The plugin watcher hands it each ``DRAPlugin`` registration
(:class:`~pytest_devplug.sim.pluginwatcher.PluginHandler`'s upstream method names). It picks the service to call
(the first of the plugin's list the kubelet supports), keeps one client per (driver, endpoint), watches whether
each is connected and, through the narrow :class:`ResourceSliceWiper` seam (the API server plugs in there),
deletes all of the node's ResourceSlices once at start and a driver's slices ``wiping_delay`` seconds after its
last plugin went away or lost its connection, unless one comes back first.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from pytest_devplug.sim.dra.client import (
    CLIENT_CALL_TIMEOUT_S,
    SERVICES_SUPPORTED_BY_KUBELET,
    CallObserver,
    DRAPluginClient,
)
from pytest_devplug.kubeletmodel.releases import KubeVersion
from pytest_devplug.kubeletmodel.periods import DRA_WIPING_DELAY_S
from pytest_devplug.sim.dra.health import (
    HEALTH_SERVICE_V1,
    HEALTH_SERVICE_V1ALPHA1,
    STREAM_RETRY_PERIOD_S,
    DeviceHealth,
    HealthInfoCache,
    HealthStream,
)
from pytest_devplug.errors import DRAPluginError

__all__ = [
    "ResourceSliceWiper",
    "DRAPluginManager",
    "go_quote_list",
]


class ResourceSliceWiper(Protocol):
    """Deletes ResourceSlices through the API server (``DeleteCollection`` by field selector
    ``spec.nodeName`` [+ ``spec.driver``]). Raise to have the call retried."""

    def delete_resource_slices(self, node_name: str, driver: str | None) -> None: ...


def go_quote_list(values: Sequence[str]) -> str:
    """fmt's ``%q`` of a Go ``[]string``: ``["a" "b"]``."""
    return "[" + " ".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "]"


class DRAPluginManager:
    """Registered DRA plugins by driver, in registration order; implements
    :class:`~pytest_devplug.sim.pluginwatcher.PluginHandler`."""

    def __init__(
        self,
        node_name: str,
        *,
        wiper: ResourceSliceWiper | None = None,
        wiping_delay: float = DRA_WIPING_DELAY_S,
        health_cache: HealthInfoCache | None = None,
        on_health_change: Callable[[str, list[DeviceHealth]], None] | None = None,
        health_retry_period: float = STREAM_RETRY_PERIOD_S,
        path_of_endpoint: Callable[[str], Path] = Path,
        on_call: CallObserver | None = None,
        logger: logging.Logger | None = None,
        kube: KubeVersion | None = None,
    ) -> None:
        self.node_name = node_name
        #: The release whose registration and health-service rules apply.
        self.kube = kube or KubeVersion.of()
        self._wiper = wiper
        #: Seconds a driver's slices outlive its last plugin (``defaultWipingDelay``); a new value applies to
        #: the wipes scheduled after it is set.
        self.wiping_delay = wiping_delay
        self._on_call = on_call
        self._health_cache = health_cache
        self._on_health_change = on_health_change
        self._health_retry_period = health_retry_period
        #: Maps an endpoint as the plugin wrote it to the socket the kubelet dials (a plugin in its own
        #: mount namespace names /var/lib/kubelet/plugins/...).
        self._path_of_endpoint = path_of_endpoint
        self._log = logger or logging.getLogger(__name__)
        self._lock = threading.RLock()
        self._stopped = threading.Event()
        #: driver name -> its plugins, oldest first
        self._store: dict[str, list[DRAPluginClient]] = {}
        #: plugin -> its health stream
        self._streams: dict[DRAPluginClient, HealthStream] = {}
        #: driver name -> timer that wipes its slices
        self._pending_wipes: dict[str, threading.Timer] = {}
        #: Wipes done so far as (driver or None for all); read by tests and evidence.
        self.wiped: list[str | None] = []
        #: Set once the startup wipe of every slice of the node went through.
        self.startup_wiped = threading.Event()
        self._startup = threading.Thread(target=self._wipe, args=(None,), name="dra-startup-wipe", daemon=True)
        self._startup.start()

    # --- PluginHandler --------------------------------------------------------------------------

    def _choose_service(self, name: str, endpoint: str, versions: Sequence[str]) -> str:
        prefix = f"invalid supported gRPC versions of DRA driver plugin {name} at endpoint {endpoint}: "
        if not versions:
            raise DRAPluginError(prefix + "empty list of supported gRPC services (aka supported versions)")
        for service in versions:
            if service in SERVICES_SUPPORTED_BY_KUBELET:
                return service
        raise DRAPluginError(
            prefix + f"none of services supported by the plugin ({go_quote_list(versions)}) "
            f"are supported by the kubelet ({go_quote_list(SERVICES_SUPPORTED_BY_KUBELET)})"
        )

    def _health_service(self, versions: Sequence[str]) -> str:
        """The health service the kubelet watches (empty: none). From 1.37 only one the plugin lists, v1 first
        (``pickHealthService``); before, v1alpha1 on every plugin, listed or not."""
        if not self.kube.has("dra-health-v1"):
            return HEALTH_SERVICE_V1ALPHA1
        return next((s for s in (HEALTH_SERVICE_V1, HEALTH_SERVICE_V1ALPHA1) if s in versions), "")

    def validate_plugin(self, name: str, endpoint: str, versions: Sequence[str]) -> None:
        self._choose_service(name, endpoint, versions)

    def register_plugin(self, name: str, endpoint: str, versions: Sequence[str], timeout: float | None) -> None:
        service = self._choose_service(name, endpoint, versions)
        with self._lock:
            if any(p.endpoint == self._path_of_endpoint(endpoint) for p in self._store.get(name, [])):
                raise DRAPluginError(f"endpoint {endpoint} already registered for DRA driver plugin {name}")
            plugin = DRAPluginClient(
                name,
                self._path_of_endpoint(endpoint),
                service,
                call_timeout=CLIENT_CALL_TIMEOUT_S if timeout is None else timeout,
                on_connection_change=lambda _p, _c: self._sync(name),
                on_call=self._on_call,
                logger=self._log,
            )
            self._store.setdefault(name, []).append(plugin)
            health_service = self._health_service(versions)
            if self._health_cache is not None and health_service:
                stream = HealthStream(
                    name,
                    plugin.channel,
                    self._health_cache,
                    service=health_service,
                    stop_on_unimplemented=self.kube.has("dra-health-v1"),
                    on_change=self._on_health_change,
                    retry_period=self._health_retry_period,
                    logger=self._log,
                )
                self._streams[plugin] = stream
                stream.start()
            self._log.info(
                "Registered DRA plugin driverName=%s endpoint=%s chosenService=%s numPlugins=%d",
                name,
                endpoint,
                service,
                len(self._store[name]),
            )
            self._sync(name)

    def deregister_plugin(self, name: str, endpoint: str) -> None:
        with self._lock:
            plugins = self._store.get(name, [])
            plugin = next((p for p in plugins if p.endpoint == self._path_of_endpoint(endpoint)), None)
            if plugin is None:
                return
            plugins.remove(plugin)
            if not plugins:
                del self._store[name]
            stream = self._streams.pop(plugin, None)
            self._log.info(
                "Unregistered DRA plugin driverName=%s endpoint=%s numPlugins=%d", name, endpoint, len(plugins)
            )
            self._sync(name)
        if stream is not None:
            stream.stop()
        plugin.close()

    # --- lookups --------------------------------------------------------------------------------

    def get_plugin(self, driver_name: str) -> DRAPluginClient:
        """The newest connected plugin of the driver, else its newest one (upstream's heuristic)."""
        if not driver_name:
            raise DRAPluginError("DRA driver name is empty")
        with self._lock:
            plugins = list(self._store.get(driver_name, []))
        if not plugins:
            raise DRAPluginError(f"DRA driver {driver_name} is not registered")
        return next((p for p in reversed(plugins) if p.connected), plugins[-1])

    def registered(self) -> dict[str, list[str]]:
        """Driver name -> endpoints of its plugins, oldest first."""
        with self._lock:
            return {name: [str(p.endpoint) for p in plugins] for name, plugins in self._store.items()}

    def pending_wipes(self) -> list[str]:
        """Drivers whose slices will be wiped unless a plugin of theirs connects first."""
        with self._lock:
            return sorted(self._pending_wipes)

    def usable(self, driver_name: str) -> bool:
        with self._lock:
            return any(p.connected for p in self._store.get(driver_name, []))

    # --- slice wiping ---------------------------------------------------------------------------

    def _sync(self, driver_name: str) -> None:
        """Cancel a pending wipe when the driver is usable; otherwise make sure one is pending."""
        if self._wiper is None or self._stopped.is_set():
            return
        with self._lock:
            pending = self._pending_wipes.get(driver_name)
            if self.usable(driver_name):
                if pending is not None:
                    pending.cancel()
                    del self._pending_wipes[driver_name]
                return
            if pending is not None:
                return  # the first deadline stands
            timer = threading.Timer(self.wiping_delay, self._wipe_later, args=(driver_name,))
            timer.daemon = True
            self._pending_wipes[driver_name] = timer
            timer.start()

    def _wipe_later(self, driver_name: str) -> None:
        with self._lock:
            self._pending_wipes.pop(driver_name, None)
        self._wipe(driver_name)

    def _wipe(self, driver_name: str | None) -> None:
        """Delete the slices, retrying with upstream's backoff (1 s doubling, capped at 5 min) until it
        works or the manager stops."""
        if self._wiper is None:
            self.startup_wiped.set()
            return
        delay = 1.0
        while not self._stopped.is_set():
            try:
                self._wiper.delete_resource_slices(self.node_name, driver_name)
            except Exception as exc:  # noqa: BLE001 - any API failure is retried, as upstream does
                self._log.info(
                    "Deleting ResourceSlice failed, retrying node=%s driver=%s: %s", self.node_name, driver_name, exc
                )
                self._stopped.wait(delay)
                delay = min(delay * 2, 300.0)
                continue
            self._log.info("Deleted ResourceSlices node=%s driver=%s", self.node_name, driver_name or "(all)")
            with self._lock:
                self.wiped.append(driver_name)
            if driver_name is None:
                self.startup_wiped.set()
            return

    def stop(self) -> None:
        """Close every connection, end health streams, cancel pending wipes (``Stop``)."""
        self._stopped.set()
        with self._lock:
            for timer in self._pending_wipes.values():
                timer.cancel()
            self._pending_wipes.clear()
            plugins = [p for ps in self._store.values() for p in ps]
            streams = list(self._streams.values())
            self._store.clear()
            self._streams.clear()
        for stream in streams:
            stream.stop()
        for plugin in plugins:
            plugin.close()
        self._startup.join(timeout=5.0)
