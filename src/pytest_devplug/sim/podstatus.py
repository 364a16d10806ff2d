"""The status the kubelet reports for a pod: its phase, its containers' statuses and its conditions.

Upstream ``kubelet_pods.go`` (``getPhase``, ``convertToAPIContainerStatuses``, ``generateAPIPodStatus``) over the
kubelet's memory of the pod and the runtime's records of its containers; ``allocatedResourcesStatus`` (the
``ResourceHealthStatus`` feature) from the device manager's view of each allocated device's health.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..kubeletmodel.views import PodSpecView
from .runtime import ContainerRecord

__all__ = ["PodRecord", "pod_phase", "pod_status", "container_status"]

#: resource -> (device ID -> "Healthy" | "Unhealthy"), as the device manager reports it now.
DeviceHealth = Callable[[str], Mapping[str, str]]
#: container name -> the DRA manager's ``allocatedResourcesStatus`` entries for that container's claims.
ClaimsStatus = Callable[[str], list[dict[str, Any]]]
#: container name -> resource -> the device IDs the device manager holds for it (since admission).
AllocatedDevices = Callable[[str], Mapping[str, Sequence[str]]]


@dataclass
class PodRecord:
    """The kubelet's memory of one admitted (or rejected) pod."""

    pod: dict[str, Any]
    view: PodSpecView
    phase: str = "Pending"
    reason: str = ""
    message: str = ""
    start_time: str = ""

    @property
    def uid(self) -> str:
        return self.view.uid

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def rejected(self) -> bool:
        """Failed with a reason (refused at admission, or so when re-admitted): its containers no longer move
        its phase."""
        return self.phase == "Failed" and bool(self.reason)


def pod_phase(records: Iterable[ContainerRecord]) -> str:
    """``getPhase``: Pending until every plain init container completed, Running while an app container runs,
    Succeeded or Failed once all app containers ended."""
    records = list(records)
    inits = [c for c in records if c.init and not c.sidecar]
    apps = [c for c in records if not c.init]
    if any(c.state != "terminated" or c.exit_code != 0 for c in inits):
        return "Pending"
    if any(c.state == "running" for c in apps):
        return "Running"
    if apps and all(c.state == "terminated" for c in apps):
        return "Succeeded" if all(c.exit_code == 0 for c in apps) else "Failed"
    return "Pending"


def pod_status(
    rec: PodRecord,
    records: Mapping[str, ContainerRecord],
    health: DeviceHealth,
    claims_status: ClaimsStatus | None = None,
    *,
    allocated: AllocatedDevices | None = None,
    resource_health: bool = True,
) -> dict[str, Any]:
    """The status the kubelet would post now for ``rec`` with its containers ``records``; ``claims_status`` adds
    the DRA entries (``claim:<name>[/<request>]``) of an app container's ``allocatedResourcesStatus``.

    ``allocatedResourcesStatus`` (``UpdateAllocatedResourcesStatus``) covers every regular container's devices,
    started or not: a container that never started (its image cannot be pulled) holds them since admission, as
    ``allocated`` tells. ``resource_health``: feature gate ResourceHealthStatus (off: the kubelet fills none,
    ``kubelet_pods.go``)."""
    status: dict[str, Any] = {"phase": rec.phase}
    if rec.reason:
        status["reason"] = rec.reason
    if rec.message:
        status["message"] = rec.message
    if rec.rejected and not records:
        return status
    status["startTime"] = rec.start_time
    health_cache: dict[str, Mapping[str, str]] = {}

    def device_health(res: str) -> Mapping[str, str]:
        if res not in health_cache:
            health_cache[res] = health(res)
        return health_cache[res]

    init_statuses: list[dict[str, Any]] = []
    app_statuses: list[dict[str, Any]] = []
    for spec in rec.view.containers:
        c = records.get(spec.name)
        if c is None:
            continue
        st = container_status(c)
        devices = c.devices or (allocated(spec.name) if allocated is not None and not spec.init else {})
        if resource_health and not spec.init and devices:
            st["allocatedResourcesStatus"] = [
                {
                    "name": res,
                    "resources": [
                        {
                            "resourceID": i,
                            "health": "Healthy" if device_health(res).get(i, "Healthy") == "Healthy" else "Unhealthy",
                        }
                        for i in sorted(ids)
                    ],
                }
                for res, ids in sorted(devices.items())
            ]
        if resource_health and not spec.init and claims_status is not None and (claims := claims_status(spec.name)):
            st["allocatedResourcesStatus"] = [*st.get("allocatedResourcesStatus", []), *claims]
        (init_statuses if spec.init else app_statuses).append(st)
    if init_statuses:
        status["initContainerStatuses"] = init_statuses
    status["containerStatuses"] = app_statuses
    initialized = all(
        c.state == "terminated" and c.exit_code == 0 for c in records.values() if c.init and not c.sidecar
    )
    ready = bool(app_statuses) and all(s["ready"] for s in app_statuses)
    t = rec.start_time
    status["conditions"] = [
        {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": t},
        {"type": "Initialized", "status": str(initialized), "lastTransitionTime": t},
        {"type": "Ready", "status": str(ready), "lastTransitionTime": t},
        {"type": "ContainersReady", "status": str(ready), "lastTransitionTime": t},
    ]
    return status


def container_status(c: ContainerRecord) -> dict[str, Any]:
    """One ``ContainerStatus`` as the API shows it."""
    cid = f"containerd://{c.container_id}" if c.container_id else ""
    if c.state == "running":
        state: dict[str, Any] = {"running": {"startedAt": c.started_at}}
    elif c.state == "terminated":
        state = {
            "terminated": {
                "exitCode": c.exit_code,
                "reason": c.reason,
                "startedAt": c.started_at,
                "finishedAt": c.finished_at,
                "containerID": cid,
            }
        }
    else:
        waiting: dict[str, Any] = {"reason": c.reason}
        if c.message:
            waiting["message"] = c.message
        state = {"waiting": waiting}
    st: dict[str, Any] = {
        "name": c.name,
        "ready": c.state == "running",
        "started": c.state == "running",
        "restartCount": c.restart_count,
        "image": c.image,
        "imageID": "",
        "state": state,
        "lastState": dict(c.last_state),
    }
    if cid:
        st["containerID"] = cid
    return st
