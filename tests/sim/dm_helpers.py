"""Helpers of the device-layer tests (prefixed ``dm_``): a bounded waiter driven by ``on_change``, mock-NVML
state files and an in-process fake plugin for faults the real one cannot make."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb
from pytest_devplug.api.deviceplugin import v1beta1_pb2_grpc as pb_grpc
from pytest_devplug.sim.devicemanager import DeviceManager

GPU = "example.com/gpu"


class DmWaiter:
    """Bounded waits on a condition that ``on_change`` (and a short poll) re-evaluates."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.changes = 0

    def notify(self) -> None:
        with self._cond:
            self.changes += 1
            self._cond.notify_all()

    def until(self, what: str, probe: Callable[[], Any], ok: Callable[[Any], bool], timeout: float = 10.0) -> Any:
        deadline = time.monotonic() + timeout
        seen = probe()
        while not ok(seen):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}; last seen: {seen!r}")
            with self._cond:
                self._cond.wait(min(left, 0.2))
            seen = probe()
        return seen


def dm_capacity_probe(dm: DeviceManager, resource: str = GPU) -> Callable[[], tuple[int | None, int | None]]:
    def probe() -> tuple[int | None, int | None]:
        cap, alloc, _ = dm.capacity()
        return cap.get(resource), alloc.get(resource)

    return probe


def dm_gpu(i: int, numa: int | None = 0, **kw: Any) -> dict[str, Any]:
    g = {
        "uuid": f"GPU-{i:04d}",
        "name": "NVIDIA A100-SXM4-40GB",
        "memory_mib": 40960,
        "numa_node": numa,
        "minor": i,
        "lost": False,
        "fail_allocate": False,
    }
    g.update(kw)
    return g


class DmMockState:
    """The plugin's mock NVML state file, always replaced atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.gpus: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []

    def write(self, gpus: list[dict[str, Any]] | None = None) -> None:
        if gpus is not None:
            self.gpus = gpus
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"gpus": self.gpus, "events": self.events}))
        os.replace(tmp, self.path)

    def set(self, uuid: str, **kw: Any) -> None:
        for g in self.gpus:
            if g["uuid"] == uuid:
                g.update(kw)
        self.write()


class FakePlugin(pb_grpc.DevicePluginServicer):
    """An in-process plugin with switchable faults (what the real plugin cannot be made to do)."""

    def __init__(self, sock: Path, resource: str = GPU, devices: list[pb.Device] | None = None) -> None:
        self.sock = sock
        self.resource = resource
        self.options = pb.DevicePluginOptions()
        self.options_error: str | None = None
        self.allocate_error: str | None = None
        self.allocate_empty = False
        self.prestart_error: str | None = None
        self.preferred: list[str] | None = None
        self.allocate_calls: list[list[str]] = []
        self.preferred_calls: list[pb.ContainerPreferredAllocationRequest] = []
        self.prestart_calls: list[list[str]] = []
        self.law_calls = 0
        self.envs: dict[str, str] = {}
        self._devices = (
            devices if devices is not None else [pb.Device(ID=f"dev-{i}", health="Healthy") for i in range(2)]
        )
        self._cond = threading.Condition()
        self._version = 0
        self._end = False
        self._server: Any = None

    # servicer
    def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:
        if self.options_error:
            context.abort(grpc.StatusCode.UNKNOWN, self.options_error)
        return self.options

    def ListAndWatch(self, request: pb.Empty, context: Any) -> Iterator[pb.ListAndWatchResponse]:
        self.law_calls += 1
        seen = -1
        while context.is_active():
            with self._cond:
                if self._end:
                    return
                if seen == self._version:
                    self._cond.wait(0.2)
                    continue
                seen = self._version
                devs = list(self._devices)
            yield pb.ListAndWatchResponse(devices=devs)

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        self.preferred_calls.extend(request.container_requests)
        resp = pb.PreferredAllocationResponse()
        for _ in request.container_requests:
            resp.container_responses.add(deviceIDs=self.preferred or [])
        return resp

    def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        self.allocate_calls.append(list(request.container_requests[0].devices_ids))
        if self.allocate_error:
            context.abort(grpc.StatusCode.INTERNAL, self.allocate_error)
        if self.allocate_empty:
            return pb.AllocateResponse()
        resp = pb.AllocateResponse()
        for r in request.container_requests:
            c = resp.container_responses.add()
            c.envs.update(self.envs or {"FAKE_DEVICES": ",".join(r.devices_ids)})
        return resp

    def PreStartContainer(self, request: pb.PreStartContainerRequest, context: Any) -> pb.PreStartContainerResponse:
        self.prestart_calls.append(list(request.devices_ids))
        if self.prestart_error:
            context.abort(grpc.StatusCode.UNKNOWN, self.prestart_error)
        return pb.PreStartContainerResponse()

    # control
    def set_devices(self, devices: list[pb.Device]) -> None:
        with self._cond:
            self._devices = devices
            self._version += 1
            self._cond.notify_all()

    def end_stream(self) -> None:
        with self._cond:
            self._end = True
            self._cond.notify_all()

    def serve(self) -> None:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_DevicePluginServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.sock}")
        self._server.start()

    def register(self, version: str = "v1beta1", resource: str | None = None) -> None:
        with grpc.insecure_channel(f"unix://{self.sock.parent / 'kubelet.sock'}") as ch:
            pb_grpc.RegistrationStub(ch).Register(
                pb.RegisterRequest(
                    version=version,
                    endpoint=self.sock.name,
                    resource_name=resource or self.resource,
                    options=self.options,
                ),
                timeout=15,
            )

    def stop(self) -> None:
        self.end_stream()
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None
