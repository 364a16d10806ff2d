"""One node's kubelet: pod admission, containers, node status, restarts and reboots.

Admission follows ``kubelet.go``'s handler order: the container manager's allocate handler
(topology manager + device manager, per container, init containers first) runs *before* the
predicate handler, so a pod bound with ``spec.nodeName`` to a node with too few devices is
rejected by the device manager (``UnexpectedAdmissionError``), and ``OutOf<resource>`` only shows
when the node's accounting disagrees with the device manager's. Rejection is ``rejectPod``: phase
Failed, the reason, ``"Pod was rejected: " + message`` and a Warning event.

Two kinds of state are kept apart so restarts behave like the real thing: the *runtime*
(containers that exist on the node; they survive a kubelet restart, not a reboot) and the
kubelet's *memory* (admitted pods; dropped on every restart and rebuilt by re-admission).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from . import cdi, errors
from .apiserver import is_extended_resource, now_rfc3339, parse_quantity
from .devicemanager import DeviceManager
from .model import ContainerRuntimeOptions, ContainerSpec, PodSpecView
from .podresources import PodResourcesServer
from .launcher import KUBELET_PATHS
from .process import PluginProcess
from .scheduler import pod_requests, tolerates

__all__ = ["SimNode", "ContainerRecord", "pod_spec_view", "KlogFormatter", "image_pull_error"]

DEFAULT_CPU = "8"
DEFAULT_MEMORY = "32Gi"
DEFAULT_PODS = "110"

EventSink = Callable[[Mapping[str, Any], str, str, str], None]  # pod, type, reason, message
StatusSink = Callable[[str, dict[str, Any]], None]  # pod uid, status
PodsSource = Callable[[], list[dict[str, Any]]]  # pods bound to this node, as the API server has them


class KlogFormatter(logging.Formatter):
    """klog's header: ``I0102 15:04:05.000000 12345 file.go:123] msg``."""

    def format(self, record: logging.LogRecord) -> str:
        lvl = {"DEBUG": "I", "INFO": "I", "WARNING": "W", "ERROR": "E", "CRITICAL": "F"}.get(record.levelname, "I")
        t = time.localtime(record.created)
        micros = int((record.created % 1) * 1_000_000)
        stamp = time.strftime("%m%d %H:%M:%S", t)
        return f"{lvl}{stamp}.{micros:06d} {os.getpid():>7} {record.module}.py:{record.lineno}] {record.getMessage()}"


class _MemoryHandler(logging.Handler):
    """Keeps the node's kubelet log in memory (bounded) and appends it to ``kubelet.log``."""

    def __init__(self, path: Path, max_lines: int = 20000) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.max_lines = max_lines
        self.path = path
        self.setFormatter(KlogFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        line = self.format(record)
        with self.lock or threading.Lock():
            self.lines.append(line)
            if len(self.lines) > self.max_lines:
                del self.lines[: len(self.lines) - self.max_lines]
            try:
                with open(self.path, "a", encoding="utf-8") as fh:
                    fh.write(line + "\n")
            except OSError:
                pass  # the node dir is being removed: keep the in-memory copy


@dataclass
class ContainerRecord:
    """A container as the runtime holds it: state, and exactly what was applied to it."""

    name: str
    image: str
    init: bool
    sidecar: bool
    container_id: str = ""
    state: str = "waiting"  # waiting | running | terminated
    reason: str = "ContainerCreating"
    message: str = ""
    exit_code: int | None = None
    restart_count: int = 0
    started_at: str = ""
    finished_at: str = ""
    last_state: dict[str, Any] = field(default_factory=dict)
    options: ContainerRuntimeOptions = field(default_factory=ContainerRuntimeOptions)
    devices: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class _PodRecord:
    """The kubelet's memory of one admitted (or rejected) pod."""

    pod: dict[str, Any]
    view: PodSpecView
    phase: str = "Pending"
    reason: str = ""
    message: str = ""
    start_time: str = ""

    @property
    def uid(self) -> str:
        return self.view.uid

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


def _ext_limits(c: Mapping[str, Any]) -> dict[str, int]:
    limits = ((c.get("resources") or {}).get("limits")) or {}
    return {k: parse_quantity(v).ceil_int() for k, v in limits.items() if is_extended_resource(k)}


def pod_spec_view(pod: Mapping[str, Any]) -> PodSpecView:
    """The device manager's view of a pod: extended-resource limits, init containers first."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    containers = [
        ContainerSpec(c["name"], _ext_limits(c), init=True, sidecar=c.get("restartPolicy") == "Always")
        for c in spec.get("initContainers") or []
    ] + [ContainerSpec(c["name"], _ext_limits(c)) for c in spec.get("containers") or []]
    return PodSpecView(meta["uid"], meta["name"], meta["namespace"], tuple(containers))


#: Registry hosts no node can pull from: the DNS top-level domain reserved never to resolve (RFC 2606) and
#: upstream's e2e image of a registry that does not exist (``imageutils.InvalidRegistryImage``).
_UNPULLABLE_TLD = ".invalid"
_UNPULLABLE_HOSTS = ("invalid.registry.k8s.io",)


def image_pull_error(image: str) -> str | None:
    """containerd's answer to pulling ``image`` when its registry host cannot exist, else ``None``: every other
    image is present on the embedded kubelet's node (it runs no containers)."""
    first, sep, _ = image.partition("/")
    host = first if sep and ("." in first or ":" in first or first == "localhost") else "docker.io"
    name = host.split(":", 1)[0]
    if not (name.endswith(_UNPULLABLE_TLD) or name in _UNPULLABLE_HOSTS):
        return None
    return (
        f'rpc error: code = Unknown desc = failed to pull and unpack image "{image}": failed to resolve reference '
        f'"{image}": failed to do request: dial tcp: lookup {name}: no such host'
    )


def _images(pod: Mapping[str, Any]) -> dict[str, str]:
    spec = pod.get("spec") or {}
    return {c["name"]: c.get("image", "") for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])}


class SimNode:
    """One node's kubelet around a real device manager, pod-resources server and plugin processes.

    Created by ``SimCluster.add_node``; the callbacks connect it to the control plane: ``pods_source``
    lists the pods bound here (for re-admission after a restart), ``pod_bound`` says whether a pod
    (by UID) is still bound here in the API (never admit a deleted one), ``status_sink`` and ``event_sink``
    publish pod statuses and events, ``on_node_change`` tells the scheduler capacity changed.
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
        grace_period: float = 300.0,
        cpu: str = DEFAULT_CPU,
        memory: str = DEFAULT_MEMORY,
        pods: str = DEFAULT_PODS,
        pods_source: PodsSource | None = None,
        pod_bound: Callable[[str], bool] | None = None,
        status_sink: StatusSink | None = None,
        event_sink: EventSink | None = None,
        on_node_change: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self.node_dir = Path(node_dir)
        self.node_dir.mkdir(parents=True, exist_ok=True)
        self.labels: dict[str, str] = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **(labels or {}),
        }
        self.taints: list[dict[str, Any]] = [dict(t) for t in taints or []]
        self.unschedulable = False
        self.numa_nodes = numa_nodes
        self.topology_policy = topology_policy
        self.grace_period = grace_period
        self.uid = str(uuid.uuid4())
        self.creation_timestamp = now_rfc3339()
        self._base = {"cpu": cpu, "memory": memory, "pods": pods}
        self._pods_source = pods_source or (lambda: [])
        self._pod_bound = pod_bound or (lambda uid: True)
        self._status_sink = status_sink
        self._event_sink = event_sink
        self._on_node_change = on_node_change
        self._lock = threading.RLock()  # kubelet memory, runtime, node status
        self._admit_lock = threading.RLock()  # one pod addition at a time, like syncLoop
        self._runtime: dict[str, dict[str, ContainerRecord]] = {}
        self._pods: dict[str, _PodRecord] = {}
        self._plugins: dict[str, PluginProcess] = {}
        self._ext_capacity: dict[str, int] = {}
        self._ext_allocatable: dict[str, int] = {}
        self._running = False
        self._dm: DeviceManager | None = None
        self._podres: PodResourcesServer | None = None
        self.logger = logging.getLogger(f"pytest_devplug.sim.kubelet.{name}.{id(self):x}")
        self.logger.setLevel(logging.DEBUG)
        self.logger.propagate = False
        self._log_handler = _MemoryHandler(self.node_dir / "kubelet.log")
        self.logger.addHandler(self._log_handler)

    # ------------------------------------------------------------------ paths
    @property
    def plugin_dir(self) -> Path:
        return self.node_dir / "device-plugins"

    @property
    def cdi_spec_dirs(self) -> list[Path]:
        """The node's ``/etc/cdi`` and ``/var/run/cdi`` (which wins), as a CDI-enabled runtime reads them."""
        return [self.node_dir / "etc-cdi", self.node_dir / "cdi"]

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
        return "\n".join(self._log_handler.lines) + ("\n" if self._log_handler.lines else "")

    # --------------------------------------------------------------- lifecycle
    def start_kubelet(self) -> None:
        """Start the kubelet: device manager (reads the checkpoint), pod-resources server, then
        re-admit the pods bound here (pods deleted meanwhile have their containers removed)."""
        with self._admit_lock:
            if self._running:
                return
            self.logger.info('"Starting kubelet" node="%s"', self.name)
            self.plugin_dir.mkdir(parents=True, exist_ok=True)
            self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
            dm = DeviceManager(
                self.plugin_dir,
                grace_period=self.grace_period,
                topology_policy=self.topology_policy,
                numa_nodes=self.numa_nodes,
                on_change=self._device_change,
                logger=self.logger,
            )
            dm.start()
            podres = PodResourcesServer(dm, self._active_pods_for_podresources, self.pod_resources_socket)
            podres.start()
            with self._lock:
                self._dm, self._podres, self._running = dm, podres, True
                self._pods = {}
            self.refresh_status()
            self._readmit_existing()
            dm.sources_ready = True
        self._notify_node_change()

    def stop_kubelet(self) -> None:
        """Stop the kubelet process: containers keep running, the kubelet's memory is lost."""
        with self._admit_lock:
            with self._lock:
                if not self._running:
                    return
                dm, podres = self._dm, self._podres
                self._running, self._dm, self._podres = False, None, None
                self._pods = {}
            self.logger.info('"Stopping kubelet" node="%s"', self.name)
            if podres is not None:
                podres.stop()
            if dm is not None:
                dm.stop()
        self._notify_node_change()

    def restart_kubelet(self) -> None:
        """A real restart: stop, drop in-memory state, start on the same dirs and re-admit."""
        self.stop_kubelet()
        self.start_kubelet()

    def reboot(self) -> None:
        """A node reboot: the kubelet, every container and every plugin process go away; then the
        kubelet starts again (plugins are not restarted: their DaemonSet pods would be, later)."""
        self.stop_kubelet()
        for proc in list(self._plugins.values()):
            proc.stop()
        with self._lock:
            self._runtime.clear()
        self.logger.info('"Node rebooted" node="%s"', self.name)
        self.start_kubelet()

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
    ) -> PluginProcess:
        """Start a device plugin subprocess; ``{plugin_dir}`` in ``argv`` becomes this node's dir.

        With ``standard_paths`` the plugin runs in a private mount namespace where this node's
        directories are at the kubelet's standard paths (``/var/lib/kubelet/device-plugins`` ...),
        for plugins that hard-code them; other nodes' plugins never see them. ``extra_binds`` (host file
        or directory, path in the namespace) add the node's own files there: its device nodes, a driver root.
        """
        if name in self._plugins and self._plugins[name].running:
            raise errors.PluginProcessError(f"plugin {name!r} is already running on node {self.name}")
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        args = [a.replace("{plugin_dir}", str(self.plugin_dir)) for a in argv]
        binds = [(self.node_dir / d, path) for d, path in KUBELET_PATHS.items()] + list(extra_binds) if standard_paths else []
        proc = PluginProcess(
            args, plugin_dir=self.plugin_dir, log_path=self.node_dir / f"{name}.log", env=dict(env) if env else None, binds=binds
        )
        proc.start()
        self._plugins[name] = proc
        self.logger.info(
            '"Started plugin process" name="%s" pid=%s kubeletSocket="%s"',
            name,
            proc.pid,
            f"{KUBELET_PATHS['device-plugins']}/kubelet.sock (private mount namespace)" if binds else self.plugin_dir / "kubelet.sock",
        )
        return proc

    def plugin(self, name: str = "plugin") -> PluginProcess:
        try:
            return self._plugins[name]
        except KeyError:
            raise errors.PluginProcessError(f"no plugin {name!r} on node {self.name}") from None

    @property
    def plugins(self) -> dict[str, PluginProcess]:
        return dict(self._plugins)

    # ------------------------------------------------------------- node status
    def _device_change(self) -> None:
        # Called from device-manager threads, maybe with its lock held: never call back into it here.
        self._notify_node_change()

    def _notify_node_change(self) -> None:
        if self._on_node_change is not None:
            self._on_node_change()

    def refresh_status(self) -> None:
        """Re-read capacity/allocatable from the device manager. A removed resource is set to 0,
        not dropped (``setters.go``: it tells device-plugin resources from cluster-level ones), and
        stays at 0 like the key in the stored Node object."""
        dm = self._dm
        if dm is None:
            return
        capacity, allocatable, removed = dm.capacity()
        with self._lock:
            if self._dm is not dm:
                return
            cap, alloc = dict(capacity), dict(allocatable)
            for res in set(removed) | (set(self._ext_capacity) - set(cap)):
                cap.setdefault(res, 0)
                alloc.setdefault(res, 0)
            self._ext_capacity, self._ext_allocatable = cap, alloc

    def capacity(self) -> dict[str, str]:
        with self._lock:
            return {**self._base, **{k: str(v) for k, v in self._ext_capacity.items()}}

    def allocatable(self) -> dict[str, str]:
        with self._lock:
            return {**self._base, **{k: str(v) for k, v in self._ext_allocatable.items()}}

    def allocatable_amounts(self) -> dict[str, int]:
        """Allocatable as the scheduler counts it (cpu in milli-units, memory in bytes)."""
        out: dict[str, int] = {}
        for k, v in self.allocatable().items():
            q = parse_quantity(v)
            out[k] = q.milli() if k == "cpu" else q.ceil_int()
        return out

    def node_dict(self) -> dict[str, Any]:
        """This node as a Kubernetes ``Node`` object."""
        ready = {
            "type": "Ready",
            "status": "True" if self._running else "Unknown",
            "reason": "KubeletReady" if self._running else "NodeStatusUnknown",
            "message": "kubelet is posting ready status" if self._running else "Kubelet stopped posting node status.",
        }
        spec: dict[str, Any] = {"taints": [dict(t) for t in self.taints]} if self.taints else {}
        if self.unschedulable:
            spec["unschedulable"] = True
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "uid": self.uid, "labels": dict(self.labels), "creationTimestamp": self.creation_timestamp},
            "spec": spec,
            "status": {"capacity": self.capacity(), "allocatable": self.allocatable(), "conditions": [ready]},
        }

    # --------------------------------------------------------------- admission
    def _active_pods_for_podresources(self) -> list[tuple[str, str, str, Sequence[str]]]:
        with self._lock:
            return [
                # server_v1.go: restartable init containers, then the regular ones; plain init containers never.
                (r.view.name, r.view.namespace, r.uid, [c.name for c in r.view.containers if not c.init or c.sidecar])
                for r in self._pods.values()
                if not r.terminal
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
            if not self._pod_bound(pod["metadata"]["uid"]):
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
        dm = self._live_dm()
        view = pod_spec_view(pod)
        uid = view.uid
        rec = _PodRecord(pod=pod, view=view, start_time=now_rfc3339())
        with self._lock:
            if uid in self._pods and not restarting:
                return
            others = [r for r in self._pods.values() if not r.terminal and r.uid != uid]
            runtime = self._runtime.get(uid, {})
            running = {n for n, c in runtime.items() if c.state == "running"}
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
        if restarting and runtime:
            self._resume_containers(rec)
        else:
            self._start_containers(rec)

    def _predicate(self, pod: Mapping[str, Any], others: Sequence[_PodRecord]) -> None:
        """``predicateAdmitHandler``: node affinity, NoExecute taints, resources (first failure)."""
        spec = pod.get("spec") or {}
        for k, v in (spec.get("nodeSelector") or {}).items():
            if self.labels.get(k) != v:
                raise errors.AdmissionError("NodeAffinity", "Predicate NodeAffinity failed")
        for taint in self.taints:
            if taint.get("effect") == "NoExecute" and not tolerates(spec.get("tolerations") or [], taint):
                raise errors.AdmissionError("TaintToleration", "Predicate TaintToleration failed")
        alloc = self.allocatable_amounts()
        # UpdatePluginResources: allocatable is at least what the device manager has handed out.
        allocated: dict[str, int] = {}
        dm = self._live_dm()
        for r in list(others) + [_PodRecord(pod=dict(pod), view=pod_spec_view(pod))]:
            for c in r.view.containers:
                for res, ids in dm.container_devices(r.uid, c.name).items():
                    allocated[res] = allocated.get(res, 0) + len(ids)
        for res, n in allocated.items():
            if alloc.get(res, 0) < n:
                alloc[res] = n
        want = {k: v for k, v in pod_requests(pod).items() if not is_extended_resource(k) or k in alloc}
        used: dict[str, int] = {"pods": len(others)}
        for r in others:
            for k, v in pod_requests(r.pod).items():
                used[k] = used.get(k, 0) + v
        if len(others) + 1 > alloc.get("pods", 0):
            raise errors.AdmissionError(
                "OutOfpods", f"Node didn't have enough resource: pods, requested: 1, used: {len(others)}, capacity: {alloc.get('pods', 0)}"
            )
        for k in [n for n in ("cpu", "memory", "ephemeral-storage") if n in want] + sorted(
            n for n in want if n not in ("cpu", "memory", "ephemeral-storage", "pods")
        ):
            if want[k] > 0 and want[k] > alloc.get(k, 0) - used.get(k, 0):
                raise errors.AdmissionError(
                    f"OutOf{k}",
                    f"Node didn't have enough resource: {k}, requested: {want[k]}, used: {used.get(k, 0)}, capacity: {alloc.get(k, 0)}",
                )

    def _reject(self, rec: _PodRecord, reason: str, message: str) -> None:
        rec.phase, rec.reason, rec.message = "Failed", reason, "Pod was rejected: " + message
        self.logger.warning('"Failed to admit pod" pod="%s" reason="%s" message="%s"', _key(rec.pod), reason, message)
        with self._lock:
            self._pods[rec.uid] = rec
            killed = self._runtime.pop(rec.uid, None)
        if killed:
            self.logger.info('"Killing containers of rejected pod" pod="%s"', _key(rec.pod))
        self._event(rec.pod, "Warning", reason, message)

    def _start_one(self, rec: _PodRecord, c: ContainerRecord) -> bool:
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
            c.state, c.reason = "waiting", "ImagePullBackOff"
            c.message = f'Back-off pulling image "{c.image}": ErrImagePull: {pull_error}'
            self.logger.error('"Error syncing pod, skipping" pod="%s" container="%s" err="ErrImagePull: %s"', _key(rec.pod), c.name, pull_error)
            return False
        try:
            dm.pre_start_container(rec.view, spec)
            options = dm.container_options(rec.uid, c.name)
        except errors.SimError as e:
            c.state, c.reason, c.message = "waiting", "CreateContainerConfigError", str(e)
            self.logger.error('"Error starting container" pod="%s" container="%s" err="%s"', _key(rec.pod), c.name, e)
            self._event(rec.pod, "Warning", "Failed", f"Error: {e}")
            return False
        try:
            options = self._with_cdi_edits(options)
        except cdi.UnresolvableCdiDevicesError as e:
            # containerd refuses to create the container; the kubelet retries with back-off, reporting the same.
            msg = f"failed to create containerd container: CDI device injection failed: {e}"
            c.state, c.reason, c.message = "waiting", "CreateContainerError", msg
            self.logger.error('"Error starting container" pod="%s" container="%s" err="%s"', _key(rec.pod), c.name, msg)
            self._event(rec.pod, "Warning", "Failed", f"Error: {msg}")
            return False
        c.options = options
        c.devices = {k: list(v) for k, v in dm.container_devices(rec.uid, c.name).items()}
        c.container_id = uuid.uuid4().hex
        c.state, c.reason, c.message, c.exit_code = "running", "", "", None
        c.started_at, c.finished_at = now_rfc3339(), ""
        self._event(rec.pod, "Normal", "Created", f"Created container: {c.name}")
        self._event(rec.pod, "Normal", "Started", f"Started container {c.name}")
        return True

    def _with_cdi_edits(self, options: ContainerRuntimeOptions) -> ContainerRuntimeOptions:
        """What a CDI-enabled runtime applies on top of the kubelet's options: the edits of the CDI devices named
        in ``CDIDevices`` and ``cdi.k8s.io/*`` annotations, from the spec files in the node's CDI directories."""
        names = [*options.cdi_devices, *cdi.names_from_annotations(options.annotations)]
        if not names:
            return options
        edits = cdi.resolve(names, self.cdi_spec_dirs)
        envs = {**options.envs, **edits.env}
        nodes = {d.container_path for d in edits.device_nodes}
        devices = [d for d in options.devices if d.container_path not in nodes] + edits.device_nodes
        paths = {m.container_path for m in edits.mounts}
        mounts = [m for m in options.mounts if m.container_path not in paths] + edits.mounts
        return replace(options, envs=envs, devices=devices, mounts=mounts)

    def _start_containers(self, rec: _PodRecord) -> None:
        images = _images(rec.pod)
        records: dict[str, ContainerRecord] = {}
        for spec in rec.view.containers:
            records[spec.name] = ContainerRecord(spec.name, images.get(spec.name, ""), spec.init, spec.sidecar)
        with self._lock:
            self._runtime[rec.uid] = records
        blocked = False
        for spec in rec.view.containers:
            c = records[spec.name]
            if blocked:
                c.reason = "PodInitializing"
                continue
            ok = self._start_one(rec, c)
            if spec.init and not spec.sidecar:
                if ok:  # a plain init container runs to completion before the next one starts
                    c.state, c.reason, c.exit_code, c.finished_at = "terminated", "Completed", 0, now_rfc3339()
                else:
                    blocked = True
        self._update_phase(rec)

    def _resume_containers(self, rec: _PodRecord) -> None:
        """After a kubelet restart: running containers are adopted as they are; the others start."""
        with self._lock:
            records = self._runtime.setdefault(rec.uid, {})
        images = _images(rec.pod)
        for spec in rec.view.containers:
            c = records.get(spec.name)
            if c is None:
                c = records[spec.name] = ContainerRecord(spec.name, images.get(spec.name, ""), spec.init, spec.sidecar)
            if c.state == "running" or (c.state == "terminated" and c.init and not c.sidecar):
                continue
            if c.state == "terminated":
                c.restart_count += 1
            self._start_one(rec, c)
        self._update_phase(rec)

    def _readmit_existing(self) -> None:
        """Startup: admit bound pods oldest first, skip terminal ones, remove orphaned containers."""
        pods = sorted(self._pods_source(), key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))
        known = {p["metadata"]["uid"] for p in pods}
        with self._lock:
            for uid in [u for u in self._runtime if u not in known]:
                self.logger.info('"Removing containers of deleted pod" podUID="%s"', uid)
                del self._runtime[uid]
        for pod in pods:
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                view = pod_spec_view(pod)
                rec = _PodRecord(pod=pod, view=view, phase=phase, reason=pod["status"].get("reason", ""), message=pod["status"].get("message", ""))
                with self._lock:
                    self._pods[rec.uid] = rec
                continue
            self._admit(dict(pod), restarting=True)
            self._publish(pod["metadata"]["uid"])

    # -------------------------------------------------------------- containers
    def _update_phase(self, rec: _PodRecord) -> None:
        if rec.phase == "Failed" and rec.reason:
            return
        with self._lock:
            records = self._runtime.get(rec.uid, {})
            inits = [c for c in records.values() if c.init and not c.sidecar]
            apps = [c for c in records.values() if not c.init]
        if any(c.state != "terminated" or c.exit_code != 0 for c in inits):
            rec.phase = "Pending"
        elif any(c.state == "running" for c in apps):
            rec.phase = "Running"
        elif apps and all(c.state == "terminated" for c in apps):
            rec.phase = "Succeeded" if all(c.exit_code == 0 for c in apps) else "Failed"
        else:
            rec.phase = "Pending"

    def _record(self, uid: str) -> _PodRecord:
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
                c = self._runtime[uid][container]
            c.last_state = {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": c.started_at, "finishedAt": now_rfc3339(), "containerID": f"containerd://{c.container_id}"}}
            c.restart_count += 1
            self.logger.info('"Restarting container" pod="%s" container="%s"', _key(rec.pod), container)
            self._start_one(rec, c)
            self._update_phase(rec)
        self._publish(uid)

    def finish_container(self, uid: str, container: str, exit_code: int = 0) -> None:
        """The container exits with ``exit_code``; restarted per ``restartPolicy`` or terminated."""
        with self._admit_lock:
            rec = self._record(uid)
            with self._lock:
                c = self._runtime[uid][container]
            policy = (rec.pod.get("spec") or {}).get("restartPolicy", "Always")
            if not c.init and (policy == "Always" or (policy == "OnFailure" and exit_code != 0)):
                c.last_state = {"terminated": {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error", "startedAt": c.started_at, "finishedAt": now_rfc3339(), "containerID": f"containerd://{c.container_id}"}}
                c.restart_count += 1
                self._start_one(rec, c)
            else:
                c.state, c.exit_code, c.finished_at = "terminated", exit_code, now_rfc3339()
                c.reason = "Completed" if exit_code == 0 else "Error"
            self._update_phase(rec)
            self.logger.info('"Container exited" pod="%s" container="%s" exitCode=%d phase="%s"', _key(rec.pod), container, exit_code, rec.phase)
        self._publish(uid)

    def kill_pod(self, uid: str) -> None:
        """The pod was deleted: its containers go; its devices are reclaimed by the device manager
        before the next allocation (and it leaves the pod-resources listing now)."""
        with self._admit_lock:
            with self._lock:
                rec = self._pods.pop(uid, None)
                if not self._running:
                    return  # containers stay until the kubelet runs again and finds the pod gone
                self._runtime.pop(uid, None)
            if rec is not None:
                self.logger.info('"Killing pod" pod="%s"', _key(rec.pod))

    def container(self, uid: str, name: str) -> ContainerRecord:
        """What the runtime holds for a container (a copy)."""
        with self._lock:
            try:
                return replace(self._runtime[uid][name])
            except KeyError:
                raise errors.SimError(f"no container {name!r} of pod {uid} on node {self.name}") from None

    def containers(self, uid: str) -> dict[str, ContainerRecord]:
        with self._lock:
            return {n: replace(c) for n, c in self._runtime.get(uid, {}).items()}

    # ------------------------------------------------------------------ status
    def pod_status(self, uid: str) -> dict[str, Any] | None:
        """The status the kubelet would post now (``None`` if it does not know the pod)."""
        with self._lock:
            rec = self._pods.get(uid)
            records = dict(self._runtime.get(uid, {}))
            dm = self._dm
        if rec is None:
            return None
        status: dict[str, Any] = {"phase": rec.phase}
        if rec.reason:
            status["reason"] = rec.reason
        if rec.message:
            status["message"] = rec.message
        if rec.phase == "Failed" and rec.reason and not records:
            return status
        status["startTime"] = rec.start_time
        health_cache: dict[str, dict[str, str]] = {}

        def health(res: str) -> dict[str, str]:
            if res not in health_cache:
                health_cache[res] = dict(dm.device_health(res)) if dm is not None else {}
            return health_cache[res]

        init_statuses: list[dict[str, Any]] = []
        app_statuses: list[dict[str, Any]] = []
        for spec in rec.view.containers:
            c = records.get(spec.name)
            if c is None:
                continue
            st = _container_status(c)
            # UpdateAllocatedResourcesStatus: every regular container's allocated devices, started or not (a
            # container waiting for its image holds them since admission).
            devices = c.devices or (dm.container_devices(rec.uid, c.name) if dm is not None and not spec.init else {})
            if not spec.init and devices:
                st["allocatedResourcesStatus"] = [
                    {"name": res, "resources": [{"resourceID": i, "health": "Healthy" if health(res).get(i, "Healthy") == "Healthy" else "Unhealthy"} for i in sorted(ids)]}
                    for res, ids in sorted(devices.items())
                ]
            (init_statuses if spec.init else app_statuses).append(st)
        if init_statuses:
            status["initContainerStatuses"] = init_statuses
        status["containerStatuses"] = app_statuses
        initialized = all(c.state == "terminated" and c.exit_code == 0 for c in records.values() if c.init and not c.sidecar)
        ready = bool(app_statuses) and all(s["ready"] for s in app_statuses)
        t = rec.start_time
        status["conditions"] = [
            {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": t},
            {"type": "Initialized", "status": str(initialized), "lastTransitionTime": t},
            {"type": "Ready", "status": str(ready), "lastTransitionTime": t},
            {"type": "ContainersReady", "status": str(ready), "lastTransitionTime": t},
        ]
        return status

    def _publish(self, uid: str) -> None:
        if self._status_sink is None:
            return
        st = self.pod_status(uid)
        if st is not None:
            self._status_sink(uid, st)

    def _event(self, pod: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        if self._event_sink is not None:
            self._event_sink(pod, type_, reason, message)


def _container_status(c: ContainerRecord) -> dict[str, Any]:
    cid = f"containerd://{c.container_id}" if c.container_id else ""
    if c.state == "running":
        state: dict[str, Any] = {"running": {"startedAt": c.started_at}}
    elif c.state == "terminated":
        state = {"terminated": {"exitCode": c.exit_code, "reason": c.reason, "startedAt": c.started_at, "finishedAt": c.finished_at, "containerID": cid}}
    else:
        waiting: dict[str, Any] = {"reason": c.reason}
        if c.message:
            waiting["message"] = c.message
        state = {"waiting": waiting}
    st: dict[str, Any] = {
        "name": c.name,
        "ready": c.state == "running",
        "started": c.state == "running",
        "restartCount": c.restart_count,
        "image": c.image,
        "imageID": "",
        "state": state,
        "lastState": dict(c.last_state),
    }
    if cid:
        st["containerID"] = cid
    return st


def _key(pod: Mapping[str, Any]) -> str:
    m = pod["metadata"]
    return f"{m.get('namespace', 'default')}/{m['name']}"
