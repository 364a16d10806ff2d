"""``DRAResourceHealth/NodeWatchResources`` (v1 and v1alpha1): each GPU's health, from the same store as ListAndWatch.

Both versions are served and listed in GetInfo, as drivers built on the kubeletplugin helper v0.37+ do: a kubelet
of 1.37+ watches v1 (and only a service the driver lists), an older one v1alpha1 on every driver.

The health loop (:mod:`devplug_gpu_plugin.health`) writes :class:`~devplug_gpu_plugin.devices.DeviceState`
from NVML's events: a critical Xid or a lost GPU is UNHEALTHY, a GPU that answers again HEALTHY. Each
message is the complete list (the kubelet replaces its view with it), sent at once, on every change, and
every :data:`HEARTBEAT_S` seconds when nothing changes: the kubelet reads a status older than its health
timeout (30 s by default) as Unknown.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from types import ModuleType

from ..api.drahealth import v1_pb2 as hpb1
from ..api.drahealth import v1alpha1_pb2 as hpb
from ..devices import DeviceState, Snapshot
from .slices import device_name

__all__ = ["HEARTBEAT_S", "HealthService", "health_response", "V1", "V1ALPHA1"]

#: The generated messages of each version (the same fields and numbers).
V1, V1ALPHA1 = hpb1, hpb

log = logging.getLogger("devplug_gpu_plugin.dra.health")

#: A third of the kubelet's default health timeout.
HEARTBEAT_S = 10.0
_POLL_S = 0.25  # how often a stream notices that its caller went away


def health_response(snapshot: Snapshot, pool: str, api: ModuleType = hpb) -> Any:
    """One message of version ``api`` (:data:`V1` or :data:`V1ALPHA1`): every GPU of ``snapshot``."""
    now = int(time.time())
    resp = api.NodeWatchResourcesResponse()
    for g in snapshot.gpus:
        resp.devices.add(
            device=api.DeviceIdentifier(pool_name=pool, device_name=device_name(g.info.minor)),
            health=api.HEALTHY if g.healthy else api.UNHEALTHY,
            last_updated_time=now,
            message="" if g.healthy else g.reason(),
        )
    return resp


class HealthService:
    """The servicer of one version (``api``: :data:`V1` or :data:`V1ALPHA1`)."""

    def __init__(
        self,
        state: DeviceState,
        pool: str,
        stopping: threading.Event,
        heartbeat: float = HEARTBEAT_S,
        api: ModuleType = hpb,
    ) -> None:
        self.api = api
        self.state = state
        self.pool = pool
        self.stopping = stopping
        self.heartbeat = heartbeat

    def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802 (gRPC name)
        snap = self.state.snapshot()
        sent = time.monotonic()
        log.info(
            "NodeWatchResources (%s): sending %d devices (version %d)",
            self.api.DESCRIPTOR.package,
            len(snap.gpus),
            snap.version,
        )
        yield health_response(snap, self.pool, self.api)
        while context.is_active() and not self.stopping.is_set():
            new = self.state.wait_for_change(snap.version, _POLL_S)
            if new.version != snap.version:
                snap = new
                log.info("NodeWatchResources: sending %d devices (version %d)", len(snap.gpus), snap.version)
            elif time.monotonic() - sent < self.heartbeat:
                continue
            sent = time.monotonic()
            yield health_response(snap, self.pool, self.api)
