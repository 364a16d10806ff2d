"""The backend protocol: everything the fixtures and helpers need from a cluster, and nothing more.

Two backends implement it: ``sim`` (the embedded kubelet, in-process) and ``kind`` (a real cluster).
The protocol is shaped so that a remote cluster can implement it: pods travel as Kubernetes JSON
manifests (dicts), ``exec`` takes an argv and returns its output, the checkpoint is the file's bytes as
read from the node, pod-resources answers come back as plain data, and the mock-NVML state is a JSON
document read from and written to the node. Nothing here exposes a sim object.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args, runtime_checkable

from ..kubeletmodel.checkpoint import Checkpoint, CheckpointEntry, parse_checkpoint
from ..kubeletmodel.periods import ENDPOINT_STOP_GRACE_PERIOD_S
from ..kubeletmodel.releases import KubeVersion
from ..kubeletmodel.runoptions import applied_view
from ..kubeletmodel.views import ContainerView, DeviceNodeView, MountView
from .dra import DRABackend
from .mockstate import DEFAULT_GPU_MODEL
from .placeholders import fill_placeholders

__all__ = [
    "Backend",
    "NodeSpec",
    "PluginSpec",
    "PluginRestarts",
    "ExecResult",
    "ContainerView",
    "MountView",
    "DeviceNodeView",
    "PodResourcesDevices",
    "PodResourcesContainer",
    "PodResourcesPod",
    "Checkpoint",
    "CheckpointEntry",
    "parse_checkpoint",
    "applied_view",
    "fill_placeholders",
    "node_tolerations",
    "DEFAULT_RESOURCE_NAME",
    "DEFAULT_TIMEOUT",
    "DEFAULT_REREGISTRATION_TIMEOUT",
    "DEFAULT_GRACE_PERIOD",
    "DEFAULT_IMAGE",
]

#: The resource the included GPU plugin advertises unless told otherwise.
DEFAULT_RESOURCE_NAME = "nvidia.com/gpu"
#: Seconds any one bounded wait may take (``--devplug-timeout``).
DEFAULT_TIMEOUT = 20.0
#: Seconds a plugin may take to register again after a kubelet restart (``--devplug-reregistration-timeout``):
#: the kubelet's own dial of the plugin's socket may take its full 10 s, and upstream-style plugins (the
#: device-plugin stub) wait 10 s after a new kubelet.sock before serving again; 40 s leaves them room on a
#: loaded machine.
DEFAULT_REREGISTRATION_TIMEOUT = 40.0
#: The sim kubelet's grace period unless ``--devplug-grace-period`` shortens it: upstream's.
DEFAULT_GRACE_PERIOD = ENDPOINT_STOP_GRACE_PERIOD_S
#: The container image of pods made by the fixtures' ``PodFactory`` (kind needs a shell for ``exec``); a
#: backend with no registry substitutes a local image for it.
DEFAULT_IMAGE = "busybox:1.36"

JSONDict = dict[str, Any]


#: Taints the node lifecycle controller puts on a node whose kubelet is not ready (``node.kubernetes.io/not-ready``,
#: ``.../unreachable``, ...) or a cloud provider on one not yet initialised: states of the node, which a check may
#: be waiting out, not the node's configuration.
_STATE_TAINT_PREFIXES = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/")


def node_tolerations(node: Mapping[str, Any], *, states: bool = False) -> list[JSONDict]:
    """Tolerations of the taints ``node`` is configured with (a GPU node's ``nvidia.com/gpu:NoSchedule``, a control
    plane's): the run's pods and plugins are pinned to their node by name, and a tainted GPU node must not keep them
    away. The taints that say the node's state are left out unless ``states``: a DRA check creates a pod while the
    node's kubelet is down (upstream's scenario), by when the node lifecycle controller may have tainted it."""
    return [
        {"key": t["key"], "operator": "Exists", "effect": t["effect"]}
        for t in (node.get("spec") or {}).get("taints") or []
        if t.get("key") and t.get("effect") and (states or not str(t["key"]).startswith(_STATE_TAINT_PREFIXES))
    ]


@dataclass(frozen=True)
class NodeSpec:
    """A node the suite wants: the sim creates it; kind must already have one with these traits."""

    name: str
    numa_nodes: int = 2
    topology_policy: str = "none"
    labels: Mapping[str, str] = field(default_factory=dict)
    #: The resource the node should carry (the cluster backend picks the first node advertising it).
    resource_name: str | None = None
    #: Device nodes the node has (``/dev/ttyS0``, ...), for plugins that scan ``/dev``: sim makes stub files at
    #: these paths in the private mount namespace of a plugin started without ``{plugin_dir}``.
    device_nodes: tuple[str, ...] = ()
    #: sim: a mock PCI/NIC node file (``--devplug-pci-node``, ``pytest_devplug.pcinodes.spec``): its sysfs, device
    #: nodes, PCI IDs and netdevs in the namespaces of a plugin started without ``{plugin_dir}``.
    pci_node: str | None = None
    #: A node other than this one (the node under test), for a second copy of the plugin (the soak's): the sim
    #: creates one; kind and cluster take ``--devplug-second-node`` and raise ``UnsupportedOperationError``
    #: without it.
    beside: str | None = None


@dataclass(frozen=True)
class PluginSpec:
    """How to deploy the plugin under test on a node.

    ``argv`` and ``env`` values (sim) may hold the placeholders ``{plugin_dir}``, ``{plugins_registry}``,
    ``{mock_state}`` and ``{python}``, filled by :meth:`command` when the plugin is started; ``image`` and
    ``manifest`` are what kind deploys. ``mock`` says the plugin reads the mock-NVML state file, so
    the fault controls (Xid, lost, add/remove, fail_allocate) work; ``gpus``/``numa_nodes`` shape the
    initial mock state.
    """

    resource_name: str = DEFAULT_RESOURCE_NAME
    argv: Sequence[str] = ()
    image: str | None = None
    manifest: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    mock: bool = False
    gpus: int = 4
    numa_nodes: int = 2
    #: MIG devices (profiles such as ``1g.5gb``) on every mock GPU, which are then MIG-enabled; none: MIG off.
    mig: tuple[str, ...] = ()
    #: The mock GPUs' model (``mockstate.GPU_MODELS``).
    gpu_model: str = DEFAULT_GPU_MODEL
    #: Whether the plugin asks for PreStartContainer (a conformance test checks it is called).
    pre_start_required: bool = False
    #: sim: run the plugin in a private mount namespace with the node's directories at the kubelet's
    #: standard paths (``/var/lib/kubelet/device-plugins``, ``/var/lib/kubelet/pod-resources``,
    #: ``/var/run/cdi``). ``None`` (default): exactly when neither ``argv`` nor ``env`` holds
    #: ``{plugin_dir}`` or ``{plugins_registry}``, i.e. for a plugin that does not take its directory as a flag.
    standard_paths: bool | None = None
    #: Opt-in checks of one plugin family's conventions the suite runs for this plugin (names in
    #: ``pytest_devplug.plugin.CONVENTIONS``); the kubelet requires none of them.
    conventions: frozenset[str] = frozenset()
    #: More resources the same plugin process advertises beside ``resource_name`` (each registered on its own,
    #: e.g. NVIDIA's mixed MIG strategy: ``nvidia.com/gpu`` and ``nvidia.com/mig-1g.5gb``). The single-resource
    #: checks judge ``resource_name``; the several-resources checks judge them all.
    extra_resource_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        names = self.resource_names
        if len(set(names)) != len(names):
            raise ValueError(f"PluginSpec: a resource is named twice in {list(names)}")

    @property
    def resource_names(self) -> tuple[str, ...]:
        """Every resource the plugin advertises, ``resource_name`` first."""
        return (self.resource_name, *self.extra_resource_names)

    def uses_standard_paths(self) -> bool:
        """Whether the sim runs this plugin at the kubelet's standard paths (see ``standard_paths``)."""
        if self.standard_paths is not None:
            return self.standard_paths
        return not any(p in a for a in [*self.argv, *self.env.values()] for p in ("{plugin_dir}", "{plugins_registry}"))

    def command(
        self,
        *,
        plugin_dir: str | os.PathLike[str],
        mock_state: str | os.PathLike[str] | None,
        plugins_registry: str | os.PathLike[str] = "",
    ) -> tuple[list[str], dict[str, str]]:
        """``argv`` and ``env`` as the plugin is started on a node: ``{plugin_dir}`` is the node's device-plugin
        directory, ``{plugins_registry}`` its plugin watcher's directory, ``{mock_state}`` the mock-NVML state file
        (empty without one), ``{python}`` this interpreter. The one place the placeholders are filled."""
        return fill_placeholders(
            self.argv,
            self.env,
            {
                "plugin_dir": os.fspath(plugin_dir),
                "mock_state": os.fspath(mock_state or ""),
                "plugins_registry": os.fspath(plugins_registry),
            },
        )


@dataclass(frozen=True)
class PluginRestarts:
    """The kubelet's restarts of the plugin's container since the harness last started it (``restartCount``: a
    plugin that exits by itself is restarted, as its DaemonSet's pod would be) and, while the kubelet holds the next
    restart back (``CrashLoopBackOff``), how it crash-loops."""

    count: int = 0
    crash_loop: str | None = None


@dataclass(frozen=True)
class ExecResult:
    """What an ``exec`` in a container returned."""

    returncode: int
    stdout: str
    stderr: str = ""


@dataclass(frozen=True)
class PodResourcesDevices:
    """One ``ContainerDevices`` of the pod-resources API."""

    resource_name: str
    device_ids: tuple[str, ...]
    numa_nodes: tuple[int, ...] = ()

    @classmethod
    def from_proto(cls, d: Any) -> PodResourcesDevices:
        """From a pod-resources v1 ``ContainerDevices`` message (any backend's answer)."""
        numa = tuple(int(n.ID) for n in d.topology.nodes) if d.HasField("topology") else ()
        return cls(resource_name=d.resource_name, device_ids=tuple(d.device_ids), numa_nodes=numa)


@dataclass(frozen=True)
class PodResourcesContainer:
    name: str
    devices: tuple[PodResourcesDevices, ...]

    def device_ids(self, resource_name: str) -> list[str]:
        return [d for devs in self.devices if devs.resource_name == resource_name for d in devs.device_ids]


@dataclass(frozen=True)
class PodResourcesPod:
    name: str
    namespace: str
    containers: tuple[PodResourcesContainer, ...]

    @classmethod
    def from_proto(cls, p: Any) -> PodResourcesPod:
        """From a pod-resources v1 ``PodResources`` message."""
        containers = tuple(
            PodResourcesContainer(c.name, tuple(PodResourcesDevices.from_proto(d) for d in c.devices))
            for c in p.containers
        )
        return cls(name=p.name, namespace=p.namespace, containers=containers)


@runtime_checkable
class Backend(Protocol):
    """A cluster the fixtures drive. Kubernetes objects are JSON-shaped dicts (camelCase keys)."""

    #: ``"sim"``, ``"kind"`` or ``"cluster"``.
    name: str
    #: What the run chose (the release and feature gates among it).
    options: BackendOptions
    #: Namespace of the test pods (sim: ``"default"``; kind and cluster make one of their own for the session).
    pod_namespace: str

    @property
    def dra(self) -> DRABackend | None:
        """The DRA side (drivers, the kubelet's view of them); ``None`` where the backend has none (not started, or
        sim without the real control plane). Read-only, so a backend may type it as its own implementation."""

    # -- cluster lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Create the cluster, or attach to an existing one (kind ``--cluster-name``)."""

    def close(self) -> None:
        """Tear everything down that ``start`` and later calls created (kind: unless kept)."""

    def ensure_node(self, spec: NodeSpec) -> str:
        """Return the name of a node with ``spec``'s traits, creating it where the backend can."""

    # -- the plugin under test ---------------------------------------------------------------------
    def deploy_plugin(self, node: str, spec: PluginSpec) -> None:
        """Start the plugin on ``node`` (sim: run ``argv``; kind: apply ``manifest`` with ``image``)."""

    def remove_plugin(self, node: str) -> None:
        """Stop the plugin for good on ``node``."""

    def stop_plugin(self, node: str) -> None:
        """Stop the plugin gracefully (SIGTERM); it may be started again."""

    def kill_plugin(self, node: str) -> None:
        """Kill the plugin abruptly (SIGKILL)."""

    def start_plugin(self, node: str) -> None:
        """Start a stopped plugin again with the same spec."""

    def plugin_running(self, node: str) -> bool: ...

    def plugin_exit(self, node: str) -> str | None:
        """Why the plugin cannot come up by itself any more — sim: the harness stopped or killed it (``"exited
        with status 3"``), or it crash-loops (the kubelet holds its restart back: its restarts and back-off);
        kind: its container is in CrashLoopBackOff or cannot be created — or ``None`` while it runs or the
        kubelet is about to start it again. Waits for the plugin stop at once on it."""

    def plugin_log(self, node: str) -> str: ...

    def surge_plugin(self, node: str) -> None:
        """Start a second instance of the node's plugin beside the running one, with the same spec (a DaemonSet
        rollout with ``maxSurge``: the new pod starts before the old one stops). Until :meth:`retire_plugin`,
        the other plugin calls act on the first instance; ``plugin_exit`` also reports the second one's exit.
        Raises ``UnsupportedOperationError`` where the backend cannot run two instances on one node."""

    def retire_plugin(self, node: str, *, newest: bool = False) -> None:
        """End a :meth:`surge_plugin` overlap: stop the first instance gracefully (SIGTERM, its pod deleted),
        so the second one is the node's plugin from now on; ``newest``: stop the second one instead (the
        rollout is abandoned) and keep the first."""

    def plugin_restarts(self, node: str) -> PluginRestarts:
        """How often the kubelet restarted the plugin on ``node`` since the harness started it, and whether it
        crash-loops (for reports and evidence; nothing waits on it). No plugin deployed: ``PluginRestarts()``."""

    # -- nodes -------------------------------------------------------------------------------------
    def list_nodes(self) -> list[JSONDict]: ...

    def get_node(self, name: str) -> JSONDict: ...

    def restart_kubelet(self, node: str) -> None:
        """Restart the kubelet; containers and plugin processes keep running."""

    def kubelet_log(self, node: str) -> str: ...

    def stop_kubelet(self, node: str) -> None:
        """Stop the kubelet and leave it down (containers keep running) until ``start_kubelet``; raises
        ``UnsupportedOperationError`` where the backend cannot keep a kubelet down and still serve the API."""

    def start_kubelet(self, node: str) -> None:
        """Start a kubelet ``stop_kubelet`` stopped; returns once it re-admitted the pods bound to the node."""

    def reboot_node(self, node: str) -> str:
        """Reboot the node: every container and plugin process goes, ``/run`` (so ``/var/run/cdi``) is emptied while
        ``/var/lib/kubelet`` is kept, then the kubelet starts again. The plugin is not started again (a DaemonSet's
        pod would come back later: ``start_plugin`` plays that part). Returns how the node was rebooted, for the
        report: a backend that cannot reboot a machine stages the same effect and says ``staged: ...``."""

    def machine_numa_nodes(self, node: str) -> list[int]:
        """The NUMA node IDs of the node's machine, as its kubelet's Topology Manager sees them (cadvisor).

        Device hints are built over these only: a device reporting a NUMA node the machine does not have
        fits no single-NUMA-node mask (sim: the node's ``NodeSpec.numa_nodes``; kind: the host's, read from
        ``/sys/devices/system/node`` in the node container)."""

    def plugin_pre_start_required(self, node: str, resource: str) -> bool | None:
        """``pre_start_required`` of the options the kubelet got from the resource's plugin
        (``GetDevicePluginOptions``); ``None`` while none is connected. Raises
        ``UnsupportedOperationError`` where the kubelet does not show them (kind)."""

    def read_checkpoint(self, node: str) -> bytes | None:
        """The checkpoint file's bytes as on the node, or ``None`` when there is none."""

    def pod_resources(self, node: str) -> list[PodResourcesPod]:
        """pod-resources v1 ``List`` on the node."""

    def allocatable_devices(self, node: str) -> list[PodResourcesDevices]:
        """pod-resources v1 ``GetAllocatableResources`` on the node."""

    def pod_resources_get(self, node: str, name: str, namespace: str) -> PodResourcesPod:
        """pod-resources v1 ``Get`` of one pod on the node; raises ``BackendError`` quoting the kubelet's answer
        when it does not know the pod (``pod <name> in namespace <ns> not found``), ``UnsupportedOperationError``
        when its feature gate ``KubeletPodResourcesGet`` is off."""

    # -- pods --------------------------------------------------------------------------------------
    def create_pod(self, manifest: JSONDict) -> JSONDict:
        """Create a pod; raises ``PodRejectedError`` when the API server refuses it."""

    def get_pod(self, name: str, namespace: str = "default") -> JSONDict: ...

    def delete_pod(self, name: str, namespace: str = "default") -> None: ...

    def list_pods(self, namespace: str | None = None) -> list[JSONDict]: ...

    def events(self, *, namespace: str | None = None, involved_name: str | None = None) -> list[JSONDict]: ...

    def exec_pod(self, name: str, argv: Sequence[str], *, container: str, namespace: str = "default") -> ExecResult:
        """Run ``argv`` in a container and return its output."""

    def container_view(self, name: str, container: str, namespace: str = "default") -> ContainerView:
        """What the runtime applied to the container from Allocate (env, mounts, devices, ...)."""

    def device_injections(self, node: str, resource: str, device_ids: Sequence[str]) -> dict[str, ContainerView]:
        """What the resource's plugin on ``node`` gives a container for each device alone: one ``Allocate`` with a
        container request per device, as for a pod of that many one-device containers (the kubelet tells a
        plugin nothing when such a pod goes, so a plugin cannot tell it from one), CDI names resolved as the
        runtime would. Raises ``UnsupportedOperationError`` where the backend cannot call the plugin."""

    def restart_container(self, name: str, container: str, namespace: str = "default") -> None: ...

    # -- mock NVML (only for plugins deployed with ``PluginSpec.mock``) ----------------------------
    def read_mock_state(self, node: str) -> JSONDict: ...

    def write_mock_state(self, node: str, state: JSONDict) -> None:
        """Replace the mock state atomically (temp file in the same directory, then rename)."""

    # -- knobs -------------------------------------------------------------------------------------
    @property
    def grace_period(self) -> float:
        """Seconds the kubelet keeps a resource after its plugin went away."""

    def set_grace_period(self, seconds: float) -> None:
        """Change the grace period (sim only; kind raises ``UnsupportedOperationError``)."""


#: sim's control plane: the harness's own API server and scheduler, or etcd, kube-apiserver, kube-scheduler and
#: kube-controller-manager of the release (``--devplug-control-plane``).
ControlPlaneKind = Literal["embedded", "real"]
CONTROL_PLANES: tuple[ControlPlaneKind, ...] = get_args(ControlPlaneKind)


@dataclass(frozen=True)
class BackendOptions:
    """What selects and shapes a backend (from the pytest options / ini keys)."""

    timeout: float = DEFAULT_TIMEOUT
    #: Bound of a wait for re-registration after a kubelet restart (at least ``timeout``).
    reregistration_timeout: float = DEFAULT_REREGISTRATION_TIMEOUT
    #: sim: seconds the kubelet keeps a resource after its plugin went away (upstream: 300).
    grace_period: float = DEFAULT_GRACE_PERIOD
    #: sim: ``embedded`` (the harness's API server and scheduler) or ``real`` (etcd, kube-apiserver, kube-scheduler).
    control_plane: ControlPlaneKind = "embedded"
    #: sim, real control plane: a directory with its binaries (``None``: KUBEBUILDER_ASSETS, the cache, a download).
    k8s_bin_dir: str | None = None
    #: The Kubernetes release the run reproduces and judges against, with its feature gates.
    kube: KubeVersion = field(default_factory=KubeVersion.of)
    #: Whether the release was chosen (``--devplug-kubernetes-version``): on kind and a cluster, nodes of another
    #: release are then reported as a mismatch.
    kube_chosen: bool = False
    # kind: pytest-kind-ng's --cluster-name etc. (or pytest-devplug's own, same names, without the extra):
    cluster_name: str = "pytest-kind"
    keep_cluster: bool = False
    kind_bin: str | None = None
    kind_image: str | None = None
    kubeconfig: str | None = None
    #: kind cluster config: a path or a file name in kind-config/ (``None``: ``$DEVPLUG_KIND_CONFIG``, else
    #: single-node).
    kind_config: str | None = None
    # cluster (any cluster, through its kubeconfig; kind and cluster also take workload_image):
    #: kubeconfig context (``None``: the current one).
    kube_context: str | None = None
    #: The node to test on (``None``: the first node advertising the resource).
    node: str | None = None
    #: A node beside ``node`` for checks that need a second one (the soak's copy of the plugin); ``None``: none.
    second_node: str | None = None
    #: ``NAMESPACE/NAME`` of a running plugin DaemonSet to adopt instead of deploying one.
    plugin_daemonset: str | None = None
    #: Image of the privileged node-operations pod (sh, nsenter, python3 + grpcio); ``None``: the plugin image.
    node_image: str | None = None
    #: Image the test pods run instead of ``busybox`` (clusters that cannot pull it).
    workload_image: str | None = None


__all__ += ["BackendOptions"]
