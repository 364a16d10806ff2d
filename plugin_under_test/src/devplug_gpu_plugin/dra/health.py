"""``v1alpha1.DRAResourceHealth/NodeWatchResources``: each GPU's health, from the same store as ListAndWatch.

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

from ..api.drahealth import v1alpha1_pb2 as hpb
from ..api.drahealth import v1alpha1_pb2_grpc as hpb_grpc
from ..devices import DeviceState, Snapshot
from .slices import device_name

__all__ = ["HEARTBEAT_S", "HealthService", "health_response"]

log = logging.getLogger("devplug_gpu_plugin.dra.health")

#: A third of the kubelet's default health timeout.
HEARTBEAT_S = 10.0
_POLL_S = 0.25  # how often a stream notices that its caller went away


def health_response(snapshot: Snapshot, pool: str) -> hpb.NodeWatchResourcesResponse:
    now = int(time.time())
    resp = hpb.NodeWatchResourcesResponse()
    for g in snapshot.gpus:
        resp.devices.add(
            device=hpb.DeviceIdentifier(pool_name=pool, device_name=device_name(g.info.minor)),
            health=hpb.HEALTHY if g.healthy else hpb.UNHEALTHY,
            last_updated_time=now,
            message="" if g.healthy else g.reason(),
        )
    return resp


class HealthService(hpb_grpc.DRAResourceHealthServicer):
    def __init__(self, state: DeviceState, pool: str, stopping: threading.Event, heartbeat: float = HEARTBEAT_S) -> None:
        self.state = state
        self.pool = pool
        self.stopping = stopping
        self.heartbeat = heartbeat

    def NodeWatchResources(self, request: hpb.NodeWatchResourcesRequest, context: Any) -> Iterator[hpb.NodeWatchResourcesResponse]:
        snap = self.state.snapshot()
        sent = time.monotonic()
        log.info("NodeWatchResources: sending %d devices (version %d)", len(snap.gpus), snap.version)
        yield health_response(snap, self.pool)
        while context.is_active() and not self.stopping.is_set():
            new = self.state.wait_for_change(snap.version, _POLL_S)
            if new.version != snap.version:
                snap = new
                log.info("NodeWatchResources: sending %d devices (version %d)", len(snap.gpus), snap.version)
            elif time.monotonic() - sent < self.heartbeat:
                continue
            sent = time.monotonic()
            yield health_response(snap, self.pool)
