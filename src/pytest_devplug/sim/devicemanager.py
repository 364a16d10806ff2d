"""The kubelet's device manager, faithful to upstream ``pkg/kubelet/cm/devicemanager``.

It owns the Registration server, the plugins' :class:`~pytest_devplug.sim.endpoint.Endpoint` s (one client per
resource before 1.37, one per plugin socket from 1.37: ``KubeVersion.has("endpoint-per-socket")``), the device sets
reported over ListAndWatch (healthy / unhealthy), the allocation of devices to
containers (``devicesToAllocate``, NUMA-aware, with ``GetPreferredAllocation`` and one
``Allocate`` per resource per container) and the checkpoint that survives a kubelet restart.

Locking: one state lock. Unlike the kubelet, which admits pods one at a time, many threads may
admit here at once, so devices are *reserved* under the lock before any RPC and the reservation
is rolled back (only this call's, never a recomputation that would drop other calls' in-flight
devices) when the RPC fails. ``on_change`` is always called with no lock held.
"""

from __future__ import annotations

import itertools
import logging
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb
from pytest_devplug.kubeletmodel.checkpoint import CHECKPOINT_NAME, CheckpointData
from pytest_devplug.errors import (
    AdmissionError,
    AllocateError,
    CheckpointError,
    EndpointError,
    PreStartError,
    RegistrationError,
)
from pytest_devplug.kubeletmodel.releases import KubeVersion
from pytest_devplug.kubeletmodel.views import ContainerSpec, ContainerView, PodSpecView
from pytest_devplug.kubeletmodel.checkpointfile import read_checkpoint, write_checkpoint
from pytest_devplug.kubeletmodel.periods import ENDPOINT_STOP_GRACE_PERIOD_S
from pytest_devplug.sim.endpoint import DIAL_TIMEOUT_S, Endpoint
from pytest_devplug.sim.pod_devices import NO_NUMA, PodDevices
from pytest_devplug.sim.registration import RegistrationServer, WatcherHandler, plugin_socket_path
from pytest_devplug.sim.topology import (
    POLICIES,
    TOPOLOGY_AFFINITY_MESSAGE,
    TOPOLOGY_AFFINITY_REASON,
    TopologyHint,
    device_hints,
    filter_by_affinity,
    merge_hints,
)

__all__ = ["DeviceManager", "KUBELET_SOCKET", "HEALTHY", "UNHEALTHY", "NO_NUMA"]

KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
#: How often an allocation starts over after losing a race during GetPreferredAllocation.
_MAX_RACE_RETRIES = 20


def _device_nodes(dev: pb.Device | None) -> list[int]:
    if dev is None or not dev.HasField("topology"):
        return []
    return [int(n.ID) for n in dev.topology.nodes]


class DeviceManager:
    """One node's device manager; see the module docstring for the rules it follows."""

    def __init__(
        self,
        plugin_dir: Path,
        *,
        grace_period: float = ENDPOINT_STOP_GRACE_PERIOD_S,
        topology_policy: str = "none",
        numa_nodes: int = 2,
        on_change: Callable[[], None] | None = None,
        logger: logging.Logger | None = None,
        kube: KubeVersion | None = None,
    ) -> None:
        if topology_policy not in POLICIES:
            raise ValueError(f"unknown topology manager policy {topology_policy!r}; known: {', '.join(POLICIES)}")
        self.plugin_dir = Path(plugin_dir)
        self.grace_period = grace_period
        self.topology_policy = topology_policy
        self.numa_nodes = list(range(numa_nodes))
        self._on_change = on_change
        self._log = logger or logging.getLogger(__name__)
        #: The release whose registration rules apply (``endpoint-per-socket``: 1.37's endpointStore).
        self.kube = kube or KubeVersion.of()
        #: Set by the kubelet once its post-restart re-admission pass is done (``sourcesReady``).
        self.sources_ready = False
        #: How long Register waits to dial the plugin socket (upstream: 10 s).
        self.dial_timeout = DIAL_TIMEOUT_S

        #: Guards every field below; released only around GetPreferredAllocation.
        self._lock = threading.Lock()
        #: Orders checkpoint writes: a later snapshot is never overwritten by an earlier one.
        self._ckpt_lock = threading.Lock()
        #: resource -> its plugin's endpoint, the one Allocate and PreStart go to (a stopped one while in its grace
        #: period): upstream's ``endpoints``.
        self._endpoints: dict[str, Endpoint] = {}
        #: resource -> socket -> the plugins whose streams the kubelet holds: from 1.37 every connected endpoint
        #: (``endpointStore``); before, the registration server's one client per resource (``clients``), which an
        #: earlier plugin's stream, still open, does not appear in.
        self._connected: dict[str, dict[Path, Endpoint]] = {}
        #: ids of endpoints whose registration-server client was dropped when a Register on their socket was
        #: refused (1.37+): their stream's end disconnects nothing.
        self._orphaned: set[int] = set()
        #: resource -> device ID -> the device as last listed by ListAndWatch.
        self._all: dict[str, dict[str, pb.Device]] = {}
        #: resource -> healthy device IDs (``healthyDevices``).
        self._healthy: dict[str, set[str]] = {}
        #: resource -> unhealthy device IDs (``unhealthyDevices``).
        self._unhealthy: dict[str, set[str]] = {}
        #: resource -> device IDs in use: allocated to pods or reserved by an allocation in flight
        #: (``allocatedDevices``).
        self._allocated: dict[str, set[str]] = {}
        #: The allocations of every known pod (``podDevices``).
        self._pod_devices = PodDevices()
        #: reservation token -> (resource, the devices an allocation in flight holds before its Allocate RPC).
        self._reservations: dict[int, tuple[str, set[str]]] = {}
        #: pod UID -> resource -> device IDs its init containers used, which later containers may take
        #: (``devicesToReuse``).
        self._reuse: dict[str, dict[str, set[str]]] = {}
        #: (pod UID, container name) -> the Topology Manager's best hint at admission (``GetAffinity``).
        self._affinity: dict[tuple[str, str], TopologyHint] = {}
        #: resource -> the timer that wakes the kubelet when its stopped endpoint's grace period ends.
        self._timers: dict[str, threading.Timer] = {}
        self._tokens = itertools.count()
        #: Bumped on every change of the free devices; tells an allocation that dropped the lock
        #: for GetPreferredAllocation whether its view went stale.
        self._gen = 0
        self._registration: RegistrationServer | None = None
        self._running = False

    # ------------------------------------------------------------------------------------------
    # lifecycle

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    @property
    def checkpoint_path(self) -> Path:
        return self.plugin_dir / CHECKPOINT_NAME

    def start(self) -> None:
        """Read the checkpoint, clean stale sockets, serve Registration (upstream ``Start``)."""
        self._read_checkpoint()
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self._cleanup_plugin_directory()
        self._registration = RegistrationServer(self.socket_path, self._on_register, logger=self._log)
        self._registration.start()
        self._running = True

    def stop(self) -> None:
        """Stop serving and every stream; nothing on disk but ``kubelet.sock`` goes away."""
        with self._lock:
            endpoints = list({id(e): e for e in [*self._endpoints.values(), *self._all_connected()]}.values())
            self._connected.clear()
            timers = list(self._timers.values())
            self._timers.clear()
            self._running = False
        for t in timers:
            t.cancel()
        if self._registration is not None:
            self._registration.stop()
            self._registration = None
        for ep in endpoints:
            ep.close()
        with self._lock:
            for resource, ep in self._endpoints.items():
                if not ep.is_stopped():
                    self._mark_resource_unhealthy(resource)
                    ep.set_stop_time(time.monotonic())

    def _read_checkpoint(self) -> None:
        try:
            data = read_checkpoint(self.checkpoint_path)
        except FileNotFoundError:
            self._log.info("Failed to read data from checkpoint %s: checkpoint is not found", CHECKPOINT_NAME)
            return
        except (CheckpointError, OSError) as err:
            self._log.error(
                "Continue after failing to read checkpoint file. Device allocation info may NOT be up-to-date: %s", err
            )
            return
        with self._lock:
            self._pod_devices.from_checkpoint_data(data.pod_device_entries or [], self._log)
            self._recompute_allocated()
            for resource in data.registered_devices or {}:
                self._healthy[resource] = set()
                self._unhealthy[resource] = set()
                self._endpoints[resource] = Endpoint.stopped(resource, logger=self._log)
                self._arm_grace_timer(resource)

    def _cleanup_plugin_directory(self) -> None:
        """Delete every socket in the plugin dir (not the checkpoint, not other files or dirs)."""
        for path in self.plugin_dir.iterdir():
            if path.name == CHECKPOINT_NAME:
                continue
            try:
                mode = path.lstat().st_mode
            except OSError as err:
                self._log.error("Failed to stat file %s: %s", path, err)
                continue
            if stat.S_ISSOCK(mode):
                path.unlink(missing_ok=True)

    # ------------------------------------------------------------------------------------------
    # registration and ListAndWatch

    def _all_connected(self) -> list[Endpoint]:
        return [e for by_socket in self._connected.values() for e in by_socket.values()]

    def _on_register(self, req: pb.RegisterRequest) -> None:
        """``Register`` on kubelet.sock: the endpoint is a socket name in the plugin directory."""
        self.connect_plugin(req.resource_name, plugin_socket_path(self.plugin_dir, req.endpoint))

    def watcher_handler(self, path_of_endpoint: Callable[[str], Path] = Path) -> WatcherHandler:
        """The ``DevicePlugin`` handler the plugin watcher gets (upstream ``GetWatcherHandler``)."""
        return WatcherHandler(
            self.connect_plugin, self.disconnect_plugin, path_of_endpoint=path_of_endpoint, logger=self._log
        )

    def disconnect_plugin(self, resource: str, socket: Path) -> None:
        """``DeRegisterPlugin`` (the plugin's socket left ``plugins_registry/``): the client of ``resource`` on
        ``socket`` (before 1.37: the resource's one client, whichever socket) is disconnected as when its stream
        ends."""
        with self._lock:
            connected = self._connected.get(resource, {})
            ep = connected.get(socket) if self.kube.has("endpoint-per-socket") else next(iter(connected.values()), None)
        if ep is not None:
            self._on_stream_end(ep)

    def connect_plugin(self, resource: str, socket: Path) -> None:
        """``PluginConnected``: dial, GetDevicePluginOptions, then take the endpoint as the resource's. From 1.37 it
        joins the resource's other endpoints and a socket the kubelet still holds is refused; before, it replaces
        the one client of the resource and the earlier plugin's stream stays open (upstream closes nothing).
        Raises :class:`RegistrationError`."""
        ep = Endpoint(resource, socket, logger=self._log)
        try:
            ep.connect(self.dial_timeout)
            ep.get_options()
        except EndpointError as err:
            ep.close()
            raise RegistrationError(str(err)) from None
        per_socket = self.kube.has("endpoint-per-socket")
        with self._lock:
            incumbent = self._connected.get(resource, {}).get(socket) if per_socket else None
            if incumbent is not None:
                # The registration server drops every client on that socket along with the refused one
                # (connectClient's deregisterClient): the incumbent's stream end then finds no client and never
                # disconnects it, so the socket stays held until the kubelet restarts (kubernetes/kubernetes#139338).
                self._orphaned.add(id(incumbent))
            else:
                if per_socket:
                    self._connected.setdefault(resource, {})[socket] = ep
                else:
                    self._connected[resource] = {socket: ep}
                self._endpoints[resource] = ep
                timer = self._timers.pop(resource, None)
        if incumbent is not None:
            ep.close()
            raise RegistrationError(f"device plugin already connected: {socket}")
        if timer is not None:
            timer.cancel()
        self._log.info("Device plugin connected: %s at %s", resource, ep.socket_path)
        ep.run(self._on_list_and_watch, self._on_stream_end)
        self._notify()

    def _on_list_and_watch(self, ep: Endpoint, resp: pb.ListAndWatchResponse) -> None:
        """``genericDeviceUpdateCallback``: whichever open stream of the resource sent it, its list replaces the
        resource's devices (an earlier plugin's stream, still open, included)."""
        resource = ep.resource_name
        with self._lock:
            if ep.is_closed:
                return
            healthy: set[str] = set()
            unhealthy: set[str] = set()
            devices: dict[str, pb.Device] = {}
            for d in resp.devices:
                devices[d.ID] = d
                (healthy if d.health == HEALTHY else unhealthy).add(d.ID)
            self._all[resource] = devices
            self._healthy[resource] = healthy
            self._unhealthy[resource] = unhealthy
            self._gen += 1
        self._log.info(
            "Processed device updates for resource %s: total %d, healthy %d", resource, len(devices), len(healthy)
        )
        self._write_checkpoint_logged()
        self._notify()

    def _on_stream_end(self, ep: Endpoint) -> None:
        """A plugin's ListAndWatch ended (the kubelet never re-dials): ``PluginDisconnected``.

        From 1.37: the endpoint leaves the resource's store; another one still connected becomes the resource's
        (health unchanged), and only the last one's end marks every device unhealthy and starts the grace period.
        Before: the registration server disconnects the resource's *current* client, whichever stream ended, so an
        earlier plugin's exit cuts the newer plugin's connection too (``runClient`` looks the client up by name)."""
        resource = ep.resource_name
        closing = [ep]
        with self._lock:
            connected = self._connected.get(resource, {})
            if self.kube.has("endpoint-per-socket"):
                socket = next((path for path, e in connected.items() if e is ep), None)
                if socket is None or id(ep) in self._orphaned:
                    return  # a stream whose client the registration server dropped: nothing disconnects it
                del connected[socket]
                ep.set_stop_time(time.monotonic())
                if connected:
                    self._endpoints[resource] = next(reversed(connected.values()))
                    self._log.info(
                        "Device plugin disconnected: %s at %s; %d still connected",
                        resource,
                        ep.socket_path,
                        len(connected),
                    )
                    last = False
                else:
                    del self._connected[resource]
                    last = True
            else:
                current = next(iter(connected.values()), None)
                if current is None:
                    return  # its client was already disconnected
                del self._connected[resource]
                closing.append(current)
                primary = self._endpoints.get(resource)
                if primary is not None:
                    primary.set_stop_time(time.monotonic())
                last = primary is not None
            for e in closing:  # upstream's Disconnect closes the connection before PluginDisconnected
                e.ignore_stream()
            if last:
                self._mark_resource_unhealthy(resource)
                if self._running:
                    self._arm_grace_timer(resource)
        if last:
            self._log.info("Endpoint became unhealthy: %s", resource)
        for e in closing:
            e.close()
        self._notify()

    def _mark_resource_unhealthy(self, resource: str) -> None:
        healthy = self._healthy.get(resource, set())
        if resource in self._healthy:
            self._healthy[resource] = set()
        self._unhealthy[resource] = self._unhealthy.get(resource, set()) | healthy
        self._gen += 1

    def _arm_grace_timer(self, resource: str) -> None:
        """Wake the kubelet when the grace period ends so that its next ``capacity()`` removes
        the resource (upstream only notices on the periodic node-status update)."""
        old = self._timers.pop(resource, None)
        if old is not None:
            old.cancel()
        t = threading.Timer(self.grace_period + 0.01, self._notify)
        t.daemon = True
        self._timers[resource] = t
        t.start()

    def _notify(self) -> None:
        if self._on_change is not None:
            try:
                self._on_change()
            except Exception:  # noqa: BLE001 - a broken listener (any error) must not kill a stream thread
                self._log.exception("on_change callback failed")

    # ------------------------------------------------------------------------------------------
    # node status views

    def capacity(self) -> tuple[dict[str, int], dict[str, int], list[str]]:
        """``GetCapacity``: capacity = healthy + unhealthy, allocatable = healthy; resources whose
        endpoint's grace period expired are dropped and reported once in the third value."""
        capacity: dict[str, int] = {}
        allocatable: dict[str, int] = {}
        removed: set[str] = set()
        with self._lock:
            for devsets, is_healthy in ((self._healthy, True), (self._unhealthy, False)):
                for resource in list(devsets):
                    ep = self._endpoints.get(resource)
                    if ep is None or ep.grace_expired(self.grace_period):
                        self._endpoints.pop(resource, None)
                        del devsets[resource]
                        self._gen += 1
                        removed.add(resource)
                        timer = self._timers.pop(resource, None)
                        if timer is not None:
                            timer.cancel()
                    elif is_healthy:
                        capacity[resource] = allocatable[resource] = len(devsets[resource])
                    else:
                        capacity[resource] = capacity.get(resource, 0) + len(devsets[resource])
        if removed:
            self._log.info("Removed resources after their grace period: %s", sorted(removed))
            self._write_checkpoint_logged()
        return capacity, allocatable, sorted(removed)

    def resources(self) -> list[str]:
        """Registered resources, including stopped ones still in their grace period."""
        with self._lock:
            return sorted(r for r, ep in self._endpoints.items() if not ep.grace_expired(self.grace_period))

    def listed_health(self, resource: str) -> dict[str, str]:
        """Each device's health as the resource's plugins last listed it (``allDevices``): what the pod status
        reports (``UpdateAllocatedResourcesStatus``); a plugin's disconnect does not change it."""
        with self._lock:
            return {d: dev.health for d, dev in sorted(self._all.get(resource, {}).items())}

    def device_health(self, resource: str) -> dict[str, str]:
        with self._lock:
            out = {d: UNHEALTHY for d in self._unhealthy.get(resource, ())}
            out.update({d: HEALTHY for d in self._healthy.get(resource, ())})
            return dict(sorted(out.items()))

    def plugin_options(self, resource: str) -> pb.DevicePluginOptions | None:
        with self._lock:
            ep = self._endpoints.get(resource)
            return ep.options if ep is not None else None

    def plugin_socket(self, resource: str) -> Path | None:
        """Where the kubelet dials the resource's plugin (``None`` while none is registered)."""
        with self._lock:
            ep = self._endpoints.get(resource)
            return ep.socket_path if ep is not None and not ep.is_stopped() else None

    def device_numa(self, resource: str, device_id: str) -> list[int]:
        with self._lock:
            return _device_nodes(self._all.get(resource, {}).get(device_id))

    def allocatable_devices(self) -> dict[str, list[tuple[str, int | None]]]:
        """Healthy devices with their NUMA node (one tuple per node; ``None`` = no topology),
        as ``GetAllocatableDevices`` feeds pod-resources."""
        with self._lock:
            out: dict[str, list[tuple[str, int | None]]] = {}
            for resource, ids in sorted(self._healthy.items()):
                rows: list[tuple[str, int | None]] = []
                for d in sorted(ids):
                    nodes = _device_nodes(self._all.get(resource, {}).get(d))
                    rows.extend([(d, n) for n in nodes] if nodes else [(d, None)])
                out[resource] = rows
            return out

    # ------------------------------------------------------------------------------------------
    # allocations views

    def container_devices(self, pod_uid: str, container_name: str) -> dict[str, list[str]]:
        with self._lock:
            resources = self._pod_devices.container_resources(pod_uid, container_name)
        return {r: sorted(ids) for r, ids in sorted(resources.items())}

    def container_device_topology(self, pod_uid: str, container_name: str) -> dict[str, dict[str, list[int]]]:
        """resource -> device -> NUMA nodes recorded at allocation (``[]`` = none), for pod-resources."""
        with self._lock:
            return self._pod_devices.get_container_devices(pod_uid, container_name)

    def pod_devices(self) -> dict[str, dict[str, dict[str, list[str]]]]:
        with self._lock:
            return self._pod_devices.as_dict()

    def container_options(self, pod_uid: str, container_name: str) -> ContainerView:
        """Merge of the container's Allocate responses (``deviceRunContainerOptions``)."""
        with self._lock:
            return self._pod_devices.device_run_container_options(pod_uid, container_name, self._log)

    def remove_stale_pods(self, active_pod_uids: set[str]) -> None:
        """``UpdateAllocatedDevices``: free the devices of pods no longer active. Like upstream it
        does nothing until ``sources_ready`` (after a restart the active list is not yet complete)."""
        if not self.sources_ready:
            return
        with self._lock:
            stale = sorted(self._pod_devices.pods() - active_pod_uids)
            for uid in list(self._reuse):
                if uid not in active_pod_uids:
                    del self._reuse[uid]
            for key in [k for k in self._affinity if k[0] not in active_pod_uids]:
                del self._affinity[key]
            if not stale:
                return
            self._pod_devices.delete(stale)
            self._recompute_allocated()
        self._log.info("Pods to be removed: %s", stale)
        self._write_checkpoint_logged()

    # ------------------------------------------------------------------------------------------
    # admission

    def admit_container(self, pod: PodSpecView, container: ContainerSpec, *, container_running: bool = False) -> None:
        """Topology Manager admit (container scope) then device allocation for one container.

        Raises :class:`AdmissionError` with upstream's reason and message."""
        if self.topology_policy != "none":
            hints = self.get_topology_hints(pod, container)
            best, admit = merge_hints(self.topology_policy, self.numa_nodes, [hints])
            self._log.info("Best TopologyHint for %s/%s: %s (admit=%s)", pod.name, container.name, best, admit)
            if not admit:
                raise AdmissionError(TOPOLOGY_AFFINITY_REASON, TOPOLOGY_AFFINITY_MESSAGE)
            with self._lock:
                self._affinity[(pod.uid, container.name)] = best
        try:
            self._allocate(pod, container, container_running)
        except (AllocateError, EndpointError) as err:
            raise AdmissionError(
                "UnexpectedAdmissionError", f"Allocate failed due to {err}, which is unexpected"
            ) from None

    def get_affinity(self, pod_uid: str, container_name: str) -> TopologyHint | None:
        with self._lock:
            return self._affinity.get((pod_uid, container_name))

    def get_topology_hints(self, pod: PodSpecView, container: ContainerSpec) -> dict[str, list[TopologyHint] | None]:
        """``GetTopologyHints``: ``None`` for resources without topology, ``[]`` when impossible."""
        hints: dict[str, list[TopologyHint] | None] = {}
        with self._lock:
            for resource, requested in sorted(container.resources.items()):
                if not self._is_device_plugin_resource(resource):
                    continue
                hints[resource] = device_hints(
                    self.numa_nodes,
                    self._device_nodes(resource),
                    allocated=self._pod_devices.container_devices(pod.uid, container.name, resource) or set(),
                    available=self._healthy.get(resource, set()) - self._allocated.get(resource, set()),
                    reusable=self._reuse.get(pod.uid, {}).get(resource, set()),
                    request=requested,
                )
        return hints

    def _device_nodes(self, resource: str) -> dict[str, list[int]]:
        """device ID -> the NUMA nodes it reports (lock held)."""
        return {d: _device_nodes(dev) for d, dev in self._all.get(resource, {}).items()}

    def _is_device_plugin_resource(self, resource: str) -> bool:
        return resource in self._healthy or resource in self._allocated

    def _allocate(self, pod: PodSpecView, container: ContainerSpec, running: bool) -> None:
        """Upstream ``Allocate``: init containers' devices become reusable by later containers
        (``devicesToReuse``) unless the init container is a sidecar, which keeps them."""
        with self._lock:
            reuse = self._reuse.setdefault(pod.uid, {})
        self._allocate_container_resources(pod, container, reuse, running)
        with self._lock:
            for resource, devices in self._pod_devices.container_resources(pod.uid, container.name).items():
                if container.init and not container.sidecar:
                    reuse[resource] = reuse.get(resource, set()) | devices
                else:
                    reuse[resource] = reuse.get(resource, set()) - devices

    def _allocate_container_resources(
        self, pod: PodSpecView, container: ContainerSpec, reuse: dict[str, set[str]], running: bool
    ) -> None:
        needs_checkpoint = False
        for resource, needed in sorted(container.resources.items()):
            with self._lock:
                if not self._is_device_plugin_resource(resource):
                    continue
                picked = self._devices_to_allocate(
                    pod.uid, container.name, resource, needed, set(reuse.get(resource, set())), running
                )
                if picked is None:
                    continue
                token, devices = picked
                ep = self._endpoints.get(resource)
            needs_checkpoint = True
            try:
                if ep is None:
                    raise AllocateError(f"unknown Device Plugin {resource}")
                self._log.info(
                    "Making allocation request for device plugin %s: %s for %s/%s",
                    resource,
                    sorted(devices),
                    pod.name,
                    container.name,
                )
                resp = ep.allocate(sorted(devices))
                if len(resp.container_responses) == 0:
                    raise AllocateError(
                        "no containers return in allocation response "
                        "&AllocateResponse{ContainerResponses:[]*ContainerAllocateResponse{},}"
                    )
            except (AllocateError, EndpointError):
                with self._lock:
                    self._release(token)
                raise
            with self._lock:
                numa: dict[int, list[str]] = {}
                for d in sorted(devices):
                    nodes = _device_nodes(self._all.get(resource, {}).get(d))
                    for n in nodes or [NO_NUMA]:
                        numa.setdefault(n, []).append(d)
                self._pod_devices.insert(pod.uid, container.name, resource, numa, resp.container_responses[0])
                self._release(token)
        if needs_checkpoint:
            try:
                self._write_checkpoint()
            except OSError as err:
                raise AllocateError(f'failed to write checkpoint file "{CHECKPOINT_NAME}": {err}') from None

    def _release(self, token: int) -> None:
        """Drop a reservation (lock held); devices recorded in pod devices stay allocated."""
        self._reservations.pop(token, None)
        self._recompute_allocated()

    def _recompute_allocated(self) -> None:
        allocated = self._pod_devices.devices()
        for resource, devs in self._reservations.values():
            allocated.setdefault(resource, set()).update(devs)
        self._allocated = allocated
        self._gen += 1

    def _devices_to_allocate(
        self, pod_uid: str, cname: str, resource: str, required: int, reusable: set[str], running: bool
    ) -> tuple[int, set[str]] | None:
        """``devicesToAllocate`` (lock held; released only around GetPreferredAllocation).

        Returns a reservation token and the devices, or ``None`` when no Allocate RPC is needed."""
        needed = required
        devices = self._pod_devices.container_devices(pod_uid, cname, resource)
        if devices is not None:
            needed -= len(devices)
            if needed != 0:
                raise AllocateError(
                    f'pod "{pod_uid}" container "{cname}" changed request for resource "{resource}" '
                    f"from {len(devices)} to {required}"
                )
        if not self.sources_ready and running:
            self._log.info("Container detected running, nothing to do: %s/%s %s", pod_uid, cname, resource)
            return None
        if resource not in self._healthy:
            raise AllocateError(f"cannot allocate unregistered device {resource}")
        if not self._healthy[resource]:
            raise AllocateError(f"no healthy devices present; cannot allocate unhealthy devices {resource}")
        if devices is not None and not devices <= self._healthy[resource]:
            raise AllocateError(
                f"previously allocated devices are no longer healthy; cannot allocate unhealthy devices {resource}"
            )
        if needed == 0:
            return None

        token = next(self._tokens)
        mine: set[str] = set()
        self._reservations[token] = (resource, mine)
        remaining = needed

        def take(candidates: set[str]) -> bool:
            nonlocal remaining
            for d in sorted(candidates - mine):
                self._allocated.setdefault(resource, set()).add(d)
                self._gen += 1
                mine.add(d)
                remaining -= 1
                if remaining == 0:
                    return True
            return False

        def less_than_required() -> AllocateError:
            return AllocateError(
                f"unexpectedly allocated less resources than required. Requested: {required}, "
                f"Got: {required - remaining}"
            )

        try:
            if take(reusable):
                return token, mine
            from_reusable = set(mine)
            for attempt in range(_MAX_RACE_RETRIES + 1):
                if attempt:
                    # Another admission took devices while the lock was released for
                    # GetPreferredAllocation and what is left does not fit: start over as if
                    # that admission had come first (the kubelet admits one pod at a time).
                    mine.intersection_update(from_reusable)
                    remaining = needed - len(mine)
                    self._recompute_allocated()
                available = self._healthy[resource] - self._allocated.get(resource, set())
                if len(available) < remaining:
                    raise AllocateError(
                        f"requested number of devices unavailable for {resource}. "
                        f"Requested: {remaining}, Available: {len(available)}"
                    )
                aligned, unaligned, no_affinity = filter_by_affinity(
                    self._affinity.get((pod_uid, cname)), self._device_nodes(resource), available
                )
                if remaining < len(aligned):
                    preferred, changed = self._call_preferred(resource, aligned | mine, set(mine), required)
                    if changed:
                        aligned &= self._free(resource, mine)
                    if take(preferred & aligned) or take(aligned):
                        return token, mine
                    if changed:
                        continue
                    raise less_than_required()
                if take(aligned):
                    return token, mine
                preferred, changed = self._call_preferred(resource, available | mine, set(mine), required)
                if changed:
                    free = self._free(resource, mine)
                    available, unaligned, no_affinity = available & free, unaligned & free, no_affinity & free
                if take(preferred & available) or take(unaligned) or take(no_affinity):
                    return token, mine
                if changed:
                    continue
                raise less_than_required()
            raise less_than_required()
        except BaseException:
            self._release(token)
            raise

    def _free(self, resource: str, mine: set[str]) -> set[str]:
        """Healthy devices not held by anyone but this allocation (lock held)."""
        return self._healthy.get(resource, set()) - (self._allocated.get(resource, set()) - mine)

    def _call_preferred(
        self, resource: str, available: set[str], must_include: set[str], size: int
    ) -> tuple[set[str], bool]:
        """``callGetPreferredAllocationIfAvailable``: the lock is released during the RPC; the
        first container answer is used. The flag says whether the device state changed meanwhile."""
        ep = self._endpoints.get(resource)
        if ep is None:
            raise AllocateError(f"endpoint not found in cache for a registered resource: {resource}")
        if ep.options is None or not ep.options.get_preferred_allocation_available:
            return set(), False
        gen = self._gen
        self._lock.release()
        try:
            resp = ep.get_preferred_allocation(sorted(available), sorted(must_include), size)
        finally:
            self._lock.acquire()
        ids = set(resp.container_responses[0].deviceIDs) if resp.container_responses else set()
        return ids, self._gen != gen

    # ------------------------------------------------------------------------------------------
    # PreStartContainer

    def pre_start_container(self, pod: PodSpecView, container: ContainerSpec) -> None:
        """``callPreStartContainerIfNeeded`` for each device resource of the container."""
        for resource, n in sorted(container.resources.items()):
            with self._lock:
                if not self._is_device_plugin_resource(resource) or n == 0:
                    continue
                ep = self._endpoints.get(resource)
                if ep is None:
                    raise PreStartError(f"endpoint not found in cache for a registered resource: {resource}")
                if ep.options is None or not ep.options.pre_start_required:
                    continue
                allocated = self._pod_devices.container_devices(pod.uid, container.name, resource)
                if allocated is None:
                    raise PreStartError(
                        f"no devices found allocated in local cache for pod {pod.uid}, "
                        f"container {container.name}, resource {resource}"
                    )
                devs = sorted(allocated)
            self._log.info("Issuing a PreStartContainer call for container %s of pod %s", container.name, pod.uid)
            try:
                ep.pre_start_container(devs)
            except EndpointError as err:
                raise PreStartError(str(err)) from None

    # ------------------------------------------------------------------------------------------
    # checkpoint

    def _write_checkpoint(self) -> None:
        """Snapshot and write under one lock so that a later snapshot is never overwritten by an
        earlier one; the state lock is held only for the snapshot."""
        with self._ckpt_lock:
            with self._lock:
                entries = self._pod_devices.to_checkpoint_data()
                registered: dict[str, list[str] | None] = {r: sorted(d) for r, d in sorted(self._healthy.items())}
            write_checkpoint(self.checkpoint_path, CheckpointData(entries or None, registered))

    def _write_checkpoint_logged(self) -> None:
        try:
            self._write_checkpoint()
        except OSError as err:
            self._log.error("Failed to write checkpoint file %s: %s", CHECKPOINT_NAME, err)
