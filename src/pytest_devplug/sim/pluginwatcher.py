"""The kubelet's plugin watcher on ``<kubelet root>/plugins_registry/`` (upstream ``pkg/kubelet/pluginmanager``).

A plugin announces itself by creating a Unix socket there that serves ``pluginregistration.Registration``.
For each socket (hidden names skipped, subdirectories walked) the watcher dials it (10 s), asks
``GetInfo`` (1 s), hands the info to the handler of its type (``DevicePlugin``: the device manager;
``DRAPlugin``: the DRA plugin manager), with an empty endpoint meaning the registration socket itself, and
tells the plugin the verdict through
``NotifyRegistrationStatus`` (5 s). A failed attempt is retried with upstream's backoff (0.5 s
doubling to 2 min 2 s); a socket that goes away is deregistered; one that is replaced (new inode or
mtime) is deregistered and registered again. Upstream learns of sockets through fsnotify and
reconciles every second; this watcher scans every ``poll_interval`` seconds, and each registration
runs in its own thread so a stuck plugin delays nobody else.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, Protocol

import grpc

from pytest_devplug.api.pluginregistration import v1_pb2 as rpb
from pytest_devplug.kubeletmodel.releases import KubeVersion
from pytest_devplug.api.pluginregistration import v1_pb2_grpc as rpb_grpc
from pytest_devplug.sim.dial import plugin_channel
from pytest_devplug.sim.endpoint import go_rpc_error
from pytest_devplug.errors import PluginHandlerError

__all__ = [
    "DEVICE_PLUGIN_TYPE",
    "DRA_PLUGIN_TYPE",
    "DIAL_TIMEOUT_S",
    "GET_INFO_TIMEOUT_S",
    "NOTIFY_TIMEOUT_S",
    "PluginHandler",
    "RegistrationEvent",
    "PluginWatcher",
]

#: ``pluginwatcherapi.DevicePlugin`` and ``DRAPlugin``: the ``type`` a plugin names in ``GetInfo``.
DEVICE_PLUGIN_TYPE = "DevicePlugin"
DRA_PLUGIN_TYPE = "DRAPlugin"
DIAL_TIMEOUT_S = 10.0
GET_INFO_TIMEOUT_S = 1.0
NOTIFY_TIMEOUT_S = 5.0
#: nestedpendingoperations: initialDurationBeforeRetry, maxDurationBeforeRetry
_BACKOFF_START_S = 0.5
_BACKOFF_MAX_S = 122.0


class PluginHandler(Protocol):
    """``cache.PluginHandler``: what the plugin watcher calls for one plugin type; refusals raise
    :class:`PluginHandlerError`."""

    def validate_plugin(self, name: str, endpoint: str, versions: Sequence[str]) -> None: ...

    def register_plugin(self, name: str, endpoint: str, versions: Sequence[str], timeout: float | None) -> None: ...

    def deregister_plugin(self, name: str, endpoint: str) -> None: ...


@dataclass(frozen=True)
class RegistrationEvent:
    """One outcome the watcher reached: ``kind`` is "registered", "failed" or "deregistered"; ``plugin_type`` is
    what ``GetInfo`` said ("" when the plugin never answered it)."""

    kind: str
    socket: str
    name: str = ""
    detail: str = ""
    at: float = field(default_factory=time.monotonic)
    plugin_type: str = ""


@dataclass
class _Socket:
    identity: tuple[int, int]
    #: (plugin type, name, endpoint) once registered
    registered: tuple[str, str, str] | None = None
    in_flight: bool = False
    next_attempt: float = 0.0
    backoff: float = 0.0


class _RegistrationFailed(Exception):
    """An attempt failed; the text is what the plugin is told (and what the kubelet logs). ``kept``: the plugin
    stays in the watcher's actual state anyway, so it is not tried again until its socket is made anew (a failed
    ``RegisterPlugin`` before 1.36)."""

    def __init__(self, error: str, kept: tuple[str, str, str] | None = None, plugin_type: str = "") -> None:
        super().__init__(error)
        self.kept = kept
        self.plugin_type = plugin_type


class PluginWatcher:
    """Registers the plugins whose sockets appear in ``registry_dir``; ``handlers`` by plugin type."""

    def __init__(
        self,
        registry_dir: Path,
        handlers: Mapping[str, PluginHandler],
        *,
        poll_interval: float = 0.1,
        logger: logging.Logger | None = None,
        kube: KubeVersion | None = None,
    ) -> None:
        self.registry_dir = registry_dir
        #: Whether a failed RegisterPlugin or NotifyRegistrationStatus(true) is retried (1.36+).
        self._retry = (kube or KubeVersion.of()).has("pluginwatcher-retry")
        self._handlers = dict(handlers)
        self._poll_interval = poll_interval
        self._log = logger or logging.getLogger(__name__)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        #: socket path -> what the watcher knows of it
        self._sockets: dict[str, _Socket] = {}
        #: Every outcome, oldest first (tests and evidence read it).
        self.events: list[RegistrationEvent] = []
        self._thread: threading.Thread | None = None
        self._workers: list[threading.Thread] = []

    def start(self) -> None:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._loop, name="plugin-watcher", daemon=True)
        self._thread.start()
        self._log.info("Plugin Watcher Start path=%s", self.registry_dir)

    def stop(self) -> None:
        """Stop watching; plugins stay registered with their handlers (the kubelet is going away)."""
        self._stop.set()
        for t in [self._thread, *self._workers]:
            if t is not None and t is not threading.current_thread():
                t.join(timeout=DIAL_TIMEOUT_S + GET_INFO_TIMEOUT_S + NOTIFY_TIMEOUT_S)

    def events_for(self, socket: Path | str) -> list[RegistrationEvent]:
        with self._lock:
            return [e for e in self.events if e.socket == str(socket)]

    # --- scanning -------------------------------------------------------------------------------

    def _scan(self) -> dict[str, tuple[int, int]]:
        found: dict[str, tuple[int, int]] = {}
        for root, dirs, files in os.walk(self.registry_dir):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for name in files:
                if name.startswith("."):
                    continue
                path = os.path.join(root, name)
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    continue
                if stat.S_ISSOCK(st.st_mode):
                    found[path] = (st.st_ino, st.st_mtime_ns)
        return found

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._reconcile(self._scan())
            self._stop.wait(self._poll_interval)

    def _reconcile(self, found: dict[str, tuple[int, int]]) -> None:
        now = time.monotonic()
        with self._lock:
            for path, known in list(self._sockets.items()):
                if known.in_flight:
                    continue
                if found.get(path) != known.identity:
                    if known.registered is not None:
                        self._deregister(path, known.registered)
                    del self._sockets[path]
            for path, identity in found.items():
                known = self._sockets.setdefault(path, _Socket(identity))
                if known.registered is None and not known.in_flight and now >= known.next_attempt:
                    known.in_flight = True
                    worker = threading.Thread(target=self._register, args=(path,), name="plugin-register", daemon=True)
                    self._workers = [w for w in self._workers if w.is_alive()] + [worker]
                    worker.start()

    def _deregister(self, path: str, registered: tuple[str, str, str]) -> None:
        kind, name, endpoint = registered
        self._log.info("DeRegisterPlugin pluginName=%s endpoint=%s socket=%s", name, endpoint, path)
        self._handlers[kind].deregister_plugin(name, endpoint)
        self.events.append(RegistrationEvent("deregistered", path, name, plugin_type=kind))

    # --- one registration -----------------------------------------------------------------------

    def _register(self, path: str) -> None:
        registered: tuple[str, str, str] | None = None
        detail = plugin_type = ""
        try:
            registered = self._attempt(path)
            plugin_type = registered[0]
        except _RegistrationFailed as exc:
            detail, plugin_type = str(exc), exc.plugin_type
            registered = exc.kept
            self._log.error("RegisterPlugin error -- failed socket=%s: %s", path, detail)
        with self._lock:
            known = self._sockets.get(path)
            if known is None or self._stop.is_set():
                # the socket went away meanwhile: undo a registration nobody will deregister
                if registered is not None:
                    self._handlers[registered[0]].deregister_plugin(registered[1], registered[2])
                return
            known.in_flight = False
            if registered is not None:
                known.registered, known.backoff = registered, 0.0
                self.events.append(
                    RegistrationEvent(
                        "failed" if detail else "registered",
                        path,
                        registered[1],
                        detail=detail,
                        plugin_type=plugin_type,
                    )
                )
            else:
                known.backoff = min(_BACKOFF_MAX_S, known.backoff * 2 or _BACKOFF_START_S)
                known.next_attempt = time.monotonic() + known.backoff
                self.events.append(RegistrationEvent("failed", path, detail=detail, plugin_type=plugin_type))

    def _attempt(self, path: str) -> tuple[str, str, str]:
        channel: Any = plugin_channel(path)
        try:
            try:
                grpc.channel_ready_future(channel).result(timeout=DIAL_TIMEOUT_S)
            except grpc.FutureTimeoutError:
                raise _RegistrationFailed(
                    f"RegisterPlugin error -- dial failed at socket {path}, err: context deadline exceeded"
                ) from None
            stub = rpb_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            try:
                info: rpb.PluginInfo = stub.GetInfo(rpb.InfoRequest(), timeout=GET_INFO_TIMEOUT_S)
            except grpc.RpcError as err:
                raise _RegistrationFailed(
                    f"RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {path}, "
                    f"err: {go_rpc_error(err)}"
                ) from None
            handler = self._handlers.get(info.type)
            if handler is None:
                self._refuse(
                    stub,
                    f"RegisterPlugin error -- no handler registered for plugin type: {info.type} at socket {path}",
                    plugin_type=info.type,
                )
            endpoint = info.endpoint or path
            versions = list(info.supported_versions)
            try:
                handler.validate_plugin(info.name, endpoint, versions)
            except PluginHandlerError as err:
                self._refuse(
                    stub, f"RegisterPlugin error -- plugin validation failed with err: {err}", plugin_type=info.type
                )
            identity = (info.type, info.name, endpoint)
            try:
                handler.register_plugin(info.name, endpoint, versions, None)
            except PluginHandlerError as err:
                # Before 1.36 the plugin was added to the actual state first and stays there: never retried.
                self._refuse(
                    stub,
                    f"RegisterPlugin error -- plugin registration failed with err: {err}",
                    None if self._retry else identity,
                    plugin_type=info.type,
                )
            try:
                stub.NotifyRegistrationStatus(rpb.RegistrationStatus(plugin_registered=True), timeout=NOTIFY_TIMEOUT_S)
            except grpc.RpcError as err:
                error = (
                    f"RegisterPlugin error -- failed to send registration status at socket {path}, "
                    f"err: {go_rpc_error(err)}"
                )
                if self._retry:  # 1.36+: out of the actual state, deregistered, tried again
                    handler.deregister_plugin(info.name, endpoint)
                    raise _RegistrationFailed(error, plugin_type=info.type) from None
                self._log.error("%s", error)  # before: the registration stays, only logged
            self._log.info(
                "Register plugin pluginName=%s type=%s endpoint=%s socket=%s", info.name, info.type, endpoint, path
            )
            return identity
        finally:
            channel.close()

    def _refuse(
        self, stub: Any, error: str, kept: tuple[str, str, str] | None = None, *, plugin_type: str = ""
    ) -> NoReturn:
        """Tell the plugin it is not registered and why; the attempt ends with ``error`` (``kept``: see
        :class:`_RegistrationFailed`)."""
        try:
            stub.NotifyRegistrationStatus(
                rpb.RegistrationStatus(plugin_registered=False, error=error), timeout=NOTIFY_TIMEOUT_S
            )
        except grpc.RpcError as err:
            self._log.error("failed to send registration status: %s", go_rpc_error(err))
        raise _RegistrationFailed(error, kept, plugin_type)
