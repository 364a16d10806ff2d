"""The ``cluster`` backend: the suite on an existing cluster (the kubeconfig's), through the Kubernetes API only.

It never creates or deletes clusters, and touches only what it made: its own namespace
(``devplug-<id>``, labelled ``app.kubernetes.io/managed-by=pytest-devplug``) holding the plugin's
DaemonSet (pinned to the node under test), the test pods and the node-operations pods
(:mod:`.k8s.hostpod`); the mock-NVML state file it wrote; a kubelet config it switched (restored).
All of it goes in :meth:`close`, which the session fixture runs also after Ctrl-C.

The plugin under test is deployed from an image the cluster can pull (``--devplug-plugin-image``;
loading it is the user's job, as for any release), or adopted as it runs
(``--devplug-plugin-daemonset NAMESPACE/NAME``: never changed, so it cannot be stopped or killed).

It shares the kind backend's Kubernetes logic (plugin lifecycle through DaemonSets, pods, the
checkpoint-derived container view) and differs in how the cluster is found and how a node is reached.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from ..waiting import WaitTimeout, wait_for
from .base import (
    BackendError,
    BackendOptions,
    BackendUnavailableError,
    NodeSpec,
    PluginSpec,
    PodResourcesDevices,
    PodResourcesPod,
    UnsupportedOperationError,
)
from .k8s.api import KubeApi
from .k8s.hostpod import MANAGED_BY, HostPodTransport
from .k8s.node import MOCK_STATE_PATH, NodeOps
from .kind.backend import GPU_LABEL, KindBackend, _Deployed
from .kind.deploy import mock_library_file, render_daemonsets
from .mockstate import initial_state

__all__ = ["ClusterBackend"]

JSONDict = dict[str, Any]
_MOCK_DIR = str(Path(MOCK_STATE_PATH).parent)


class ClusterBackend(KindBackend):
    """Backend on the cluster of a kubeconfig: pods and plugin through the API, node internals through a pod."""

    name = "cluster"

    def __init__(self, options: BackendOptions) -> None:  # noqa: D107 - no kind cluster, no Docker
        self.options = options
        self.namespace = "devplug-" + secrets.token_hex(4)
        self.pod_namespace = self.namespace
        self._api: KubeApi | None = None
        self._plugins: dict[str, _Deployed] = {}
        self._loaded: set[str] = set()
        self._workload_image = options.workload_image
        self._policy_saved: dict[str, str] = {}
        self._node_image = options.node_image
        self._mock_dirs: set[str] = set()  # nodes where we made /var/lib/devplug (removed at the end)
        self._transport: HostPodTransport | None = None
        self._nodeops: NodeOps | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        import kubernetes

        try:
            client = kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=self.options.kubeconfig, context=self.options.kube_context
            )
        except Exception as exc:  # noqa: BLE001 - the loader raises ConfigException, OSError, TypeError
            where = self.options.kubeconfig or "$KUBECONFIG or ~/.kube/config"
            raise BackendUnavailableError(f"cluster backend: cannot load kubeconfig {where}: {exc}") from None
        self._api = KubeApi(client, self.options.timeout)
        try:
            self._create_namespace()
            self._transport = HostPodTransport(self._api, self.namespace, self._node_pod_image, self.options.timeout)
            self._nodeops = NodeOps(self._transport, self.options.timeout)
        except BaseException:
            self.close()
            raise

    def _create_namespace(self) -> None:
        labels = {
            MANAGED_BY[0]: MANAGED_BY[1],
            # The node-operations pods are privileged; a cluster enforcing Pod Security must let them in.
            "pod-security.kubernetes.io/enforce": "privileged",
        }
        try:
            self.api.create_namespace(self.namespace, labels)
        except BackendError as exc:
            raise BackendUnavailableError(f"cluster backend: {exc}") from None
        try:
            # Pods are refused until the namespace's default ServiceAccount exists.
            wait_for(
                lambda: self.api.service_account_exists("default", self.namespace), bool,
                timeout=max(self.options.timeout, 60.0), interval=0.5,
                what=f"ServiceAccount default in namespace {self.namespace}",
            )  # fmt: skip
        except WaitTimeout as exc:
            raise BackendError(str(exc)) from None

    def close(self) -> None:
        errors: list[str] = []
        if self._api is None:
            return
        for node in list(self._plugins):
            try:
                self._plugins[node].refs = 1
                self.remove_plugin(node)
            except Exception as exc:  # noqa: BLE001 - keep tearing down, report at the end
                errors.append(f"removing plugin on {node}: {exc}")
        if self._nodeops is not None:
            for node in sorted(self._mock_dirs):
                try:
                    self._nodeops.exec(node, f"rm -rf {_MOCK_DIR}")
                except BackendError as exc:
                    errors.append(f"removing {_MOCK_DIR} on {node}: {exc}")
        if self._transport is not None:
            try:
                self._transport.close()
            except BackendError as exc:
                errors.append(str(exc))
        try:
            self._delete_namespace()
        except BackendError as exc:
            errors.append(str(exc))
        self._api.close()
        self._api = None
        if errors:
            raise BackendError("cluster backend teardown: " + "; ".join(errors))

    def _delete_namespace(self) -> None:
        self.api.delete_namespace(self.namespace)
        try:
            wait_for(
                lambda: self.api.namespace_exists(self.namespace), lambda exists: not exists,
                timeout=max(self.options.timeout, 120.0), interval=1.0, what=f"namespace {self.namespace} deleted",
            )  # fmt: skip
        except WaitTimeout as exc:
            raise BackendError(f"{exc} (it is terminating; check it with kubectl get ns {self.namespace})") from None

    @property
    def nodeops(self) -> NodeOps:  # type: ignore[override]
        if self._nodeops is None:
            raise BackendError("cluster backend not started")
        return self._nodeops

    def _node_pod_image(self) -> str:
        if self._node_image:
            return self._node_image
        raise BackendUnavailableError(
            "cluster backend: node operations (kubelet restart, checkpoint, pod-resources, mock state) run in a "
            "privileged pod whose image needs sh, nsenter and python3 with grpcio; pass --devplug-node-image "
            "(the included plugin's image has them), or --devplug-plugin-image of such an image"
        )

    # -- nodes -------------------------------------------------------------------------------------
    def _pick_node(self, spec: NodeSpec) -> str:
        """``--devplug-node``, else the first node advertising the resource, else one labelled devplug.io/gpu."""
        nodes = sorted(self.api.list_nodes(), key=lambda n: str(n["metadata"]["name"]))
        names = [str(n["metadata"]["name"]) for n in nodes]
        if spec.resource_name is None and self._plugins:
            return next(iter(self._plugins))  # a second spec for the node under test (e.g. a Topology Manager policy)
        if self.options.node:
            if self.options.node not in names:
                raise BackendUnavailableError(f"--devplug-node {self.options.node}: no such node (nodes: {names})")
            return self.options.node
        if spec.resource_name:
            for n in nodes:
                if (n.get("status", {}).get("capacity") or {}).get(spec.resource_name, "0") not in ("0", ""):
                    return str(n["metadata"]["name"])
        k, v = GPU_LABEL
        for n in nodes:
            if (n["metadata"].get("labels") or {}).get(k) == v:
                return str(n["metadata"]["name"])
        raise BackendUnavailableError(
            f"cluster backend: no node advertises {spec.resource_name} and none is labelled {k}={v}; "
            f"pass --devplug-node (nodes: {names})"
        )

    def _apply_policy(self, node: str, spec: NodeSpec) -> None:
        """A real node's kubelet config is read and changed only when a test asks for a policy."""
        if spec.topology_policy == "none" and node not in self._policy_saved:
            return
        super()._apply_policy(node, spec)

    def pod_resources(self, node: str) -> list[PodResourcesPod]:
        return self.nodeops.pod_resources(node)

    def allocatable_devices(self, node: str) -> list[PodResourcesDevices]:
        return self.nodeops.allocatable_devices(node)

    # -- the plugin --------------------------------------------------------------------------------
    def _load(self, image: str) -> None:
        """Images come from the cluster's registries (or were loaded onto the nodes by the user)."""

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
                dep.refs += 1
                return
            raise BackendError(f"a different plugin is already deployed on {node}; remove it first")
        if spec.mock:
            if self.nodeops.transport.run(node, f"test -e {_MOCK_DIR}", timeout=60.0).returncode != 0:
                self._mock_dirs.add(node)
            self.write_mock_state(node, initial_state(spec.gpus, spec.numa_nodes), _deploying=True)
            self.nodeops.write_file(node, *mock_library_file())
        adopted = self._adopted()
        if adopted is not None:
            ds = self.api.get_daemonset(adopted[1], adopted[0])
            if ds is None:
                raise BackendUnavailableError(f"--devplug-plugin-daemonset {adopted[0]}/{adopted[1]}: no such DaemonSet")
            self._plugins[node] = _Deployed(spec, [ds], "(adopted)")
            return
        if not spec.image:
            raise BackendUnavailableError(
                "cluster backend: pass --devplug-plugin-image (an image the cluster can pull; for the included "
                "plugin build plugin_under_test/Dockerfile and push or load it), or adopt a running plugin with "
                "--devplug-plugin-daemonset NAMESPACE/NAME"
            )
        self._node_image = self._node_image or spec.image
        daemonsets = [self._own(ds, node) for ds in render_daemonsets(spec, spec.image)]
        for ds in daemonsets:
            self.api.apply_daemonset(ds)
        self._plugins[node] = _Deployed(spec, daemonsets, spec.image)

    def _own(self, ds: JSONDict, node: str) -> JSONDict:
        """The DaemonSet in our namespace, labelled as ours, running on ``node`` only."""
        meta = ds["metadata"]
        meta["namespace"] = self.namespace
        meta.setdefault("labels", {})[MANAGED_BY[0]] = MANAGED_BY[1]
        pod = ds["spec"]["template"]["spec"]
        selector = dict(pod.get("nodeSelector") or {})
        selector.pop(GPU_LABEL[0], None)  # the included manifest's kind label: a real node may not have it
        selector["kubernetes.io/hostname"] = node
        pod["nodeSelector"] = selector
        return ds

    def remove_plugin(self, node: str) -> None:
        if self._adopted() is None:
            super().remove_plugin(node)
            return
        dep = self._plugins.get(node)
        if dep is None:
            return
        dep.refs -= 1
        if node in self._policy_saved:
            self._reconfigure_kubelet(node, self._policy_saved.pop(node))
        if dep.refs <= 0:
            del self._plugins[node]

    def _not_adopted(self, what: str) -> None:
        if (ref := self._adopted()) is not None:
            raise UnsupportedOperationError(
                f"cannot {what} the adopted plugin {ref[0]}/{ref[1]}: the cluster backend does not change objects it "
                "did not make (deploy the plugin with --devplug-plugin-image to test its lifecycle)"
            )

    def stop_plugin(self, node: str) -> None:
        self._not_adopted("stop")
        super().stop_plugin(node)

    def kill_plugin(self, node: str) -> None:
        self._not_adopted("kill")
        super().kill_plugin(node)

    def start_plugin(self, node: str) -> None:
        self._not_adopted("start")
        super().start_plugin(node)

