"""The DevicePlugin servicer (thin) and the two ways to register: serve -> prove -> ``Register``, or a socket
the kubelet's plugin watcher finds.

Order matters to the kubelet: it dials the endpoint during ``Register``, so the plugin
serves first, proves its own socket answers, then registers. Kubelet restarts are seen by
inotify on the plugin dir (own socket deleted, ``kubelet.sock`` re-created) and answered by
serving again and registering again.

With ``--registration plugins_registry`` (:class:`WatchedPluginServer`) the socket lives in the watcher's
directory and serves ``pluginregistration.Registration`` beside ``DevicePlugin``: the kubelet asks ``GetInfo``
and connects, on every start of its own, so the plugin never calls ``Register`` and has nothing to redo after a
kubelet restart.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
import tenacity

from .allocation import AllocationConfig, AllocationError, container_response, gpu_of, preferred_allocation, replica_ids
from .api.deviceplugin import v1beta1_pb2 as pb
from .api.deviceplugin import v1beta1_pb2_grpc as pb_grpc
from .api.pluginregistration import v1_pb2 as rpb
from .api.pluginregistration import v1_pb2_grpc as rpb_grpc
from .devices import DeviceState, Snapshot
from .watch import IN_CREATE, IN_DELETE, IN_MOVED_FROM, IN_MOVED_TO, Follower, Inotify, InotifyEvent

log = logging.getLogger("devplug_gpu_plugin.server")

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
STREAM_POLL_S = 0.25
#: Bytes of a Unix socket path (``sun_path`` less its terminating NUL).
MAX_SOCKET_PATH = 107


class RegistrationRefused(Exception):
    """The kubelet answered ``Register`` with an error: retrying will not help."""


#: What a kubelet of 1.37+ answers a Register naming a socket it still holds an endpoint for
#: (``pkg/kubelet/cm/devicemanager/manager.go``, PluginConnected).
HELD_SOCKET = "device plugin already connected"
#: How many fresh sockets a plugin tries when the kubelet holds the one it registered with.
FRESH_SOCKET_TRIES = 3


def serve_unix(path: str, add_services: Callable[[Any], None], workers: int) -> Any:
    """A started gRPC server on the Unix socket ``path``, replacing a stale socket file there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpc"))
    add_services(server)
    server.add_insecure_port("unix://" + path)
    server.start()
    return server


def default_socket_name(resource_name: str) -> str:
    """``nvidia.com/gpu`` -> ``devplug-nvidia.com-gpu.sock``: one socket per resource."""
    return "devplug-" + resource_name.replace("/", "-") + ".sock"


def socket_answers(path: str) -> bool:
    """Whether a server accepts connections on the Unix socket ``path`` (a socket file left by a killed
    process refuses them)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def instance_socket_name(plugin_dir: str, resource_name: str) -> str:
    """The default socket name, unless another instance of the plugin serves on it now (a rolling update
    starts the new pod before the old one stops): then a name of this process's own, so that neither
    instance removes the other's socket. A stale file at the default name is taken over."""
    name = default_socket_name(resource_name)
    if not socket_answers(os.path.join(plugin_dir, name)):
        return name
    return f"devplug-{secrets.token_hex(4)}.sock"  # short: a Unix socket path holds 107 bytes


def to_devices(gpu: Any, replicas: int = 1) -> list[pb.Device]:
    """The GPU's device IDs (one, or one per replica), with its health and NUMA node."""
    out = []
    for device_id in replica_ids(gpu.uuid, replicas):
        dev = pb.Device(ID=device_id, health=gpu.health)
        if gpu.info.numa_node is not None:
            dev.topology.nodes.add(ID=gpu.info.numa_node)
        out.append(dev)
    return out


def list_response(snapshot: Snapshot, replicas: int = 1) -> pb.ListAndWatchResponse:
    return pb.ListAndWatchResponse(devices=[d for g in snapshot.gpus for d in to_devices(g, replicas)])


class DevicePluginServicer(pb_grpc.DevicePluginServicer):
    """Maps RPCs onto :mod:`.devices` and :mod:`.allocation`; holds no logic of its own."""

    def __init__(
        self,
        state: DeviceState,
        config: AllocationConfig,
        pre_start_required: bool,
        fault: Callable[[str], str | None] | None,
        stopping: threading.Event,
        *,
        pre_start_fault: Callable[[str], str | None] | None = None,
        member: Callable[[str], bool] | None = None,
    ) -> None:
        self.state = state
        self.config = config
        self.pre_start_required = pre_start_required
        self.fault = fault
        self.pre_start_fault = pre_start_fault
        self.stopping = stopping
        #: Which GPUs (by UUID) this resource advertises; ``None``: all of them (one resource per process).
        self.member = member

    def snapshot(self, snap: Snapshot | None = None) -> Snapshot:
        """The device state as this resource sees it: only its own GPUs."""
        snap = self.state.snapshot() if snap is None else snap
        member = self.member
        return snap if member is None else Snapshot(snap.version, [g for g in snap.gpus if member(g.uuid)])

    def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(
            pre_start_required=self.pre_start_required, get_preferred_allocation_available=True
        )

    def ListAndWatch(self, request: pb.Empty, context: Any) -> Iterator[pb.ListAndWatchResponse]:
        snap = self.snapshot()
        sent = list_response(snap, self.config.replicas)
        log.info(
            "ListAndWatch: sending %d %s devices (version %d)", len(snap.gpus), self.config.resource_name, snap.version
        )
        yield sent
        while context.is_active() and not self.stopping.is_set():
            new = self.state.wait_for_change(snap.version, STREAM_POLL_S)
            if new.version == snap.version:
                continue
            snap = self.snapshot(new)
            resp = list_response(snap, self.config.replicas)
            if resp != sent:  # another resource's GPU changed: nothing new for this stream
                sent = resp
                log.info(
                    "ListAndWatch: sending %d %s devices (version %d)",
                    len(snap.gpus),
                    self.config.resource_name,
                    snap.version,
                )
                yield resp

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        infos = {i: g.info for g in self.snapshot().gpus for i in replica_ids(g.uuid, self.config.replicas)}
        resp = pb.PreferredAllocationResponse()
        for req in request.container_requests:
            ids = preferred_allocation(
                list(req.available_deviceIDs), list(req.must_include_deviceIDs), req.allocation_size, infos
            )
            resp.container_responses.add(deviceIDs=ids)
        return resp

    def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        snap = self.snapshot()
        resp = pb.AllocateResponse()
        try:
            for req in request.container_requests:
                resp.container_responses.append(
                    container_response(list(req.devices_ids), snap, self.config, self.fault)
                )
        except AllocationError as exc:
            log.error("Allocate refused: %s", exc.message)
            code = grpc.StatusCode.INVALID_ARGUMENT if exc.code == "invalid_argument" else grpc.StatusCode.INTERNAL
            context.abort(code, exc.message)
        log.info(
            "Allocate: %s",
            "; ".join(",".join(r.devices_ids) for r in request.container_requests),
        )
        return resp

    def PreStartContainer(self, request: pb.PreStartContainerRequest, context: Any) -> pb.PreStartContainerResponse:
        log.info("PreStartContainer: devices %s", ",".join(request.devices_ids))
        if self.pre_start_fault is not None:
            for uuid in dict.fromkeys(gpu_of(i) for i in request.devices_ids):
                why = self.pre_start_fault(uuid)
                if why:
                    message = f"preparing GPU {uuid} for the container failed: {why}"
                    log.error("PreStartContainer refused: %s", message)
                    context.abort(grpc.StatusCode.INTERNAL, message)
        return pb.PreStartContainerResponse()


@dataclass
class ServerConfig:
    plugin_dir: str
    resource_name: str
    socket_name: str
    pre_start_required: bool = False


class PluginServer:
    """Serves the socket and keeps the plugin registered until :meth:`stop`."""

    def __init__(
        self,
        config: ServerConfig,
        servicer: DevicePluginServicer,
        stopping: threading.Event,
    ) -> None:
        self.config = config
        self.servicer = servicer
        self.stopping = stopping
        #: The socket served and registered now (a fresh one replaces it when the kubelet holds it).
        self.socket_name = config.socket_name
        self.socket_path = os.path.join(config.plugin_dir, config.socket_name)
        self.kubelet_socket = os.path.join(config.plugin_dir, KUBELET_SOCKET)
        self._server: Any = None
        self._kick = threading.Event()
        # Set by inotify when kubelet.sock is created: a new socket may reuse the old inode,
        # so its identity alone cannot tell a restarted kubelet from the one we registered with.
        self._kubelet_created = threading.Event()
        self._registered_kubelet: tuple[int, int] | None = None  # (dev, ino) of kubelet.sock
        self._follower: Follower | None = None

    # ---- serving -----------------------------------------------------------------------------
    def serve(self) -> None:
        """(Re)start the gRPC server on our socket and prove it answers."""
        if len(os.fsencode(self.socket_path)) > MAX_SOCKET_PATH:
            raise ValueError(
                f"socket path {self.socket_path} is {len(os.fsencode(self.socket_path))} bytes: a Unix socket path "
                f"holds at most {MAX_SOCKET_PATH} (a shorter --plugin-dir or --socket-name)"
            )
        self._stop_server()
        self._server = serve_unix(
            self.socket_path,
            lambda server: pb_grpc.add_DevicePluginServicer_to_server(self.servicer, server),  # type: ignore[no-untyped-call]
            workers=16,
        )
        self._prove()
        log.info("serving on %s", self.socket_path)

    def _prove(self) -> None:
        with grpc.insecure_channel("unix://" + self.socket_path) as channel:
            stub = pb_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
            # 15 s: a loaded host can take seconds to start serving
            stub.GetDevicePluginOptions(pb.Empty(), timeout=15, wait_for_ready=True)

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait(2)
            self._server = None

    # ---- registration ------------------------------------------------------------------------
    def _kubelet_identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.kubelet_socket)
        except FileNotFoundError:
            return None
        return (st.st_dev, st.st_ino)

    def _register_once(self) -> None:
        self._kubelet_created.clear()  # a creation seen from here on is a newer kubelet
        identity = self._kubelet_identity()
        if identity is None:
            raise FileNotFoundError(f"kubelet socket {self.kubelet_socket} does not exist")
        request = pb.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket_name,
            resource_name=self.config.resource_name,
            options=pb.DevicePluginOptions(
                pre_start_required=self.config.pre_start_required, get_preferred_allocation_available=True
            ),
        )
        with grpc.insecure_channel("unix://" + self.kubelet_socket) as channel:
            try:
                stub = pb_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
                stub.Register(request, timeout=10)
            except grpc.RpcError as exc:
                if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise ConnectionError(f"kubelet at {self.kubelet_socket}: {exc.details()}") from None
                raise RegistrationRefused(str(exc.details())) from None
        self._registered_kubelet = identity
        log.info("registered with kubelet as %s (endpoint %s)", self.config.resource_name, self.socket_name)

    def register(self) -> bool:
        """Register, retrying with backoff while the kubelet is absent; False if stopping.

        A wait is cut short when ``kubelet.sock`` appears (inotify), so a restarted kubelet
        is answered at once, whatever the backoff has grown to. A kubelet of 1.37+ that still holds an endpoint
        on our socket (an earlier instance's, not yet seen gone, or one whose stream it keeps against our new
        server) refuses the registration: we then serve on a fresh socket of our own and register that, as
        upstream advises (a new socket name per restart of the server).
        """
        for attempt in range(FRESH_SOCKET_TRIES + 1):
            try:
                return self._register_retrying()
            except RegistrationRefused as exc:
                if HELD_SOCKET not in str(exc) or attempt == FRESH_SOCKET_TRIES:
                    raise
                log.warning("the kubelet holds %s (%s): serving on a fresh socket", self.socket_name, exc)
                self._fresh_socket()
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _fresh_socket(self) -> None:
        old = self.socket_path
        self.socket_name = f"devplug-{secrets.token_hex(4)}.sock"  # short: a Unix socket path holds 107 bytes
        self.socket_path = os.path.join(self.config.plugin_dir, self.socket_name)
        self.serve()
        try:
            os.unlink(old)
        except FileNotFoundError:
            pass

    def _register_retrying(self) -> bool:

        def sleep(seconds: float) -> None:
            self._kick.wait(seconds)
            self._kick.clear()

        def before_sleep(rs: tenacity.RetryCallState) -> None:
            exc = rs.outcome.exception() if rs.outcome else None
            delay = rs.next_action.sleep if rs.next_action else 0.0
            log.warning("waiting for the kubelet (attempt %d, retry in %.2fs): %s", rs.attempt_number, delay, exc)

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type((FileNotFoundError, ConnectionError)),
            wait=tenacity.wait_exponential(multiplier=0.05, min=0.05, max=5),
            stop=lambda rs: self.stopping.is_set(),
            sleep=sleep,
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            retrying(self._register_once)
        except (FileNotFoundError, ConnectionError):
            if self.stopping.is_set():
                return False
            raise
        return True

    # ---- kubelet restarts --------------------------------------------------------------------
    def start_watching(self) -> None:
        """Watch the plugin dir (inotify) so a kubelet restart is answered at once. Without a watcher (the
        host's inotify instances used up: EMFILE) the run loop's once-a-second check still sees it."""
        try:
            watcher = Inotify()
        except OSError as exc:
            log.warning("cannot watch %s (%s): checking it every second instead", self.config.plugin_dir, exc)
            return
        try:
            watcher.add_watch(self.config.plugin_dir, IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO)
        except OSError as exc:
            watcher.close()
            log.warning("cannot watch %s (%s): checking it every second instead", self.config.plugin_dir, exc)
            return
        kubelet = KUBELET_SOCKET

        def handle(events: list[InotifyEvent]) -> None:
            for e in events:
                if (e.name == self.socket_name and e.mask & (IN_DELETE | IN_MOVED_FROM)) or (
                    e.name == kubelet and e.mask & (IN_CREATE | IN_MOVED_TO)
                ):
                    created = bool(e.mask & (IN_CREATE | IN_MOVED_TO))
                    log.info("plugin dir: %s %s", e.name, "created" if created else "removed")
                    if created:
                        self._kubelet_created.set()
                    self._kick.set()

        self._follower = Follower(watcher, self.stopping, handle, "plugin-dir-watch")

    def needs_attention(self) -> bool:
        """Our socket is gone, or the kubelet socket is not the one we registered with."""
        return (
            self._kubelet_created.is_set()
            or not os.path.exists(self.socket_path)
            or self._kubelet_identity() != self._registered_kubelet
        )

    def run(self) -> None:
        """Serve, register, and re-serve/re-register on kubelet restarts until stopped."""
        self.start_watching()
        self.serve()
        if not self.register():
            return
        while not self.stopping.is_set():
            self._kick.wait(1.0)  # also a periodic self-check should an inotify event be missed
            self._kick.clear()
            if self.stopping.is_set():
                break
            if not self.needs_attention():
                continue
            started = time.monotonic()
            if not os.path.exists(self.socket_path):
                log.info("own socket %s is gone: serving again", self.socket_path)
                self.serve()
            else:
                log.info("kubelet socket re-created: registering again")
            if not self.register():
                return
            log.info("re-registered in %.3fs", time.monotonic() - started)

    def request_stop(self) -> None:
        """Ask :meth:`run` to return soon; safe from a signal handler (only sets events)."""
        self.stopping.set()
        self._kick.set()

    def stop(self) -> None:
        """Stop serving and remove our socket (the kubelet then marks our devices unhealthy)."""
        self.stopping.set()
        self._kick.set()
        self._stop_server()
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        if self._follower is not None:
            self._follower.stop()
            self._follower = None


#: ``GetInfo``'s type for a device plugin (``pluginwatcherapi.DevicePlugin``).
DEVICE_PLUGIN_TYPE = "DevicePlugin"


class WatcherRegistration(rpb_grpc.RegistrationServicer):
    """What the plugin watcher asks: the resource as the plugin's name, this socket as the endpoint (the kubelet
    dials it for ``DevicePlugin`` too), the API version; and the kubelet's verdict, logged."""

    def __init__(self, resource_name: str, endpoint: str) -> None:
        self.resource_name = resource_name
        self.endpoint = endpoint

    def GetInfo(self, request: rpb.InfoRequest, context: Any) -> rpb.PluginInfo:  # noqa: N802 (gRPC name)
        return rpb.PluginInfo(
            type=DEVICE_PLUGIN_TYPE, name=self.resource_name, endpoint=self.endpoint, supported_versions=[API_VERSION]
        )

    def NotifyRegistrationStatus(self, request: rpb.RegistrationStatus, context: Any) -> rpb.RegistrationStatusResponse:  # noqa: N802
        if request.plugin_registered:
            log.info(
                "registered with the kubelet's plugin watcher as %s (endpoint %s)", self.resource_name, self.endpoint
            )
        else:
            log.error("the kubelet's plugin watcher refused %s: %s", self.resource_name, request.error)
        return rpb.RegistrationStatusResponse()


class WatchedPluginServer:
    """Serves ``DevicePlugin`` and ``Registration`` on one socket in the plugin watcher's directory
    (``config.plugin_dir``) until :meth:`stop`; serves again should the socket be removed."""

    def __init__(self, config: ServerConfig, servicer: DevicePluginServicer, stopping: threading.Event) -> None:
        self.config = config
        self.servicer = servicer
        self.stopping = stopping
        self.socket_path = os.path.join(config.plugin_dir, config.socket_name)
        self.registration = WatcherRegistration(config.resource_name, self.socket_path)
        self._server: Any = None

    def serve(self) -> None:
        if len(os.fsencode(self.socket_path)) > MAX_SOCKET_PATH:
            raise ValueError(
                f"socket path {self.socket_path} is longer than a Unix socket path may be ({MAX_SOCKET_PATH} bytes)"
            )
        self._stop_server()

        def add(server: Any) -> None:
            pb_grpc.add_DevicePluginServicer_to_server(self.servicer, server)  # type: ignore[no-untyped-call]
            rpb_grpc.add_RegistrationServicer_to_server(self.registration, server)  # type: ignore[no-untyped-call]

        self._server = serve_unix(self.socket_path, add, workers=16)
        log.info("serving on %s for the kubelet's plugin watcher", self.socket_path)

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait(2)
            self._server = None

    def run(self) -> None:
        os.makedirs(self.config.plugin_dir, exist_ok=True)
        self.serve()
        while not self.stopping.wait(1.0):  # a periodic self-check: the kubelet does the rest
            if not os.path.exists(self.socket_path):
                log.info("own socket %s is gone: serving again", self.socket_path)
                self.serve()

    def request_stop(self) -> None:
        self.stopping.set()

    def stop(self) -> None:
        """Stop serving and remove the socket: the watcher deregisters the plugin."""
        self.stopping.set()
        self._stop_server()
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
