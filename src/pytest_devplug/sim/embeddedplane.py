"""``EmbeddedPlane``: the embedded control plane (API server, scheduler, events) around ``SimNode``s.

Pods go through the same steps as on a real cluster, synchronously where possible: validation and
defaulting, scheduling (or the ``spec.nodeName`` bypass), then the node's kubelet admits them.
Pending pods are retried by one background thread whenever a node's devices change or a pod goes.

Locking: the cluster lock guards pods and events only and is never held while calling into a
kubelet or device manager (whose callbacks may arrive from gRPC threads); a node's admission lock
may be held while the node calls back into the cluster, never the other way round.
"""

from __future__ import annotations

import copy
import logging
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..kubeletmodel.releases import KubeVersion
from ..kubeletmodel.periods import ENDPOINT_STOP_GRACE_PERIOD_S
from .. import errors
from . import apiserver
from .controlplanes import SimControlPlane, PlaneBase
from .kubelet import SimNode
from .names import dns1123_subdomain_errors, go_quote
from .scheduler import NodeView, pod_requests, schedule

__all__ = ["EmbeddedPlane", "BETA_LABELS"]

#: What kube-controller-manager's node lifecycle controller adds to every Node (its reconcileNodeLabels: the
#: deprecated beta twins of the kubelet's os/arch labels), seen on a real 1.34 control plane.
BETA_LABELS = {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux"}

_log = logging.getLogger(__name__)


@dataclass
class _Pod:
    obj: dict[str, Any]  # apiVersion, kind, metadata, spec as the API server stored them
    scheduled: dict[str, Any] | None = None  # the PodScheduled condition
    kubelet_status: dict[str, Any] | None = None  # last status the kubelet posted
    #: Set while ``create_pod`` makes the first scheduling attempt itself, so the retry thread
    #: does not bind it meanwhile and ``create_pod`` returns the admitted pod.
    in_create: bool = True

    @property
    def uid(self) -> str:
        return str(self.obj["metadata"]["uid"])

    @property
    def node_name(self) -> str | None:
        return self.obj["spec"].get("nodeName") or None

    @property
    def phase(self) -> str:
        return str((self.kubelet_status or {}).get("phase", "Pending"))

    def render(self) -> dict[str, Any]:
        out = copy.deepcopy(self.obj)
        status: dict[str, Any] = copy.deepcopy(self.kubelet_status) if self.kubelet_status else {"phase": "Pending"}
        conditions: list[dict[str, Any]] = list(status.get("conditions") or [])
        if self.scheduled is not None:
            conditions.insert(0, dict(self.scheduled))
        if conditions:
            status["conditions"] = conditions
        out["status"] = status
        return out


class EmbeddedPlane(PlaneBase):
    """Embedded kubelets behind the embedded control plane (API objects, scheduling, events in-process).

    Use as a context manager (``close()`` cleans up); :class:`~.realplane.RealPlane` is the same behind a real
    API server.
    """

    def __init__(
        self,
        workdir: Path | None = None,
        *,
        grace_period: float = ENDPOINT_STOP_GRACE_PERIOD_S,
        kube: KubeVersion | None = None,
    ) -> None:
        super().__init__(workdir, grace_period, kube)
        self._lock = threading.RLock()
        self._nodes: dict[str, SimNode] = {}
        self._pods: dict[tuple[str, str], _Pod] = {}
        self._uids: dict[str, tuple[str, str]] = {}
        self._events: list[dict[str, Any]] = []
        self._event_keys: dict[tuple[str, ...], dict[str, Any]] = {}
        self._closed = False
        self._kick = threading.Event()
        self._worker = threading.Thread(target=self._retry_loop, name="sim-scheduler", daemon=True)
        self._worker.start()

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Stop every plugin process, server and thread; remove the work dir if it was ours."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            nodes = list(self._nodes.values())
        self._kick.set()
        self._worker.join(timeout=10)
        for node in nodes:
            node.close()
        self._remove_own_workdir()

    # ---------------------------------------------------------------------- nodes
    def add_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, Any]] | None = None,
        numa_nodes: int = 2,
        topology_policy: str = "none",
    ) -> SimNode:
        """Add a node and start its kubelet (no plugin yet: start one with ``node.start_plugin``).

        The name is validated as the API server validates a Node's (a DNS-1123 subdomain) before
        any path is made from it, so ``../x`` cannot place a node directory outside the work dir.
        """
        problems = dns1123_subdomain_errors(name)
        if problems:
            details = [f"metadata.name: Invalid value: {go_quote(name)}: {p}" for p in problems]
            agg = details[0] if len(details) == 1 else "[" + ", ".join(details) + "]"
            raise errors.ApiError(422, "Invalid", f"Node {go_quote(name)} is invalid: {agg}")
        with self._lock:
            if name in self._nodes:
                raise errors.ApiError(409, "AlreadyExists", f'nodes "{name}" already exists')
            node = SimNode(
                name,
                self.workdir / name,
                labels={**BETA_LABELS, **(labels or {})},
                taints=taints,
                numa_nodes=numa_nodes,
                topology_policy=topology_policy,
                grace_period=self.grace_period,
                kube=self.kube,
                control_plane=self,
            )
            self._nodes[name] = node
        node.start_kubelet()
        return node

    def node(self, name: str) -> SimNode:
        with self._lock:
            try:
                return self._nodes[name]
            except KeyError:
                raise errors.NotFoundError("nodes", name) from None

    @property
    def nodes(self) -> list[SimNode]:
        with self._lock:
            return list(self._nodes.values())

    def get_node(self, name: str) -> dict[str, Any]:
        node = self.node(name)
        node.refresh_status()
        return node.node_dict()

    def list_nodes(self) -> list[dict[str, Any]]:
        out = []
        for node in self.nodes:
            node.refresh_status()
            out.append(node.node_dict())
        return out

    def update_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, Any]] | None = None,
        unschedulable: bool | None = None,
    ) -> dict[str, Any]:
        """Replace labels/taints, cordon/uncordon; pending pods are retried."""
        node = self.node(name)
        with self._lock:
            node.update(labels=labels, taints=taints, unschedulable=unschedulable)
        self._kick.set()
        return node.node_dict()

    # ----------------------------------------------------------------------- pods
    def create_pod(self, manifest: Any) -> dict[str, Any]:
        """Validate and default (``ApiError`` 422/409/400), schedule, admit; returns the pod."""
        pod = apiserver.admit_pod(manifest)
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        with self._lock:
            if self._closed:
                raise errors.SimError("the cluster is closed")
            if key in self._pods:
                raise errors.ApiError(409, "AlreadyExists", f'pods "{meta["name"]}" already exists')
            self._pods[key] = _Pod(pod)
            self._uids[meta["uid"]] = key
            target = pod["spec"].get("nodeName")
            node = self._nodes.get(target) if target else None
        if target:
            if node is not None:  # spec.nodeName: no scheduler, straight to that node's kubelet
                node.admit(copy.deepcopy(pod))
        else:
            self._refresh_nodes()
            self._try_schedule(key, from_create=True)
        return self.get_pod(meta["name"], meta["namespace"])

    def get_pod(self, name: str, namespace: str = "default") -> dict[str, Any]:
        with self._lock:
            rec = self._pods.get((namespace, name))
            if rec is None:
                raise errors.NotFoundError("pods", name)
            node = self._nodes.get(rec.node_name) if rec.node_name else None
            uid = rec.uid
        live = node.pod_status(uid) if node is not None and node.running else None
        with self._lock:
            if live is not None and self._pods.get((namespace, name)) is rec:
                rec.kubelet_status = live
            return rec.render()

    def list_pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            keys = sorted(k for k in self._pods if namespace is None or k[0] == namespace)
        out = []
        for ns, name in keys:
            try:
                out.append(self.get_pod(name, ns))
            except errors.NotFoundError:
                continue  # deleted meanwhile
        return out

    def delete_pod(self, name: str, namespace: str = "default") -> dict[str, Any]:
        """Delete at once (like ``--grace-period=0 --force``); the kubelet kills the containers."""
        with self._lock:
            rec = self._pods.pop((namespace, name), None)
            if rec is None:
                raise errors.NotFoundError("pods", name)
            self._uids.pop(rec.uid, None)
            node = self._nodes.get(rec.node_name) if rec.node_name else None
            out = rec.render()
        if node is not None:
            node.kill_pod(rec.uid)
        self._kick.set()
        return out

    def _container_finished(self) -> None:
        self._kick.set()  # its pod may have ended, so its requests no longer count: pending pods may fit now

    def _bound(self, name: str, namespace: str) -> tuple[SimNode, str]:
        with self._lock:
            rec = self._pods.get((namespace, name))
            if rec is None:
                raise errors.NotFoundError("pods", name)
            node = self._nodes.get(rec.node_name) if rec.node_name else None
            if node is None:
                raise errors.SimError(f"pod {namespace}/{name} is not bound to a node")
            return node, rec.uid

    # --------------------------------------------------------------------- events
    def events(self, *, namespace: str | None = None, involved_name: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [
                copy.deepcopy(e)
                for e in self._events
                if (namespace is None or e["involvedObject"]["namespace"] == namespace)
                and (involved_name is None or e["involvedObject"]["name"] == involved_name)
            ]

    def _record_event(
        self, pod: Mapping[str, Any], type_: str, reason: str, message: str, component: str, host: str = ""
    ) -> None:
        meta = pod["metadata"]
        key = (meta["uid"], type_, reason, message, component)
        now = apiserver.now_rfc3339()
        with self._lock:
            ev = self._event_keys.get(key)
            if ev is not None:
                ev["count"] += 1
                ev["lastTimestamp"] = now
                return
            ev = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": meta["namespace"]},
                "type": type_,
                "reason": reason,
                "message": message,
                "involvedObject": {
                    "kind": "Pod",
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "uid": meta["uid"],
                    "apiVersion": "v1",
                },
                "source": {"component": component, **({"host": host} if host else {})},
                "reportingComponent": component,
                "count": 1,
                "firstTimestamp": now,
                "lastTimestamp": now,
            }
            self._event_keys[key] = ev
            self._events.append(ev)

    # ------------------------------------------------- the kubelets' side (ControlPlaneLink)
    def record_event(self, node: str, pod: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self._record_event(pod, type_, reason, message, "kubelet", node)

    def set_pod_status(self, node: str, uid: str, status: dict[str, Any]) -> None:
        with self._lock:
            key = self._uids.get(uid)
            rec = self._pods.get(key) if key else None
            if rec is not None:
                rec.kubelet_status = copy.deepcopy(status)
        if status.get("phase") in ("Succeeded", "Failed"):
            self._kick.set()  # its requests no longer count: pending pods may fit now

    def pod_bound(self, uid: str, node: str) -> bool:
        with self._lock:
            key = self._uids.get(uid)
            rec = self._pods.get(key) if key else None
            return rec is not None and rec.node_name == node

    def pods_bound_to(self, node: str) -> list[dict[str, Any]]:
        with self._lock:
            return [rec.render() for rec in self._pods.values() if rec.node_name == node]

    def node_changed(self, node: str) -> None:
        self._kick.set()

    # ------------------------------------------------------------------ internals

    def _refresh_nodes(self) -> None:
        for node in self.nodes:
            node.refresh_status()

    def _node_views(self) -> list[NodeView]:
        """Caller holds the lock. Requests of bound, non-terminated pods count (the "assume")."""
        views: dict[str, NodeView] = {}
        for node in self._nodes.values():
            views[node.name] = NodeView(
                node.name,
                dict(node.labels),
                [dict(t) for t in node.taints],
                node.unschedulable,
                node.allocatable_amounts(),
                {"pods": 0},
            )
        for rec in self._pods.values():
            view = views.get(rec.node_name or "")
            if view is None or rec.phase in ("Succeeded", "Failed"):
                continue
            view.requested["pods"] += 1
            for k, v in pod_requests(rec.obj).items():
                view.requested[k] = view.requested.get(k, 0) + v
        return list(views.values())

    def _try_schedule(self, key: tuple[str, str], *, from_create: bool = False) -> None:
        with self._lock:
            rec = self._pods.get(key)
            if rec is None or rec.node_name or self._closed or (rec.in_create and not from_create):
                return
            rec.in_create = False
            result = schedule(rec.obj, self._node_views(), self.kube)
            now = apiserver.now_rfc3339()
            if result.node is None:
                rec.scheduled = {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": result.message,
                    "lastTransitionTime": now,
                }
                obj = rec.obj
                self._record_event(obj, "Warning", "FailedScheduling", result.message, "default-scheduler")
                return
            rec.obj["spec"]["nodeName"] = result.node
            rec.scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": now}
            self._record_event(
                rec.obj,
                "Normal",
                "Scheduled",
                f"Successfully assigned {key[0]}/{key[1]} to {result.node}",
                "default-scheduler",
            )
            node = self._nodes[result.node]
            pod = copy.deepcopy(rec.obj)
        node.admit(pod)

    def _retry_loop(self) -> None:
        """Retry unscheduled pods when something changed (no polling: woken by ``_kick``)."""
        while True:
            self._kick.wait()
            self._kick.clear()
            with self._lock:
                if self._closed:
                    return
            try:
                self._refresh_nodes()
                with self._lock:
                    pending = sorted(
                        (k for k, r in self._pods.items() if not r.node_name),
                        key=lambda k: self._pods[k].obj["metadata"]["creationTimestamp"],
                    )
                for key in pending:
                    self._try_schedule(key)
            except Exception:  # noqa: BLE001 - the retry thread must outlive any one bad pass
                _log.exception("scheduling pass failed; retrying on the next change")


#: Checked by mypy: ``EmbeddedPlane`` is a :class:`~.controlplanes.SimControlPlane`, like the real control plane's
#: ``RealPlane``.
_IS_CLUSTER_API: type[SimControlPlane] = EmbeddedPlane
