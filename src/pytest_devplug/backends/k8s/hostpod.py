"""Reaching a node through the Kubernetes API only: a privileged pod per node, in the host's PID namespace.

The pod sleeps; every node command is an API ``exec`` into it that runs
``nsenter -t 1 -m -u -i -n -p -- sh -c SCRIPT``, i.e. in the namespaces of the node's init process, so
``systemctl``, ``journalctl`` and the kubelet's files are the node's own. gRPC services on the node's Unix
sockets (pod-resources, a DRA driver's) are called from inside the pod: pod-resources through the kubelet's
``pod-resources`` directory it mounts, any other socket through ``/proc/1/root`` (the node's root, seen from
a privileged host-PID pod). The image needs ``sh``,
``nsenter`` (util-linux) and ``python3`` with ``grpcio``: the included plugin's image has all three.
The pods live in the run's namespace and are deleted by :meth:`HostPodTransport.close`; each carries an
``activeDeadlineSeconds`` (:data:`NODE_POD_DEADLINE_S`), so one left by a killed run stops by itself soon,
and a session that outlasts it gets a new pod.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from typing import Any

from ...waiting import wait_for
from ...errors import BackendError, NodeGrpcError, ObjectNotFoundError, WaitTimeout
from ..base import ExecResult
from .api import KubeApi
from .nodeops import GRPC_CALL, POD_RESOURCES_SOCKET
from .ownership import MANAGED_BY

__all__ = ["HostPodTransport", "MANAGED_BY", "NODE_POD_DEADLINE_S", "node_pod_manifest"]

#: How long a privileged node pod may live: longer than a session's use of one node (the suite's longest
#: test waits out the kubelet's 5-min grace period), short enough that a leftover one does not stay long.
NODE_POD_DEADLINE_S = 3600
_CONTAINER = "node"
_NSENTER = ["nsenter", "-t", "1", "-m", "-u", "-i", "-n", "-p", "--"]
_PULL_ERRORS = {
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
}


def node_pod_manifest(node: str, name: str, namespace: str, image: str) -> dict[str, Any]:
    """The privileged host-PID pod for ``node`` (pinned by ``nodeName``, tolerating every taint)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {MANAGED_BY[0]: MANAGED_BY[1], "devplug.io/role": "node-ops"},
        },
        "spec": {
            "nodeName": node,
            "hostPID": True,
            "restartPolicy": "Never",
            "activeDeadlineSeconds": NODE_POD_DEADLINE_S,
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": _CONTAINER,
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sleep", "infinity"],
                    "securityContext": {"privileged": True},
                    "volumeMounts": [{"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources"}],
                }
            ],
            "volumes": [{"name": "pod-resources", "hostPath": {"path": "/var/lib/kubelet/pod-resources"}}],
        },
    }


class HostPodTransport:
    """``NodeTransport`` through the API: one privileged host-PID pod per node, made on first use."""

    #: An API ``exec`` is served by the node's kubelet: with the kubelet down the node cannot be reached.
    bypasses_kubelet = False

    def __init__(self, api: KubeApi, namespace: str, image: Callable[[], str], timeout: float) -> None:
        """``image``: called when the first pod is made (the backend may learn the plugin image late)."""
        self.api = api
        self.namespace = namespace
        self._image = image
        self.timeout = timeout
        self._pods: dict[str, str] = {}

    def _phase(self, name: str) -> str | None:
        """The pod's phase; ``None`` once it is gone."""
        try:
            return str((self.api.get_pod(name, self.namespace).get("status") or {}).get("phase"))
        except ObjectNotFoundError:
            return None

    def _pod(self, node: str) -> str:
        if node in self._pods:
            return self._pods[node]
        image = self._image()
        name = "devplug-node-" + hashlib.sha256(node.encode()).hexdigest()[:10]
        self.api.create_pod(node_pod_manifest(node, name, self.namespace, image))
        self._pods[node] = name

        def stuck() -> str | None:
            pod = self.api.get_pod(name, self.namespace)
            status = pod.get("status") or {}
            if status.get("phase") in ("Failed", "Succeeded"):
                return f"it ended ({status.get('phase')}: {status.get('reason')} {status.get('message')})"
            for cs in status.get("containerStatuses") or []:
                waiting = (cs.get("state") or {}).get("waiting") or {}
                if waiting.get("reason") in _PULL_ERRORS:
                    return (
                        f"its image {image} cannot be used there ({waiting['reason']}: {waiting.get('message')}); "
                        "make it pullable by the node or pass --devplug-node-image"
                    )
            return None

        try:
            wait_for(
                lambda: (self.api.get_pod(name, self.namespace).get("status") or {}).get("phase"),
                lambda phase: phase == "Running",
                timeout=max(self.timeout, 120.0),
                interval=0.5,
                give_up=stuck,
                what=f"node-operations pod {self.namespace}/{name} running on {node}",
            )
        except WaitTimeout as exc:
            raise BackendError(f"cannot reach node {node} through a privileged pod: {exc}") from None
        return name

    def _renew(self, node: str) -> None:
        """Past its deadline (a long session) the pod has ended: delete it, the next call makes a new one."""
        name = self._pods.pop(node)
        try:
            self.api.delete_pod(name, self.namespace, grace=0)
        except ObjectNotFoundError:
            return
        try:
            wait_for(
                lambda: self._phase(name),
                lambda phase: phase is None,
                timeout=max(self.timeout, 60.0),
                interval=0.5,
                what=f"ended node-operations pod {name} deleted",
            )
        except WaitTimeout as exc:
            raise BackendError(str(exc)) from None

    def _exec(self, node: str, argv: list[str]) -> ExecResult:
        name = self._pod(node)
        try:
            return self.api.exec(name, self.namespace, _CONTAINER, argv)
        except Exception as exc:  # noqa: BLE001 - the stream client raises several types (websocket, HTTP)
            if self._phase(name) in (None, "Failed", "Succeeded"):
                self._renew(node)
                return self._exec(node, argv)
            if isinstance(exc, BackendError):
                raise
            # e.g. while the node's kubelet restarts: exec streams go through it.
            raise BackendError(
                f"exec in {self.namespace}/{name} on node {node} failed: {type(exc).__name__}: {exc}"
            ) from None

    def run(self, node: str, script: str, *, timeout: float) -> ExecResult:
        return self._exec(node, [*_NSENTER, "sh", "-c", script])

    def grpc_call(
        self, node: str, socket: str, method: str, request: bytes, *, timeout: float, stream: bool = False
    ) -> bytes:
        where = socket if socket == POD_RESOURCES_SOCKET else f"/proc/1/root{socket}"
        argv = [where, method, base64.b64encode(request).decode(), str(timeout), "stream" if stream else "unary"]
        res = self._exec(node, ["python3", "-c", GRPC_CALL, *argv])
        if res.returncode != 0:
            raise NodeGrpcError.from_stderr(res.stderr) or BackendError(
                f"{method} at {socket} on node {node} failed ({res.returncode}): {res.stderr.strip()[-1500:]}"
            )
        return base64.b64decode(res.stdout.strip())

    def close(self) -> None:
        errors = []
        for node, name in list(self._pods.items()):
            try:
                self.api.delete_pod(name, self.namespace, grace=0)
            except ObjectNotFoundError:
                pass
            except BackendError as exc:
                errors.append(f"{name} (node {node}): {exc}")
            del self._pods[node]
        if errors:
            raise BackendError("could not delete node-operations pods: " + "; ".join(errors))
