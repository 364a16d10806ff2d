"""The ``sim`` backend: the protocol on the embedded kubelet (``pytest_devplug.sim.embeddedplane.EmbeddedPlane``, or
``sim.realplane.RealPlane`` with a real API server).

Everything lives under one short work dir (:mod:`pytest_devplug.procs.workdir`: Unix socket paths are
limited to 107 bytes), removed by :meth:`SimBackend.close`, which also stops every plugin process, or
by the next run when this one was killed.

``exec`` is emulated from the runtime's record of the container, and only for questions that
record answers honestly: ``env``, ``printenv [NAME...]``, ``ls [-1] /dev`` (a fixed base set plus
the injected device nodes), ``ls PATH`` / ``test -e PATH`` for injected mounts and device nodes,
and ``cat /proc/mounts`` style listing via ``mounts``. Anything else raises
:class:`~pytest_devplug.errors.UnsupportedOperationError` instead of inventing an answer.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from ..api.podresources import v1_pb2, v1_pb2_grpc
from ..nvml import MOCK_DRIVER_VERSION, mock_library
from ..errors import (
    BackendError,
    BackendUnavailableError,
    MockBuildError,
    ObjectNotFoundError,
    PciNodeError,
    PodRejectedError,
    UnresolvableCdiDevicesError,
    UnsupportedOperationError,
)
from ..procs import workdir
from ..nvml.driverroot import gpu_device_nodes
from ..sim.gpunode import gpu_pci_functions, mig_cap_device_nodes, node_file_binds
from ..pcinodes.spec import DEVICE_INFO_DIR, PCI_IDS_PATH, PciNode, load_pci_node
from ..waiting import wait_for
from . import mockstate
from .base import (
    BackendOptions,
    ContainerView,
    ExecResult,
    NodeSpec,
    PluginRestarts,
    PluginSpec,
    PodResourcesDevices,
    PodResourcesPod,
)
from .extras import CLUSTER_MODULES, require_extra
from .mocknvml import mock_nvml_env
from .sim_dra import SimDRA

if TYPE_CHECKING:
    from ..controlplane import ControlPlane
    from ..sim.controlplanes import SimControlPlane
    from ..sim.daemon import PluginDaemon
    from ..sim.kubelet import SimNode

__all__ = ["SimBackend", "BASE_DEV_ENTRIES"]

#: What ``ls /dev`` lists in every emulated container besides the injected device nodes.
BASE_DEV_ENTRIES = ("full", "null", "ptmx", "pts", "random", "shm", "tty", "urandom", "zero")

JSONDict = dict[str, Any]


class _Deployed:
    def __init__(
        self, spec: PluginSpec, argv: list[str], env: dict[str, str], mock_path: Path | None, name: str
    ) -> None:
        self.spec, self.argv, self.env, self.mock_path, self.name = spec, argv, env, mock_path, name
        self.proc: PluginDaemon | None = None
        #: The second instance while a rolling update overlaps (``surge_plugin``), else ``None``.
        self.surge: PluginDaemon | None = None
        self.binds: list[tuple[Path, str]] = []
        self.instances = 1


class SimBackend:
    """Backend on the embedded kubelet; see the module docstring for what ``exec`` answers."""

    name = "sim"
    pod_namespace = "default"

    def __init__(self, options: BackendOptions) -> None:
        self.options = options
        self.workdir: Path | None = None
        self.cluster: SimControlPlane | None = None
        #: The real control plane (``--devplug-control-plane real``), else ``None``.
        self.control_plane: ControlPlane | None = None
        self._api_client: Any = None
        #: Set by ``close()`` when the real control plane was kept: where it is and how to stop it.
        self.kept: str | None = None
        self._plugins: dict[str, _Deployed] = {}
        #: The DRA side (``backends/sim_dra.py``), with the real control plane only: DRA drivers need its API server.
        self.dra: SimDRA | None = None
        self._device_nodes: dict[str, tuple[str, ...]] = {}  # node -> its declared device nodes (NodeSpec)
        self._pci_nodes: dict[str, PciNode] = {}  # node -> its mock PCI/NIC functions (NodeSpec.pci_node)
        self._serial = 0
        self._lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> str | None:
        """The admin kubeconfig of the real control plane (``None`` on the embedded one, which has no API)."""
        return str(self.control_plane.kubeconfig) if self.control_plane is not None else None

    def start(self) -> None:
        from ..sim.embeddedplane import EmbeddedPlane  # type: ignore[import-not-found,unused-ignore]

        self.workdir = workdir.create()
        try:
            if self.options.control_plane == "real":
                self.cluster = self._start_real()
            else:
                self.cluster = EmbeddedPlane(
                    self.workdir / "c", grace_period=self.options.grace_period, kube=self.options.kube
                )
        except BaseException:
            self._stop_control_plane(force=True)
            workdir.remove(self.workdir)
            self.workdir = None
            raise

    def _start_real(self) -> SimControlPlane:
        """etcd + kube-apiserver + kube-scheduler + kube-controller-manager, the embedded kubelets as its Nodes."""
        require_extra("sim backend with --devplug-control-plane real", "cluster", CLUSTER_MODULES)
        from ..controlplane import ControlPlane, resolve
        from ..errors import ControlPlaneError
        from ..sim.realplane import RealPlane

        try:
            kube = self.options.kube
            binaries = resolve(self.options.k8s_bin_dir, version=kube.release.minor)
            self.control_plane = ControlPlane(
                binaries,
                timeout=max(self.options.timeout, 30.0),
                keep=self.options.keep_cluster,
                feature_gates=kube.gate_flag(),
            )
            self.control_plane.start()
        except ControlPlaneError as exc:
            raise BackendUnavailableError(f"the real control plane did not start: {exc}") from None
        self._api_client = self.control_plane.client()
        self.dra = SimDRA(self, self._api_client)
        assert self.workdir is not None
        return RealPlane(
            self._api_client,
            self.workdir / "c",
            grace_period=self.options.grace_period,
            timeout=self.options.timeout,
            remove_nodes=not self.options.keep_cluster,
            kube=self.options.kube,
        )

    def _stop_control_plane(self, *, force: bool = False) -> None:
        """Stop the real control plane, unless it is kept (``--keep-cluster``): then say how to stop it."""
        if self._api_client is not None:
            self._api_client.close()
            self._api_client = None
        cp = self.control_plane
        if cp is not None and cp.keep and not force:
            self.kept = f"kubeconfig {cp.kubeconfig}; stop it with: {cp.stop_command()}"
        elif cp is not None:
            cp.stop()
        self.control_plane = None

    def close(self) -> None:
        errors: list[BaseException] = []
        steps: list[Callable[[], None]] = []
        if self.dra is not None:
            steps.append(self.dra.close)
        steps += [functools.partial(self.remove_plugin, node) for node in list(self._plugins)]
        if self.cluster is not None:
            steps.append(self.cluster.close)
        for step in steps:
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - every step must run (no process left behind); all reported below
                errors.append(exc)
        self.cluster = None
        self._stop_control_plane()
        if self.workdir is not None:
            workdir.remove(self.workdir)
            self.workdir = None
        if errors:
            raise BackendError(f"sim teardown: {'; '.join(map(repr, errors))}")

    def _c(self) -> SimControlPlane:
        if self.cluster is None:
            raise BackendError("sim backend not started")
        return self.cluster

    def sim_node(self, name: str) -> SimNode:
        from ..errors import NotFoundError

        try:
            return self._c().node(name)
        except NotFoundError as exc:
            raise ObjectNotFoundError(str(exc)) from None

    def ensure_node(self, spec: NodeSpec) -> str:
        c = self._c()
        if spec.name in {n.name for n in c.nodes}:
            return spec.name
        labels = {"kubernetes.io/hostname": spec.name, **spec.labels}
        c.add_node(spec.name, labels=labels, numa_nodes=spec.numa_nodes, topology_policy=spec.topology_policy)
        self._device_nodes[spec.name] = tuple(spec.device_nodes)
        if spec.pci_node is not None:
            try:
                self._pci_nodes[spec.name] = load_pci_node(spec.pci_node)
            except PciNodeError as exc:
                raise BackendError(str(exc)) from None
        return spec.name

    # -- plugin ------------------------------------------------------------------------------------
    def deploy_plugin(self, node: str, spec: PluginSpec) -> None:
        if node in self._plugins:
            raise BackendError(f"a plugin is already deployed on {node}; remove it first")
        if not spec.argv:
            raise BackendError("the sim backend runs the plugin from PluginSpec.argv, which is empty")
        n = self.sim_node(node)
        mock_path: Path | None = None
        assert self.workdir is not None
        if spec.mock:
            mock_dir = self.workdir / f"mock-{node}"
            mock_dir.mkdir(exist_ok=True)
            mock_path = mock_dir / "mock-state.json"
            _write_json_atomic(mock_path, mockstate.initial_state(spec.gpus, spec.numa_nodes, spec.mig, spec.gpu_model))
        with self._lock:
            self._serial += 1
            name = f"plugin-{self._serial}"
        argv, env = spec.command(plugin_dir=n.plugin_dir, mock_state=mock_path, plugins_registry=n.registry_dir)
        if mock_path is not None:
            env = {**mock_nvml_env(mock_path), **env}
        dep = _Deployed(spec, argv, env, mock_path, name)
        self._plugins[node] = dep
        dep.binds = self.node_files(node, spec)
        pci = self._pci_nodes.get(node)
        dep.proc = n.start_plugin(
            argv,
            name=name,
            env=dep.env or None,
            standard_paths=spec.uses_standard_paths(),
            extra_binds=dep.binds,
            netdevs=pci.netdevs if pci is not None and spec.uses_standard_paths() else None,
        )

    def node_files(self, node: str, spec: PluginSpec) -> list[tuple[Path, str]]:
        """The node's declared device nodes and, for a plugin on the mock NVML, what a GPU node has: the GPUs'
        device nodes, a stub driver root and the GPUs' PCI functions in sysfs (``sim/gpunode.py``), for the plugin's
        private mount namespace. A node with a PCI node file and mock GPUs has one sysfs tree showing both."""
        nodes = list(self._device_nodes.get(node, ()))
        gpus = []
        if spec.mock:
            gpus = mockstate.initial_state(spec.gpus, spec.numa_nodes, spec.mig, spec.gpu_model)["gpus"]
        pci_binds: list[tuple[Path, str]] = []
        pci = self._pci_nodes.get(node)
        if pci is not None:
            gpu_functions = gpu_pci_functions(gpus)
            clash = sorted({f.address for f in pci.functions} & {f.address for f in gpu_functions})
            if clash:
                raise BackendError(f"node {node}: PCI function(s) {clash} of {pci.source} are the mock GPUs' addresses")
            pci = dataclasses.replace(pci, functions=pci.functions + tuple(gpu_functions))
            root = Path(self.sim_node(node).node_dir) / "pci-node"
            sys_dir, ids = pci.write_tree(root)
            # what the plugin reads (sysfs, the PCI IDs) and writes beside its devices (device-info files)
            pci_binds = [(sys_dir, "/sys"), (ids, PCI_IDS_PATH), (root / "devinfo", DEVICE_INFO_DIR)]
            nodes += [d for d in pci.device_nodes() if d not in nodes]
        version, nvml, mig_gpus = None, None, None
        if spec.mock:
            minors = [int(g["minor"]) for g in gpus]
            nodes += [d for d in gpu_device_nodes(minors) + mig_cap_device_nodes(gpus) if d not in nodes]
            version = MOCK_DRIVER_VERSION
            mig_gpus = minors if spec.mig else None
            try:
                nvml = mock_library()
            except MockBuildError as exc:
                raise BackendError(f"cannot give the plugin the mock NVML: {exc}") from None
        if not nodes and version is None:
            return pci_binds
        try:
            return pci_binds + node_file_binds(
                Path(self.sim_node(node).node_dir) / "node-files",
                nodes,
                driver_version=version,
                nvml=nvml,
                mig_gpus=mig_gpus,
                pci_gpus=gpus if pci is None else (),
            )
        except ValueError as exc:
            raise BackendError(f"node {node}: {exc}") from None

    def _dep(self, node: str) -> _Deployed:
        try:
            return self._plugins[node]
        except KeyError:
            raise BackendError(f"no plugin deployed on node {node}") from None

    def _proc(self, node: str) -> PluginDaemon:
        proc = self._dep(node).proc
        if proc is None:
            raise BackendError(f"the plugin on node {node} never started (its deploy failed)")
        return proc

    def remove_plugin(self, node: str) -> None:
        dep = self._plugins.pop(node, None)
        if dep is None or dep.proc is None:
            return
        if dep.surge is not None:
            dep.surge.stop(timeout=5.0)  # held down too, running or not
        running = dep.proc.running
        dep.proc.stop(timeout=5.0)  # also when it is not running: the kubelet must not start it again
        if running:
            self._wait_plugin_seen_gone(node, dep.spec.resource_name)

    def stop_plugin(self, node: str) -> None:
        proc = self._proc(node)
        running = proc.running
        proc.stop(timeout=5.0)  # held down until start_plugin, even between two crashes
        if running:
            self._wait_plugin_seen_gone(node, self._dep(node).spec.resource_name)

    def kill_plugin(self, node: str) -> None:
        import signal

        proc = self._proc(node)
        running = proc.running
        proc.kill(signal.SIGKILL)  # held down until start_plugin, even between two crashes
        if running:
            proc.wait(timeout=5.0)
            self._wait_plugin_seen_gone(node, self._dep(node).spec.resource_name)

    def _wait_plugin_seen_gone(self, node: str, res: str) -> None:
        """Return once the kubelet has seen the plugin's stream end (none of its devices healthy), as the
        kind backend waits for the node status. Otherwise a restart looks complete while the old endpoint
        still counts: the next pod is sent to a socket that is gone (seen with upstream's device-plugin
        stub, whose new process has not yet re-created its socket), or a redeployed plugin looks ready
        before it registered."""

        def healthy() -> int:
            dm = self.sim_node(node).device_manager
            return 0 if dm is None else sum(1 for h in dm.device_health(res).values() if h == "Healthy")

        wait_for(
            healthy,
            lambda n: n == 0,
            timeout=self.options.timeout,
            what=f"the kubelet on {node} seeing the {res} plugin stop",
        )

    def start_plugin(self, node: str) -> None:
        proc = self._proc(node)
        if proc.running:
            return
        proc.start()  # appends to the same log file: plugin_log has every run once

    def surge_plugin(self, node: str) -> None:
        """A second process of the plugin on the node, started as the first was (same argv, env, mock state and
        mount namespace): a DaemonSet's new pod beside the old one, which the kubelet keeps running as it keeps
        the first (an exit of its own is restarted with the crash back-off)."""
        self._proc(node)
        dep = self._dep(node)
        if dep.surge is not None:
            raise BackendError(f"a second instance of the plugin already runs on {node} (retire_plugin first)")
        dep.instances += 1
        dep.surge = self.sim_node(node).start_plugin(
            dep.argv,
            name=f"{dep.name}-{dep.instances}",
            env=dep.env or None,
            standard_paths=dep.spec.uses_standard_paths(),
            extra_binds=dep.binds,
        )

    def retire_plugin(self, node: str, *, newest: bool = False) -> None:
        """SIGTERM to the first instance (or the second, ``newest``), held down as a deleted pod is, without
        waiting for the kubelet to see a resource go: in a rolling update it must not."""
        first = self._proc(node)
        dep = self._dep(node)
        if dep.surge is None:
            raise BackendError(f"no second instance of the plugin runs on {node} (surge_plugin first)")
        (dep.surge if newest else first).stop(timeout=5.0)  # also when it is not running: never restarted
        if not newest:
            dep.proc = dep.surge
        dep.surge = None

    def plugin_running(self, node: str) -> bool:
        dep = self._plugins.get(node)
        return bool(dep is not None and dep.proc is not None and dep.proc.running)

    def plugin_exit(self, node: str) -> str | None:
        """How the plugin ended when it was stopped or killed, or that it crash-loops (the kubelet holds its
        restart back); ``None`` while it runs or the kubelet is about to restart it (``sim/daemon.py``)."""
        dep = self._plugins.get(node)
        if dep is None or dep.proc is None:
            return None
        if (how := dep.proc.exit_reason()) is not None or dep.surge is None:
            return how
        how = dep.surge.exit_reason()
        return None if how is None else "the second instance " + how

    def plugin_log(self, node: str) -> str:
        """The plugin's log; while a second instance runs, its log follows under a ``---`` header line."""
        dep = self._dep(node)
        log = str(dep.proc.log()) if dep.proc is not None else ""
        if dep.surge is not None:
            log += f"--- second instance ({dep.name}-{dep.instances}) ---\n" + str(dep.surge.log())
        return log

    def plugin_restarts(self, node: str) -> PluginRestarts:
        dep = self._plugins.get(node)
        if dep is None or dep.proc is None:
            return PluginRestarts()
        loop, count = dep.proc.crash_loop(), dep.proc.restarts
        if (
            dep.surge is not None
        ):  # a rolling update's second pod: its restarts count, as the pods' restartCounts do on kind
            count += dep.surge.restarts
            if loop is None and (surged := dep.surge.crash_loop()) is not None:
                loop = "the second instance " + surged
        return PluginRestarts(count, loop)

    # -- nodes -------------------------------------------------------------------------------------
    def list_nodes(self) -> list[JSONDict]:
        return list(self._c().list_nodes())

    def get_node(self, name: str) -> JSONDict:
        self.sim_node(name)  # ObjectNotFoundError for an unknown node
        return dict(self._c().get_node(name))

    def restart_kubelet(self, node: str) -> None:
        self.sim_node(node).restart_kubelet()

    def kubelet_log(self, node: str) -> str:
        return str(self.sim_node(node).kubelet_log())

    def stop_kubelet(self, node: str) -> None:
        self.sim_node(node).stop_kubelet()

    def start_kubelet(self, node: str) -> None:
        self.sim_node(node).start_kubelet()

    def kubelet_running(self, node: str) -> bool:
        return bool(self.sim_node(node).running)

    def reboot_node(self, node: str) -> str:
        kept_boot_id = self.sim_node(node).reboot()
        done = "every container, sandbox and plugin process gone, /var/run/cdi emptied, /var/lib/kubelet kept"
        if kept_boot_id is not None:
            return f"staged (embedded kubelet): {done}; the boot ID unchanged (no private namespace: {kept_boot_id})"
        return f"rebooted (embedded kubelet): {done}, a new boot ID and uptime for the node's processes"

    def machine_numa_nodes(self, node: str) -> list[int]:
        return list(range(int(self.sim_node(node).numa_nodes)))

    def plugin_pre_start_required(self, node: str, resource: str) -> bool | None:
        dm = self.sim_node(node).device_manager
        opts = None if dm is None else dm.plugin_options(resource)
        return None if opts is None else bool(opts.pre_start_required)

    def read_checkpoint(self, node: str) -> bytes | None:
        path = Path(self.sim_node(node).checkpoint_path)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None

    def _pod_resources_stub(self, node: str) -> tuple[grpc.Channel, Any]:
        sock = self.sim_node(node).pod_resources_socket
        channel = grpc.insecure_channel(f"unix://{sock}")
        return channel, v1_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]

    def pod_resources(self, node: str) -> list[PodResourcesPod]:
        channel, stub = self._pod_resources_stub(node)
        with channel:
            resp = stub.List(v1_pb2.ListPodResourcesRequest(), timeout=self.options.timeout)
        return [PodResourcesPod.from_proto(p) for p in resp.pod_resources]

    def allocatable_devices(self, node: str) -> list[PodResourcesDevices]:
        channel, stub = self._pod_resources_stub(node)
        with channel:
            resp = stub.GetAllocatableResources(v1_pb2.AllocatableResourcesRequest(), timeout=self.options.timeout)
        return [PodResourcesDevices.from_proto(d) for d in resp.devices]

    def pod_resources_get(self, node: str, name: str, namespace: str) -> PodResourcesPod:
        channel, stub = self._pod_resources_stub(node)
        request = v1_pb2.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace)
        try:
            with channel:
                resp = stub.Get(request, timeout=self.options.timeout)
        except grpc.RpcError as exc:
            raise BackendError(
                f"pod-resources Get({namespace}/{name}) on {node}: {exc.code().name}: {exc.details()}"
            ) from None
        return PodResourcesPod.from_proto(resp.pod_resources)

    # -- pods --------------------------------------------------------------------------------------
    def create_pod(self, manifest: JSONDict) -> JSONDict:
        from ..errors import ApiError

        try:
            return dict(self._c().create_pod(manifest))
        except ApiError as exc:
            raise PodRejectedError(exc.status, exc.reason, exc.message) from None

    def get_pod(self, name: str, namespace: str = "default") -> JSONDict:
        from ..errors import NotFoundError

        try:
            return dict(self._c().get_pod(name, namespace))
        except NotFoundError as exc:
            raise ObjectNotFoundError(str(exc)) from None

    def delete_pod(self, name: str, namespace: str = "default") -> None:
        from ..errors import ApiError

        try:
            self._c().delete_pod(name, namespace)
        except ApiError as exc:
            # NotFoundError (embedded control plane) or the real API server's 404 (ApiError(404, "NotFound", ...)).
            if exc.status == 404:
                raise ObjectNotFoundError(str(exc)) from None
            raise

    def list_pods(self, namespace: str | None = None) -> list[JSONDict]:
        return list(self._c().list_pods(namespace))

    def events(self, *, namespace: str | None = None, involved_name: str | None = None) -> list[JSONDict]:
        return list(self._c().events(namespace=namespace, involved_name=involved_name))

    def container_view(self, name: str, container: str, namespace: str = "default") -> ContainerView:
        pod = self.get_pod(name, namespace)
        node = pod.get("spec", {}).get("nodeName")
        if not node:
            raise BackendError(f"pod {namespace}/{name} is not on a node yet")
        from ..errors import SimError

        try:
            rec = self.sim_node(node).container(pod["metadata"]["uid"], container)
        except SimError:
            raise BackendError(
                f"pod {namespace}/{name} has no container {container!r} on {node} (not admitted?)"
            ) from None
        return rec.options

    def device_injections(self, node: str, resource: str, device_ids: Sequence[str]) -> dict[str, ContainerView]:
        """One ``Allocate`` of the registered plugin, a container request per device; each answer as the runtime
        sees it, the edits of the CDI devices it names added."""
        from ..api.deviceplugin import v1beta1_pb2 as dp
        from ..api.deviceplugin import v1beta1_pb2_grpc as dpg
        from ..sim.endpoint import go_rpc_error
        from ..kubeletmodel.runoptions import run_container_options
        from ..kubeletmodel.cdi import apply_edits

        n = self.sim_node(node)
        dm = n.device_manager
        sock = None if dm is None else dm.plugin_socket(resource)
        if sock is None:
            raise BackendError(f"no plugin for {resource} is connected to the kubelet on {node}")
        ids = list(device_ids)
        req = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=[d]) for d in ids])
        with grpc.insecure_channel(f"unix://{sock}") as channel:
            try:
                resp = dpg.DevicePluginStub(channel).Allocate(req, timeout=self.options.timeout)  # type: ignore[no-untyped-call]
            except grpc.RpcError as err:
                raise BackendError(
                    f"Allocate of {resource} with one device per container {ids}: {go_rpc_error(err)}"
                ) from None
        if len(resp.container_responses) != len(ids):
            raise BackendError(
                f"Allocate of {resource} answered {len(resp.container_responses)} container responses "
                f"to {len(ids)} requests"
            )
        out: dict[str, ContainerView] = {}
        for device_id, answer in zip(ids, resp.container_responses, strict=True):
            try:
                out[device_id] = apply_edits(run_container_options([answer]), n.cdi_spec_dirs)
            except UnresolvableCdiDevicesError as exc:
                raise BackendError(
                    f"Allocate of {resource} for {device_id!r} names CDI devices no spec resolves: {exc}"
                ) from None
        return out

    def exec_pod(self, name: str, argv: Sequence[str], *, container: str, namespace: str = "default") -> ExecResult:
        view = self.container_view(name, container, namespace)
        return emulate_exec(view, list(argv))

    def restart_container(self, name: str, container: str, namespace: str = "default") -> None:
        self._c().restart_container(name, container, namespace)

    # -- mock NVML ---------------------------------------------------------------------------------
    def _mock_path(self, node: str) -> Path:
        path = self._dep(node).mock_path
        if path is None:
            raise BackendError(f"the plugin on {node} was deployed without a mock-NVML state file")
        return path

    def read_mock_state(self, node: str) -> JSONDict:
        return dict(json.loads(self._mock_path(node).read_text()))

    def write_mock_state(self, node: str, state: JSONDict) -> None:
        _write_json_atomic(self._mock_path(node), state)

    # -- knobs -------------------------------------------------------------------------------------
    @property
    def grace_period(self) -> float:
        return float(self._c().grace_period)

    def set_grace_period(self, seconds: float) -> None:
        """For the cluster, every node and every running device manager (a kubelet restart keeps it)."""
        c = self._c()
        c.grace_period = float(seconds)
        for n in c.nodes:
            n.grace_period = float(seconds)
            if n.device_manager is not None:
                n.device_manager.grace_period = float(seconds)


def _write_json_atomic(path: Path, doc: JSONDict) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def emulate_exec(view: ContainerView, argv: list[str]) -> ExecResult:
    """Answer the few shell questions the container record can answer truthfully (see module doc)."""
    if not argv:
        raise UnsupportedOperationError("sim exec: empty command")
    cmd, args = argv[0].rsplit("/", 1)[-1], argv[1:]
    paths = {m.container_path for m in view.mounts} | {d.container_path for d in view.devices}
    if cmd == "env" and not args:
        return ExecResult(0, "".join(f"{k}={v}\n" for k, v in sorted(view.envs.items())))
    if cmd == "printenv":
        if not args:
            return ExecResult(0, "".join(f"{k}={v}\n" for k, v in sorted(view.envs.items())))
        found = [view.envs[a] for a in args if a in view.envs]
        return ExecResult(0 if len(found) == len(args) else 1, "".join(f"{v}\n" for v in found))
    if cmd == "ls":
        out: list[str] = []
        for t in [a for a in args if not a.startswith("-")] or ["."]:
            t = t.rstrip("/") or "/"
            children = {p[len(t) + 1 :].split("/", 1)[0] for p in paths if p.startswith(t + "/")}
            if t == "/dev":
                out.extend(sorted(children | set(BASE_DEV_ENTRIES)))
            elif t in paths:
                out.append(t)
            elif children:
                out.extend(sorted(children))
            elif t.startswith("/dev/"):
                return ExecResult(2, "", f"ls: {t}: No such file or directory\n")
            else:
                break  # a path of the image itself: the record cannot say
        else:
            return ExecResult(0, "".join(f"{n}\n" for n in out))
    if cmd == "test" and len(args) == 2 and args[0] == "-e":
        return ExecResult(0 if args[1] in paths or args[1] in {f"/dev/{n}" for n in BASE_DEV_ENTRIES} else 1, "")
    if cmd == "cat" and args == ["/proc/mounts"]:
        return ExecResult(
            0, "".join(f"devplug {m.container_path} bind {'ro' if m.read_only else 'rw'} 0 0\n" for m in view.mounts)
        )
    raise UnsupportedOperationError(
        f"sim exec cannot answer {argv!r} honestly; it emulates env, printenv, ls /dev, ls/test -e of injected "
        "paths and cat /proc/mounts (use the kind backend for real commands)"
    )
