"""``RealPlane``: embedded kubelets as real Nodes of a real API server (``--devplug-control-plane real``).

The same surface as :class:`~pytest_devplug.sim.embeddedplane.EmbeddedPlane` (see :mod:`.controlplanes`), so the
backend, handles and the conformance suite run unchanged; what ``EmbeddedPlane`` does itself, the real
control plane does here: validation and defaulting (kube-apiserver), scheduling (kube-scheduler), the
not-ready taint (kube-controller-manager). Each ``SimNode`` acts as its node's kubelet through the API:

- it registers its ``Node`` and a ``Lease`` in ``kube-node-lease`` (renewed every 10 s while it runs),
  posts node status (capacity and allocatable from its device manager) whenever its devices change;
- one watch of all pods hands each pod bound to a node (by the scheduler or ``spec.nodeName``) to that
  node's admission, one pod at a time per node (the kubelet's sync loop); a deletion kills the pod;
- pod status is posted through the ``status`` subresource (strategic merge: the scheduler's
  ``PodScheduled`` condition stays), re-synced on every read as the kubelet's status manager would;
- the events a kubelet emits are core/v1 Events with ``source.component: kubelet``.

Requests go by path through :class:`~pytest_devplug.kuberest.KubeRest` (JSON as it is, the patch type chosen
here, any release of the ``kubernetes`` client); only the pod watch uses the client's typed ``Watch``.

A stopped kubelet posts nothing (as a real one): the Node keeps its last status until the node
lifecycle controller's grace period (50 s in 1.34) runs out.
"""

from __future__ import annotations

import copy
import datetime
import logging
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import kubernetes
import urllib3
from kubernetes.client import ApiException

from ..kubeletmodel.releases import KubeVersion
from ..kubeletmodel.periods import ENDPOINT_STOP_GRACE_PERIOD_S
from ..kuberest import STRATEGIC_PATCH, KubeRest
from ..errors import RestError, WaitTimeout
from ..waiting import wait_for
from .. import errors
from .apiserver import now_rfc3339
from .controlplanes import SimControlPlane, PlaneBase
from .dra.apiseams import KubeletDRAApi
from .dra.kubeletside import DRATimings, NodeDRA
from .kubelet import SimNode
from ..procs.launcher import KUBELET_PATHS
from .nodestatus import node_labels

__all__ = ["RealPlane", "LEASE_SECONDS", "NOT_READY_TAINT", "RENEW_SECONDS"]

_log = logging.getLogger(__name__)

#: The kubelet's defaults: a 40 s node lease renewed every 10 s (a quarter of it).
LEASE_SECONDS = 40
RENEW_SECONDS = 10.0
#: The taint a new Node gets from the API server (TaintNodesByCondition) until its kubelet reports Ready.
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
_LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
#: Seconds an idle watch waits for data before it is re-opened (bounds how long ``close`` waits for it).
_WATCH_IDLE_SECONDS = 1.0


def _api_error(exc: RestError) -> errors.ApiError:
    """The API server's own status (reason, message) as the sim's error, so callers map one type."""
    if exc.status == 404 and exc.details.get("kind") and exc.details.get("name"):
        return errors.NotFoundError(
            str(exc.details["kind"]), str(exc.details["name"])
        )  # the same text: `pods "x" not found`
    return errors.ApiError(exc.status, exc.reason, exc.message)


def _micro_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _NodeAgent:
    """What one node's kubelet keeps about the API: its admission queue, last posted statuses, events."""

    def __init__(self, node: SimNode) -> None:
        self.node = node
        self.queue = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"kubelet-{node.name}")
        #: Pod UIDs handed to this node's admission since they were seen bound here.
        self.handed: set[str] = set()
        #: pod UID -> the status last posted for it (post only what changed).
        self.posted: dict[str, dict[str, Any]] = {}
        #: Held across reading a pod's status and posting it: posts of one node never overtake each other.
        self.post_lock = threading.Lock()
        #: (pod uid, type, reason, message) -> [event name, count]: repeated events are counted, as the recorder does.
        self.events: dict[tuple[str, str, str, str], list[Any]] = {}
        #: The node status last posted; ``status_lock`` is held from reading the device manager to the PATCH, so a
        #: reader's post (``get_node``) and the status thread's never land out of order: a stale status landing last
        #: would stay, since an unchanged status is not posted again.
        self.node_status: dict[str, Any] | None = None
        self.status_lock = threading.Lock()
        self.ready_since = now_rfc3339()


class RealPlane(PlaneBase):
    """Embedded kubelets registered with the API server that ``client`` (a ``kubernetes.client.ApiClient``) talks to.

    ``timeout``: how long :meth:`create_pod` waits for the scheduler and the node to act on a new pod
    before returning it as it is then (the caller's own waits decide what that means).
    ``remove_nodes``: ``close()`` deletes the Nodes (and Leases) it registered, as decommissioning a machine
    does, so a control plane that lives on (shared by tests, or kept) schedules nothing onto dead kubelets.
    """

    def __init__(
        self,
        client: Any,
        workdir: Path | None = None,
        *,
        grace_period: float = ENDPOINT_STOP_GRACE_PERIOD_S,
        timeout: float = 20.0,
        remove_nodes: bool = True,
        kube: KubeVersion | None = None,
    ) -> None:
        super().__init__(workdir, grace_period, kube)
        self.remove_nodes = remove_nodes
        self.timeout = timeout
        #: The DRA periods every kubelet starts with (``set_dra_timings`` changes them for all).
        self.dra_timings = DRATimings()
        self._rest = KubeRest(client, timeout)
        self._core: Any = kubernetes.client.CoreV1Api(client)  # the pod watch's list call
        self._lock = threading.RLock()
        self._agents: dict[str, _NodeAgent] = {}
        #: pod UID -> (namespace, name) of every pod seen (watch or create), for the kubelet's by-UID questions.
        self._uids: dict[str, tuple[str, str]] = {}
        self._closed = threading.Event()
        self._kick = threading.Event()
        self._synced = threading.Event()
        self._watcher = threading.Thread(target=self._watch_loop, name="sim-api-watch", daemon=True)
        self._heart = threading.Thread(target=self._status_loop, name="sim-api-status", daemon=True)
        self._watcher.start()
        self._heart.start()
        if not self._synced.wait(timeout):
            self.close()
            raise errors.SimError(f"the pod watch on the API server did not start within {timeout:g}s")

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Stop the watch and status threads, every node (plugins included); remove the work dir if it was ours."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._kick.set()
        self._heart.join(timeout=10)
        self._watcher.join(timeout=10)
        with self._lock:
            agents = list(self._agents.values())
        for agent in agents:
            agent.queue.shutdown(wait=True, cancel_futures=True)
            agent.node.close()
            if self.remove_nodes:
                self._deregister(agent.node.name)
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
        """Register the Node (the API server validates the name first), then start its kubelet."""
        own_labels = node_labels(name, labels)
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": own_labels},
            "spec": {},
        }
        if taints:
            body["spec"]["taints"] = [dict(t) for t in taints]
        try:
            self._rest.create("/api/v1/nodes", body)
        except RestError as exc:
            raise _api_error(exc) from None
        node = SimNode(
            name,
            self.workdir / name,
            labels=own_labels,
            taints=taints,
            numa_nodes=numa_nodes,
            topology_policy=topology_policy,
            grace_period=self.grace_period,
            kube=self.kube,
            control_plane=self,
        )
        node.dra = NodeDRA(
            name,
            node.node_dir,
            KubeletDRAApi(self._rest),
            endpoint_paths={KUBELET_PATHS[d]: node.node_dir / d for d in ("plugins_registry", "plugins")},
            event_sink=lambda pod, type_, reason, message: self.record_event(name, pod, type_, reason, message),
            on_change=self._kick.set,
            timings=DRATimings(**vars(self.dra_timings)),
            logger=node.logger,
            kube=self.kube,
        )
        agent = _NodeAgent(node)
        with self._lock:
            self._agents[name] = agent
        node.start_kubelet()
        self._post_node_status(agent)
        self._renew_lease(agent)
        self._wait_schedulable(name)
        self._hand_over_bound(name)
        return node

    def set_dra_timings(self, **seconds: float) -> None:
        """Change DRA periods (``wiping_delay``, ``retry_period``, ``reconcile_period``) of every kubelet, now and
        after its restarts, and of nodes added later."""
        for key, value in seconds.items():
            setattr(self.dra_timings, key, float(value))
        for node in self.nodes:
            if node.dra is not None:
                for key, value in seconds.items():
                    setattr(node.dra.timings, key, float(value))
                if "wiping_delay" in seconds:
                    node.dra.set_wiping_delay(float(seconds["wiping_delay"]))

    def _wait_schedulable(self, name: str) -> None:
        """Return once the node lifecycle controller lifted the ``not-ready`` taint the API server put on the new
        Node (the embedded control plane's nodes are schedulable at once; so are these when this returns)."""

        def taints() -> list[str]:
            node = self._rest.get(f"/api/v1/nodes/{name}")
            return [str(t.get("key")) for t in (node.get("spec") or {}).get("taints") or []]

        wait_for(
            taints,
            lambda keys: NOT_READY_TAINT not in keys,
            timeout=self.timeout,
            what=f"kube-controller-manager's node lifecycle controller to lift the {NOT_READY_TAINT} taint "
            f"of node {name}",
        )

    def _deregister(self, name: str) -> None:
        for path in (f"/api/v1/nodes/{name}", f"{_LEASES}/{name}"):
            try:
                self._rest.delete(path)
            except RestError as exc:
                if not exc.not_found:
                    _log.warning("removing node %s from the API failed: %s", name, _api_error(exc))

    def _agent(self, name: str) -> _NodeAgent:
        with self._lock:
            try:
                return self._agents[name]
            except KeyError:
                raise errors.NotFoundError("nodes", name) from None

    def node(self, name: str) -> SimNode:
        return self._agent(name).node

    @property
    def nodes(self) -> list[SimNode]:
        with self._lock:
            return [a.node for a in self._agents.values()]

    def get_node(self, name: str) -> dict[str, Any]:
        agent = self._agent(name)
        self._post_node_status(agent)
        try:
            return self._rest.get(f"/api/v1/nodes/{name}")
        except RestError as exc:
            raise _api_error(exc) from None

    def list_nodes(self) -> list[dict[str, Any]]:
        with self._lock:
            agents = list(self._agents.values())
        for agent in agents:
            self._post_node_status(agent)
        return self._rest.items("/api/v1/nodes")

    def update_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, Any]] | None = None,
        unschedulable: bool | None = None,
    ) -> dict[str, Any]:
        """Replace labels/taints, cordon/uncordon, in the API (the scheduler reacts) and in the node's kubelet."""
        node = self.node(name)
        patch: dict[str, Any] = {}
        if labels is not None:
            gone = {k: None for k in node.labels if k not in labels}
            patch["metadata"] = {"labels": {**gone, **dict(labels)}}
        spec: dict[str, Any] = {}
        if taints is not None:
            spec["taints"] = [dict(t) for t in taints] or None
        if unschedulable is not None:
            spec["unschedulable"] = unschedulable or None
        if spec:
            patch["spec"] = spec
        try:
            updated = self._rest.patch(f"/api/v1/nodes/{name}", patch)
        except RestError as exc:
            raise _api_error(exc) from None
        node.update(labels=labels, taints=taints, unschedulable=unschedulable)
        return updated

    def _node_status(self, agent: _NodeAgent) -> dict[str, Any]:
        node = agent.node
        node.refresh_status()
        return {
            "capacity": node.capacity(),
            "allocatable": node.allocatable(),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastTransitionTime": agent.ready_since,
                }
            ],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": node.name}],
            "nodeInfo": node.node_info(),
        }

    def _post_node_status(self, agent: _NodeAgent, *, heartbeat: bool = False) -> None:
        """Post the node's status when it changed (or as a heartbeat); a stopped kubelet posts nothing."""
        if not agent.node.running:
            return
        with agent.status_lock:
            status = self._node_status(agent)
            if status == agent.node_status and not heartbeat:
                return
            body = copy.deepcopy(status)
            body["conditions"][0]["lastHeartbeatTime"] = now_rfc3339()
            try:
                self._rest.patch(
                    f"/api/v1/nodes/{agent.node.name}/status", {"status": body}, content_type=STRATEGIC_PATCH
                )
            except RestError as exc:
                agent.node_status = None  # post again next time
                _log.warning("posting node status of %s failed: %s", agent.node.name, _api_error(exc))
            else:
                agent.node_status = status

    def _renew_lease(self, agent: _NodeAgent) -> None:
        name = agent.node.name
        spec = {"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": _micro_now()}
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": "kube-node-lease"},
            "spec": spec,
        }
        try:
            try:
                self._rest.patch(f"{_LEASES}/{name}", {"spec": spec})
            except RestError as exc:
                if not exc.not_found:
                    raise
                self._rest.create(_LEASES, body)
        except RestError as exc:
            _log.warning("renewing the node lease of %s failed: %s", name, _api_error(exc))

    def _status_loop(self) -> None:
        """Node status on every device change; lease and status heartbeat every 10 s; pod statuses re-synced."""
        last_beat = time.monotonic()
        while not self._closed.is_set():
            self._kick.wait(max(0.0, last_beat + RENEW_SECONDS - time.monotonic()))
            self._kick.clear()
            if self._closed.is_set():
                return
            heartbeat = time.monotonic() - last_beat >= RENEW_SECONDS
            if heartbeat:
                last_beat = time.monotonic()
            with self._lock:
                agents = list(self._agents.values())
            for agent in agents:
                try:
                    if not agent.node.running:
                        continue
                    self._post_node_status(agent, heartbeat=heartbeat)
                    if heartbeat:
                        self._renew_lease(agent)
                    for uid in agent.node.active_pod_uids():
                        self._sync_pod_status(agent, uid)
                except Exception:  # noqa: BLE001 - the status thread must outlive one bad pass
                    _log.exception("status pass for %s failed; retrying on the next change", agent.node.name)

    # ----------------------------------------------------------------------- pods
    def create_pod(self, manifest: Any) -> dict[str, Any]:
        """POST the pod (the API server's refusals raise ``ApiError`` with its status and text); return it once
        the scheduler placed it and its node admitted or rejected it, or the scheduler found no node."""
        if not isinstance(manifest, Mapping):
            raise errors.ApiError(
                400, "BadRequest", f"the pod manifest must be a JSON object, not {type(manifest).__name__}"
            )
        ns = str((manifest.get("metadata") or {}).get("namespace") or "default")
        try:
            pod = self._rest.create(f"/api/v1/namespaces/{ns}/pods", manifest)  # as it is: the API server judges it
        except RestError as exc:
            raise _api_error(exc) from None
        meta = pod["metadata"]
        with self._lock:
            self._uids[meta["uid"]] = (ns, meta["name"])
        return self._settled(meta["name"], ns, meta["uid"])

    def _settled(self, name: str, namespace: str, uid: str) -> dict[str, Any]:
        """Poll (bounded by ``timeout``) until the pod's fate is decided, as ``EmbeddedPlane.create_pod`` returns it."""

        def decided(pod: dict[str, Any]) -> bool:
            node_name = pod["spec"].get("nodeName")
            if not node_name:
                conds = (pod.get("status") or {}).get("conditions") or []
                return any(c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conds)
            with self._lock:
                agent = self._agents.get(node_name)
            return agent is None or not agent.node.running or agent.node.pod_status(uid) is not None

        try:
            return wait_for(
                lambda: self.get_pod(name, namespace),
                decided,
                timeout=self.timeout,
                what=f"pod {namespace}/{name} to be scheduled and admitted",
            )
        except WaitTimeout as exc:
            if exc.last is None:
                raise
            return dict(exc.last)

    def get_pod(self, name: str, namespace: str = "default") -> dict[str, Any]:
        return self._synced_pod(self._read_pod(name, namespace))

    def _synced_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """The pod with its kubelet's current status posted first if it changed (the status manager's sync)."""
        node_name = pod["spec"].get("nodeName")
        with self._lock:
            agent = self._agents.get(node_name) if node_name else None
        if agent is None:
            return pod
        uid = pod["metadata"]["uid"]
        patched = self._sync_pod_status(agent, uid)
        if patched is not None:
            return patched
        with self._lock:
            posted = agent.posted.get(uid)
        status = pod.get("status") or {}
        if posted is not None and any(status.get(k) != v for k, v in posted.items() if k != "conditions"):
            # Read before another thread's post of the same status landed: read the result of that post.
            return self._read_pod(pod["metadata"]["name"], pod["metadata"]["namespace"])
        return pod

    def _read_pod(self, name: str, namespace: str) -> dict[str, Any]:
        try:
            return self._rest.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        except RestError as exc:
            raise _api_error(exc) from None

    def set_pod_status(self, node_name: str, uid: str, status: dict[str, Any]) -> None:
        """ControlPlaneLink: post the kubelet's status (read again at post time: see _sync_pod_status)."""
        with self._lock:
            agent = self._agents.get(node_name)
        if agent is not None:
            self._sync_pod_status(agent, uid)

    def _sync_pod_status(self, agent: _NodeAgent, uid: str) -> dict[str, Any] | None:
        """PATCH the status subresource with the kubelet's status *now* when it differs from what was posted last;
        the updated pod, or ``None``. One post at a time per node, each reading the status under the node's post
        lock, so a slower post of an older status can never land after a newer one."""
        with agent.post_lock:
            if not agent.node.running:
                return None
            status = agent.node.pod_status(uid)
            with self._lock:
                key = self._uids.get(uid)
                if status is None or key is None or agent.posted.get(uid) == status:
                    return None
            try:
                patched = self._rest.patch(
                    f"/api/v1/namespaces/{key[0]}/pods/{key[1]}/status",
                    {"metadata": {"uid": uid}, "status": status},
                    content_type=STRATEGIC_PATCH,
                )
            except RestError as exc:
                if exc.status not in (404, 409):  # deleted (or replaced by a pod of the same name) meanwhile
                    _log.warning("posting status of pod %s/%s failed: %s", key[0], key[1], _api_error(exc))
                return None
            with self._lock:
                agent.posted[uid] = status
            return patched

    def list_pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        items = sorted(
            self._rest.items("/api/v1/pods" if namespace is None else f"/api/v1/namespaces/{namespace}/pods"),
            key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]),
        )
        return [self._synced_pod(p) for p in items]

    def delete_pod(self, name: str, namespace: str = "default") -> dict[str, Any]:
        """Delete at once (``--grace-period=0 --force``); the node's kubelet kills the containers before returning."""
        pod = self.get_pod(name, namespace)
        try:
            self._rest.delete(f"/api/v1/namespaces/{namespace}/pods/{name}", gracePeriodSeconds="0")
        except RestError as exc:
            raise _api_error(exc) from None
        self._forget(pod)
        return pod

    def _forget(self, pod: Mapping[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        node_name = pod["spec"].get("nodeName")
        with self._lock:
            self._uids.pop(uid, None)
            agent = self._agents.get(node_name) if node_name else None
            if agent is not None:
                agent.handed.discard(uid)
                agent.posted.pop(uid, None)
        if agent is not None:
            agent.node.kill_pod(uid)

    def _bound(self, name: str, namespace: str) -> tuple[SimNode, str]:
        pod = self.get_pod(name, namespace)
        node_name = pod["spec"].get("nodeName")
        with self._lock:
            agent = self._agents.get(node_name) if node_name else None
        if agent is None:
            raise errors.SimError(f"pod {namespace}/{name} is not bound to a node")
        return agent.node, str(pod["metadata"]["uid"])

    # ------------------------------------------------------------ the kubelet side
    def pods_bound_to(self, node_name: str) -> list[dict[str, Any]]:
        """ControlPlaneLink; the pods are remembered as handed to the node."""
        pods = self._rest.items("/api/v1/pods", fieldSelector=f"spec.nodeName={node_name}")
        with self._lock:
            for p in pods:
                self._uids[p["metadata"]["uid"]] = (p["metadata"]["namespace"], p["metadata"]["name"])
            agent = self._agents.get(node_name)
            if agent is not None:
                agent.handed |= {p["metadata"]["uid"] for p in pods}
        return pods

    def pod_bound(self, uid: str, node_name: str) -> bool:
        with self._lock:
            key = self._uids.get(uid)
        if key is None:
            return False
        try:
            pod = self._rest.get(f"/api/v1/namespaces/{key[0]}/pods/{key[1]}")
        except RestError as exc:
            if exc.not_found:
                return False
            raise _api_error(exc) from None
        return bool(
            pod["metadata"]["uid"] == uid
            and pod["spec"].get("nodeName") == node_name
            and not pod["metadata"].get("deletionTimestamp")
        )

    def _hand_over(self, pod: dict[str, Any]) -> None:
        """A pod bound to one of our nodes goes to that node's admission queue, once; one being deleted
        gracefully is terminated instead."""
        node_name = pod["spec"].get("nodeName")
        uid = pod["metadata"]["uid"]
        with self._lock:
            agent = self._agents.get(node_name) if node_name else None
            if agent is None:
                return
            deleting = bool(pod["metadata"].get("deletionTimestamp"))
            if not deleting:
                if uid in agent.handed:
                    return
                agent.handed.add(uid)
        if deleting:
            self._terminate(agent, pod)
            return
        try:
            agent.queue.submit(self._admit, agent, pod)
        except RuntimeError:
            pass  # shutting down

    def _terminate(self, agent: _NodeAgent, pod: Mapping[str, Any]) -> None:
        """A pod another component deleted gracefully (its ``deletionTimestamp`` set: the device-taint or taint
        eviction controller, the eviction API, ``kubectl delete``): the node's kubelet stops it, then removes the
        object for good with a zero grace period and a UID precondition, as the kubelet's status manager does once
        the pod's resources are reclaimed. A node whose kubelet is down leaves it until the kubelet starts again."""
        if not agent.node.running:
            return
        meta = pod["metadata"]
        agent.node.kill_pod(meta["uid"])
        try:
            self._rest.request(
                "DELETE",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
            )
        except RestError as exc:
            if exc.status not in (404, 409):  # gone already, or a new pod of that name
                _log.warning("deleting terminated pod %s/%s failed: %s", meta["namespace"], meta["name"], exc)

    def _admit(self, agent: _NodeAgent, pod: dict[str, Any]) -> None:
        try:
            agent.node.admit(pod)
        except Exception:  # noqa: BLE001 - one pod's failure must not stop the node's queue
            _log.exception("admitting pod %s/%s failed", pod["metadata"]["namespace"], pod["metadata"]["name"])

    def _hand_over_bound(self, node_name: str) -> None:
        for pod in self.pods_bound_to(node_name):
            with self._lock:
                agent = self._agents.get(node_name)
                if agent is not None:
                    agent.handed.discard(pod["metadata"]["uid"])
            self._hand_over(pod)

    def _relist(self) -> str:
        """List every pod (hand the bound ones over); the resource version to watch from."""
        resp = self._rest.get("/api/v1/pods")
        for pod in resp["items"]:
            with self._lock:
                self._uids[pod["metadata"]["uid"]] = (pod["metadata"]["namespace"], pod["metadata"]["name"])
            self._hand_over(pod)
        return str(resp["metadata"]["resourceVersion"])

    def _watch_loop(self) -> None:
        """One watch of every pod: bound ones are admitted, deleted ones killed. The watch is re-opened from the
        last resource version every few idle seconds (so ``close`` ends it promptly), listed again after a 410."""
        rv: str | None = None
        while not self._closed.is_set():
            try:
                if rv is None:
                    rv = self._relist()
                    self._synced.set()
                for event in kubernetes.watch.Watch().stream(  # type: ignore[no-untyped-call]
                    self._core.list_pod_for_all_namespaces,
                    resource_version=rv,
                    timeout_seconds=60,
                    _request_timeout=(self.timeout, _WATCH_IDLE_SECONDS),
                ):
                    if self._closed.is_set():
                        return
                    pod = event.get("raw_object") or {}
                    if event.get("type") == "ERROR" or "metadata" not in pod:
                        rv = None  # e.g. 410 Gone: the version is too old, list again
                        break
                    rv = str(pod["metadata"]["resourceVersion"])
                    if event["type"] == "DELETED":
                        self._forget(pod)
                        continue
                    with self._lock:
                        self._uids[pod["metadata"]["uid"]] = (pod["metadata"]["namespace"], pod["metadata"]["name"])
                    self._hand_over(pod)
            except urllib3.exceptions.ReadTimeoutError:
                continue  # idle: watch again from rv
            except Exception as exc:  # noqa: BLE001 - the watch must survive a dropped connection
                if self._closed.is_set():
                    return
                if isinstance(exc, ApiException) and exc.status == 410:
                    rv = None
                else:
                    _log.warning("pod watch failed (%r); watching again", exc)
                    self._closed.wait(0.5)

    # --------------------------------------------------------------------- events
    def events(self, *, namespace: str | None = None, involved_name: str | None = None) -> list[dict[str, Any]]:
        query = {"fieldSelector": f"involvedObject.name={involved_name}"} if involved_name else {}
        items = self._rest.items(
            "/api/v1/events" if namespace is None else f"/api/v1/namespaces/{namespace}/events", **query
        )
        items.sort(
            key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or e["metadata"].get("creationTimestamp") or ""
        )
        return items

    def node_changed(self, node_name: str) -> None:
        self._kick.set()

    def record_event(self, node_name: str, pod: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """ControlPlaneLink: a kubelet event (core/v1, ``source: {component: kubelet, host: <node>}``); a repeat
        raises ``count``."""
        meta = pod["metadata"]
        ns = meta.get("namespace", "default")
        now = now_rfc3339()
        key = (meta["uid"], type_, reason, message)
        with self._lock:
            agent = self._agents.get(node_name)
            seen = agent.events.get(key) if agent is not None else None
            if seen is not None:
                seen[1] += 1
        try:
            if seen is not None:
                self._rest.patch(f"/api/v1/namespaces/{ns}/events/{seen[0]}", {"count": seen[1], "lastTimestamp": now})
                return
            name = f"{meta['name']}.{uuid.uuid4().hex[:16]}"
            body = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": ns},
                "type": type_,
                "reason": reason,
                "message": message,
                "involvedObject": {
                    "kind": "Pod",
                    "name": meta["name"],
                    "namespace": ns,
                    "uid": meta["uid"],
                    "apiVersion": "v1",
                },
                "source": {"component": "kubelet", "host": node_name},
                "reportingComponent": "kubelet",
                "reportingInstance": node_name,
                "count": 1,
                "firstTimestamp": now,
                "lastTimestamp": now,
            }
            self._rest.create(f"/api/v1/namespaces/{ns}/events", body)
        except RestError as exc:
            _log.warning("recording event %s for %s/%s failed: %s", reason, ns, meta["name"], _api_error(exc))
            return
        with self._lock:
            if agent is not None:
                agent.events[key] = [name, 1]


#: Checked by mypy: ``RealPlane`` is a :class:`SimControlPlane` (as ``EmbeddedPlane`` is), so the backend takes either.
_IS_CLUSTER_API: type[SimControlPlane] = RealPlane
