"""The ``kind`` backend: the protocol on a real kind cluster (see the package docstring for the pieces)."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from .. import mockstate
from ..base import (
    BackendError,
    BackendOptions,
    ContainerView,
    ExecResult,
    NodeSpec,
    ObjectNotFoundError,
    PluginSpec,
    PodResourcesDevices,
    PodResourcesPod,
    UnsupportedOperationError,
    applied_view,
    parse_checkpoint,
)
from ..k8s.api import KubeApi
from ..k8s.node import MOCK_STATE_PATH, NodeOps
from .cluster import ClusterManager, python_base_image
from .deploy import STOP_LABEL, PluginImage, mock_library_file, render_daemonsets, selector_of
from .node import DockerExecTransport

__all__ = ["KindBackend", "GPU_LABEL", "KUBELET_GRACE_PERIOD"]

JSONDict = dict[str, Any]
T = TypeVar("T")

#: Nodes that carry the resource under test (kind-config/*.yaml label them).
GPU_LABEL = ("devplug.io/gpu", "true")
#: The kubelet's endpointStopGracePeriod: a constant in the device manager, no flag changes it.
KUBELET_GRACE_PERIOD = 300.0


#: Container waiting reasons the kubelet does not get out of by itself soon (the plugin will not come up).
_HOPELESS_WAITING = frozenset(
    {"CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError"}
)


@dataclass
class _Deployed:
    spec: PluginSpec
    daemonsets: list[JSONDict]
    image: str
    refs: int = 1
    #: pod UID -> (pod name, its last log text): logs of plugin pods that are gone stay readable.
    logs: dict[str, tuple[str, str]] = field(default_factory=dict)


class KindBackend:
    """Backend on a kind cluster: pods through the API, node internals through the node container."""

    name = "kind"
    pod_namespace = "default"

    def __init__(self, options: BackendOptions, *, config: str | None = None) -> None:
        """``config``: a kind config (path or file name in kind-config/); default ``$DEVPLUG_KIND_CONFIG`` or single-node."""
        self.options = options
        self.cluster = ClusterManager(options, config=config)
        self.workdir = Path(tempfile.mkdtemp(prefix="devplug-kindb-", dir="/tmp"))
        self.transport = DockerExecTransport(self.workdir)
        self.nodeops = NodeOps(self.transport, options.timeout)
        self.images = PluginImage(self.workdir)
        self._api: KubeApi | None = None
        self._plugins: dict[str, _Deployed] = {}
        self._loaded: set[str] = set()
        self._workload_image: str | None = options.workload_image
        self._policy_saved: dict[str, str] = {}

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        try:
            self.cluster.start()
            self._api = KubeApi(self.cluster.api_client(), self.options.timeout)
            for n in self._api.list_nodes():
                self.nodeops.mark_log_start(n["metadata"]["name"])
            if self.cluster.offline and not self._workload_image:
                # No registry: pods asking for handles.DEFAULT_IMAGE (busybox) run the local Python base,
                # which has the same shell tools (sh, sleep, env, ls, cat).
                self._workload_image = python_base_image()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        errors: list[str] = []
        if self._api is not None:
            for node in list(self._plugins):
                try:
                    self._plugins[node].refs = 1
                    self.remove_plugin(node)
                except Exception as exc:  # noqa: BLE001 - keep tearing down, report at the end
                    errors.append(f"removing plugin on {node}: {exc}")
            self._api.close()
            self._api = None
        try:
            self.cluster.close()
        except Exception as exc:  # noqa: BLE001
            errors.append(str(exc))
        shutil.rmtree(self.workdir, ignore_errors=True)
        if errors:
            raise BackendError("kind teardown: " + "; ".join(errors))

    @property
    def api(self) -> KubeApi:
        if self._api is None:
            raise BackendError("kind backend not started")
        return self._api

    def _wait(self, probe: Callable[[], T], ok: Callable[[T], bool], what: str, timeout: float | None = None) -> T:
        """Poll ``probe`` until ``ok``; bounded, and the error says what was awaited and what was seen."""
        limit = self.options.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        last: Any = None
        while True:
            try:
                value = probe()
                last = value
                if ok(value):
                    return value
            except (BackendError, OSError) as exc:
                last = exc
            if time.monotonic() > deadline:
                raise BackendError(f"timed out after {limit:g}s waiting for {what}; last seen: {last!r}")
            time.sleep(0.5)

    # -- nodes -------------------------------------------------------------------------------------
    def _gpu_nodes(self) -> list[str]:
        k, v = GPU_LABEL
        return [n["metadata"]["name"] for n in self.api.list_nodes() if (n["metadata"].get("labels") or {}).get(k) == v]

    def ensure_node(self, spec: NodeSpec) -> str:
        """The GPU node (kind cannot add nodes); a Topology Manager policy is set on its kubelet for a while.

        A spec with ``topology_policy`` other than ``none`` switches the GPU node's kubelet to it (config
        file + restart); the original config comes back when the plugin deployed for that spec is removed.
        """
        node = self._pick_node(spec)
        self._apply_policy(node, spec)
        return node

    def _pick_node(self, spec: NodeSpec) -> str:
        gpu = self._gpu_nodes()
        want = [n for n in gpu if all(self.get_node(n)["metadata"].get("labels", {}).get(k) == v for k, v in spec.labels.items())]
        if not want:
            raise BackendError(
                f"no node labelled {GPU_LABEL[0]}={GPU_LABEL[1]} (and {dict(spec.labels)}) in kind cluster "
                f"{self.cluster.name}; the kind-config/*.yaml configs label one"
            )
        return want[0]

    def _apply_policy(self, node: str, spec: NodeSpec) -> None:
        """Switch the node's kubelet to ``spec.topology_policy`` (kept until the plugin deployed for it goes)."""
        config = yaml.safe_load(self.nodeops.kubelet_config(node))
        current = config.get("topologyManagerPolicy", "none")
        if spec.topology_policy != current:
            if node not in self._policy_saved:
                self._policy_saved[node] = self.nodeops.kubelet_config(node)
            config["topologyManagerPolicy"] = spec.topology_policy
            self._reconfigure_kubelet(node, yaml.safe_dump(config))

    def _reconfigure_kubelet(self, node: str, text: str) -> None:
        before = self._status_heartbeat(node)
        running = self._running_pods(node)
        self.nodeops.set_kubelet_config(node, text)
        self._after_kubelet_restart(node, before)
        self._wait_pods_resynced(node, running)
        dep = self._plugins.get(node)
        if dep is not None and self.plugin_running(node):
            res = dep.spec.resource_name
            self._wait(
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
        limit = max(self.options.timeout, 60.0)
        self.nodeops.wait_kubelet_serving(node, limit)
        self._wait(
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
        return {
            (p["metadata"]["namespace"], p["metadata"]["name"])
            for p in self.api.list_pods(None, field_selector=f"spec.nodeName={node},status.phase=Running")
        }

    def _wait_pods_resynced(self, node: str, running: set[tuple[str, str]]) -> None:
        """Until pod-resources lists the pods that ran before the restart: the kubelet handled its first pod
        sync from the API server (and so marked its pod sources seen).

        Until then a real kubelet's device manager does not drop allocations of pods that are gone
        (``UpdateAllocatedDevices`` returns early while ``sourcesReady.AllReady()`` is false, and the kubelet
        marks a source seen only after handling its first update): devices of pods deleted before the
        restart still count as allocated from the checkpoint, and a pod arriving in that first sync can be
        refused (e.g. TopologyAffinityError: its NUMA node's devices look taken). The embedded kubelet's
        restart returns only after its sources are ready, so it has no such window.
        """
        self._wait(
            lambda: running - {(p.namespace, p.name) for p in self.pod_resources(node)},
            lambda missing: not missing,
            f"pod-resources on {node} listing the pods that ran before the kubelet restart",
            timeout=max(self.options.timeout, 60.0),
        )

    def kubelet_log(self, node: str) -> str:
        return self.nodeops.kubelet_log(node)

    def stop_kubelet(self, node: str) -> None:
        raise UnsupportedOperationError(
            "keeping a real kubelet down while pods are force-deleted through the API is not implemented for "
            f"{self.name} (it needs the node-status and pod-resources catch-up restart_kubelet does, after a stop)"
        )

    def start_kubelet(self, node: str) -> None:
        raise UnsupportedOperationError(f"{self.name}: no kubelet was stopped by stop_kubelet (not implemented here)")

    def reboot_node(self, node: str) -> None:
        raise UnsupportedOperationError(
            f"{self.name} cannot reboot a node: its containers are removed only through the CRI (crictl), which the "
            "node transport does not drive"
        )

    def machine_numa_nodes(self, node: str) -> list[int]:
        return self.nodeops.numa_nodes(node)

    def plugin_pre_start_required(self, node: str, resource: str) -> bool | None:
        raise UnsupportedOperationError("a real kubelet shows the options it got from a plugin nowhere (not in its API, log or checkpoint)")

    def read_checkpoint(self, node: str) -> bytes | None:
        return self.nodeops.read_checkpoint(node)

    def pod_resources(self, node: str) -> list[PodResourcesPod]:
        self.transport.helper_image = self.transport.helper_image or self.images.built
        return self.nodeops.pod_resources(node)

    def allocatable_devices(self, node: str) -> list[PodResourcesDevices]:
        self.transport.helper_image = self.transport.helper_image or self.images.built
        return self.nodeops.allocatable_devices(node)

    # -- the plugin --------------------------------------------------------------------------------
    def _load(self, image: str) -> None:
        if image not in self._loaded:
            self.cluster.load_image(image)
            self._loaded.add(image)

    def deploy_plugin(self, node: str, spec: PluginSpec) -> None:
        dep = self._plugins.get(node)
        if dep is not None:
            if dep.spec == spec:
                dep.refs += 1  # the same plugin again (e.g. the Topology Manager fixture): shared
                return
            raise BackendError(f"a different plugin is already deployed on {node}; remove it first")
        if spec.mock:
            # Before the DaemonSet: the plugin reads the state and loads the library at start.
            self.write_mock_state(node, mockstate.initial_state(spec.gpus, spec.numa_nodes), _deploying=True)
            self.nodeops.write_file(node, *mock_library_file())
        image = self.images.resolve(spec)
        self._load(image)
        daemonsets = render_daemonsets(spec, image)
        for ds in daemonsets:
            self.api.apply_daemonset(ds)
        self._plugins[node] = _Deployed(spec, daemonsets, image)

    def _dep(self, node: str) -> _Deployed:
        try:
            return self._plugins[node]
        except KeyError:
            raise BackendError(f"no plugin deployed on node {node}") from None

    def _plugin_pods(self, node: str) -> list[JSONDict]:
        dep = self._dep(node)
        pods = []
        for ds in dep.daemonsets:
            pods += self.api.list_pods(
                ds["metadata"]["namespace"], label_selector=selector_of(ds), field_selector=f"spec.nodeName={node}"
            )
        return pods

    def _snapshot_logs(self, node: str) -> None:
        dep = self._dep(node)
        for p in self._plugin_pods(node):
            meta = p["metadata"]
            text = "".join(
                self.api.pod_log(meta["name"], meta["namespace"], c["name"]) for c in p["spec"].get("containers", [])
            )
            if text or meta["uid"] not in dep.logs:
                dep.logs[meta["uid"]] = (meta["name"], text)

    def _set_stopped(self, node: str, stopped: bool) -> None:
        for ds in self._dep(node).daemonsets:
            patch = {"spec": {"template": {"spec": {"nodeSelector": {STOP_LABEL: "true" if stopped else None}}}}}
            self.api.patch_daemonset(ds["metadata"]["name"], ds["metadata"]["namespace"], patch)

    def _wait_no_plugin_pods(self, node: str, what: str) -> None:
        self._wait(lambda: self._plugin_pods(node), lambda pods: not pods, what, timeout=max(self.options.timeout, 60.0))

    def _wait_kubelet_noticed_stop(self, node: str, resource: str) -> None:
        """Until the node status shows no allocatable ``resource``: the kubelet noticed the plugin went away.

        The kubelet posts node status every 10 s; without this wait the next reader sees the old plugin's
        counts, a scheduler binds to them and admission fails (``no healthy devices``) before the new
        plugin registers. The sim updates at once, so it needs no such wait.
        """
        self._wait(
            lambda: (self.get_node(node).get("status", {}).get("allocatable") or {}).get(resource),
            lambda a: a in (None, "0"),
            f"{resource} allocatable 0 on {node} after its plugin stopped (the kubelet posts status every 10 s)",
            timeout=max(self.options.timeout, 60.0),
        )

    def remove_plugin(self, node: str) -> None:
        dep = self._plugins.get(node)
        if dep is None:
            return
        dep.refs -= 1
        if node in self._policy_saved:
            self._reconfigure_kubelet(node, self._policy_saved.pop(node))
        if dep.refs > 0:
            return
        try:
            self._snapshot_logs(node)
        except BackendError:
            pass
        for ds in dep.daemonsets:
            self.api.delete_daemonset(ds["metadata"]["name"], ds["metadata"]["namespace"])
        try:
            self._wait_no_plugin_pods(node, f"plugin pods on {node} gone after deleting the DaemonSet")
            self._wait_kubelet_noticed_stop(node, dep.spec.resource_name)
        finally:
            del self._plugins[node]

    def stop_plugin(self, node: str) -> None:
        """Graceful stop (SIGTERM): the DaemonSet stops selecting the node, so its pod is deleted."""
        self._snapshot_logs(node)
        self._set_stopped(node, True)
        self._wait_no_plugin_pods(node, f"plugin pod on {node} terminated")
        self._wait_kubelet_noticed_stop(node, self._dep(node).spec.resource_name)

    def kill_plugin(self, node: str) -> None:
        """Abrupt stop: the pod is force-deleted (SIGKILL, no grace) and not recreated until ``start_plugin``."""
        self._snapshot_logs(node)
        self._set_stopped(node, True)
        for p in self._plugin_pods(node):
            try:
                self.api.delete_pod(p["metadata"]["name"], p["metadata"]["namespace"], grace=0)
            except ObjectNotFoundError:
                pass
        self._wait_no_plugin_pods(node, f"plugin pod on {node} killed")
        self._wait_kubelet_noticed_stop(node, self._dep(node).spec.resource_name)

    def start_plugin(self, node: str) -> None:
        self._set_stopped(node, False)

    def plugin_running(self, node: str) -> bool:
        if node not in self._plugins:
            return False
        for p in self._plugin_pods(node):
            if p["metadata"].get("deletionTimestamp") or p.get("status", {}).get("phase") != "Running":
                continue
            statuses = p["status"].get("containerStatuses") or []
            if statuses and all("running" in (s.get("state") or {}) for s in statuses):
                return True
        return False

    def plugin_exit(self, node: str) -> str | None:
        """A plugin container the kubelet keeps failing to run: it will not come up by itself."""
        if node not in self._plugins:
            return None
        for p in self._plugin_pods(node):
            for st in p.get("status", {}).get("containerStatuses") or []:
                waiting = (st.get("state") or {}).get("waiting") or {}
                if waiting.get("reason") in _HOPELESS_WAITING:
                    last = ((st.get("lastState") or {}).get("terminated")) or {}
                    code = f", last exit code {last['exitCode']}" if "exitCode" in last else ""
                    return f"container {st.get('name')} of pod {p['metadata']['name']} is {waiting['reason']}{code}"
        return None

    def plugin_log(self, node: str) -> str:
        dep = self._dep(node)
        self._snapshot_logs(node)
        return "".join(f"--- plugin pod {name}\n{text}" for name, text in dep.logs.values())

    # -- pods --------------------------------------------------------------------------------------
    def create_pod(self, manifest: JSONDict) -> JSONDict:
        from ...handles import DEFAULT_IMAGE

        body = json.loads(json.dumps(manifest))
        if self._workload_image:
            spec = body.get("spec", {})
            for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
                if c.get("image") == DEFAULT_IMAGE:
                    self._load(self._workload_image)
                    c["image"] = self._workload_image
                    c.setdefault("imagePullPolicy", "IfNotPresent")
        return self.api.create_pod(body)

    def get_pod(self, name: str, namespace: str = "default") -> JSONDict:
        return self.api.get_pod(name, namespace)

    def delete_pod(self, name: str, namespace: str = "default") -> None:
        """Delete and wait until the pod is gone (as ``kubectl delete`` does): its devices are free afterwards."""
        self.api.delete_pod(name, namespace)

        def gone() -> bool:
            try:
                self.api.get_pod(name, namespace)
            except ObjectNotFoundError:
                return True
            return False

        self._wait(gone, bool, f"pod {namespace}/{name} deleted", timeout=max(self.options.timeout, 60.0))

    def list_pods(self, namespace: str | None = None) -> list[JSONDict]:
        return self.api.list_pods(namespace)

    def events(self, *, namespace: str | None = None, involved_name: str | None = None) -> list[JSONDict]:
        return self.api.events(namespace=namespace, involved_name=involved_name)

    def exec_pod(self, name: str, argv: Sequence[str], *, container: str, namespace: str = "default") -> ExecResult:
        return self.api.exec(name, namespace, container, argv)

    def container_view(self, name: str, container: str, namespace: str = "default") -> ContainerView:
        """The Allocate responses the kubelet recorded for the container (checkpoint), i.e. what it handed the runtime."""
        pod = self.get_pod(name, namespace)
        node = pod.get("spec", {}).get("nodeName")
        if not node:
            raise BackendError(f"pod {namespace}/{name} is not on a node yet")
        raw = self.read_checkpoint(node)
        entries = parse_checkpoint(raw).entries_for(pod["metadata"]["uid"], container) if raw else []
        return applied_view(entries)

    def restart_container(self, name: str, container: str, namespace: str = "default") -> None:
        """Kill the container's task in containerd (SIGKILL): the kubelet restarts it, as after a crash."""
        pod = self.get_pod(name, namespace)
        node = pod.get("spec", {}).get("nodeName")
        cid = next(
            (s.get("containerID", "") for s in pod.get("status", {}).get("containerStatuses") or [] if s["name"] == container),
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

    def write_mock_state(self, node: str, state: JSONDict, *, _deploying: bool = False) -> None:
        if not _deploying:
            self._check_mock(node)
        self.nodeops.write_file(node, MOCK_STATE_PATH, json.dumps(state, indent=1).encode())

    # -- knobs -------------------------------------------------------------------------------------
    @property
    def grace_period(self) -> float:
        return KUBELET_GRACE_PERIOD

    def set_grace_period(self, seconds: float) -> None:
        raise UnsupportedOperationError(
            "a real kubelet's device-plugin grace period is a constant (endpointStopGracePeriod, 5 min); no flag changes it"
        )

