"""One backend for every real Kubernetes cluster: a cluster provider and a node transport, composed.

:class:`KubeBackend` holds the Kubernetes logic (the run's namespace, the plugin's DaemonSets, pods, waits,
the checkpoint-derived container view, kubelet restarts and policies); a :class:`ClusterProvider` says how
the cluster is had (kind: created, reused or kept, images loaded into it; a kubeconfig: an existing cluster,
images pulled by its nodes) and which :class:`~.nodeops.NodeTransport` reaches a node (``docker exec`` into a
kind node; a privileged host-PID pod). Backends differ only in their provider.

Everything the run creates lives in its own namespace (``devplug-<id>``, labelled and annotated with the
owner process, :mod:`.ownership`): the plugin's DaemonSets (pinned to the node under test), the test pods
and the node pods. :meth:`KubeBackend.close` removes it, also after Ctrl-C or SIGTERM; a later run removes
what a SIGKILLed one left. The plugin under test is deployed from an image, or adopted as it runs
(``--devplug-plugin-daemonset NAMESPACE/NAME``: never changed, so it cannot be stopped or killed).
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import yaml

from ...errors import (
    BackendError,
    BackendUnavailableError,
    ClaimError,
    ObjectNotFoundError,
    UnresolvableCdiDevicesError,
    UnsupportedOperationError,
    WaitTimeout,
)
from ...kubeletmodel import cdi
from ...kubeletmodel import dracheckpoint as dra_cp
from ...kubeletmodel.claims import container_cdi_devices
from ...kubeletmodel.periods import ENDPOINT_STOP_GRACE_PERIOD_S
from ...waiting import wait_for
from .. import mockstate
from ..base import (
    DEFAULT_IMAGE,
    BackendOptions,
    ContainerView,
    ExecResult,
    NodeSpec,
    PluginRestarts,
    PluginSpec,
    PodResourcesDevices,
    PodResourcesPod,
    applied_view,
    node_tolerations,
    parse_checkpoint,
)
from . import gpunode
from .api import KubeApi
from .daemonsets import PinnedDaemonSets, container_statuses, exit_reason, pods_running, restarts
from .dra import DRA_CHECKPOINT_PATH, KubeDRA
from .manifests import GPU_LABEL, MOCK_DIR, mock_library_file, own_daemonset, render_daemonsets
from .nodeops import MOCK_STATE_PATH, NodeOps, NodeTransport
from .ownership import MANAGED_BY, Owner, SignalGuard, delete_namespace, sweep_orphans

__all__ = ["KubeBackend", "ClusterProvider"]

JSONDict = dict[str, Any]
T = TypeVar("T")

#: Where a CDI-enabled runtime reads spec files, lowest priority first (containerd's and CRI-O's default).
CDI_SPEC_DIRS = cdi.SPEC_DIRS
#: The label of a node running the control plane's static pods (kubeadm's, and so kind's).
CONTROL_PLANE_ROLE = "node-role.kubernetes.io/control-plane"
#: The spec directory on the node's ``/run`` tmpfs, which a reboot empties.
CDI_RUN_DIR = cdi.SPEC_DIRS[-1]
#: How ``reboot_node`` rebooted a node here: staged, the machine kept running.
STAGED_REBOOT = (
    f"staged: kubelet stopped, every pod sandbox removed through the CRI, {CDI_RUN_DIR} emptied, kubelet started "
    "(the machine itself was not rebooted)"
)
#: Waits on the cluster's own pace (pods going, node status after a kubelet restart) get at least this.
_CLUSTER_PACE_S = 60.0


class ClusterProvider(Protocol):
    """How a :class:`KubeBackend` gets its cluster, its images onto the nodes, and reaches a node."""

    #: The backend's name (``"kind"``, ``"cluster"``).
    name: str
    #: Whether each node is a container of its own (kind): its ``/dev`` and files are the container's, so a mock GPU
    #: node's device nodes and driver root may be made there. A real node's are the machine's: never.
    nodes_are_containers: bool

    def start(self) -> Any:
        """Have the cluster ready; an API client for it (``kubernetes.client.ApiClient``)."""
        ...

    @property
    def routes_services(self) -> bool:
        """Whether Service IPs route (kube-proxy or a CNI doing its part): where not (the offline kind node has no
        kube-proxy), pods that call the API server in-cluster (a DRA driver) are pointed at its endpoint instead."""
        ...

    def transport(self, api: KubeApi, namespace: str, node_image: Callable[[], str]) -> NodeTransport:
        """The node transport; ``node_image`` gives an image for node pods where the transport needs one."""
        ...

    def plugin_image(self, spec: PluginSpec, node: str) -> str:
        """The plugin's image, present for ``node`` (built and loaded, or the user's pullable one)."""
        ...

    def workload_image(self, image: str, node: str | None) -> str | None:
        """What test pods asking for ``image`` run instead on ``node`` (``None``: any node) where the cluster has no
        registry, present there; or ``None``."""
        ...

    def disposes_cluster(self) -> bool:
        """Whether :meth:`close` deletes the whole cluster (then nothing in it needs removing first)."""
        ...

    def describe(self) -> str:
        """The cluster in words, for messages."""
        ...

    def close(self) -> None:
        """Release the cluster (delete it if this run made it and may) and the provider's temp files."""
        ...


@dataclass
class _Deployed:
    spec: PluginSpec
    workload: PinnedDaemonSets
    image: str
    refs: int = 1


class KubeBackend:
    """The backend protocol on a real cluster: pods and plugin through the API, node internals via the transport."""

    def __init__(self, options: BackendOptions, provider: ClusterProvider) -> None:
        self.options = options
        self.provider = provider
        self.name = provider.name
        self.namespace = "devplug-" + secrets.token_hex(4)
        #: Test pods live in the run's namespace too: removing it removes everything.
        self.pod_namespace = self.namespace
        self._api: KubeApi | None = None
        self._nodeops: NodeOps | None = None
        self._plugins: dict[str, _Deployed] = {}
        self._policy_saved: dict[str, str] = {}
        self._node_image = options.node_image
        self._mock_dirs: set[str] = set()  # nodes where we made /var/lib/devplug (removed at the end)
        self._logged: set[str] = set()  # nodes whose kubelet journal is read from our first use on
        self._kubelet_down: set[str] = set()  # nodes whose kubelet stop_kubelet stopped
        self._gpu_node_files: dict[
            str, list[str]
        ] = {}  # node -> what we made of a mock GPU node there (removed at the end)
        self._signals = SignalGuard()
        self._dra: KubeDRA | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        self._signals.install()
        try:
            self._api = KubeApi(self.provider.start(), self.options.timeout)
            sweep_orphans(self._api, max(self.options.timeout, 120.0))
            self._create_namespace()
            transport = self.provider.transport(self._api, self.namespace, self._node_pod_image)
            self._nodeops = NodeOps(transport, self.options.timeout)
        except BaseException:
            self.close()
            raise

    def _create_namespace(self) -> None:
        labels = {
            MANAGED_BY[0]: MANAGED_BY[1],
            # The node pods are privileged; a cluster enforcing Pod Security must let them in.
            "pod-security.kubernetes.io/enforce": "privileged",
        }
        try:
            self.api.create_namespace(self.namespace, labels, Owner.current().annotations())
        except BackendError as exc:
            raise BackendUnavailableError(f"{self.name} backend: {exc}") from None
        # Pods are refused until the namespace's default ServiceAccount exists.
        self.wait_until(
            lambda: self.api.service_account_exists("default", self.namespace),
            bool,
            f"ServiceAccount default in namespace {self.namespace}",
            timeout=max(self.options.timeout, _CLUSTER_PACE_S),
        )

    def close(self) -> None:
        """Remove everything the run made (plugins, node files and pods, the namespace), then the cluster if ours."""
        errors: list[str] = []
        with self._signals.shielded():
            if self._api is not None:
                if not self.provider.disposes_cluster():
                    errors += self._clean_cluster()
                self._api.close()
                self._api = None
            try:
                self.provider.close()
            except Exception as exc:  # noqa: BLE001 - kind's own deletion raises several types; report it
                errors.append(str(exc))
        self._signals.uninstall()
        if errors:
            raise BackendError(f"{self.name} backend teardown: " + "; ".join(errors))

    def _clean_cluster(self) -> list[str]:
        errors: list[str] = []
        for node in sorted(self._kubelet_down):  # a test ended between stop_kubelet and start_kubelet
            try:
                self.nodeops.start_kubelet(node)
                self._kubelet_down.discard(node)
            except BackendError as exc:
                errors.append(f"starting the kubelet on {node} again: {exc}")
        if self._dra is not None:  # its pods go only through a running kubelet
            errors += self._dra.close()
        for node in list(self._plugins):
            try:
                self._plugins[node].refs = 1
                self.remove_plugin(node)
            except Exception as exc:  # noqa: BLE001 - keep tearing down, report at the end
                errors.append(f"removing plugin on {node}: {exc}")
        if self._nodeops is not None:
            for node in sorted(self._mock_dirs):
                try:
                    self._nodeops.exec(node, f"rm -rf {MOCK_DIR}")
                except BackendError as exc:
                    errors.append(f"removing {MOCK_DIR} on {node}: {exc}")
            for node, made in sorted(self._gpu_node_files.items()):
                try:
                    self._nodeops.exec(node, gpunode.remove_script(made))
                except BackendError as exc:
                    errors.append(f"removing the mock GPU node's files {made} on {node}: {exc}")
            try:
                self._nodeops.transport.close()
            except BackendError as exc:
                errors.append(str(exc))
        try:
            assert self._api is not None
            delete_namespace(self._api, self.namespace, max(self.options.timeout, 120.0))
        except BackendError as exc:
            errors.append(str(exc))
        return errors

    @property
    def dra(self) -> KubeDRA | None:
        """The DRA side (:class:`~.dra.KubeDRA`), made at first use; ``None`` before the backend started."""
        if self._dra is None and self._api is not None and self._nodeops is not None:
            self._dra = KubeDRA(self)
        return self._dra

    @property
    def api(self) -> KubeApi:
        if self._api is None:
            raise BackendError(f"{self.name} backend not started")
        return self._api

    @property
    def nodeops(self) -> NodeOps:
        if self._nodeops is None:
            raise BackendError(f"{self.name} backend not started")
        return self._nodeops

    def wait_until(self, probe: Callable[[], T], ok: Callable[[T], bool], what: str, timeout: float | None = None) -> T:
        """:func:`wait_for` with the backend's timeout; API and node errors count as "not yet"."""
        try:
            return wait_for(
                probe,
                ok,
                timeout=self.options.timeout if timeout is None else timeout,
                interval=0.5,
                what=what,
                retry_on=(BackendError, OSError),
            )
        except WaitTimeout as exc:
            raise BackendError(str(exc)) from None

    def _node_pod_image(self) -> str:
        if self._node_image:
            return self._node_image
        raise BackendUnavailableError(
            f"{self.name} backend: node operations (kubelet restart, checkpoint, pod-resources, mock state) run in a "
            "privileged pod whose image needs sh, nsenter and python3 with grpcio; pass --devplug-node-image "
            "(the included plugin's image has them), or --devplug-plugin-image of such an image"
        )

    # -- nodes -------------------------------------------------------------------------------------
    def ensure_node(self, spec: NodeSpec) -> str:
        """A node of the cluster that fits ``spec`` (no node is created); a Topology Manager policy is set on its
        kubelet until the plugin deployed for that spec is removed."""
        node = self._pick_node(spec)
        if node not in self._logged:
            try:
                self.nodeops.mark_log_start(node)
                self._logged.add(node)
            except BackendUnavailableError:
                pass  # no node-pod image known yet (an adopted plugin): its journal is then read whole
        self._apply_policy(node, spec)
        return node

    def _pick_node(self, spec: NodeSpec) -> str:
        """``--devplug-node``, else the first node advertising the resource, else one labelled devplug.io/gpu;
        for a node beside the one under test, ``--devplug-second-node``."""
        nodes = sorted(self.api.list_nodes(), key=lambda n: str(n["metadata"]["name"]))
        names = [str(n["metadata"]["name"]) for n in nodes]
        if spec.beside is not None:
            return self._second_node(spec.beside, names)
        tested = [n for n in self._plugins if n != self.options.second_node]
        if spec.resource_name is None and tested:
            return tested[0]  # a second spec for the node under test (e.g. a Topology Manager policy)
        if self.options.node:
            if self.options.node not in names:
                raise BackendUnavailableError(f"--devplug-node {self.options.node}: no such node (nodes: {names})")
            return self.options.node
        if spec.resource_name and not spec.labels:
            for n in nodes:
                if (n.get("status", {}).get("capacity") or {}).get(spec.resource_name, "0") not in ("0", ""):
                    return str(n["metadata"]["name"])
        want = {GPU_LABEL[0]: GPU_LABEL[1], **spec.labels}
        for n in nodes:
            labels = n["metadata"].get("labels") or {}
            if all(labels.get(k) == v for k, v in want.items()):
                return str(n["metadata"]["name"])
        raise BackendUnavailableError(
            f"{self.name} backend: in {self.provider.describe()} no node advertises {spec.resource_name} and none is "
            f"labelled {want} (the kind-config/*.yaml configs label one); pass --devplug-node (nodes: {names})"
        )

    def _second_node(self, beside: str, names: list[str]) -> str:
        second = self.options.second_node
        if not second:
            raise UnsupportedOperationError(
                f"needs a second node beside {beside}, and the {self.name} backend adds no nodes: pass "
                f"--devplug-second-node NAME, a node of {self.provider.describe()} where a copy of the plugin may run "
                f"(nodes: {names})"
            )
        if second not in names:
            raise BackendUnavailableError(f"--devplug-second-node {second}: no such node (nodes: {names})")
        if second == beside:
            raise UnsupportedOperationError(f"--devplug-second-node {second} is the node under test; name another one")
        return second

    def _apply_policy(self, node: str, spec: NodeSpec) -> None:
        """Switch the node's kubelet to ``spec.topology_policy`` (kept until the plugin deployed for it goes).

        The kubelet config is read and changed only when a test asks for a policy."""
        if spec.topology_policy == "none" and node not in self._policy_saved:
            return
        config = yaml.safe_load(self.nodeops.kubelet_config(node))
        if spec.topology_policy != config.get("topologyManagerPolicy", "none"):
            if node not in self._policy_saved:
                self._policy_saved[node] = self.nodeops.kubelet_config(node)
            config["topologyManagerPolicy"] = spec.topology_policy
            self.reconfigure_kubelet(node, yaml.safe_dump(config))

    def reconfigure_kubelet(self, node: str, text: str) -> None:
        """Give the node's kubelet config ``text`` and restart it; returns once its pods and the plugin's resource
        are back."""
        before = self._status_heartbeat(node)
        running = self._running_pods(node)
        self.nodeops.set_kubelet_config(node, text)
        self._after_kubelet_restart(node, before)
        self._wait_pods_resynced(node, running)
        dep = self._plugins.get(node)
        if dep is not None and self.plugin_running(node):
            res = dep.spec.resource_name
            self.wait_until(
                lambda: (self.get_node(node)["status"].get("allocatable") or {}).get(res),
                lambda a: a not in (None, "0"),
                f"{res} registered again on {node} after reconfiguring its kubelet",
            )

    def list_nodes(self) -> list[JSONDict]:
        return self.api.list_nodes()

    def get_node(self, name: str) -> JSONDict:
        return self.api.get_node(name)

    def _status_heartbeat(self, node: str) -> str:
        for c in self.get_node(node).get("status", {}).get("conditions") or []:
            if c.get("type") == "Ready":
                return str(c.get("lastHeartbeatTime"))
        return ""

    def _after_kubelet_restart(self, node: str, heartbeat_before: str) -> None:
        """Wait until the new kubelet serves and has posted a fresh node status (so reads are not stale)."""
        limit = max(self.options.timeout, _CLUSTER_PACE_S)
        self.nodeops.wait_kubelet_serving(node, limit)
        self.wait_until(
            lambda: self._status_heartbeat(node),
            lambda hb: hb != heartbeat_before,
            f"a node status from the restarted kubelet on {node}",
            timeout=limit,
        )

    def restart_kubelet(self, node: str) -> None:
        """Restart, then wait until the new kubelet posted node status and pod-resources lists its running pods.

        Right after a restart the real kubelet answers pod-resources before it has synced its pods from the
        API server; "restarted" here means caught up, as the embedded kubelet is when its restart returns.
        """
        before = self._status_heartbeat(node)
        running = self._running_pods(node)
        self.nodeops.restart_kubelet(node)
        self._after_kubelet_restart(node, before)
        self._wait_pods_resynced(node, running)

    def _running_pods(self, node: str) -> set[tuple[str, str]]:
        """The pods the API server has running on ``node`` and not being deleted (any namespace: other runs' too)."""
        return {
            (p["metadata"]["namespace"], p["metadata"]["name"])
            for p in self.api.list_pods(None, field_selector=f"spec.nodeName={node},status.phase=Running")
            if not p["metadata"].get("deletionTimestamp")
        }

    def _wait_pods_resynced(self, node: str, running: set[tuple[str, str]]) -> None:
        """Until pod-resources lists the pods that ran before the restart: the kubelet handled its first pod
        sync from the API server (and so marked its pod sources seen).

        Until then a real kubelet's device manager does not drop allocations of pods that are gone
        (``UpdateAllocatedDevices`` returns early while ``sourcesReady.AllReady()`` is false, and the kubelet
        marks a source seen only after handling its first update): devices of pods deleted before the
        restart still count as allocated from the checkpoint, and a pod arriving in that first sync can be
        refused (e.g. TopologyAffinityError: its NUMA node's devices look taken). The embedded kubelet's
        restart returns only after its sources are ready, so it has no such window. A pod deleted meanwhile (another
        run's, on a shared cluster) is not waited for.
        """
        self.wait_until(
            lambda: (running & self._running_pods(node)) - {(p.namespace, p.name) for p in self.pod_resources(node)},
            lambda missing: not missing,
            f"pod-resources on {node} listing the pods that ran before the kubelet restart",
            timeout=max(self.options.timeout, _CLUSTER_PACE_S),
        )

    def kubelet_log(self, node: str) -> str:
        return self.nodeops.kubelet_log(node)

    def _reach_without_kubelet(self, node: str, what: str) -> None:
        if not self.nodeops.transport.bypasses_kubelet:
            raise UnsupportedOperationError(
                f"the {self.name} backend cannot {what}: it reaches node {node} only through its kubelet (an API exec "
                "into a privileged pod), which is down meanwhile"
            )

    def stop_kubelet(self, node: str) -> None:
        """Stop the kubelet unit (containers keep running); pods deleted meanwhile are force-deleted (grace 0), as
        upstream's orphaned-pods test deletes them: nothing on the node can confirm a graceful deletion."""
        self._reach_without_kubelet(node, "keep a kubelet down")
        self.nodeops.stop_kubelet(node)
        self._kubelet_down.add(node)

    def start_kubelet(self, node: str) -> None:
        """Start the kubelet again; returns once it posted a fresh node status and pod-resources lists the pods the
        API server still binds to the node (it re-admitted them: the embedded kubelet's start returns then too)."""
        self._reach_without_kubelet(node, "start a kubelet it stopped")
        before = self._status_heartbeat(node)
        bound = self._running_pods(node)
        self.nodeops.start_kubelet(node)
        self._kubelet_down.discard(node)
        self._after_kubelet_restart(node, before)
        self._wait_pods_resynced(node, bound)

    def kubelet_running(self, node: str) -> bool:
        """``False`` between :meth:`stop_kubelet` and :meth:`start_kubelet`: the harness keeps a kubelet down only so
        (asked after every test: no call to the node)."""
        return node not in self._kubelet_down

    def reboot_node(self, node: str) -> str:
        """A staged reboot, as upstream's node e2e tests stage one (``device_plugin_test.go``): the kubelet stopped,
        every pod sandbox removed through the CRI (the containers killed), the node's ``/var/run/cdi`` emptied (on a
        real node ``/run`` is a tmpfs), the kubelet started again; the machine itself keeps running. The plugin's pod
        goes with the others and its DaemonSet stops selecting the node until ``start_plugin`` (a DaemonSet pod would
        come back later, as the sim's plugin process is started later)."""
        self._reach_without_kubelet(node, "reboot a node")
        labels = (self.get_node(node).get("metadata") or {}).get("labels") or {}
        if CONTROL_PLANE_ROLE in labels:
            raise UnsupportedOperationError(
                f"node {node} runs the cluster's control plane ({CONTROL_PLANE_ROLE}): rebooting it, even staged, "
                "takes the API server down with its pods; run the reboot checks on a worker node (--devplug-node)"
            )
        dep = self._plugins.get(node)
        if dep is not None:
            self._not_adopted("reboot the node of")
            dep.workload.snapshot_logs()
        before = self._status_heartbeat(node)
        self.nodeops.stop_kubelet(node)
        try:
            if dep is not None:
                dep.workload.force_remove_pods("plugin pod removed for the reboot")
            self.nodeops.remove_pod_sandboxes(node)
            self.nodeops.empty_directory(node, CDI_RUN_DIR)
        finally:
            self.nodeops.start_kubelet(node)
        self._after_kubelet_restart(node, before)
        return STAGED_REBOOT

    def machine_numa_nodes(self, node: str) -> list[int]:
        return self.nodeops.numa_nodes(node)

    def plugin_pre_start_required(self, node: str, resource: str) -> bool | None:
        raise UnsupportedOperationError(
            "a real kubelet shows the options it got from a plugin nowhere (not in its API, log or checkpoint)"
        )

    def device_injections(self, node: str, resource: str, device_ids: Sequence[str]) -> dict[str, ContainerView]:
        raise UnsupportedOperationError(
            f"{self.name}: calling the plugin's Allocate outside the kubelet is not implemented (it would run on the "
            "node, beside the kubelet's own dial of the plugin socket)"
        )

    def read_checkpoint(self, node: str) -> bytes | None:
        return self.nodeops.read_checkpoint(node)

    def pod_resources(self, node: str) -> list[PodResourcesPod]:
        return self.nodeops.pod_resources(node)

    def allocatable_devices(self, node: str) -> list[PodResourcesDevices]:
        return self.nodeops.allocatable_devices(node)

    def pod_resources_get(self, node: str, name: str, namespace: str) -> PodResourcesPod:
        return self.nodeops.pod_resources_get(node, name, namespace)

    # -- the plugin --------------------------------------------------------------------------------
    def _adopted(self) -> tuple[str, str] | None:
        ref = self.options.plugin_daemonset
        if not ref:
            return None
        ns, _, name = ref.partition("/")
        if not ns or not name:
            raise BackendUnavailableError(f"--devplug-plugin-daemonset {ref!r}: expected NAMESPACE/NAME")
        return ns, name

    def deploy_plugin(self, node: str, spec: PluginSpec) -> None:
        dep = self._plugins.get(node)
        if dep is not None:
            if dep.spec == spec:
                dep.refs += 1  # the same plugin again (e.g. the Topology Manager fixture): shared
                return
            raise BackendError(f"a different plugin is already deployed on {node}; remove it first")
        image = None if self._adopted() else self.provider.plugin_image(spec, node)
        self.note_node_image(image)
        if spec.mock:  # before the DaemonSet: the plugin reads the state and loads the library at start
            self.prepare_mock_node(
                node, mockstate.initial_state(spec.gpus, spec.numa_nodes, spec.mig, spec.gpu_model), MOCK_STATE_PATH
            )
        adopted = self._adopted()
        if adopted is not None:
            ds = self.api.get_daemonset(adopted[1], adopted[0])
            if ds is None:
                raise BackendUnavailableError(
                    f"--devplug-plugin-daemonset {adopted[0]}/{adopted[1]}: no such DaemonSet"
                )
            self._plugins[node] = _Deployed(spec, self.pinned_daemonsets(node, [ds]), "(adopted)")
            return
        assert image is not None
        labels = {MANAGED_BY[0]: MANAGED_BY[1]}
        daemonsets = [
            own_daemonset(ds, self.namespace, node, labels, tolerations=node_tolerations(self.get_node(node)))
            for ds in render_daemonsets(spec, image)
        ]
        workload = self.pinned_daemonsets(node, daemonsets)
        workload.apply()
        self._plugins[node] = _Deployed(spec, workload, image)

    def note_node_image(self, image: str | None) -> None:
        """An image the node pods may run (it has python3, grpcio, nsenter), if none was given."""
        self._node_image = self._node_image or image

    def prepare_mock_node(self, node: str, state: JSONDict, state_path: str) -> None:
        """The mock NVML on ``node``: ``state`` at ``state_path``, the mock library, and on a node that is a container
        the mock GPU node's files (device nodes, driver root); all removed at the end."""
        if (
            node not in self._mock_dirs
            and self.nodeops.transport.run(node, f"test -e {MOCK_DIR}", timeout=_CLUSTER_PACE_S).returncode != 0
        ):
            self._mock_dirs.add(node)
        self.nodeops.write_file(node, state_path, json.dumps(state, indent=1).encode())
        library = mock_library_file()
        self.nodeops.write_file(node, *library)
        if self.provider.nodes_are_containers and node not in self._gpu_node_files:
            made = self.nodeops.exec(node, gpunode.make_script((int(g["minor"]) for g in state["gpus"]), library[0]))
            self._gpu_node_files[node] = made.split()

    def pinned_daemonsets(self, node: str, daemonsets: list[JSONDict]) -> PinnedDaemonSets:
        """``daemonsets`` (not applied yet) as a workload pinned to ``node``, its waits on the cluster's pace."""

        def wait_gone(probe: Callable[[], list[JSONDict]], what: str) -> None:
            self.wait_until(probe, lambda pods: not pods, what, timeout=max(self.options.timeout, _CLUSTER_PACE_S))

        return PinnedDaemonSets(self.api, node, daemonsets, wait_gone)

    def _dep(self, node: str) -> _Deployed:
        try:
            return self._plugins[node]
        except KeyError:
            raise BackendError(f"no plugin deployed on node {node}") from None

    def _plugin_pods(self, node: str) -> list[JSONDict]:
        return self._dep(node).workload.pods()

    def _wait_kubelet_noticed_stop(self, node: str, resource: str) -> None:
        """Until the node status shows no allocatable ``resource``: the kubelet noticed the plugin went away.

        The kubelet posts node status every 10 s; without this wait the next reader sees the old plugin's
        counts, a scheduler binds to them and admission fails (``no healthy devices``) before the new
        plugin registers. The sim updates at once, so it needs no such wait.
        """
        self.wait_until(
            lambda: (self.get_node(node).get("status", {}).get("allocatable") or {}).get(resource),
            lambda a: a in (None, "0"),
            f"{resource} allocatable 0 on {node} after its plugin stopped (the kubelet posts status every 10 s)",
            timeout=max(self.options.timeout, _CLUSTER_PACE_S),
        )

    def remove_plugin(self, node: str) -> None:
        dep = self._plugins.get(node)
        if dep is None:
            return
        dep.refs -= 1
        if node in self._policy_saved:
            self.reconfigure_kubelet(node, self._policy_saved.pop(node))
        if dep.refs > 0:
            return
        if self._adopted() is not None:  # not ours: left running
            del self._plugins[node]
            return
        try:
            dep.workload.snapshot_logs()
        except BackendError:
            pass
        dep.workload.delete()
        try:
            dep.workload.wait_no_pods(f"plugin pods on {node} gone after deleting the DaemonSet")
            self._wait_kubelet_noticed_stop(node, dep.spec.resource_name)
        finally:
            del self._plugins[node]

    def _not_adopted(self, what: str) -> None:
        if (ref := self._adopted()) is not None:
            raise UnsupportedOperationError(
                f"cannot {what} the adopted plugin {ref[0]}/{ref[1]}: the {self.name} backend does not change objects "
                "it did not make (deploy the plugin with --devplug-plugin-image to test its lifecycle)"
            )

    def stop_plugin(self, node: str) -> None:
        """Graceful stop (SIGTERM): the DaemonSet stops selecting the node, so its pod is deleted."""
        self._not_adopted("stop")
        workload = self._dep(node).workload
        workload.snapshot_logs()
        workload.set_stopped(True)
        workload.wait_no_pods(f"plugin pod on {node} terminated")
        self._wait_kubelet_noticed_stop(node, self._dep(node).spec.resource_name)

    def kill_plugin(self, node: str) -> None:
        """Abrupt stop: the pod is force-deleted (SIGKILL, no grace) and not recreated until ``start_plugin``."""
        self._not_adopted("kill")
        workload = self._dep(node).workload
        workload.snapshot_logs()
        workload.force_remove_pods("plugin pod killed")
        self._wait_kubelet_noticed_stop(node, self._dep(node).spec.resource_name)

    def start_plugin(self, node: str) -> None:
        self._not_adopted("start")
        self._dep(node).workload.set_stopped(False)

    def plugin_running(self, node: str) -> bool:
        return node in self._plugins and pods_running(self._plugin_pods(node))

    def plugin_exit(self, node: str) -> str | None:
        """A plugin container the kubelet keeps failing to run: it will not come up by itself."""
        return exit_reason(self._plugin_container_statuses(node))

    def surge_plugin(self, node: str) -> None:
        raise UnsupportedOperationError(
            f"{self.name}: a second instance of the plugin beside the first on one node (a DaemonSet rollout with "
            "maxSurge) is not implemented on this backend; and a real kubelet before kubernetes/kubernetes#135437 "
            "disconnects the newer instance when the older one's connection ends (kubernetes/kubernetes#121994), so "
            "a correct plugin would fail there"
        )

    def retire_plugin(self, node: str, *, newest: bool = False) -> None:
        raise UnsupportedOperationError(
            f"{self.name}: no second instance of the plugin to retire (surge_plugin is not implemented)"
        )

    def plugin_restarts(self, node: str) -> PluginRestarts:
        """The plugin pods' containers' ``restartCount`` (a pod the harness deletes takes its count with it)."""
        return restarts(self._plugin_container_statuses(node))

    def _plugin_container_statuses(self, node: str) -> list[tuple[str, JSONDict]]:
        """(pod name, container status) of the plugin's pods on ``node``; none while no plugin is deployed there."""
        return container_statuses(self._plugin_pods(node)) if node in self._plugins else []

    def plugin_log(self, node: str) -> str:
        return self._dep(node).workload.log("plugin")

    # -- pods --------------------------------------------------------------------------------------
    def create_pod(self, manifest: JSONDict) -> JSONDict:
        body = json.loads(json.dumps(manifest))
        spec = body.get("spec", {})
        node = spec.get("nodeName") or (spec.get("nodeSelector") or {}).get("kubernetes.io/hostname")
        for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            if c.get("image") == DEFAULT_IMAGE and (local := self.provider.workload_image(DEFAULT_IMAGE, node)):
                c["image"] = local
                c.setdefault("imagePullPolicy", "IfNotPresent")
        return self.api.create_pod(body)

    def get_pod(self, name: str, namespace: str = "default") -> JSONDict:
        return self.api.get_pod(name, namespace)

    def delete_pod(self, name: str, namespace: str = "default") -> None:
        """Delete and wait until the pod is gone (as ``kubectl delete`` does): its devices are free afterwards.

        On a node whose kubelet is stopped the deletion is forced (grace 0): no kubelet confirms it."""
        down = (
            bool(self._kubelet_down)
            and self.api.get_pod(name, namespace).get("spec", {}).get("nodeName") in self._kubelet_down
        )
        self.api.delete_pod(name, namespace, grace=0 if down else None)

        def gone() -> bool:
            try:
                self.api.get_pod(name, namespace)
            except ObjectNotFoundError:
                return True
            return False

        self.wait_until(
            gone, bool, f"pod {namespace}/{name} deleted", timeout=max(self.options.timeout, _CLUSTER_PACE_S)
        )

    def list_pods(self, namespace: str | None = None) -> list[JSONDict]:
        return self.api.list_pods(namespace)

    def events(self, *, namespace: str | None = None, involved_name: str | None = None) -> list[JSONDict]:
        return self.api.events(namespace=namespace, involved_name=involved_name)

    def exec_pod(self, name: str, argv: Sequence[str], *, container: str, namespace: str = "default") -> ExecResult:
        return self.api.exec(name, namespace, container, argv)

    def container_view(self, name: str, container: str, namespace: str = "default") -> ContainerView:
        """The Allocate responses the kubelet recorded for the container (checkpoint), i.e. what it handed the
        runtime."""
        pod = self.get_pod(name, namespace)
        node = pod.get("spec", {}).get("nodeName")
        if not node:
            raise BackendError(f"pod {namespace}/{name} is not on a node yet")
        raw = self.read_checkpoint(node)
        entries = parse_checkpoint(raw).entries_for(pod["metadata"]["uid"], container) if raw else []
        view = applied_view(entries)
        if (pod.get("spec") or {}).get("resourceClaims") or (pod.get("status") or {}).get(
            "extendedResourceClaimStatus"
        ):
            view = self._with_claim_devices(node, pod, container, view)
        return self._with_cdi_edits(node, view)

    def _with_claim_devices(self, node: str, pod: JSONDict, container: str, view: ContainerView) -> ContainerView:
        """The view plus the CDI device IDs of the container's ResourceClaims, from the kubelet's ``dra_manager_state``
        (upstream's ``GetResources``: the devices of each claim, or of the request, the container names, then those of
        the scheduler's claim for its DRA-backed extended resources where the node's release has
        DRAExtendedResource)."""
        raw = self.nodeops.read_file(node, DRA_CHECKPOINT_PATH)
        states = {(e.namespace, e.claim_name): e for e in (dra_cp.decode(raw).entries or [])} if raw else {}
        try:
            info = (self.get_node(node).get("status") or {}).get("nodeInfo") or {}
            extended = self.options.kube.on_node(str(info.get("kubeletVersion") or "")).gate("DRAExtendedResource")
            ids = container_cdi_devices(pod, container, lambda ns, name: states.get((ns, name)), extended=extended)
        except ClaimError as exc:
            raise BackendError(
                f"pod {pod['metadata'].get('namespace')}/{pod['metadata'].get('name')} on {node}: {exc}"
            ) from None
        return dataclasses.replace(
            view, cdi_devices=(*view.cdi_devices, *(i for i in ids if i not in view.cdi_devices))
        )

    def _with_cdi_edits(self, node: str, view: ContainerView) -> ContainerView:
        """The view with the edits of its CDI devices, as a CDI-enabled runtime applies them, from the spec files on
        the node (resolved by upstream's rules, :func:`pytest_devplug.kubeletmodel.cdi.apply_edits`): what the container
        should have. Whether it has them is for the container to show (``exec``); a name no spec resolves any more
        is an error."""
        if not view.cdi_devices and not cdi.names_from_annotations(view.annotations):
            return view
        with tempfile.TemporaryDirectory(prefix="devplug-cdi-") as tmp:
            self.nodeops.read_tree(node, CDI_SPEC_DIRS, Path(tmp))
            try:
                return cdi.apply_edits(view, [Path(tmp) / d.lstrip("/") for d in CDI_SPEC_DIRS])
            except UnresolvableCdiDevicesError as exc:
                raise BackendError(f"on node {node}: {str(exc).replace(tmp, '')}") from None

    def restart_container(self, name: str, container: str, namespace: str = "default") -> None:
        """Kill the container's task in containerd (SIGKILL): the kubelet restarts it, as after a crash."""
        pod = self.get_pod(name, namespace)
        node = pod.get("spec", {}).get("nodeName")
        cid = next(
            (
                s.get("containerID", "")
                for s in pod.get("status", {}).get("containerStatuses") or []
                if s["name"] == container
            ),
            "",
        )
        if not node or "://" not in cid:
            raise BackendError(f"container {container} of {namespace}/{name} is not running (no containerID)")
        self.nodeops.kill_container(node, cid.split("://", 1)[1])

    # -- mock NVML ---------------------------------------------------------------------------------
    def _check_mock(self, node: str) -> None:
        if not self._dep(node).spec.mock:
            raise BackendError(f"the plugin on {node} was deployed without a mock-NVML state file")

    def read_mock_state(self, node: str) -> JSONDict:
        self._check_mock(node)
        return self.nodeops.read_json(node, MOCK_STATE_PATH)

    def write_mock_state(self, node: str, state: JSONDict) -> None:
        self._check_mock(node)
        self.nodeops.write_file(node, MOCK_STATE_PATH, json.dumps(state, indent=1).encode())

    # -- knobs -------------------------------------------------------------------------------------
    @property
    def grace_period(self) -> float:
        return ENDPOINT_STOP_GRACE_PERIOD_S  # a constant in the device manager: no flag changes it

    def set_grace_period(self, seconds: float) -> None:
        raise UnsupportedOperationError(
            "a real kubelet's device-plugin grace period is a constant (endpointStopGracePeriod, 5 min); "
            "no flag changes it"
        )
