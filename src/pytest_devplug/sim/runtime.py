"""The node's container runtime (containerd's part): the containers that exist, and exactly what each was given.

Containers outlive a kubelet restart (the kubelet adopts the running ones when it starts again), not a reboot.
So does a pod's sandbox: whether the kubelet must create one decides whether it prepares the pod's claims
(``kuberuntime_manager.go`` calls ``PrepareDynamicResources`` only on the way to ``CreatePodSandbox``).
Nothing runs: a container is a record of its state and of the options applied to it, which the sim backend's
``exec`` answers from. A CDI-enabled runtime adds the edits of the CDI devices the kubelet names
(:func:`pytest_devplug.kubeletmodel.cdi.apply_edits`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..kubeletmodel.views import ContainerView, PodSpecView
from .apiserver import now_rfc3339

__all__ = ["ContainerRecord", "ContainerRuntime", "image_pull_error"]


@dataclass
class ContainerRecord:
    """A container as the runtime holds it: state, and exactly what was applied to it."""

    name: str
    image: str
    init: bool
    sidecar: bool
    container_id: str = ""
    state: str = "waiting"  # waiting | running | terminated
    reason: str = "ContainerCreating"
    message: str = ""
    exit_code: int | None = None
    restart_count: int = 0
    started_at: str = ""
    finished_at: str = ""
    last_state: dict[str, Any] = field(default_factory=dict)
    options: ContainerView = field(default_factory=ContainerView)
    #: resource -> the device IDs the container was started with.
    devices: dict[str, list[str]] = field(default_factory=dict)

    def wait(self, reason: str, message: str = "") -> None:
        """Not running (yet): why, as the container status's ``waiting`` shows it."""
        self.state, self.reason, self.message = "waiting", reason, message

    def run(self, options: ContainerView, devices: Mapping[str, list[str]]) -> None:
        """Created and started with ``options`` (a new container ID each time)."""
        self.options = options
        self.devices = {k: list(v) for k, v in devices.items()}
        self.container_id = uuid.uuid4().hex
        self.state, self.reason, self.message, self.exit_code = "running", "", "", None
        self.started_at, self.finished_at = now_rfc3339(), ""

    def terminate(self, exit_code: int) -> None:
        """Exited for good (a completed init container, or one its pod's restart policy does not restart)."""
        self.state, self.exit_code, self.finished_at = "terminated", exit_code, now_rfc3339()
        self.reason = _exit_reason(exit_code)

    def exited(self, exit_code: int) -> None:
        """Exited and is to be started again: the exit becomes ``lastState``, the restart count goes up."""
        self.last_state = {
            "terminated": {
                "exitCode": exit_code,
                "reason": _exit_reason(exit_code),
                "startedAt": self.started_at,
                "finishedAt": now_rfc3339(),
                "containerID": f"containerd://{self.container_id}",
            }
        }
        self.restart_count += 1


#: Registry hosts no node can pull from: the DNS top-level domain reserved never to resolve (RFC 2606) and
#: upstream's e2e image of a registry that does not exist (``imageutils.InvalidRegistryImage``).
_UNPULLABLE_TLD = ".invalid"
_UNPULLABLE_HOSTS = ("invalid.registry.k8s.io",)


def image_pull_error(image: str) -> str | None:
    """containerd's answer to pulling ``image`` when its registry host cannot exist, else ``None``: every other
    image is present on the embedded kubelet's node (it runs no containers)."""
    first, sep, _ = image.partition("/")
    host = first if sep and ("." in first or ":" in first or first == "localhost") else "docker.io"
    name = host.split(":", 1)[0]
    if not (name.endswith(_UNPULLABLE_TLD) or name in _UNPULLABLE_HOSTS):
        return None
    return (
        f'rpc error: code = Unknown desc = failed to pull and unpack image "{image}": failed to resolve reference '
        f'"{image}": failed to do request: dial tcp: lookup {name}: no such host'
    )


def _exit_reason(exit_code: int) -> str:
    return "Completed" if exit_code == 0 else "Error"


class ContainerRuntime:
    """The containers on the node by pod UID. No lock of its own: the kubelet's lock guards every call."""

    def __init__(self) -> None:
        #: pod UID -> container name -> its record.
        self._pods: dict[str, dict[str, ContainerRecord]] = {}
        #: UIDs of the pods whose sandbox exists (made when their containers are first created).
        self._sandboxes: set[str] = set()

    def create(self, view: PodSpecView, pod: Mapping[str, Any]) -> dict[str, ContainerRecord]:
        """The pod's sandbox and records for every container (init containers first), replacing any it had."""
        self._pods[view.uid] = {}
        self._sandboxes.add(view.uid)
        return self.adopt(view, pod)

    def has_sandbox(self, uid: str) -> bool:
        """Whether pod ``uid``'s sandbox exists (records made by :meth:`adopt` alone do not make one)."""
        return uid in self._sandboxes

    def adopt(self, view: PodSpecView, pod: Mapping[str, Any]) -> dict[str, ContainerRecord]:
        """The pod's records, adding one for each container the runtime does not hold yet."""
        spec = pod.get("spec") or {}
        images = {
            c["name"]: c.get("image", "")
            for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        }
        records = self._pods.setdefault(view.uid, {})
        for c in view.containers:
            if c.name not in records:
                records[c.name] = ContainerRecord(c.name, images.get(c.name, ""), c.init, c.sidecar)
        return records

    def containers(self, uid: str) -> dict[str, ContainerRecord]:
        """The pod's records (live; empty when the runtime holds none)."""
        return self._pods.get(uid, {})

    def copies(self, uid: str) -> dict[str, ContainerRecord]:
        """Snapshots of the pod's records, for readers outside the kubelet's lock."""
        return {n: replace(c) for n, c in self._pods.get(uid, {}).items()}

    def pod_uids(self) -> list[str]:
        return list(self._pods)

    def remove(self, uid: str) -> bool:
        """Kill and remove the pod's containers and sandbox; whether it had any containers."""
        self._sandboxes.discard(uid)
        return bool(self._pods.pop(uid, None))

    def clear(self) -> None:
        """A reboot: every container and sandbox is gone."""
        self._pods.clear()
        self._sandboxes.clear()
