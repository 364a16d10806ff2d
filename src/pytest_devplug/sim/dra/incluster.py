"""What a DRA driver's DaemonSet pod gets to reach the API server, for a driver run as a process on the embedded
kubelet.

client-go's in-cluster configuration reads ``KUBERNETES_SERVICE_HOST`` / ``KUBERNETES_SERVICE_PORT`` and the
files ``token``, ``ca.crt`` and ``namespace`` under ``/var/run/secrets/kubernetes.io/serviceaccount``. The
driver gets a ServiceAccount of its own (``kube-system/devplug-dra-driver``) bound to ``cluster-admin``: the
suite judges the driver by what the kubelet and the API require of it, not by the RBAC rules of a chart it
is not deployed with. The same credentials are also written as a kubeconfig, for drivers started with
``--kubeconfig {kubeconfig}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ...kuberest import KubeRest
from ...errors import RestError

__all__ = ["SERVICE_ACCOUNT_DIR", "DriverCredentials", "driver_credentials"]

#: Where a pod's service-account files are mounted (``rest.InClusterConfig``).
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
_NAMESPACE, _NAME = "kube-system", "devplug-dra-driver"
#: A token for the whole run (a real pod's projected token is refreshed by the kubelet; this one need not be).
_TOKEN_SECONDS = 24 * 3600


@dataclass(frozen=True)
class DriverCredentials:
    """``directory`` holds ``token``, ``ca.crt``, ``namespace`` (bind it at :data:`SERVICE_ACCOUNT_DIR`);
    ``kubeconfig`` the same credentials; ``env`` the service variables a pod has."""

    directory: Path
    kubeconfig: Path
    env: dict[str, str]


def _ensure(rest: KubeRest, path: str, body: dict[str, object]) -> None:
    try:
        rest.create(path, body)
    except RestError as exc:
        if exc.status != 409:  # AlreadyExists: made by an earlier deployment of this run
            raise


def driver_credentials(rest: KubeRest, server: str, ca_cert: Path, where: Path) -> DriverCredentials:
    """Make the driver's ServiceAccount, its binding and a token; write them under ``where``. Raises ``RestError``."""
    _ensure(rest, f"/api/v1/namespaces/{_NAMESPACE}/serviceaccounts", {"metadata": {"name": _NAME}})
    _ensure(
        rest,
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "metadata": {"name": _NAME},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": _NAME, "namespace": _NAMESPACE}],
        },
    )
    answer = rest.create(
        f"/api/v1/namespaces/{_NAMESPACE}/serviceaccounts/{_NAME}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": _TOKEN_SECONDS},
        },
    )
    token = str(answer["status"]["token"])
    directory = where / "serviceaccount"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(token)
    (directory / "ca.crt").write_bytes(Path(ca_cert).read_bytes())
    (directory / "namespace").write_text(_NAMESPACE)
    kubeconfig = where / "driver.kubeconfig"
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "devplug", "cluster": {"server": server, "certificate-authority": str(directory / "ca.crt")}}
        ],
        "users": [{"name": _NAME, "user": {"token": token}}],
        "contexts": [{"name": "devplug", "context": {"cluster": "devplug", "user": _NAME, "namespace": _NAMESPACE}}],
        "current-context": "devplug",
    }
    kubeconfig.write_text(json.dumps(doc, indent=1) + "\n")  # JSON is YAML
    url = urlsplit(server)
    env = {"KUBERNETES_SERVICE_HOST": url.hostname or "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(url.port or 443)}
    return DriverCredentials(directory, kubeconfig, env)
