"""The API server as the driver uses it: read claims and its Node, publish and watch its ResourceSlices.

Objects stay JSON (``dict``) both ways: the ``kubernetes`` client's typed calls with
``_preload_content=False`` for reads, and plain dicts (built here, never read back into models) for
writes. A client's models that are older or newer than the API server would drop or refuse fields of a
claim or slice (the Go helper calls this "dropped fields"); raw JSON keeps what the server said.

The ``kubernetes`` client is imported only here, only by a driver that connects: it is the ``dra``
extra (``pip install 'devplug-gpu-plugin[dra]'``), so the device plugin's install stays small.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

__all__ = ["SERVICE_ACCOUNT_DIR", "ApiConfigError", "KubeApi", "KubeApiError", "connect"]

log = logging.getLogger("devplug_gpu_plugin.dra.kubeapi")

#: Where a pod finds its service-account token and the cluster's CA (the in-cluster way).
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
JSON = dict[str, Any]


class ApiConfigError(Exception):
    """No way to reach the API server: no kubeconfig and not in a pod, or a config that does not load."""


class KubeApiError(Exception):
    """A call failed: ``status`` is the HTTP status (0: no answer), ``str()`` the API server's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    @property
    def not_found(self) -> bool:
        return self.status == 404


def connect(kubeconfig: str | None, timeout: float = 10.0) -> KubeApi:
    """A client from ``kubeconfig`` (a file or a ``KUBECONFIG``-style list), else the in-cluster one."""
    try:
        import kubernetes
    except ImportError:
        raise ApiConfigError(
            "the DRA driver needs the kubernetes client: pip install 'devplug-gpu-plugin[dra]'"
        ) from None
    loader: Any = kubernetes.config  # typed in some releases of the client, not in others
    cfg = kubernetes.client.Configuration()
    try:
        if kubeconfig:
            loader.load_kube_config(config_file=kubeconfig, client_configuration=cfg, persist_config=False)
        else:
            loader.load_incluster_config(client_configuration=cfg)
    except (loader.ConfigException, OSError, ValueError) as exc:
        where = (
            f"kubeconfig {kubeconfig}"
            if kubeconfig
            else f"the in-cluster config (KUBERNETES_SERVICE_HOST/_PORT, {SERVICE_ACCOUNT_DIR}/token and ca.crt)"
        )
        raise ApiConfigError(
            f"cannot reach the API server through {where}: {exc}; give --kubeconfig (or KUBECONFIG) or run in a pod"
        ) from None
    # urllib3 warns of each connection retry; the publisher reports a failed call once, with the reason
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    return KubeApi(kubernetes.client.ApiClient(cfg), timeout)


def _error(exc: BaseException) -> KubeApiError:
    """The API server's own Status message when it answered, else what the transport said."""
    status = int(getattr(exc, "status", 0) or 0)
    body = getattr(exc, "body", None)
    if status and body:
        try:
            message = json.loads(body).get("message")
        except (ValueError, AttributeError):
            message = None
        if message:
            return KubeApiError(status, str(message))
    reason = getattr(exc, "reason", None)
    return KubeApiError(status, f"{reason} (HTTP {status})" if status and reason else str(exc) or type(exc).__name__)


class KubeApi:
    """The few calls the driver makes; each raises :class:`KubeApiError`."""

    def __init__(self, api_client: Any, timeout: float) -> None:
        import kubernetes

        self._client = api_client
        self._timeout = timeout
        self._core = kubernetes.client.CoreV1Api(api_client)
        self._resource = kubernetes.client.ResourceV1Api(api_client)
        self._lock = threading.Lock()
        self._watches: list[Any] = []  # open watch responses, closed by close()

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            resp = method(*args, _preload_content=False, _request_timeout=self._timeout, **kwargs)
            return json.loads(resp.data) if resp.data else {}
        except Exception as exc:  # noqa: BLE001 - ApiException, urllib3's errors, a JSON error: one type up
            raise _error(exc) from None

    def get_claim(self, namespace: str, name: str) -> JSON:
        claim: JSON = self._call(self._resource.read_namespaced_resource_claim, name, namespace)
        return claim

    def set_claim_device_status(
        self, namespace: str, name: str, resource_version: str, entries: Sequence[Mapping[str, Any]]
    ) -> None:
        """Set the claim's ``status.devices`` to ``entries`` if the claim is still at ``resource_version`` (a
        conflict otherwise: HTTP 409). A JSON patch: a list body is sent as one by every client release."""
        patch = [
            {"op": "replace", "path": "/metadata/resourceVersion", "value": resource_version},
            {"op": "add", "path": "/status/devices", "value": [dict(e) for e in entries]},
        ]
        self._call(self._resource.patch_namespaced_resource_claim_status, name, namespace, patch)

    def get_node_uid(self, name: str) -> str:
        return str(self._call(self._core.read_node, name).get("metadata", {}).get("uid", ""))

    @staticmethod
    def _selector(driver: str, node: str) -> str:
        return f"spec.driver={driver},spec.nodeName={node}"

    def list_slices(self, driver: str, node: str) -> list[JSON]:
        items = self._call(self._resource.list_resource_slice, field_selector=self._selector(driver, node)).get("items")
        return list(items or [])

    def create_slice(self, body: Mapping[str, Any]) -> JSON:
        created: JSON = self._call(self._resource.create_resource_slice, dict(body))
        return created

    def update_slice(self, current: Mapping[str, Any], spec: Mapping[str, Any]) -> JSON:
        """Replace ``current``'s spec (an update, as the Go controller makes; conditional on its resourceVersion).

        The metadata sent is what the driver may keep of the object (labels, annotations, owners, finalizers),
        never timestamps or managed fields a client's models would rewrite. (Not a patch: which patch types a
        call accepts differs between releases of the client.)
        """
        meta = current.get("metadata") or {}
        kept = {
            k: meta[k]
            for k in ("name", "resourceVersion", "labels", "annotations", "ownerReferences", "finalizers")
            if meta.get(k)
        }
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": kept, "spec": dict(spec)}
        updated: JSON = self._call(self._resource.replace_resource_slice, str(meta.get("name")), body)
        return updated

    def delete_slice(self, name: str, uid: str, resource_version: str) -> None:
        """Delete only the object we looked at (the Go controller's preconditions); gone already is fine."""
        body = {"preconditions": {"uid": uid, "resourceVersion": resource_version}}
        try:
            self._call(self._resource.delete_resource_slice, name, body=body)
        except KubeApiError as exc:
            if not exc.not_found:
                raise

    def watch_slices(self, driver: str, node: str, timeout_s: int) -> Iterator[JSON]:
        """Watch events (``{"type", "object"}``) of the node's slices of ``driver``, starting with an ADDED
        event per existing slice, until the server ends the watch (``timeout_s``) or :meth:`close`."""
        try:
            resp: Any = self._resource.list_resource_slice(
                field_selector=self._selector(driver, node),
                watch=True,
                timeout_seconds=timeout_s,
                _preload_content=False,
                _request_timeout=(self._timeout, timeout_s + self._timeout),
            )
        except Exception as exc:  # noqa: BLE001 - as in _call
            raise _error(exc) from None
        with self._lock:
            self._watches.append(resp)
        try:
            pending = b""
            for chunk in resp.stream(amt=None, decode_content=False):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        except Exception as exc:  # noqa: BLE001 - a dropped connection ends the watch like a timeout
            raise _error(exc) from None
        finally:
            with self._lock:
                if resp in self._watches:
                    self._watches.remove(resp)
            resp.release_conn()

    def close(self) -> None:
        """End open watches and the connection pool (the watch thread sees its stream end)."""
        with self._lock:
            watches, self._watches = self._watches, []
        for resp in watches:
            try:
                resp.shutdown() if hasattr(resp, "shutdown") else resp.close()
            except Exception as exc:  # noqa: BLE001 - closing is best effort at exit
                log.debug("closing a watch: %s", exc)
        self._client.close()
