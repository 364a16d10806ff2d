"""One node's kubelet: its lifecycle (start, stop, restart, reboot) and the pod workers that tie the parts together.

The parts, along upstream's lines: the device manager (``devicemanager.py``), admission (``admission.py``:
the pod view and the predicate handler), node status (``nodestatus.py``), the container runtime (``runtime.py``)
and pod status (``podstatus.py``); the klog output is ``klog.py``.

Admission follows ``kubelet.go``'s handler order: the container manager's allocate handler
(topology manager + device manager, per container, init containers first) runs *before* the
predicate handler, so a pod bound with ``spec.nodeName`` to a node with too few devices is
rejected by the device manager (``UnexpectedAdmissionError``), and ``OutOf<resource>`` only shows
when the node's accounting disagrees with the device manager's. Rejection is ``rejectPod``: phase
Failed, the reason, ``"Pod was rejected: " + message`` and a Warning event.

A pod's life here, and where a new kind of pod-level resource hooks in: :meth:`SimNode._admit` (the pod is
admitted, or rejected), :meth:`SimNode._start_containers` / :meth:`SimNode._resume_containers` (its containers
are about to start; upstream's ``SyncPod`` prepares pod resources there), :meth:`SimNode.kill_pod` (the pod is
terminated and its containers go).

Two kinds of state are kept apart so restarts behave like the real thing: the *runtime*
(containers that exist on the node; they survive a kubelet restart, not a reboot) and the
kubelet's *memory* (admitted pods; dropped on every restart and rebuilt by re-admission).
"""

from __future__ import annotations

import functools
import logging
import shutil
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

from ..kubeletmodel.releases import KubeVersion
from ..kubeletmodel.periods import ENDPOINT_STOP_GRACE_PERIOD_S
from ..kubeletmodel import cdi
from .. import errors
from .admission import pod_spec_view, predicate_admit
from .apiserver import now_rfc3339
from .devicemanager import DeviceManager
from .dra.kubeletside import NodeDRA
from .klog import KlogFormatter, KlogHandler
from ..procs.launcher import KUBELET_PATHS, path_in_node
from .pluginwatcher import DEVICE_PLUGIN_TYPE, DRA_PLUGIN_TYPE, PluginHandler, PluginWatcher, RegistrationEvent
from .daemon import KUBELET_BACKOFF, BackOffPolicy, PluginDaemon
from .nodestatus import DEFAULT_CPU, DEFAULT_MEMORY, DEFAULT_PODS, NodeStatus
from .podresources import PodResourcesServer
from .podstatus import PodRecord, pod_phase, pod_status
from ..procs.boot import NodeBoot
from ..procs.process import PluginProcess, namespace_problem
from .runtime import ContainerRecord, ContainerRuntime, image_pull_error
from ..errors import UnresolvableCdiDevicesError

#: How long a kubelet start waits for its wipe of the node's ResourceSlices (a few milliseconds when the API answers).
STARTUP_WIPE_WAIT_S = 10.0

__all__ = ["SimNode", "ControlPlaneLink", "ContainerRecord", "pod_spec_view", "KlogFormatter"]


class ControlPlaneLink(Protocol):
    """What a node's kubelet needs from the control plane it is a node of (``EmbeddedPlane``, ``RealPlane``): its
    pod source, its status manager, its event recorder and the node-status update. ``node`` is the asking node."""

    def pods_bound_to(self, node: str) -> list[dict[str, Any]]:
        """The pods bound to ``node``, as the API server has them (re-admitted after a kubelet restart)."""
        ...

    def pod_bound(self, uid: str, node: str) -> bool:
        """Whether pod ``uid`` is still bound to ``node`` in the API: a deleted one is never admitted."""
        ...

    def set_pod_status(self, node: str, uid: str, status: dict[str, Any]) -> None:
        """The kubelet's status of pod ``uid`` changed (upstream's status manager)."""
        ...

    def record_event(self, node: str, pod: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """An event about ``pod`` from the kubelet of ``node``."""
        ...

    def node_changed(self, node: str) -> None:
        """``node``'s capacity, allocatable or readiness changed: the scheduler may place pods again."""
        ...


class SimNode:
    """One node's kubelet around a real device manager, pod-resources server and plugin processes.

    Created by the cluster's ``add_node``, which passes itself as the ``control_plane`` it talks to.
    """

    def __init__(
        self,
        name: str,
        node_dir: Path,
        *,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, Any]] | None = None,
        numa_nodes: int = 2,
        topology_policy: str = "none",
        grace_period: float = ENDPOINT_STOP_GRACE_PERIOD_S,
        kube: KubeVersion | None = None,
        cpu: str = DEFAULT_CPU,
        memory: str = DEFAULT_MEMORY,
        pods: str = DEFAULT_PODS,
        control_plane: ControlPlaneLink,
    ) -> None:
        self.name = name
        self.node_dir = Path(node_dir)
        self.node_dir.mkdir(parents=True, exist_ok=True)
        #: The machine boot its processes see: a boot ID of its own, renewed by :meth:`reboot`.
        self.boot = NodeBoot(self.node_dir / "boot_id")
        self.numa_nodes = numa_nodes
        self.topology_policy = topology_policy
        self.grace_period = grace_period
        #: The release this kubelet behaves as.
        self.kube = kube or KubeVersion.of()
        self._status = NodeStatus(
            name,
            labels=labels,
            taints=taints,
            cpu=cpu,
            memory=memory,
            pods=pods,
            kubelet_version=self.kube.release.kubernetes,
        )
        self._control_plane = control_plane
        #: Guards the kubelet's memory (``_pods``), the runtime and the running device manager.
        self._lock = threading.RLock()
        #: One pod addition, kill or container change at a time, like the kubelet's syncLoop.
        self._admit_lock = threading.RLock()
        #: The containers on the node (they outlive a kubelet restart).
        self._runtime = ContainerRuntime()
        #: pod UID -> the kubelet's memory of the pod (lost on a restart, rebuilt by re-admission).
        self._pods: dict[str, PodRecord] = {}
        #: name -> a plugin started on this node, restarted like a DaemonSet's pod.
        self._plugins: dict[str, PluginDaemon] = {}
        self._running = False
        self._dm: DeviceManager | None = None
        self._podres: PodResourcesServer | None = None
        self._watcher: PluginWatcher | None = None
        #: Registration outcomes of the plugin watchers of earlier kubelet lifetimes, oldest first.
        self._registrations: list[RegistrationEvent] = []
        #: The kubelet's DRA side (``sim/dra/kubeletside.py``), set by a cluster with an API server to read claims from.
        self.dra: NodeDRA | None = None
        self.logger = logging.getLogger(f"pytest_devplug.sim.kubelet.{name}.{id(self):x}")
        self.logger.setLevel(logging.DEBUG)
        self.logger.propagate = False
        self._log_handler = KlogHandler(self.node_dir / "kubelet.log")
        self.logger.addHandler(self._log_handler)

    # ------------------------------------------------------------------ paths
    @property
    def plugin_dir(self) -> Path:
        return self.node_dir / "device-plugins"

    @property
    def registry_dir(self) -> Path:
        """The plugin watcher's ``/var/lib/kubelet/plugins_registry``."""
        return self.node_dir / "plugins_registry"

    def host_path(self, path: str) -> Path:
        """The host path of a path a plugin in the node's namespace names (an endpoint in ``GetInfo``)."""
        return path_in_node(path, {standard: self.node_dir / d for d, standard in KUBELET_PATHS.items()})

    @property
    def cdi_spec_dirs(self) -> list[Path]:
        """The node's ``/etc/cdi`` and ``/var/run/cdi`` (which wins), as a CDI-enabled runtime reads them."""
        return [self.node_dir / "etc-cdi", self.node_dir / "cdi"]

    @property
    def tmpfs_dirs(self) -> list[Path]:
        """The node's directories under ``/run``, a tmpfs a reboot empties (``/var/run/cdi``); everything under
        ``/var/lib/kubelet`` (checkpoints, sockets, the drivers' own state) is on disk and survives."""
        return [self.node_dir / "cdi"]

    @property
    def checkpoint_path(self) -> Path:
        return self.plugin_dir / "kubelet_internal_checkpoint"

    @property
    def pod_resources_socket(self) -> Path:
        return self.node_dir / "pod-resources" / "kubelet.sock"

    @property
    def running(self) -> bool:
        return self._running

    @property
    def device_manager(self) -> DeviceManager | None:
        """The live ``DeviceManager`` (``None`` while the kubelet is stopped)."""
        return self._dm

    def kubelet_log(self) -> str:
        return self._log_handler.text()

    def registration_events(self) -> list[RegistrationEvent]:
        """What the plugin watcher of every kubelet lifetime saw, oldest first (device plugins and DRA drivers)."""
        with self._lock:
            now = list(self._watcher.events) if self._watcher is not None else []
            return [*self._registrations, *now]

    # --------------------------------------------------------------- lifecycle
    def start_kubelet(self) -> None:
        """Start the kubelet: device manager (reads the checkpoint), pod-resources server, then
        re-admit the pods bound here (pods deleted meanwhile have their containers removed)."""
        with self._admit_lock:
            if self._running:
                return
            self.logger.info('"Starting kubelet" node="%s"', self.name)
            handlers: dict[str, PluginHandler] = {}
            if self.dra is not None:
                handlers[DRA_PLUGIN_TYPE] = self.dra.start()
            self.plugin_dir.mkdir(parents=True, exist_ok=True)
            self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
            dm = DeviceManager(
                self.plugin_dir,
                grace_period=self.grace_period,
                topology_policy=self.topology_policy,
                numa_nodes=self.numa_nodes,
                on_change=self._device_change,
                logger=self.logger,
                kube=self.kube,
            )
            dm.start()
            handlers[DEVICE_PLUGIN_TYPE] = dm.watcher_handler(self.host_path)
            watcher = PluginWatcher(self.registry_dir, handlers, logger=self.logger, kube=self.kube)
            get_terminal = not self.kube.has("podresources-get-terminal-not-found")
            podres = PodResourcesServer(
                dm,
                self._active_pods_for_podresources,
                self.pod_resources_socket,
                get_pods=functools.partial(self._pods_for_podresources, terminal=get_terminal),
            )
            podres.start()
            with self._lock:
                self._dm, self._podres, self._watcher, self._running = dm, podres, watcher, True
                self._pods = {}
            watcher.start()  # upstream's plugin manager starts once the runtime is up, after the container manager
            self.refresh_status()
            self._readmit_existing()
            dm.sources_ready = True
            if self.dra is not None:
                self.dra.sources_ready(self.active_pod_uids)
                if not self.dra.wait_startup_wipe(STARTUP_WIPE_WAIT_S):
                    self.logger.warning(
                        '"ResourceSlices of the node not deleted yet, going on" node="%s" waited=%gs',
                        self.name,
                        STARTUP_WIPE_WAIT_S,
                    )
        self._notify_node_change()

    def stop_kubelet(self) -> None:
        """Stop the kubelet process: containers keep running, the kubelet's memory is lost."""
        with self._admit_lock:
            with self._lock:
                if not self._running:
                    return
                dm, podres, watcher = self._dm, self._podres, self._watcher
                self._running, self._dm, self._podres, self._watcher = False, None, None, None
                self._pods = {}
                if watcher is not None:
                    self._registrations.extend(watcher.events)
            self.logger.info('"Stopping kubelet" node="%s"', self.name)
            if watcher is not None:
                watcher.stop()
            if podres is not None:
                podres.stop()
            if dm is not None:
                dm.stop()
            if self.dra is not None:
                self.dra.stop()
        self._notify_node_change()

    def restart_kubelet(self) -> None:
        """A real restart: stop, drop in-memory state, start on the same dirs and re-admit."""
        self.stop_kubelet()
        self.start_kubelet()

    def reboot(self) -> str | None:
        """A node reboot: the kubelet, every container and sandbox and every plugin process go away and
        ``/run`` is empty (:attr:`tmpfs_dirs`); the node gets a new boot ID and its uptime starts over (:attr:`boot`);
        then the kubelet starts again (plugins are not restarted: their DaemonSet pods would be, later).

        Returns why the node's processes keep seeing the host's boot ID (no private namespace can be made here), or
        ``None`` when they see the new one."""
        self.stop_kubelet()
        for proc in list(self._plugins.values()):
            proc.stop()
        with self._lock:
            self._runtime.clear()
        for d in self.tmpfs_dirs:
            _empty_dir(d)
        self.boot.renew()
        self.logger.info(
            '"Node rebooted" node="%s" emptied="%s" bootID="%s"',
            self.name,
            ",".join(str(d) for d in self.tmpfs_dirs),
            self.boot.boot_id,
        )
        self.start_kubelet()
        return namespace_problem()

    def close(self) -> None:
        """Stop plugins and the kubelet; keep nothing running."""
        for proc in list(self._plugins.values()):
            try:
                proc.stop()
            except errors.SimError:
                self.logger.warning('"Plugin did not stop cleanly" pid=%s', getattr(proc, "pid", None))
        self.stop_kubelet()
        self.logger.removeHandler(self._log_handler)

    # ----------------------------------------------------------------- plugins
    def start_plugin(
        self,
        argv: Sequence[str],
        *,
        name: str = "plugin",
        env: Mapping[str, str] | None = None,
        standard_paths: bool = False,
        extra_binds: Sequence[tuple[Path, str]] = (),
        netdevs: Mapping[str, str] | None = None,
        backoff: BackOffPolicy = KUBELET_BACKOFF,
    ) -> PluginDaemon:
        """Start a device plugin subprocess running ``argv`` as given (the harness fills its placeholders:
        ``PluginSpec.command``); a plugin that takes its directory as a flag is given :attr:`plugin_dir`.

        The kubelet keeps it running as a DaemonSet pod's container (:mod:`~pytest_devplug.sim.daemon`: an exit
        of its own is restarted with ``backoff``). With ``standard_paths`` the plugin runs in a private mount
        namespace where this node's directories are at the kubelet's standard paths
        (``/var/lib/kubelet/device-plugins`` ...), for plugins that hard-code them; other nodes' plugins never
        see them. ``extra_binds`` (host file or directory, path in the namespace) add the node's own files
        there: its device nodes, a driver root, a mock PCI node's sysfs; ``netdevs`` (name -> MAC) are links in a
        network namespace of the plugin's own.
        """
        if name in self._plugins and self._plugins[name].running:
            raise errors.PluginProcessError(f"plugin {name!r} is already running on node {self.name}")
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        binds = (
            [(self.node_dir / d, path) for d, path in KUBELET_PATHS.items()] + list(extra_binds)
            if standard_paths
            else []
        )
        proc = PluginProcess(
            argv,
            log_path=self.node_dir / f"{name}.log",
            env=dict(env) if env else None,
            binds=binds,
            netdevs=netdevs,
            boot=self.boot,
        )
        daemon = PluginDaemon(proc, name=name, kubelet=lambda: self._dm, logger=self.logger, policy=backoff)
        daemon.start()
        self._plugins[name] = daemon
        self.logger.info(
            '"Started plugin process" name="%s" pid=%s kubeletSocket="%s"',
            name,
            daemon.pid,
            f"{KUBELET_PATHS['device-plugins']}/kubelet.sock (private mount namespace)"
            if binds
            else self.plugin_dir / "kubelet.sock",
        )
        return daemon

    def plugin(self, name: str = "plugin") -> PluginDaemon:
        try:
            return self._plugins[name]
        except KeyError:
            raise errors.PluginProcessError(f"no plugin {name!r} on node {self.name}") from None

    @property
    def plugins(self) -> dict[str, PluginDaemon]:
        return dict(self._plugins)

    # ------------------------------------------------------------- node status
    @property
    def labels(self) -> dict[str, str]:
        return self._status.labels

    @labels.setter
    def labels(self, labels: dict[str, str]) -> None:
        self._status.labels = labels

    @property
    def taints(self) -> list[dict[str, Any]]:
        return self._status.taints

    @taints.setter
    def taints(self, taints: list[dict[str, Any]]) -> None:
        self._status.taints = taints

    @property
    def unschedulable(self) -> bool:
        return self._status.unschedulable

    @unschedulable.setter
    def unschedulable(self, unschedulable: bool) -> None:
        self._status.unschedulable = unschedulable

    def update(
        self,
        *,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, Any]] | None = None,
        unschedulable: bool | None = None,
    ) -> None:
        """Take an update of the Node object (``None``: that field unchanged): the kubelet admits pods by these."""
        if labels is not None:
            self.labels = dict(labels)
        if taints is not None:
            self.taints = [dict(t) for t in taints]
        if unschedulable is not None:
            self.unschedulable = unschedulable

    @property
    def uid(self) -> str:
        return self._status.uid

    @property
    def creation_timestamp(self) -> str:
        return self._status.creation_timestamp

    def _device_change(self) -> None:
        # Called from device-manager threads, maybe with its lock held: never call back into it here.
        self._notify_node_change()

    def _notify_node_change(self) -> None:
        self._control_plane.node_changed(self.name)

    def refresh_status(self) -> None:
        """Re-read capacity/allocatable from the device manager (see :mod:`~pytest_devplug.sim.nodestatus`)."""
        dm = self._dm
        if dm is None:
            return
        capacity, allocatable, removed = dm.capacity()
        with self._lock:
            if self._dm is dm:
                self._status.set_device_resources(capacity, allocatable, removed)

    def capacity(self) -> dict[str, str]:
        return self._status.capacity()

    def allocatable(self) -> dict[str, str]:
        return self._status.allocatable()

    def node_info(self) -> dict[str, str]:
        return self._status.node_info()

    def allocatable_amounts(self) -> dict[str, int]:
        """Allocatable as the scheduler counts it (cpu in milli-units, memory in bytes)."""
        return self._status.allocatable_amounts()

    def node_dict(self) -> dict[str, Any]:
        """This node as a Kubernetes ``Node`` object."""
        return self._status.node_dict(ready=self._running)

    # --------------------------------------------------------------- admission
    def _active_pods_for_podresources(self) -> list[tuple[str, str, str, Sequence[str]]]:
        return self._pods_for_podresources(terminal=False)

    def _pods_for_podresources(self, *, terminal: bool) -> list[tuple[str, str, str, Sequence[str]]]:
        """The pods pod-resources reports: the active ones (``List``; ``Get`` from 1.35); ``terminal``: also those
        that ended (``Get`` before 1.35 finds any pod the pod manager still has)."""
        with self._lock:
            return [
                # server_v1.go: restartable init containers, then the regular ones; plain init containers never.
                (r.view.name, r.view.namespace, r.uid, [c.name for c in r.view.containers if not c.init or c.sidecar])
                for r in self._pods.values()
                if terminal or not r.terminal
            ]

    def active_pod_uids(self) -> set[str]:
        with self._lock:
            return {uid for uid, r in self._pods.items() if not r.terminal}

    def admit(self, pod: Mapping[str, Any]) -> None:
        """Admit a pod bound to this node and start its containers (no-op while stopped: it is
        admitted when the kubelet starts).

        A pod deleted between its binding and this call is not admitted: the kubelet works from
        its watch of the API, where the deletion already shows (its kill found nothing to kill,
        so admitting now would hold the pod's devices for good). The check runs under the
        admission lock, which ``kill_pod`` also takes, so a deletion is seen either here or there.
        """
        with self._admit_lock:
            if not self._running:
                self.logger.info('"Kubelet not running, pod admission deferred" pod="%s"', _key(pod))
                return
            if not self._control_plane.pod_bound(pod["metadata"]["uid"], self.name):
                self.logger.info('"Pod was deleted before admission, not admitting" pod="%s"', _key(pod))
                return
            self._admit(dict(pod), restarting=False)
        self._publish(pod["metadata"]["uid"])

    def _live_dm(self) -> DeviceManager:
        dm = self._dm
        if dm is None:
            raise errors.SimError(f"the kubelet of node {self.name} is not running")
        return dm

    def _admit(self, pod: dict[str, Any], *, restarting: bool) -> None:
        """The admit handlers in order, then the pod's containers start (or are adopted after a restart)."""
        dm = self._live_dm()
        view = pod_spec_view(pod)
        uid = view.uid
        rec = PodRecord(pod=pod, view=view, start_time=now_rfc3339())
        with self._lock:
            if uid in self._pods and not restarting:
                return
            others = [r for r in self._pods.values() if not r.terminal and r.uid != uid]
            runtime = self._runtime.containers(uid)
            running = {n for n, c in runtime.items() if c.state == "running"}
            sandbox = self._runtime.has_sandbox(uid)
        self.logger.info('"SyncLoop ADD" source="api" pods=["%s"]', _key(pod))
        dm.remove_stale_pods({r.uid for r in others} | {uid})
        try:
            for c in view.containers:
                dm.admit_container(view, c, container_running=restarting and c.name in running)
            self._predicate(pod, others)
        except errors.AdmissionError as e:
            self._reject(rec, e.reason, e.message)
            return
        with self._lock:
            self._pods[uid] = rec
        if self.dra is not None and not self.dra.sync_pod(
            pod, sandbox=sandbox, start=lambda: self._start_prepared(uid)
        ):
            with self._lock:  # ContainerCreating until its claims are prepared
                self._runtime.adopt(view, pod)
            return
        if restarting and runtime:
            self._resume_containers(rec)
        else:
            self._start_containers(rec)

    def _start_prepared(self, uid: str) -> None:
        """DRA: the pod's claims are prepared, its containers start (unless it went away meanwhile)."""
        with self._admit_lock:
            with self._lock:
                rec = self._pods.get(uid)
            if rec is None or rec.terminal or not self._running:
                return
            self._start_containers(rec)
        self._publish(uid)

    def _predicate(self, pod: Mapping[str, Any], others: Sequence[PodRecord]) -> None:
        """``predicateAdmitHandler`` (see :mod:`~pytest_devplug.sim.admission`) with the devices the device manager
        holds for the node's pods and this one."""
        dm = self._live_dm()
        allocated: dict[str, int] = {}
        for view in [*(r.view for r in others), pod_spec_view(pod)]:
            for c in view.containers:
                for res, ids in dm.container_devices(view.uid, c.name).items():
                    allocated[res] = allocated.get(res, 0) + len(ids)
        predicate_admit(
            pod,
            [r.pod for r in others],
            labels=self.labels,
            taints=self.taints,
            allocatable=self.allocatable_amounts(),
            allocated=allocated,
        )

    def _reject(self, rec: PodRecord, reason: str, message: str) -> None:
        rec.phase, rec.reason, rec.message = "Failed", reason, "Pod was rejected: " + message
        self.logger.warning('"Failed to admit pod" pod="%s" reason="%s" message="%s"', _key(rec.pod), reason, message)
        with self._lock:
            self._pods[rec.uid] = rec
            killed = self._runtime.remove(rec.uid)
        if killed:
            self.logger.info('"Killing containers of rejected pod" pod="%s"', _key(rec.pod))
        self._event(rec.pod, "Warning", reason, message)

    def _start_one(self, rec: PodRecord, c: ContainerRecord) -> bool:
        """Pull the image, PreStartContainer (when the plugin asks for it), then run ``c`` with the options the
        device manager hands the runtime. ``False`` when it could not be started."""
        dm = self._live_dm()
        spec = rec.view.container(c.name)
        pull_error = image_pull_error(c.image)
        if pull_error is not None:
            # kuberuntime pulls before it generates the container's config, so PreStartContainer is never reached.
            # The real kubelet reports ErrImagePull first and ImagePullBackOff from its next sync on; the embedded
            # one has no periodic sync and reports the back-off state at once.
            self._event(rec.pod, "Normal", "Pulling", f'Pulling image "{c.image}"')
            self._event(rec.pod, "Warning", "Failed", f'Failed to pull image "{c.image}": {pull_error}')
            self._event(rec.pod, "Warning", "Failed", "Error: ErrImagePull")
            self._event(rec.pod, "Normal", "BackOff", f'Back-off pulling image "{c.image}"')
            self._event(rec.pod, "Warning", "Failed", "Error: ImagePullBackOff")
            c.wait("ImagePullBackOff", f'Back-off pulling image "{c.image}": ErrImagePull: {pull_error}')
            self.logger.error(
                '"Error syncing pod, skipping" pod="%s" container="%s" err="ErrImagePull: %s"',
                _key(rec.pod),
                c.name,
                pull_error,
            )
            return False
        try:
            dm.pre_start_container(rec.view, spec)
            options = dm.container_options(rec.uid, c.name)
            if self.dra is not None:
                options = replace(options, cdi_devices=(*options.cdi_devices, *self.dra.cdi_devices(rec.pod, c.name)))
        except errors.SimError as e:
            c.wait("CreateContainerConfigError", str(e))
            self.logger.error('"Error starting container" pod="%s" container="%s" err="%s"', _key(rec.pod), c.name, e)
            self._event(rec.pod, "Warning", "Failed", f"Error: {e}")
            return False
        try:
            options = cdi.apply_edits(options, self.cdi_spec_dirs)
        except UnresolvableCdiDevicesError as e:
            # containerd refuses to create the container; the kubelet retries with back-off, reporting the same.
            msg = f"failed to create containerd container: CDI device injection failed: {e}"
            c.wait("CreateContainerError", msg)
            self.logger.error('"Error starting container" pod="%s" container="%s" err="%s"', _key(rec.pod), c.name, msg)
            self._event(rec.pod, "Warning", "Failed", f"Error: {msg}")
            return False
        c.run(options, dm.container_devices(rec.uid, c.name))
        self._event(rec.pod, "Normal", "Created", f"Created container: {c.name}")
        self._event(rec.pod, "Normal", "Started", f"Started container {c.name}")
        return True

    def _start_containers(self, rec: PodRecord) -> None:
        """A newly admitted pod's containers start, init containers first, each to completion."""
        with self._lock:
            records = self._runtime.create(rec.view, rec.pod)
        blocked = False
        for spec in rec.view.containers:
            c = records[spec.name]
            if blocked:
                c.wait("PodInitializing")
                continue
            ok = self._start_one(rec, c)
            if spec.init and not spec.sidecar:
                if ok:  # a plain init container runs to completion before the next one starts
                    c.terminate(0)
                else:
                    blocked = True
        self._update_phase(rec)

    def _resume_containers(self, rec: PodRecord) -> None:
        """After a kubelet restart: running containers are adopted as they are; the others start."""
        with self._lock:
            records = self._runtime.adopt(rec.view, rec.pod)
        for spec in rec.view.containers:
            c = records[spec.name]
            if c.state == "running" or (c.state == "terminated" and c.init and not c.sidecar):
                continue
            if c.state == "terminated":
                c.restart_count += 1
            self._start_one(rec, c)
        self._update_phase(rec)

    def _readmit_existing(self) -> None:
        """Startup: admit bound pods oldest first, skip terminal ones, remove orphaned containers."""
        pods = sorted(
            self._control_plane.pods_bound_to(self.name),
            key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]),
        )
        known = {p["metadata"]["uid"] for p in pods}
        with self._lock:
            for uid in [u for u in self._runtime.pod_uids() if u not in known]:
                self.logger.info('"Removing containers of deleted pod" podUID="%s"', uid)
                self._runtime.remove(uid)
        for pod in pods:
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                view = pod_spec_view(pod)
                rec = PodRecord(
                    pod=pod,
                    view=view,
                    phase=phase,
                    reason=pod["status"].get("reason", ""),
                    message=pod["status"].get("message", ""),
                )
                with self._lock:
                    self._pods[rec.uid] = rec
                continue
            self._admit(dict(pod), restarting=True)
            self._publish(pod["metadata"]["uid"])

    # -------------------------------------------------------------- containers
    def _update_phase(self, rec: PodRecord) -> None:
        if rec.rejected:
            return
        with self._lock:
            records = list(self._runtime.containers(rec.uid).values())
        rec.phase = pod_phase(records)

    def _record(self, uid: str) -> PodRecord:
        with self._lock:
            rec = self._pods.get(uid)
        if rec is None or not self._running:
            raise errors.SimError(f"pod {uid} is not admitted on node {self.name} (or the kubelet is down)")
        return rec

    def restart_container(self, uid: str, container: str) -> None:
        """The container exits and the kubelet starts it again: same devices, restartCount + 1."""
        with self._admit_lock:
            rec = self._record(uid)
            with self._lock:
                c = self._runtime.containers(uid)[container]
            c.exited(137)
            self.logger.info('"Restarting container" pod="%s" container="%s"', _key(rec.pod), container)
            self._start_one(rec, c)
            self._update_phase(rec)
        self._publish(uid)

    def finish_container(self, uid: str, container: str, exit_code: int = 0) -> None:
        """The container exits with ``exit_code``; restarted per ``restartPolicy`` or terminated."""
        with self._admit_lock:
            rec = self._record(uid)
            with self._lock:
                c = self._runtime.containers(uid)[container]
            policy = (rec.pod.get("spec") or {}).get("restartPolicy", "Always")
            if not c.init and (policy == "Always" or (policy == "OnFailure" and exit_code != 0)):
                c.exited(exit_code)
                self._start_one(rec, c)
            else:
                c.terminate(exit_code)
            self._update_phase(rec)
            self.logger.info(
                '"Container exited" pod="%s" container="%s" exitCode=%d phase="%s"',
                _key(rec.pod),
                container,
                exit_code,
                rec.phase,
            )
        if rec.terminal and self.dra is not None:
            self.dra.pods_changed()
        self._publish(uid)

    def kill_pod(self, uid: str) -> None:
        """The pod was deleted: its containers go; its devices are reclaimed by the device manager
        before the next allocation (and it leaves the pod-resources listing now)."""
        with self._admit_lock:
            with self._lock:
                rec = self._pods.pop(uid, None)
                if not self._running:
                    return  # containers stay until the kubelet runs again and finds the pod gone
                self._runtime.remove(uid)
            if rec is not None:
                self.logger.info('"Killing pod" pod="%s"', _key(rec.pod))
        if self.dra is not None:
            self.dra.pods_changed()

    def container(self, uid: str, name: str) -> ContainerRecord:
        """What the runtime holds for a container (a copy)."""
        with self._lock:
            try:
                return self._runtime.copies(uid)[name]
            except KeyError:
                raise errors.SimError(f"no container {name!r} of pod {uid} on node {self.name}") from None

    def containers(self, uid: str) -> dict[str, ContainerRecord]:
        with self._lock:
            return self._runtime.copies(uid)

    # ------------------------------------------------------------------ status
    def pod_status(self, uid: str) -> dict[str, Any] | None:
        """The status the kubelet would post now (``None`` if it does not know the pod)."""
        with self._lock:
            rec = self._pods.get(uid)
            records = dict(self._runtime.containers(uid))
            dm = self._dm
        if rec is None:
            return None
        dra = self.dra
        claims = (lambda container: dra.resources_status(rec.pod, container)) if dra is not None else None
        return pod_status(
            rec,
            records,
            lambda res: dm.listed_health(res) if dm is not None else {},
            claims,
            allocated=lambda container: dm.container_devices(rec.uid, container) if dm is not None else {},
            resource_health=self.kube.gate("ResourceHealthStatus"),
        )

    def _publish(self, uid: str) -> None:
        st = self.pod_status(uid)
        if st is not None:
            self._control_plane.set_pod_status(self.name, uid, st)

    def _event(self, pod: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self._control_plane.record_event(self.name, pod, type_, reason, message)


def _empty_dir(directory: Path) -> None:
    """Remove what ``directory`` holds, keeping the directory itself (a tmpfs mount point after a reboot)."""
    if not directory.is_dir():
        return
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _key(pod: Mapping[str, Any]) -> str:
    m = pod["metadata"]
    return f"{m.get('namespace', 'default')}/{m['name']}"
