"""A DRA driver's objects on a real cluster: its manifest rendered for the spec, owned by the run, pinned to a node.

A driver ships as a ServiceAccount, the RBAC its kubelet plugin needs and a DaemonSet (what ``helm template``
renders of its chart, less its controller and webhook). The included driver's manifest is
``plugin_under_test/deploy/dra-driver.yaml``; another driver's comes as ``DriverSpec.manifest``
(``--devplug-driver-manifest``), its image as ``DriverSpec.image`` (``--devplug-driver-image``, replacing the
manifest's images). The run owns everything: namespaced objects move into its namespace, cluster-scoped ones (the
ClusterRoles and their bindings) are renamed ``<run namespace>-<name>`` and owned by the run's Namespace, so the
garbage collector removes them with it, also after a run that was killed.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from ...errors import BackendError, BackendUnavailableError
from ..dra import DriverSpec
from .manifests import MOCK_DIR, PLUGIN_SRC, hand_mock_nvml, own_daemonset, set_env

__all__ = ["DEFAULT_DRIVER_MANIFEST", "DRA_MOCK_STATE_PATH", "DriverObjects", "render_driver"]

DEFAULT_DRIVER_MANIFEST = PLUGIN_SRC / "deploy" / "dra-driver.yaml" if PLUGIN_SRC else None
#: On the node (hostPath), for a driver deployed with mock NVML: its state file (the mock library is the device
#: plugin's, :data:`~.manifests.MOCK_LIB_DIR`).
DRA_MOCK_STATE_PATH = f"{MOCK_DIR}/dra-mock-state.json"

JSONDict = dict[str, Any]
_NAMESPACED = {"ServiceAccount", "Role", "RoleBinding", "DaemonSet"}
_CLUSTER = {"ClusterRole", "ClusterRoleBinding"}
#: API collection of each kind a driver manifest may hold ({ns}: the run's namespace).
COLLECTIONS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
}


class DriverObjects:
    """The rendered objects: ``rbac`` (created once per run, in order) and the ``daemonsets``."""

    def __init__(self, rbac: list[JSONDict], daemonsets: list[JSONDict]) -> None:
        self.rbac = rbac
        self.daemonsets = daemonsets


def _load(spec: DriverSpec) -> tuple[Path, list[JSONDict]]:
    path = Path(spec.manifest) if spec.manifest else DEFAULT_DRIVER_MANIFEST
    if path is None or not path.is_file():
        raise BackendUnavailableError(
            f"no DRA driver manifest: {path or 'the included one needs a pytest-devplug checkout'} (pass "
            "--devplug-driver-manifest: the driver's ServiceAccount, RBAC and DaemonSet, "
            "as `helm template` renders them)"
        )
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    kinds = [str(d.get("kind")) for d in docs]
    others = [
        f"{d.get('kind')}/{(d.get('metadata') or {}).get('name')}"
        for d in docs
        if d.get("kind") not in _NAMESPACED | _CLUSTER
    ]
    if others or "DaemonSet" not in kinds:
        raise BackendError(
            f"{path}: a DRA driver is deployed from ServiceAccounts, (Cluster)Roles and their bindings and DaemonSets; "
            f"found {others or 'no DaemonSet'}"
        )
    return path, docs


def render_driver(
    spec: DriverSpec,
    image: str | None,
    *,
    namespace: str,
    namespace_uid: str,
    node: str,
    labels: dict[str, str],
    api_endpoint: tuple[str, int] | None = None,
    tolerations: list[JSONDict] | None = None,
) -> DriverObjects:
    """The driver's objects for ``node``, owned by the run (``namespace``, its UID) and labelled ``labels``.

    Every container runs ``image`` (``None``: the manifest's own); the included driver's manifest gets
    ``spec.driver_name`` (``DP_DRIVER_NAME``); with ``spec.mock`` every container gets the mock NVML and its state
    at :data:`DRA_MOCK_STATE_PATH`;
    ``spec.env`` is set last. ``api_endpoint``: where pods reach the API server when the cluster routes no Service
    IPs (its containers get ``KUBERNETES_SERVICE_HOST``/``_PORT``, which the in-cluster config reads first)."""
    _, docs = _load(spec)
    included = spec.manifest is None
    renamed = {
        str(d["metadata"]["name"]): f"{namespace}-{d['metadata']['name']}"
        for d in docs
        if d.get("kind") == "ClusterRole"
    }
    owner = {"apiVersion": "v1", "kind": "Namespace", "name": namespace, "uid": namespace_uid}
    rbac, daemonsets = [], []
    for d in map(copy.deepcopy, docs):
        kind, meta = d["kind"], d.setdefault("metadata", {})
        meta.setdefault("labels", {}).update(labels)
        if kind in _CLUSTER:
            meta["name"] = f"{namespace}-{meta['name']}"
            meta.pop("namespace", None)
            meta["ownerReferences"] = [owner]
        else:
            meta["namespace"] = namespace
        if kind in ("RoleBinding", "ClusterRoleBinding"):
            for s in d.get("subjects") or []:
                if s.get("kind") == "ServiceAccount":
                    s["namespace"] = namespace
            ref = d.get("roleRef") or {}
            if ref.get("kind") == "ClusterRole" and ref.get("name") in renamed:
                ref["name"] = renamed[ref["name"]]
        if kind != "DaemonSet":
            rbac.append(d)
            continue
        pod = d["spec"]["template"]["spec"]
        for c in [*(pod.get("initContainers") or []), *pod.get("containers", [])]:
            if image is not None:
                c["image"] = image
                c["imagePullPolicy"] = "IfNotPresent"
            if included:
                set_env(c, "DP_DRIVER_NAME", spec.driver_name)
                set_env(c, "DP_MOCK_STATE", DRA_MOCK_STATE_PATH)
                if not spec.mock:
                    set_env(c, "DP_NVML", "real")
                    set_env(c, "DP_CREATE_DEV_NODES", "false")
            if spec.mock:
                hand_mock_nvml(pod, c, DRA_MOCK_STATE_PATH)
            if api_endpoint is not None:
                set_env(c, "KUBERNETES_SERVICE_HOST", api_endpoint[0])
                set_env(c, "KUBERNETES_SERVICE_PORT", str(api_endpoint[1]))
            for k, v in spec.env.items():
                set_env(c, k, v)
        daemonsets.append(own_daemonset(d, namespace, node, labels, tolerations=tolerations or ()))
    return DriverObjects(rbac, daemonsets)
