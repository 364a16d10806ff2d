"""A workload of the run pinned to one node by DaemonSets (the plugin under test, a DRA driver): its pods, their logs
(kept after the pods go), stop and start, and what its container statuses say.

Stopping adds a ``nodeSelector`` key no node has (:data:`~.manifests.STOP_LABEL`), so the DaemonSet controller
deletes the pod (SIGTERM, its grace period) and makes none until the key is removed again; a kill force-deletes
the pod with grace 0 (SIGKILL) while the DaemonSet does not select the node, as a DaemonSet would otherwise
restart the container at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..base import PluginRestarts
from ...errors import ObjectNotFoundError
from .api import KubeApi
from .manifests import STOP_LABEL, selector_of

__all__ = ["PinnedDaemonSets", "container_statuses", "exit_reason", "pods_running", "restarts"]

JSONDict = dict[str, Any]

#: Container waiting reasons the kubelet does not get out of by itself soon (the workload will not come up).
_HOPELESS_WAITING = frozenset(
    {"CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError"}
)


def _waiting_reason(status: JSONDict) -> str | None:
    """A container status's ``state.waiting.reason`` (``None`` while it runs or has terminated)."""
    reason = ((status.get("state") or {}).get("waiting") or {}).get("reason")
    return str(reason) if reason else None


def container_statuses(pods: Iterable[JSONDict]) -> list[tuple[str, JSONDict]]:
    """(pod name, container status) of every container of ``pods``."""
    return [(p["metadata"]["name"], st) for p in pods for st in p.get("status", {}).get("containerStatuses") or []]


def pods_running(pods: Iterable[JSONDict]) -> bool:
    """A pod not being deleted whose containers all run."""
    for p in pods:
        if p["metadata"].get("deletionTimestamp") or p.get("status", {}).get("phase") != "Running":
            continue
        statuses = p["status"].get("containerStatuses") or []
        if statuses and all("running" in (s.get("state") or {}) for s in statuses):
            return True
    return False


def exit_reason(statuses: Iterable[tuple[str, JSONDict]]) -> str | None:
    """A container the kubelet keeps failing to run (it will not come up by itself), in words; else ``None``."""
    for pod, st in statuses:
        if (reason := _waiting_reason(st)) in _HOPELESS_WAITING:
            last = ((st.get("lastState") or {}).get("terminated")) or {}
            code = f", last exit code {last['exitCode']}" if "exitCode" in last else ""
            return f"container {st.get('name')} of pod {pod} is {reason}{code}"
    return None


def restarts(statuses: Iterable[tuple[str, JSONDict]]) -> PluginRestarts:
    """The containers' ``restartCount`` summed, and a crash loop in words (a pod deleted takes its count with it)."""
    count, loop = 0, None
    for pod, st in statuses:
        count += int(st.get("restartCount") or 0)
        if _waiting_reason(st) == "CrashLoopBackOff":
            message = ((st.get("state") or {}).get("waiting") or {}).get("message") or "CrashLoopBackOff"
            loop = f"container {st.get('name')} of pod {pod} is crash-looping: {message}"
    return PluginRestarts(count, loop)


class PinnedDaemonSets:
    """``daemonsets`` (already owned by the run and pinned to ``node``) as one workload; ``wait_gone(probe, what)``
    waits until ``probe()`` is empty (the backend's bounded wait)."""

    def __init__(
        self,
        api: KubeApi,
        node: str,
        daemonsets: list[JSONDict],
        wait_gone: Callable[[Callable[[], list[JSONDict]], str], None],
    ) -> None:
        self.api = api
        self.node = node
        self.daemonsets = daemonsets
        self._wait_gone = wait_gone
        #: pod UID -> (pod name, its last log text): logs of pods that are gone stay readable.
        self.logs: dict[str, tuple[str, str]] = {}

    def apply(self) -> None:
        for ds in self.daemonsets:
            self.api.apply_daemonset(ds)

    def pods(self) -> list[JSONDict]:
        pods = []
        for ds in self.daemonsets:
            pods += self.api.list_pods(
                ds["metadata"]["namespace"], label_selector=selector_of(ds), field_selector=f"spec.nodeName={self.node}"
            )
        return pods

    def snapshot_logs(self) -> None:
        for p in self.pods():
            meta = p["metadata"]
            text = "".join(
                self.api.pod_log(meta["name"], meta["namespace"], c["name"]) for c in p["spec"].get("containers", [])
            )
            if text or meta["uid"] not in self.logs:
                self.logs[meta["uid"]] = (meta["name"], text)

    def log(self, what: str) -> str:
        """Every pod's log so far, oldest first, each under ``--- <what> pod <name>``."""
        self.snapshot_logs()
        return "".join(f"--- {what} pod {name}\n{text}" for name, text in self.logs.values())

    def set_stopped(self, stopped: bool) -> None:
        for ds in self.daemonsets:
            patch = {"spec": {"template": {"spec": {"nodeSelector": {STOP_LABEL: "true" if stopped else None}}}}}
            self.api.patch_daemonset(ds["metadata"]["name"], ds["metadata"]["namespace"], patch)

    def wait_no_pods(self, what: str) -> None:
        self._wait_gone(self.pods, what)

    def force_remove_pods(self, what: str) -> None:
        """The DaemonSets stop selecting the node and their pods there are deleted with grace period 0 (SIGKILL)."""
        self.set_stopped(True)
        for p in self.pods():
            try:
                self.api.delete_pod(p["metadata"]["name"], p["metadata"]["namespace"], grace=0)
            except ObjectNotFoundError:
                pass
        self.wait_no_pods(f"{what} on {self.node}")

    def delete(self) -> None:
        for ds in self.daemonsets:
            self.api.delete_daemonset(ds["metadata"]["name"], ds["metadata"]["namespace"])
